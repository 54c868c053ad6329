"""Keeps vLLM's node-disk ("fs") KV tier under its planned size: a least-recently-used index of its chunk files.

vLLM's fs tier writes one file per offloaded chunk and never deletes one (vllm/v1/kv_offload/tiering/fs/), so a
busy engine fills its volume until the kubelet evicts the pod for ephemeral storage. The evictor runs inside the
engine core, beside the tier: it sees every store before it is written and every load before it is read, so
  - the bound is exact and counts what the volume spends: each file rounded up to the file system's block, and
    the two directories vLLM's file mapper makes per chunk hash (4 KiB each on ext4), which are removed with
    their last file; a chunk is admitted only when it fits (older chunks are deleted to make room; a store that
    cannot fit, every older chunk being read or written right now, is dropped and counted);
  - "recently used" is known without atime (node disks are mounted noatime/relatime): a load moves its files to
    the young end and stamps their mtime, so a restarted engine's scan orders them the same way;
  - it stops with the engine; no extra container, no second process with write access to the volume.
A background thread keeps some room free (deletes down to LOW_WATER when use passes HIGH_WATER), watches the
volume itself (statvfs: when free space falls under a floor, for whatever reason, it deletes the oldest chunks
until the floor is met twice over; a read-only volume is reported and stores are refused), reclaims the chunks of
the slot's other namespaces (another model revision's), and stamps the mtimes of loaded chunks.

It faults softly: a file that cannot be deleted is counted, logged and set aside (its bytes still count against
the bound, retried later); an error in the thread is counted and the loop goes on; the tier's guard restarts a
thread that died (disk_tier.SpillwayFsTier).

Only files whose names vLLM's file mapper gives are deleted (<namespace>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin, its
temporary files, a namespace's config.json), and each only after checking that it is a regular file (not a
link) whose real directory lies inside this engine's slot: nothing outside the tier is ever touched. The one
exception is the tier's own: on a full volume, a slot of the same root that no running engine holds (its replica
scaled away) is emptied first, by an index over that slot under the same rules, while its lock is held.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

CHUNK_SUFFIX = ".bin"  # vllm/v1/kv_offload/file_mapper.py: <root>/<model>_<digest>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin
_NAMESPACE = r"[^/]+_[0-9a-f]{12}"
CHUNK_FILE = re.compile(rf"^(?P<ns>{_NAMESPACE})_r\d+/[0-9a-f]{{3}}/[0-9a-f]{{2}}_g\d+/[0-9a-f]+\.bin$")
TMP_FILE = re.compile(rf"^(?P<ns>{_NAMESPACE})_r\d+/[0-9a-f]{{3}}/[0-9a-f]{{2}}_g\d+/[0-9a-f]+\.bin_\d+\.tmp$")
CONFIG_FILE = re.compile(rf"^(?P<ns>{_NAMESPACE})/config\.json(\.\d+\.tmp)?$")
HIGH_WATER = 0.95  # the background thread starts deleting above this share of the bound ...
LOW_WATER = 0.90  # ... and stops at this one
POLL_S = 0.5
BATCH_FILES = 64
STUCK_RETRY_S = 30.0  # files that could not be deleted are tried again this often
FREE_FLOOR_BYTES = 256 << 20  # the volume's free space kept at least min(this, FREE_FLOOR_SHARE of the volume)
FREE_FLOOR_SHARE = 0.02
DEFAULT_BLOCK = 4096


@dataclass
class EvictorCounts:
    """What happened since the last take(): bytes and chunks deleted, stores dropped for want of room, files
    that could not be deleted, errors in the evictor's loop."""

    evicted_bytes: int = 0
    evicted_chunks: int = 0
    refused_chunks: int = 0
    delete_errors: int = 0
    loop_errors: int = 0

    def any(self) -> bool:
        return any(vars(self).values())


def inside(root: str, path: str) -> bool:
    """Whether `path`'s real directory is `root` or below it (symlinked directories resolved)."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return parent == root or parent.startswith(root + os.sep)


class DiskTierIndex:
    """The chunk files of one namespace in one slot, oldest use first, never more than `capacity_bytes` of disk.

    reserve() before a store is written, pin() before a load is read, release() when either finished,
    forget() for a file removed by someone else (a failed checksum). Thread-safe: the engine core's scheduler
    thread calls these, the evictor thread deletes.
    """

    def __init__(self, root: str, capacity_bytes: int, namespace: str | None = None,
                 orphans: Callable[[], Iterable[Any]] | None = None):
        if capacity_bytes <= 0:
            raise ValueError(f"disk tier bound must be a positive number of bytes, got {capacity_bytes}")
        self.root = os.path.realpath(root)
        self.namespace = namespace  # the base name of our namespace; None: every namespace in root is ours
        # the other slots of a shared root that no engine holds (disk_namespace.orphaned_slots), emptied first
        # when the volume runs short: a replica scaled away leaves its chunks outside every running one's bound
        self._orphans = orphans
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.block = self._block_size()
        self.free_bytes: int | None = None  # the volume's, at the last check
        self.read_only = False
        self.full = False
        self._files: OrderedDict[str, int] = OrderedDict()  # path -> bytes on disk, least recently used first
        self._busy: dict[str, int] = {}  # path -> in-flight loads and stores: never deleted
        self._touched: set[str] = set()  # loaded since the last mtime stamp
        self._leaf_files: dict[str, int] = {}  # <hh>_g<g> directory -> our files in it
        self._mid_leaves: dict[str, int] = {}  # <hhh> directory -> its leaf directories
        self._stuck: dict[str, int] = {}  # files that could not be deleted -> bytes (still on disk)
        self._stale: list[str] = []  # other namespaces' files: deleted by the thread
        self._stale_dirs: set[str] = set()
        self._stuck_tried = 0.0
        self._counts = EvictorCounts()
        self._logged: set[tuple] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _block_size(self) -> int:
        try:
            return os.statvfs(self.root).f_bsize or DEFAULT_BLOCK
        except OSError:
            return DEFAULT_BLOCK

    def disk_bytes(self, size: int) -> int:
        """Bytes a file of `size` takes on the volume: whole blocks."""
        return -(-size // self.block) * self.block

    def _classify(self, relative: str) -> tuple[str, re.Match] | None:
        for kind, pattern in (("chunk", CHUNK_FILE), ("tmp", TMP_FILE), ("config", CONFIG_FILE)):
            match = pattern.match(relative)
            if match:
                return kind, match
        return None

    def _ours(self, match: re.Match) -> bool:
        return self.namespace is None or match.group("ns") == self.namespace

    # -- start --------------------------------------------------------------------------------------------
    def scan(self) -> int:
        """Index our namespace's chunk files already in the slot (a restarted engine's), oldest mtime first;
        delete the oldest beyond the bound; queue other namespaces' files for reclaiming and remove our own
        leftover temporary files. Files the file mapper does not name are left alone. Returns how many chunks
        were indexed. Links are neither followed nor indexed."""
        found: list[tuple[float, str, int]] = []
        stale: list[str] = []
        leftovers: list[str] = []
        foreign = 0
        for directory, subdirs, files in os.walk(self.root, followlinks=False):
            for name in files:
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, self.root)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                kind = self._classify(relative)
                if not stat.S_ISREG(info.st_mode) or kind is None:
                    foreign += name != ".owner.lock"
                    continue
                if not self._ours(kind[1]):
                    stale.append(path)
                    self._stale_dirs.add(os.path.join(self.root, relative.split(os.sep)[0]))
                elif kind[0] == "chunk":
                    found.append((info.st_mtime, path, info.st_size))
                elif kind[0] == "tmp":
                    leftovers.append(path)
        if foreign:
            logger.warning("disk tier %s: %d files the tier did not write are left alone", self.root, foreign)
        found.sort()
        with self._lock:
            for path in leftovers:
                self._unlink(path)
            for _, path, size in found:
                if path not in self._files:
                    self._add_locked(path, self.disk_bytes(size))
            self._stale.extend(stale)
            self._evict_locked(self.used_bytes - self.capacity_bytes)
        if stale:
            logger.info("disk tier %s: reclaiming %d files of %d stale namespaces", self.root, len(stale),
                        len(self._stale_dirs))
            self._wake.set()
        return len(found)

    def start(self) -> DiskTierIndex:
        """Start the background thread (HIGH_WATER/LOW_WATER, the volume's free space, stale namespaces)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="spillway-disk-evictor", daemon=True)
            self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure_running(self) -> bool:
        """Start the thread again if it died (not if it was stopped); True when it had to."""
        if self._stop.is_set() or self._thread is None or self._thread.is_alive():
            return False
        logger.error("disk tier %s: the evictor thread died; restarting it", self.root)
        self._thread = None
        self.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- the tier's calls -----------------------------------------------------------------------------------
    def _new_dir_bytes(self, path: str) -> int:
        leaf = os.path.dirname(path)
        mid = os.path.dirname(leaf)
        new = 0
        if leaf not in self._leaf_files:
            new += self.block
            if mid not in self._mid_leaves:
                new += self.block
        return new

    def _add_locked(self, path: str, size: int) -> None:
        leaf = os.path.dirname(path)
        mid = os.path.dirname(leaf)
        self.used_bytes += size + self._new_dir_bytes(path)
        if leaf not in self._leaf_files:
            self._leaf_files[leaf] = 0
            self._mid_leaves[mid] = self._mid_leaves.get(mid, 0) + 1
        self._leaf_files[leaf] += 1
        self._files[path] = size

    def _freed_dir_bytes(self, path: str) -> int:
        """The directory bytes deleting `path` alone would free (its leaf and <hhh> directories if it is their
        last file)."""
        leaf = os.path.dirname(path)
        if self._leaf_files.get(leaf, 0) != 1:
            return 0
        return self.block * (1 + (self._mid_leaves.get(os.path.dirname(leaf), 0) == 1))

    def _drop_locked(self, path: str) -> None:
        """Take `path` out of the index (its file is gone or being deleted); remove directories left empty."""
        self.used_bytes -= self._files.pop(path)
        self._touched.discard(path)
        leaf = os.path.dirname(path)
        mid = os.path.dirname(leaf)
        left = self._leaf_files.get(leaf, 1) - 1
        if left > 0:
            self._leaf_files[leaf] = left
            return
        self._leaf_files.pop(leaf, None)
        self.used_bytes -= self.block
        self._rmdir(leaf)
        leaves = self._mid_leaves.get(mid, 1) - 1
        if leaves > 0:
            self._mid_leaves[mid] = leaves
            return
        self._mid_leaves.pop(mid, None)
        self.used_bytes -= self.block
        self._rmdir(mid)

    def _rmdir(self, directory: str) -> None:
        if os.path.realpath(directory) == self.root or not inside(self.root, os.path.join(directory, "x")):
            return
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:  # not empty (a file we do not index), read-only, ...: it stays, harmlessly
            if exc.errno != errno.ENOTEMPTY:
                self._log_once(("rmdir", exc.errno), "disk tier %s: cannot remove directory %s: %s", self.root,
                               directory, exc.strerror)

    def reserve(self, paths: Iterable[str], chunk_bytes: int) -> list[bool]:
        """Before a store: True for each path that may be written (already held, or its bytes now fit),
        False for one dropped because everything older is busy. Admitted paths are busy until release()."""
        admitted = []
        size = self.disk_bytes(chunk_bytes)
        with self._lock:
            for path in paths:
                if path in self._files:
                    self._files.move_to_end(path)
                    admitted.append(True)
                elif self.read_only or not inside(self.root, path) or size > self.capacity_bytes:
                    admitted.append(False)
                    self._counts.refused_chunks += 1
                    continue
                else:
                    need = size + self._new_dir_bytes(path)
                    self._evict_locked(self.used_bytes + need - self.capacity_bytes)
                    need = size + self._new_dir_bytes(path)  # eviction may have removed the directories
                    if self.used_bytes + need > self.capacity_bytes:
                        admitted.append(False)
                        self._counts.refused_chunks += 1
                        continue
                    self._add_locked(path, size)
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
        """A load or store finished. `stored=False`: a failed store, whose files may not exist; the volume is
        checked at once (a full or read-only volume fails every store)."""
        with self._lock:
            for path in paths:
                left = self._busy.get(path, 0) - 1
                if left > 0:
                    self._busy[path] = left
                else:
                    self._busy.pop(path, None)
                if stored is False and path in self._files and not os.path.lexists(path):
                    self._drop_locked(path)
        if stored is False:
            self._wake.set()

    def forget(self, path: str) -> None:
        """A file removed by someone else (a chunk that failed its checksum)."""
        with self._lock:
            if path in self._files:
                self._drop_locked(path)

    def take_counts(self) -> EvictorCounts:
        with self._lock:
            counts, self._counts = self._counts, EvictorCounts()
        return counts

    def __len__(self) -> int:
        return len(self._files)

    # -- deleting -------------------------------------------------------------------------------------------
    def _evict_locked(self, need_bytes: int, most_files: int | None = None) -> int:
        """Delete least recently used idle files until `need_bytes` are freed (nothing when <= 0), at most
        `most_files` of them; returns how many left the index. A file that cannot be deleted is set aside
        (counted) and the next one tried."""
        removed = 0
        while need_bytes > 0 and (most_files is None or removed < most_files):
            victims = []
            for path, size in self._files.items():  # oldest first; stops as soon as enough is found
                if need_bytes <= 0 or (most_files is not None and removed + len(victims) >= most_files):
                    break
                if path not in self._busy:
                    victims.append(path)
                    need_bytes -= size + self._freed_dir_bytes(path)
            if not victims:
                break
            for path in victims:
                removed += 1
                freed = self._unlink(path)
                if freed is None and os.path.lexists(path):  # could not be deleted: its bytes are still spent
                    size = self._stuck[path] = self._files.pop(path)
                    self._touched.discard(path)
                    need_bytes += size + self._freed_dir_bytes(path)
                    continue
                self._drop_locked(path)
                if freed is not None:
                    self._counts.evicted_bytes += freed
                    self._counts.evicted_chunks += 1
        return removed

    def _unlink(self, path: str) -> int | None:
        """Delete one file the file mapper names; its size, or None when it was gone, is not the tier's, or
        could not be deleted (counted and logged)."""
        kind = self._classify(os.path.relpath(path, self.root))
        if kind is None or not inside(self.root, path):
            return None
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                return None
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._counts.delete_errors += 1
            self._log_once(("unlink", exc.errno), "disk tier %s: cannot delete %s: %s (counted, skipped; its "
                           "space stays counted until it can be)", self.root, path, exc.strerror)
            return None
        return info.st_size

    def _log_once(self, key: tuple, message: str, *args) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.error(message, *args)

    def _retry_stuck_locked(self) -> None:
        for path, size in list(self._stuck.items()):
            freed = self._unlink(path)
            if freed is not None or not os.path.lexists(path):
                self._files[path] = self._stuck.pop(path)  # back in, to leave with its directories
                self._drop_locked(path)
                if freed is not None:
                    self._counts.evicted_bytes += freed
                    self._counts.evicted_chunks += 1

    def _reclaim_stale(self) -> None:
        """Delete other namespaces' files in batches, then their emptied directories."""
        while self._stale and not self._stop.is_set():
            with self._lock:
                batch, self._stale = self._stale[:BATCH_FILES], self._stale[BATCH_FILES:]
                for path in batch:
                    freed = self._unlink(path)
                    if freed is not None:
                        self._counts.evicted_bytes += freed
                        self._counts.evicted_chunks += path.endswith(CHUNK_SUFFIX)
        if not self._stale and self._stale_dirs:
            for top in sorted(self._stale_dirs):
                for directory, _, _ in sorted(os.walk(top, followlinks=False), reverse=True):
                    self._rmdir(directory)
            self._stale_dirs.clear()

    def _check_volume(self) -> None:
        """statvfs: note a read-only volume; when free space is under the floor, delete the oldest chunks."""
        try:
            info = os.statvfs(self.root)
        except OSError as exc:
            self._log_once(("statvfs", exc.errno), "disk tier %s: cannot read the volume's state: %s", self.root,
                           exc.strerror)
            return
        read_only = bool(info.f_flag & os.ST_RDONLY)
        if read_only != self.read_only:
            self.read_only = read_only
            if read_only:
                logger.error("disk tier %s is on a read-only volume: stores are refused, stored chunks still "
                             "load", self.root)
            else:
                logger.warning("disk tier %s is writable again", self.root)
        size = info.f_blocks * info.f_frsize
        floor = min(FREE_FLOOR_BYTES, int(FREE_FLOOR_SHARE * size))
        self.free_bytes = info.f_bavail * info.f_frsize
        if self.free_bytes >= floor or read_only:
            if self.full and self.free_bytes >= floor:
                self.full = False
                logger.warning("disk tier %s: the volume has room again (%d bytes free)", self.root,
                               self.free_bytes)
            return
        if not self.full:
            self.full = True
            logger.error("disk tier %s: the volume is full (%d bytes free of %d, floor %d): deleting the oldest "
                         "chunks", self.root, self.free_bytes, size, floor)
        if self._reclaim_orphans():
            info = os.statvfs(self.root)
            self.free_bytes = info.f_bavail * info.f_frsize
        while self.free_bytes < 2 * floor and not self._stop.is_set():
            with self._lock:
                if not self._evict_locked(2 * floor - self.free_bytes, BATCH_FILES):
                    return  # nothing idle left to delete: the space is someone else's
            info = os.statvfs(self.root)
            self.free_bytes = info.f_bavail * info.f_frsize

    def _reclaim_orphans(self) -> int:
        """Empty the slots no running engine holds, each through an index of its own over that slot (every
        namespace in it counted, the same checks on each file deleted); the chunks deleted."""
        if self._orphans is None:
            return 0
        deleted = 0
        for slot in self._orphans():
            try:
                orphan = DiskTierIndex(slot.path, 1 << 62)
                orphan.scan()
                with orphan._lock:
                    orphan._evict_locked(orphan.used_bytes)
                counts = orphan.take_counts()
                with self._lock:
                    self._counts.evicted_bytes += counts.evicted_bytes
                    self._counts.evicted_chunks += counts.evicted_chunks
                    self._counts.delete_errors += counts.delete_errors
                if counts.evicted_chunks:
                    logger.warning("disk tier %s: the volume is full; deleted %d chunks (%d bytes) of %s, a slot no "
                                   "running engine holds", self.root, counts.evicted_chunks, counts.evicted_bytes,
                                   slot.path)
                deleted += counts.evicted_chunks
            finally:
                slot.release()
        return deleted

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - the loop goes on; what failed is counted and named once
                with self._lock:
                    self._counts.loop_errors += 1
                self._log_once(("loop", type(exc).__name__), "disk tier %s: evictor error %r (counted; it goes on)",
                               self.root, exc)
                time.sleep(POLL_S)

    def _step(self) -> None:
        self._reclaim_stale()
        self._check_volume()
        with self._lock:
            draining = self.used_bytes > HIGH_WATER * self.capacity_bytes
            if self._stuck and time.monotonic() - self._stuck_tried > STUCK_RETRY_S:
                self._stuck_tried = time.monotonic()
                self._retry_stuck_locked()
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
