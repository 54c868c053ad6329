"""The node-disk tier's replica slots as a test sees them from outside the engines."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path


def held_slots(root: Path) -> int:
    """The replica slots in `root` whose lock a running engine holds."""
    held = 0
    for lock in Path(root).glob("replica-*/.owner.lock"):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held += 1
        finally:
            os.close(fd)
    return held


def slots_released(root: Path, running: int = 0) -> bool:
    """At most `running` slots held: a stopped engine's last process has exited. Under load its engine core can
    outlive the server's process group by seconds, and a restart would then take another slot (an empty one),
    where a pod's restart comes only after the old container is gone."""
    return held_slots(root) <= running
