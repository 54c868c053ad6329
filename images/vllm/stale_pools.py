#!/usr/bin/env python3
"""Remove the offload pool files a previous container left in /dev/shm, before vLLM starts.

A pod restarted in place keeps its memory-backed /dev/shm. vLLM 0.33 backs the CPU offload pool with
files there (vllm/v1/kv_offload/cpu/shared_offload_region.py: /dev/shm/vllm_offload_{engine_id}.mmap,
and .mmap.N for further segments); one left behind by a crashed or killed engine still holds its
memory, so the next engine's pool would double the pod's footprint and get it OOMKilled.

A file is stale when no process has it open or mapped, in this container or in any other that shares
/dev/shm (a sidecar, a second engine: their processes are not visible here). The kernel tells: a write
lease (fcntl F_SETLEASE) is granted only on a file that no other open file description refers to, an
mmap included. The lease is held while the file is unlinked, so no process can open it in between.
A file the lease cannot be taken on (in use, or owned by another user) is kept, and the log says why;
so are the further segments of a pool whose first file is kept.

    stale_pools.py [DIRECTORY]      (default /dev/shm)
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import sys

# vllm/v1/kv_offload/cpu/shared_offload_region.py (0.33): f"/dev/shm/vllm_offload_{engine_id}.mmap" + ".N"
POOL_FILE = re.compile(r"vllm_offload_.+\.mmap(\.[0-9]+)?")
LOG_PREFIX = "spillway-vllm:"


def log(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def remove_if_stale(path: str) -> bool:
    """Unlink path when no process holds it; True when it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False  # gone meanwhile: its engine unlinked it
    except OSError as exc:
        log(f"kept {path}: cannot open it ({exc.strerror})")
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            log(f"kept {path}: not a regular file")
            return False
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EBUSY):
                log(f"kept {path} ({gib(info.st_blocks * 512)}): a running process holds it "
                    "(another container sharing /dev/shm?)")
            elif exc.errno in (errno.EACCES, errno.EPERM):
                log(f"kept {path}: owned by uid {info.st_uid}, not {os.geteuid()}; "
                    "cannot tell whether a process holds it")
            else:
                log(f"kept {path}: cannot tell whether a process holds it (lease: {exc.strerror})")
            return False
        try:
            os.unlink(path)
        finally:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        log(f"removed stale pool file {path} ({gib(info.st_blocks * 512)} of memory), "
            "left by a previous container")
        return True
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    directory = argv[1] if len(argv) > 1 else "/dev/shm"
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log(f"cannot list {directory} for stale pool files: {exc.strerror}")
        return 1
    pools = [(name, match) for name in names if (match := POOL_FILE.fullmatch(name))]
    kept = set()
    for name, match in pools:  # first files first: they decide for their segments
        if not match.group(1) and not remove_if_stale(os.path.join(directory, name)) \
                and os.path.exists(os.path.join(directory, name)):
            kept.add(name)
    for name, match in pools:
        if not match.group(1):
            continue
        first = name[: -len(match.group(1))]
        if first in kept:
            # vLLM creates, sizes and closes the segment files before it maps them, holding only the
            # first file open meanwhile: a segment of a kept pool may be unheld for a moment, yet in use.
            log(f"kept {os.path.join(directory, name)}: a segment of the kept {first}")
        else:
            remove_if_stale(os.path.join(directory, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
