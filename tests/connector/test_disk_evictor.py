"""DiskTierIndex on a real directory: the bound (files in whole blocks and the directories they need),
least-recently-used order, busy files, a restart's scan, other namespaces reclaimed, faults (a file that cannot be
deleted, a dying thread), and nothing ever deleted that vLLM's file mapper did not name inside the slot (links,
`..`, other files, another replica's chunks)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from spillway_connector import disk_evictor
from spillway_connector.disk_evictor import DiskTierIndex, inside

CHUNK = 4096
NS = "model_0123456789ab"  # <model>_<12 hex>: vLLM's namespace directory name
OLD_NS = "model_ba9876543210"


def chunk_path(root: Path, n: int, ns: str = NS) -> str:
    return str(root / f"{ns}_r0" / f"{n:03x}" / "00_g0" / f"{n:064x}.bin")


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


def du(root: Path) -> int:
    """What the volume spends below `root`: allocated blocks of files and directories (du's count)."""
    used = 0
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            used += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return used


def per_chunk(index: DiskTierIndex) -> int:
    return CHUNK + 2 * index.block  # the file and its two directories (each chunk hash its own here)


def index_for(root: Path, chunks: int, **kwargs) -> DiskTierIndex:
    root.mkdir(parents=True, exist_ok=True)
    probe = DiskTierIndex(str(root), 1)
    return DiskTierIndex(str(root), chunks * per_chunk(probe), namespace=NS, **kwargs)


def test_the_bound_counts_files_and_directories_and_the_least_recently_used_go_first(tmp_path: Path):
    root = tmp_path / "slot"
    index = index_for(root, 10)
    bound = index.capacity_bytes
    paths = [chunk_path(root, n) for n in range(30)]
    for path in paths[:10]:
        assert store(index, path)
    index.pin([paths[0]])  # a load of the oldest: it becomes the youngest
    index.release([paths[0]])
    for path in paths[10:30]:
        assert store(index, path)
        assert index.used_bytes <= bound and du(root) - du_base(root) <= bound
    kept = {p for p in paths if os.path.exists(p)}
    assert kept == set(paths[20:30])
    assert index.used_bytes == du(root) - du_base(root), "the index counts what du sees"
    counts = index.take_counts()
    assert (counts.evicted_chunks, counts.evicted_bytes, counts.refused_chunks) == (20, 20 * CHUNK, 0)
    assert index.take_counts().evicted_chunks == 0  # taken once
    gone = Path(paths[0]).parent
    assert not gone.exists() and not gone.parent.exists(), "a chunk's directories go with its last file"


def du_base(root: Path) -> int:
    """The namespace's fixed directories (<ns>_r0), which the bound leaves aside."""
    return sum(os.lstat(p).st_blocks * 512 for p in root.glob("*_r0"))


def test_a_touch_keeps_a_hot_chunk_and_a_busy_one_is_never_deleted(tmp_path: Path):
    root = tmp_path / "slot"
    index = index_for(root, 4)
    paths = [chunk_path(root, n) for n in range(12)]
    for path in paths[:4]:
        store(index, path)
    index.pin([paths[1]])  # being read: stays however old
    for path in paths[4:12]:
        index.touch([paths[0]])  # a CPU-pool hit of the first chunk, every time
        store(index, path)
    assert os.path.exists(paths[0]) and os.path.exists(paths[1])
    index.release([paths[1]])
    busy = index_for(tmp_path / "b", 2)  # everything busy: a new store is refused rather than let the tier grow
    a, b, c = (chunk_path(tmp_path / "b", n) for n in range(3))
    assert busy.reserve([a, b], CHUNK) == [True, True]
    assert busy.reserve([c], CHUNK) == [False]
    assert busy.take_counts().refused_chunks == 1 and busy.used_bytes == busy.capacity_bytes


def test_a_failed_store_gives_its_room_back(tmp_path: Path):
    index = index_for(tmp_path / "slot", 2)
    path = chunk_path(tmp_path / "slot", 1)
    assert index.reserve([path], CHUNK) == [True]
    index.release([path], stored=False)  # never written
    assert index.used_bytes == 0 and len(index) == 0


def test_the_scan_takes_its_namespace_reclaims_others_and_leaves_foreign_files(tmp_path: Path):
    root, outside = tmp_path / "slot", tmp_path / "outside"
    old, new = chunk_path(root, 1), chunk_path(root, 2)
    write(old)
    write(new)
    os.utime(old, (1000, 1000))
    leftover = new + "_123.tmp"  # a store cut by the previous engine's end
    write(leftover)
    stale = [chunk_path(root, n, OLD_NS) for n in range(3)]  # another revision's chunks in this slot
    for path in stale:
        write(path)
    (root / OLD_NS).mkdir()
    (root / OLD_NS / "config.json").write_text("{}")
    write(str(outside / "victim.bin"))
    (root / "escape.bin").symlink_to(outside / "victim.bin")
    (root / "escape-dir").symlink_to(outside, target_is_directory=True)
    (root / "notes.txt").write_text("x")
    (root / "pytorch_model.bin").write_bytes(b"w" * CHUNK)  # a model cache's file: not the mapper's name
    foreign_chunk = root / f"{NS}_r0" / "fff" / "ff_g0" / "not-a-hash.bin"
    write(str(foreign_chunk))
    index = DiskTierIndex(str(root), CHUNK + 2 * DiskTierIndex(str(root), 1).block, namespace=NS)
    assert index.scan() == 2  # room for one: the scan deletes the older
    assert not os.path.exists(old) and os.path.exists(new) and not os.path.exists(leftover)
    index.start()
    try:
        for _ in range(100):
            if not (root / f"{OLD_NS}_r0").exists() and not (root / OLD_NS).exists():
                break
            time.sleep(0.05)
        assert not (root / f"{OLD_NS}_r0").exists() and not (root / OLD_NS).exists(), "stale namespace reclaimed"
    finally:
        index.stop()
    for kept in (outside / "victim.bin", root / "notes.txt", root / "pytorch_model.bin", foreign_chunk):
        assert kept.exists(), kept
    assert (root / "escape.bin").is_symlink()


def test_nothing_outside_the_slot_is_reserved_or_deleted(tmp_path: Path):
    root, outside = tmp_path / "slot", tmp_path / "outside"
    root.mkdir()
    write(str(outside / "victim.bin"))
    (root / "door").symlink_to(outside, target_is_directory=True)
    index = index_for(root, 4)
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
    root = tmp_path / "slot"
    index = index_for(root, 20).start()
    try:
        for n in range(20):
            store(index, chunk_path(root, n))
        index._wake.set()
        for _ in range(100):
            if len(index) <= 18:
                break
            time.sleep(0.05)
        assert len(index) == 18 and index.used_bytes == du(root) - du_base(root)  # drained to LOW_WATER (90%)
    finally:
        index.stop()


def immutable(path: str, on: bool) -> bool:
    """chattr +i / -i (root on ext4): a file even root cannot delete. False when the file system refuses."""
    result = subprocess.run(["chattr", "+i" if on else "-i", path], check=False, capture_output=True)
    return result.returncode == 0


def test_a_file_that_cannot_be_deleted_is_counted_and_skipped(tmp_path: Path):
    root = tmp_path / "slot"
    index = index_for(root, 3)
    paths = [chunk_path(root, n) for n in range(6)]
    store(index, paths[0])
    if os.geteuid() != 0 or not immutable(paths[0], True):
        pytest.skip("needs root and chattr to make an undeletable file")
    try:
        for path in paths[1:]:
            assert store(index, path), "stores go on past the file that cannot be deleted"
        counts = index.take_counts()
        assert counts.delete_errors >= 1
        assert os.path.exists(paths[0])
        assert index.used_bytes <= index.capacity_bytes
        assert index.used_bytes == du(root) - du_base(root), "its bytes still count"
        immutable(paths[0], False)
        index._stuck_tried = 0.0
        disk_evictor.STUCK_RETRY_S, saved = 0.0, disk_evictor.STUCK_RETRY_S
        try:
            index._step()
        finally:
            disk_evictor.STUCK_RETRY_S = saved
        assert not os.path.exists(paths[0]), "retried once it can be deleted"
    finally:
        immutable(paths[0], False)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread killed on purpose
def test_a_dead_evictor_thread_is_restarted_and_loop_errors_are_counted(tmp_path: Path, monkeypatch):
    index = index_for(tmp_path / "slot", 4).start()
    try:
        calls = []

        def failing_step():
            calls.append(1)
            raise OSError("injected")

        monkeypatch.setattr(index, "_step", failing_step)
        index._wake.set()
        for _ in range(100):
            if calls:
                break
            time.sleep(0.02)
        assert index.alive(), "an error in the loop does not end the thread"
        index.stop()
        assert not index.ensure_running(), "a stopped evictor stays stopped"

        def dying_step():
            raise SystemExit  # not an Exception: ends the thread
        index._stop.clear()
        monkeypatch.setattr(index, "_step", dying_step)
        index.start()
        index._thread.join(timeout=5)
        assert not index.alive()
        monkeypatch.setattr(index, "_step", lambda: None)
        assert index.ensure_running() and index.alive()
        assert index.take_counts().loop_errors >= 1
    finally:
        index.stop()


def test_a_bound_of_nothing_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="positive"):
        DiskTierIndex(str(tmp_path), 0)


def test_replicas_on_one_root_never_delete_each_other_s_chunks(tmp_path: Path):
    from spillway_connector.disk_namespace import claim_slot

    first, second = claim_slot(str(tmp_path)), claim_slot(str(tmp_path))
    try:
        a, b = (DiskTierIndex(slot.path, 4 * per_chunk(DiskTierIndex(slot.path, 1)), namespace=NS)
                for slot in (first, second))
        theirs = [chunk_path(Path(second.path), n) for n in range(4)]
        for path in theirs:
            store(b, path)
        ours = [chunk_path(Path(first.path), n) for n in range(40)]  # 10x the bound, same names as theirs
        for path in ours:
            store(a, path)
        assert a.scan() == 4 and a.take_counts().evicted_chunks == 36
        assert all(os.path.exists(p) for p in theirs), "the other replica's chunks are not ours to delete"
    finally:
        first.release()
        second.release()


def test_a_full_volume_empties_slots_no_engine_holds_before_its_own_chunks(tmp_path: Path, monkeypatch):
    """A replica scaled away leaves its slot's chunks outside every running replica's bound: under a full volume
    they go first; a slot another running engine holds, and this engine's own chunks, stay."""
    from spillway_connector.disk_namespace import claim_slot, orphaned_slots

    ours, held, gone = (claim_slot(str(tmp_path)) for _ in range(3))
    try:
        index = DiskTierIndex(ours.path, 8 * per_chunk(DiskTierIndex(ours.path, 1)), namespace=NS,
                              orphans=lambda: orphaned_slots(str(tmp_path), ours.path))
        mine = [chunk_path(Path(ours.path), n) for n in range(4)]
        theirs = [chunk_path(Path(held.path), n) for n in range(4)]
        left = [chunk_path(Path(gone.path), n, ns=OLD_NS) for n in range(6)]
        for path in mine:
            store(index, path)
        for path in theirs + left:
            write(path)
        gone.release()  # its engine stopped: nobody holds the slot now
        real = os.statvfs

        class Full:  # what statvfs says of a volume with next to nothing free, until the orphan is emptied
            def __init__(self, path):
                info = real(path)
                self.f_flag, self.f_blocks, self.f_frsize, self.f_bsize = 0, info.f_blocks, info.f_frsize, info.f_bsize
                self.f_bavail = info.f_blocks if not any(os.path.exists(p) for p in left) else 0

        monkeypatch.setattr(disk_evictor.os, "statvfs", Full)
        index._check_volume()
        assert not any(os.path.exists(p) for p in left), "the unheld slot's chunks are deleted"
        assert all(os.path.exists(p) for p in theirs), "a slot a running engine holds is never touched"
        assert all(os.path.exists(p) for p in mine), "the orphan freed enough: none of our chunks went"
        assert index.take_counts().evicted_chunks == len(left)
        assert os.path.exists(os.path.join(gone.path, ".owner.lock")), "the slot stays, free for the next engine"
        again = claim_slot(str(tmp_path))  # the emptied slot is free again: a new replica takes it
        assert again.path == gone.path
        again.release()
    finally:
        for slot in (ours, held):
            slot.release()


def test_a_volume_without_file_locks_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    """Some network file systems keep no flock: without it two replicas could share a slot and delete each
    other's chunks, so the tier is refused with a line that says what to do."""
    import errno

    from spillway_connector import disk_namespace

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(disk_namespace.fcntl, "flock", no_locks)
    with pytest.raises(disk_namespace.TierRootError, match="cannot lock files .*directory of its own"):
        disk_namespace.claim_slot(str(tmp_path))
