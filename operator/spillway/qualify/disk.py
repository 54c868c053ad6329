"""The node disk's read rate into the CPU pool, measured the way vLLM's fs tier reads (`spillway qualify --disk`).

vLLM's fs tier (vllm/v1/kv_offload/tiering/fs/io.py) keeps one file per chunk and loads a chunk with
os.open(O_RDONLY | O_DIRECT) and one os.readv into the pool's shared mapping, from n_read_threads threads at
once; it falls back to buffered I/O where O_DIRECT is refused. This does the same: it writes `chunks` files of
`chunk_bytes` into a fresh directory under the tier's volume, drops them from the page cache (O_DIRECT writes,
or fsync and POSIX_FADV_DONTNEED), reads them back with `threads` threads into one shared mapping, and removes
only the directory it made.
"""
from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ..core.disk_tier import READ_THREADS
from ..core.errors import InvalidSpec

O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass(frozen=True)
class DiskReadRate:
    gbps: float  # 1e9 bytes per second, disk -> shared mapping
    chunk_bytes: int
    chunks: int
    threads: int
    o_direct: bool
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _o_direct_works(directory: str) -> bool:
    if not O_DIRECT:
        return False
    page = mmap.mmap(-1, mmap.PAGESIZE)
    path = os.path.join(directory, ".o_direct_probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | O_DIRECT, 0o600)
        try:
            os.write(fd, page)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        page.close()
        if os.path.exists(path):
            os.remove(path)


def _write(path: str, data: memoryview, direct: bool) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL | (O_DIRECT if direct else 0), 0o600)
    try:
        os.write(fd, data)
        if not direct:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read must come from the disk
    finally:
        os.close(fd)


def _read(path: str, into: memoryview, direct: bool) -> int:
    fd = os.open(path, os.O_RDONLY | (O_DIRECT if direct else 0))
    try:
        return os.readv(fd, [into])
    finally:
        os.close(fd)


def measure_disk_read(directory: str, chunk_bytes: int = 2 * 2**20, chunks: int = 256,
                      threads: int = READ_THREADS) -> DiskReadRate:
    if not os.path.isdir(directory):
        raise InvalidSpec(f"--disk {directory}: not a directory (the disk tier's volume)")
    if chunk_bytes < mmap.PAGESIZE or chunk_bytes % mmap.PAGESIZE:
        raise InvalidSpec(f"--disk-chunk-size must be a positive multiple of {mmap.PAGESIZE} bytes, got {chunk_bytes}")
    if chunks < 1 or threads < 1:
        raise InvalidSpec("--disk-chunks and --disk-threads must be at least 1")
    work = tempfile.mkdtemp(prefix="spillway-qualify-", dir=directory)
    region = mmap.mmap(-1, chunk_bytes * chunks, flags=mmap.MAP_SHARED)  # page aligned, as O_DIRECT needs
    try:
        view = memoryview(region)
        direct = _o_direct_works(work)
        for n in range(chunks):
            view[n * chunk_bytes:(n + 1) * chunk_bytes] = os.urandom(64) * (chunk_bytes // 64)
        paths = [os.path.join(work, f"{n:08d}.bin") for n in range(chunks)]
        for n, path in enumerate(paths):
            _write(path, view[n * chunk_bytes:(n + 1) * chunk_bytes], direct)
        region.madvise(mmap.MADV_DONTNEED)  # the reads fill fresh pages, as a pool's free chunks would be
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            got = list(pool.map(lambda n: _read(paths[n], view[n * chunk_bytes:(n + 1) * chunk_bytes], direct),
                                range(chunks)))
        seconds = time.perf_counter() - started
        if sum(got) != chunk_bytes * chunks:
            raise InvalidSpec(f"--disk {directory}: short reads ({sum(got)} of {chunk_bytes * chunks} bytes)")
        view.release()
    finally:
        region.close()
        shutil.rmtree(work, ignore_errors=True)
    return DiskReadRate(round(chunk_bytes * chunks / seconds / 1e9, 3), chunk_bytes, chunks, threads, direct,
                        round(seconds, 4))
