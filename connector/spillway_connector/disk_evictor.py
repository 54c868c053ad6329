"""Keeps vLLM's node-disk ("fs") KV tier under its planned size: a least-recently-used index of its chunk files.

vLLM's fs tier writes one file per offloaded chunk and never deletes one (vllm/v1/kv_offload/tiering/fs/), so a
busy engine fills its volume until the kubelet evicts the pod for ephemeral storage. The evictor runs inside the
engine core, beside the tier: it sees every store before it is written and every load before it is read, so
  - the bound is exact: a chunk is admitted only when its bytes fit (older chunks are deleted to make room; a
    store that cannot fit, every older chunk being read or written right now, is dropped and counted), with
    no scan racing the writers and no sidecar guessing from a directory listing;
  - "recently used" is known without atime (node disks are mounted noatime/relatime): a load moves its files to
    the young end and stamps their mtime, so a restarted engine's scan orders them the same way;
  - it stops with the engine; no extra container, no second process with write access to the volume.
A background thread keeps some room free (deletes down to LOW_WATER when use passes HIGH_WATER), so stores
rarely wait on an unlink; when it lags, the store deletes what it needs itself.

Only files this index holds are deleted, and each one only after checking that it is a regular file (not a
link) named `*.bin` whose real directory lies inside the tier's root: nothing outside the tier is ever touched.
"""
from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

CHUNK_SUFFIX = ".bin"  # vllm/v1/kv_offload/file_mapper.py: <root>/<model>_<digest>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin
HIGH_WATER = 0.95  # the background thread starts deleting above this share of the bound ...
LOW_WATER = 0.90  # ... and stops at this one
POLL_S = 0.5
BATCH_FILES = 64


@dataclass
class EvictorCounts:
    """What happened since the last take(): bytes and chunks deleted, stores dropped for want of room."""

    evicted_bytes: int = 0
    evicted_chunks: int = 0
    refused_chunks: int = 0

    def any(self) -> bool:
        return bool(self.evicted_bytes or self.evicted_chunks or self.refused_chunks)


def inside(root: str, path: str) -> bool:
    """Whether `path`'s real directory is `root` or below it (symlinked directories resolved)."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return parent == root or parent.startswith(root + os.sep)


class DiskTierIndex:
    """The chunk files of one tier directory, oldest use first, never more than `capacity_bytes` of them.

    reserve() before a store is written, pin() before a load is read, release() when either finished.
    Thread-safe: the engine core's scheduler thread calls the first three, the evictor thread deletes.
    """

    def __init__(self, root: str, capacity_bytes: int):
        if capacity_bytes <= 0:
            raise ValueError(f"disk tier bound must be a positive number of bytes, got {capacity_bytes}")
        self.root = os.path.realpath(root)
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self._files: OrderedDict[str, int] = OrderedDict()  # path -> bytes, least recently used first
        self._busy: dict[str, int] = {}  # path -> in-flight loads and stores: never deleted
        self._touched: set[str] = set()  # loaded since the last mtime stamp
        self._counts = EvictorCounts()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- start --------------------------------------------------------------------------------------------
    def scan(self) -> int:
        """Index the chunk files already under the root (a restarted engine's), oldest mtime first; delete the
        oldest beyond the bound. Returns how many were indexed. Links are neither followed nor indexed."""
        found: list[tuple[float, str, int]] = []
        for directory, subdirs, files in os.walk(self.root, followlinks=False):
            for name in files:
                if not name.endswith(CHUNK_SUFFIX):
                    continue
                path = os.path.join(directory, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    found.append((info.st_mtime, path, info.st_size))
        found.sort()
        with self._lock:
            for _, path, size in found:
                if path not in self._files:
                    self._files[path] = size
                    self.used_bytes += size
            self._evict_locked(self.used_bytes - self.capacity_bytes)
        return len(found)

    def start(self) -> DiskTierIndex:
        """Start the background thread that keeps room free between HIGH_WATER and LOW_WATER."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spillway-disk-evictor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- the tier's calls -----------------------------------------------------------------------------------
    def reserve(self, paths: Iterable[str], chunk_bytes: int) -> list[bool]:
        """Before a store: True for each path that may be written (already held, or its bytes now fit),
        False for one dropped because everything older is busy. Admitted paths are busy until release()."""
        admitted = []
        with self._lock:
            for path in paths:
                if path in self._files:
                    self._files.move_to_end(path)
                    admitted.append(True)
                elif not inside(self.root, path) or chunk_bytes > self.capacity_bytes:
                    admitted.append(False)
                    self._counts.refused_chunks += 1
                    continue
                else:
                    self._evict_locked(self.used_bytes + chunk_bytes - self.capacity_bytes)
                    if self.used_bytes + chunk_bytes > self.capacity_bytes:
                        admitted.append(False)
                        self._counts.refused_chunks += 1
                        continue
                    self._files[path] = chunk_bytes
                    self.used_bytes += chunk_bytes
                    admitted.append(True)
                self._busy[path] = self._busy.get(path, 0) + 1
            over = self.used_bytes > HIGH_WATER * self.capacity_bytes
        if over:
            self._wake.set()
        return admitted

    def pin(self, paths: Iterable[str]) -> None:
        """Before a load: the files become the most recently used and stay until release()."""
        with self._lock:
            for path in paths:
                if path in self._files:
                    self._files.move_to_end(path)
                    self._touched.add(path)
                self._busy[path] = self._busy.get(path, 0) + 1

    def touch(self, paths: Iterable[str]) -> None:
        """A hit served from the CPU pool: the chunks' files become the most recently used too (the pool forgets
        a chunk long before the disk does; a prefix hot in the pool must not age on disk)."""
        with self._lock:
            for path in paths:
                if path in self._files:
                    self._files.move_to_end(path)
                    self._touched.add(path)

    def release(self, paths: Iterable[str], stored: bool | None = None) -> None:
        """A load or store finished. `stored=False`: a failed store, whose files may not exist."""
        with self._lock:
            for path in paths:
                left = self._busy.get(path, 0) - 1
                if left > 0:
                    self._busy[path] = left
                else:
                    self._busy.pop(path, None)
                if stored is False and path in self._files and not os.path.lexists(path):
                    self.used_bytes -= self._files.pop(path)

    def take_counts(self) -> EvictorCounts:
        with self._lock:
            counts, self._counts = self._counts, EvictorCounts()
        return counts

    def __len__(self) -> int:
        return len(self._files)

    # -- deleting -------------------------------------------------------------------------------------------
    def _evict_locked(self, need_bytes: int, most_files: int | None = None) -> int:
        """Delete least recently used idle files until `need_bytes` are freed (nothing when <= 0), at most
        `most_files` of them; returns how many left the index."""
        victims = []
        for path, size in self._files.items():  # oldest first; stops as soon as enough is found
            if need_bytes <= 0 or (most_files is not None and len(victims) >= most_files):
                break
            if path not in self._busy:
                victims.append(path)
                need_bytes -= size
        for path in victims:
            self.used_bytes -= self._files.pop(path)
            self._touched.discard(path)
            freed = self._unlink(path)
            if freed is not None:
                self._counts.evicted_bytes += freed
                self._counts.evicted_chunks += 1
        return len(victims)

    def _unlink(self, path: str) -> int | None:
        """Delete one chunk file; its size, or None when it was gone or is not a chunk file inside the root."""
        if not path.endswith(CHUNK_SUFFIX) or not inside(self.root, path):
            return None
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                return None
            os.unlink(path)
        except FileNotFoundError:
            return None
        return info.st_size

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            with self._lock:
                draining = self.used_bytes > HIGH_WATER * self.capacity_bytes
            while draining and not self._stop.is_set():
                with self._lock:  # small batches: the scheduler's reserve() waits on this lock
                    removed = self._evict_locked(self.used_bytes - int(LOW_WATER * self.capacity_bytes), BATCH_FILES)
                    draining = removed > 0 and self.used_bytes > LOW_WATER * self.capacity_bytes
            with self._lock:
                touched, self._touched = self._touched, set()
            now = time.time()
            for path in touched:  # the order a restarted engine's scan() finds
                try:
                    os.utime(path, (now, now), follow_symlinks=False)
                except OSError:
                    pass
