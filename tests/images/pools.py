"""Offload pool files as vLLM 0.33 leaves them in /dev/shm, and a process that keeps one mapped."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

POOL = 1 << 20


def plant(path: Path, size: int = POOL) -> Path:
    """A pool file as vLLM leaves it: created O_EXCL, sized, its pages written (they hold memory)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as region:
            region[::mmap.PAGESIZE] = b"\1" * (size // mmap.PAGESIZE)
    finally:
        os.close(fd)
    return path


HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
region = mmap.mmap(fd, 0)
os.close(fd)  # vLLM's engine keeps only the mapping alive once the pool is set up
print("holding", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 120)
"""
