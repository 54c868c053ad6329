"""DiskTierIndex on a real directory: the bound, least-recently-used order, busy files, a restart's scan, and
nothing outside the tier's root ever deleted (links, `..`, other files)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from spillway_connector.disk_evictor import DiskTierIndex, inside

CHUNK = 4096


def chunk_path(root: Path, n: int) -> str:
    return str(root / "model_abc_r0" / f"{n:03x}" / "00_g0" / f"{n:064x}.bin")


def write(path: str, size: int = CHUNK) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"k" * size)


def store(index: DiskTierIndex, path: str) -> bool:
    """What the tier does: reserve, write what was admitted, release."""
    (admitted,) = index.reserve([path], CHUNK)
    if admitted and not os.path.exists(path):
        write(path)
    index.release([path], stored=admitted)
    return admitted


def on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.bin") if p.is_file() and not p.is_symlink())


def test_the_bound_holds_and_the_least_recently_used_go_first(tmp_path: Path):
    index = DiskTierIndex(str(tmp_path), 10 * CHUNK)
    paths = [chunk_path(tmp_path, n) for n in range(30)]
    for n, path in enumerate(paths[:10]):
        assert store(index, path)
    index.pin([paths[0]])  # a load of the oldest: it becomes the youngest
    index.release([paths[0]])
    for path in paths[10:30]:
        assert store(index, path)
        assert on_disk(tmp_path) <= 10 * CHUNK and index.used_bytes <= 10 * CHUNK
    kept = {p for p in paths if os.path.exists(p)}
    assert kept == set(paths[20:30])
    counts = index.take_counts()
    assert (counts.evicted_chunks, counts.evicted_bytes, counts.refused_chunks) == (20, 20 * CHUNK, 0)
    assert index.take_counts().evicted_chunks == 0  # taken once


def test_a_touch_keeps_a_hot_chunk_and_a_busy_one_is_never_deleted(tmp_path: Path):
    index = DiskTierIndex(str(tmp_path), 4 * CHUNK)
    paths = [chunk_path(tmp_path, n) for n in range(12)]
    for path in paths[:4]:
        store(index, path)
    index.pin([paths[1]])  # being read: stays however old
    for path in paths[4:12]:
        index.touch([paths[0]])  # a CPU-pool hit of the first chunk, every time
        store(index, path)
    assert os.path.exists(paths[0]) and os.path.exists(paths[1])
    index.release([paths[1]])
    # everything busy: a new store is refused rather than let the tier grow
    busy = DiskTierIndex(str(tmp_path / "b"), 2 * CHUNK)
    a, b, c = (chunk_path(tmp_path / "b", n) for n in range(3))
    assert busy.reserve([a, b], CHUNK) == [True, True]
    assert busy.reserve([c], CHUNK) == [False]
    assert busy.take_counts().refused_chunks == 1 and busy.used_bytes == 2 * CHUNK


def test_a_failed_store_gives_its_room_back(tmp_path: Path):
    index = DiskTierIndex(str(tmp_path), 2 * CHUNK)
    path = chunk_path(tmp_path, 1)
    assert index.reserve([path], CHUNK) == [True]
    index.release([path], stored=False)  # never written
    assert index.used_bytes == 0 and len(index) == 0


def test_the_scan_indexes_what_a_restarted_engine_finds_oldest_first_and_skips_links(tmp_path: Path):
    root, outside = tmp_path / "tier", tmp_path / "outside"
    old, new = chunk_path(root, 1), chunk_path(root, 2)
    write(old)
    write(new)
    os.utime(old, (1000, 1000))
    write(str(outside / "victim.bin"))
    (root / "escape.bin").symlink_to(outside / "victim.bin")
    (root / "escape-dir").symlink_to(outside, target_is_directory=True)
    (root / "notes.txt").write_text("x")
    index = DiskTierIndex(str(root), CHUNK)  # room for one: the scan deletes the older
    assert index.scan() == 2
    assert not os.path.exists(old) and os.path.exists(new)
    assert index.used_bytes == CHUNK
    assert (outside / "victim.bin").exists() and (root / "escape.bin").is_symlink() and (root / "notes.txt").exists()


def test_nothing_outside_the_root_is_reserved_or_deleted(tmp_path: Path):
    root, outside = tmp_path / "tier", tmp_path / "outside"
    root.mkdir()
    write(str(outside / "victim.bin"))
    (root / "door").symlink_to(outside, target_is_directory=True)
    index = DiskTierIndex(str(root), 4 * CHUNK)
    escapes = [str(root / ".." / "outside" / "victim.bin"), str(root / "door" / "victim.bin"),
               str(outside / "victim.bin")]
    assert index.reserve(escapes, CHUNK) == [False, False, False]
    assert index.take_counts().refused_chunks == 3
    assert not inside(index.root, escapes[1]) and inside(index.root, chunk_path(root, 1))
    # a chunk file replaced by a link after it was indexed: the link is left, its target untouched
    path = chunk_path(root, 1)
    store(index, path)
    os.unlink(path)
    os.symlink(outside / "victim.bin", path)
    for n in range(2, 8):
        store(index, chunk_path(root, n))
    assert os.path.islink(path) and (outside / "victim.bin").exists()


def test_the_background_thread_keeps_room_free(tmp_path: Path):
    index = DiskTierIndex(str(tmp_path), 20 * CHUNK).start()
    try:
        for n in range(20):
            store(index, chunk_path(tmp_path, n))
        index._wake.set()
        for _ in range(100):
            if index.used_bytes <= 18 * CHUNK:
                break
            time.sleep(0.05)
        assert index.used_bytes == 18 * CHUNK == on_disk(tmp_path)  # drained to LOW_WATER (90%)
    finally:
        index.stop()


def test_a_bound_of_nothing_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="positive"):
        DiskTierIndex(str(tmp_path), 0)
