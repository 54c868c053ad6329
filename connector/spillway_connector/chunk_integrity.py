"""A checksum written with every chunk file of vLLM's node-disk ("fs") tier, verified before a load counts.

vLLM's fs tier checks only a file's length on load (vllm/v1/kv_offload/tiering/fs/io.py _load_block), so a file
with flipped bits, zeros, random bytes, or another prompt's file under this prompt's name is served as a hit and
its KV reaches the GPU. Here each file is the chunk's bytes followed by one trailer page:

    [chunk bytes (the pool's row, block_size)] [TRAILER_BYTES: MAGIC, chunk length, BLAKE3 digest, zeros]

The digest covers the file's name inside the tier (<namespace>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin) and the chunk's
bytes, so a file moved or copied under another chunk's name fails as surely as a damaged one. The trailer is a
whole page so that O_DIRECT reads and writes stay aligned; both go in one writev/readv with the chunk.

A load reads the chunk straight into the CPU-pool slot vLLM allocated for it (no extra copy) together with the
trailer, then verifies. On a mismatch the slot is zeroed, the file removed, the mismatch reported (a counter and
one log line, through the listener the disk tier registers), and the load fails from that chunk on with
vLLM's own partial-failure path (OSError.num_succeeded): vLLM frees the slot as never written
(TieringOffloadingManager._complete_promotion -> complete_write(..., False)), marks the chunk a miss and the
request recomputes it. The slot was not yet readable (the promotion had not completed), so no request saw it.

BLAKE3 is vLLM's own dependency (its multimodal hasher). Its cost per GiB is measured by
bench/disk-tier/checksum_cost.py.
"""
from __future__ import annotations

import contextlib
import logging
import mmap
import os
import random
import struct
import threading
from collections.abc import Callable

import blake3

logger = logging.getLogger(__name__)

TRAILER_BYTES = 4096  # one page: O_DIRECT needs every buffer and length aligned to the device's block
MAGIC = b"SPWKV001"
DIGEST_BYTES = 16
_HEADER = struct.Struct("<8sQ16s")  # magic, chunk length, digest
O_DIRECT = getattr(os, "O_DIRECT", 0)
NAME_PARTS = 4  # <namespace>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin: what names a chunk inside the tier

_local = threading.local()
_listeners: list[tuple[str, Callable[[str, str], None]]] = []  # (directory prefix, on_mismatch(path, why))
_listeners_lock = threading.Lock()


class ChunkMismatch(OSError):
    """A chunk file whose trailer does not vouch for its bytes under its name."""


def chunk_name(path: str) -> bytes:
    """What the digest binds a chunk to: the last NAME_PARTS components of its path."""
    return "/".join(path.split(os.sep)[-NAME_PARTS:]).encode()


def digest(name: bytes, data: memoryview | bytes) -> bytes:
    hasher = blake3.blake3(struct.pack("<I", len(name)) + name)
    hasher.update(data)
    return hasher.digest(DIGEST_BYTES)


def file_bytes(block_size: int) -> int:
    """The size of one chunk's file."""
    return block_size + TRAILER_BYTES


def _trailer_page() -> mmap.mmap:
    """This thread's page-aligned trailer buffer (mmap memory is page aligned, as O_DIRECT wants)."""
    page = getattr(_local, "page", None)
    if page is None:
        page = _local.page = mmap.mmap(-1, TRAILER_BYTES)
        _local.suffix = f"_{random.randint(0, 2**63 - 1)}.tmp"
    return page


def _tmp_suffix() -> str:
    _trailer_page()
    return _local.suffix


def add_listener(prefix: str, on_mismatch: Callable[[str, str], None]) -> None:
    """Call `on_mismatch(path, reason)` for every mismatched file under `prefix` (a directory)."""
    with _listeners_lock:
        _listeners.append((prefix.rstrip(os.sep) + os.sep, on_mismatch))


def remove_listener(on_mismatch: Callable[[str, str], None]) -> None:
    with _listeners_lock:
        _listeners[:] = [item for item in _listeners if item[1] is not on_mismatch]


def _report(path: str, reason: str) -> None:
    with _listeners_lock:
        listeners = [callback for prefix, callback in _listeners if path.startswith(prefix)]
    logger.error("KV chunk file %s failed its check (%s): removed, served as a miss (recomputed)", path, reason)
    for callback in listeners:
        callback(path, reason)


def _check_offsets(view: memoryview, offsets: list[int], block_size: int) -> None:
    total = len(view)
    for offset in offsets:
        if offset < 0 or offset + block_size > total:
            raise ValueError(f"block offset {offset} (block_size {block_size}) is out of bounds for a buffer of "
                             f"size {total}")


def store_chunks(paths: list[str], view: memoryview, offsets: list[int], block_size: int,
                 use_o_direct: bool = True) -> None:
    """vLLM's batch_store_block with a trailer: each chunk written to a temporary file, then renamed into place."""
    flat = view.cast("B")
    _check_offsets(flat, offsets, block_size)
    page = _trailer_page()
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC | (O_DIRECT if use_o_direct else 0)
    for path, offset in zip(paths, offsets):
        if os.path.exists(path):  # same name, same bytes: written already (by us or another replica)
            continue
        data = flat[offset:offset + block_size]
        page.seek(0)
        page.write(_HEADER.pack(MAGIC, block_size, digest(chunk_name(path), data)))  # the rest stays zero
        tmp = path + _tmp_suffix()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(tmp, flags, 0o644)
            try:
                written = os.writev(fd, [data, page])
            finally:
                os.close(fd)
            if written != block_size + TRAILER_BYTES:
                raise OSError(f"short write of {path}: {written} of {block_size + TRAILER_BYTES} bytes")
            try:
                os.replace(tmp, path)
            except FileExistsError:  # as vLLM 0.33's _store_block: a shared file system that will not rename
                os.remove(tmp)       # over a file another writer published; the name is the chunk's hash
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


def _verify(path: str, size: int, read: int, data: memoryview, page: mmap.mmap, block_size: int) -> str | None:
    """Why the chunk just read is not to be trusted, or None."""
    if size != block_size + TRAILER_BYTES or read != size:
        return f"{size} bytes on disk, {read} read, {block_size + TRAILER_BYTES} expected"
    magic, length, want = _HEADER.unpack_from(page, 0)
    if magic != MAGIC or length != block_size:
        return "no Spillway trailer"
    if digest(chunk_name(path), data) != want:
        return "checksum mismatch"
    return None


def load_chunks(paths: list[str], view: memoryview, offsets: list[int], block_size: int,
                use_o_direct: bool = True) -> None:
    """vLLM's batch_load_block, verified: raises OSError with num_succeeded (the chunks loaded and verified before
    the first bad one) like vLLM's own, so its tier keeps those and recomputes the rest."""
    flat = view.cast("B")
    _check_offsets(flat, offsets, block_size)
    page = _trailer_page()
    flags = os.O_RDONLY | (O_DIRECT if use_o_direct else 0)
    for index, (path, offset) in enumerate(zip(paths, offsets)):
        data = flat[offset:offset + block_size]
        try:
            fd = os.open(path, flags)
            try:
                size = os.fstat(fd).st_size
                read = os.readv(fd, [data, page]) if size == block_size + TRAILER_BYTES else 0
            finally:
                os.close(fd)
        except OSError as exc:
            exc.num_succeeded = index  # type: ignore[attr-defined]
            raise
        reason = _verify(path, size, read, data, page, block_size)
        if reason is None:
            continue
        data[:] = bytes(block_size)  # the slot never keeps bytes that failed
        with contextlib.suppress(OSError):
            os.remove(path)
        _report(path, reason)
        error = ChunkMismatch(f"KV chunk file {path}: {reason}")
        error.num_succeeded = index  # type: ignore[attr-defined]
        raise error
