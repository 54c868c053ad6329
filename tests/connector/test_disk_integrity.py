"""The disk tier's chunk checksum and namespace on real files (spillway_connector.chunk_integrity,
disk_namespace): every kind of damaged or misplaced chunk file is refused before a request could read it, the
pool slot it was read into is zeroed, the file removed, a listener told; a root that holds other files is
refused; replicas on one root each hold a slot; the weights fingerprint follows the weights."""
from __future__ import annotations

import mmap
import os
import random
import shutil
from pathlib import Path

import pytest
from spillway_connector import chunk_integrity as ci
from spillway_connector import disk_namespace as dn

BLOCK = 16384
NS = "model_0123456789ab"


def pool(chunks: int) -> memoryview:
    """Page-aligned memory like the CPU pool's (O_DIRECT wants aligned buffers)."""
    return memoryview(mmap.mmap(-1, chunks * BLOCK))


def path_of(root: Path, n: int) -> str:
    return str(root / f"{NS}_r0" / f"{n:03x}" / "00_g0" / f"{n:064x}.bin")


def fill(view: memoryview, chunk: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(BLOCK)
    view[chunk * BLOCK:(chunk + 1) * BLOCK] = data
    return data


def damage_flip_bit(path: str, _: str) -> None:
    with open(path, "r+b") as f:
        f.seek(BLOCK // 2)
        byte = f.read(1)[0]
        f.seek(BLOCK // 2)
        f.write(bytes([byte ^ 0x40]))


def damage_zeros(path: str, _: str) -> None:
    with open(path, "r+b") as f:
        f.write(bytes(BLOCK))


def damage_random(path: str, _: str) -> None:
    with open(path, "r+b") as f:
        f.write(os.urandom(BLOCK))


def damage_other_prompt(path: str, other: str) -> None:
    shutil.copyfile(other, path)


def damage_truncate(path: str, _: str) -> None:
    os.truncate(path, BLOCK)  # vLLM's own length: a file written without a trailer


@pytest.mark.parametrize("use_o_direct", [True, False])
@pytest.mark.parametrize("damage", [damage_flip_bit, damage_zeros, damage_random, damage_other_prompt,
                                    damage_truncate])
def test_a_damaged_or_misplaced_chunk_is_a_miss_removed_and_never_left_in_the_pool(tmp_path, damage, use_o_direct):
    if use_o_direct and not _o_direct_works(tmp_path):
        pytest.skip("O_DIRECT is not supported here")
    source = pool(3)
    paths = [path_of(tmp_path, n) for n in range(3)]
    originals = [fill(source, n, n) for n in range(3)]
    ci.store_chunks(paths, source, [0, BLOCK, 2 * BLOCK], BLOCK, use_o_direct)
    assert all(os.path.getsize(p) == ci.file_bytes(BLOCK) for p in paths)

    target = pool(3)
    ci.load_chunks(paths, target, [0, BLOCK, 2 * BLOCK], BLOCK, use_o_direct)
    assert [bytes(target[n * BLOCK:(n + 1) * BLOCK]) for n in range(3)] == originals, "good chunks load as stored"

    seen = []

    def on_mismatch(path: str, why: str) -> None:
        seen.append((path, why))

    ci.add_listener(str(tmp_path), on_mismatch)
    try:
        damage(paths[1], paths[2])
        target = pool(3)
        for n in range(3):
            target[n * BLOCK:(n + 1) * BLOCK] = b"\xff" * BLOCK
        with pytest.raises(ci.ChunkMismatch) as failed:
            ci.load_chunks(paths, target, [0, BLOCK, 2 * BLOCK], BLOCK, use_o_direct)
        assert failed.value.num_succeeded == 1, "vLLM keeps the chunks before the bad one, recomputes the rest"
        assert bytes(target[:BLOCK]) == originals[0]
        assert bytes(target[BLOCK:2 * BLOCK]) == bytes(BLOCK), "the slot that held bad bytes is zeroed"
        assert not os.path.exists(paths[1]) and os.path.exists(paths[2])
        assert [path for path, _ in seen] == [paths[1]]
    finally:
        ci.remove_listener(on_mismatch)


def test_a_missing_file_fails_as_vllm_s_own_load_does(tmp_path):
    with pytest.raises(FileNotFoundError) as failed:
        ci.load_chunks([path_of(tmp_path, 0)], pool(1), [0], BLOCK, False)
    assert failed.value.num_succeeded == 0


def test_a_rename_refused_because_another_writer_published_the_chunk_is_a_store_done(tmp_path, monkeypatch):
    """Some shared file systems refuse to rename over a file (EEXIST), as vLLM 0.33's own _store_block allows for:
    the chunk's name is its hash, so the published file holds the same chunk; the temporary file goes."""
    source, path = pool(1), path_of(tmp_path, 7)
    original = fill(source, 0, 7)
    ci.store_chunks([path], source, [0], BLOCK, False)
    published = Path(path).read_bytes()
    os.remove(path)
    replace = os.replace

    def racing_replace(src: str, dst: str) -> None:
        replace(src, dst)  # the other writer's file lands first ...
        Path(src).write_bytes(b"ours")
        raise FileExistsError(17, "File exists", dst)  # ... and ours is refused

    monkeypatch.setattr(os, "replace", racing_replace)
    ci.store_chunks([path], source, [0], BLOCK, False)
    monkeypatch.undo()
    assert Path(path).read_bytes() == published
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name], "no temporary file left behind"
    target = pool(1)
    ci.load_chunks([path], target, [0], BLOCK, False)
    assert bytes(target[:BLOCK]) == original


def _o_direct_works(directory: Path) -> bool:
    try:
        from vllm.v1.kv_offload.tiering.fs.io import probe_o_direct
    except ImportError:
        return False
    return probe_o_direct(str(directory))


# -- the root, its slots, the namespace ------------------------------------------------------------------------
def test_a_root_holding_other_files_is_refused(tmp_path):
    root = tmp_path / "tier"
    root.mkdir()
    (root / "lost+found").mkdir()
    (root / "replica-0").mkdir()
    stub = root / "model_0123456789ab"
    stub.mkdir()
    (stub / "config.json").write_text("{}")  # vLLM's tier writes this before the connector moves it ...
    (stub / ".o_direct_probe_123.tmp").write_bytes(b"")  # ... and probes O_DIRECT beside it
    dn.check_root(str(root))
    for name, make in (("pytorch_model.bin", lambda p: p.write_bytes(b"w")),
                       ("model_0123456789ab_r0", lambda p: p.mkdir()),
                       ("elsewhere", lambda p: p.symlink_to(tmp_path))):
        make(root / name)
        with pytest.raises(dn.TierRootError, match=name.replace("+", r"\+")):
            dn.check_root(str(root))
        (root / name).unlink() if (root / name).is_symlink() or (root / name).is_file() else (root / name).rmdir()


def test_replicas_on_one_root_each_hold_their_own_slot(tmp_path):
    first, second = dn.claim_slot(str(tmp_path)), dn.claim_slot(str(tmp_path))
    assert first.path != second.path and {os.path.basename(first.path), os.path.basename(second.path)} == {
        "replica-0", "replica-1"}
    first.release()
    again = dn.claim_slot(str(tmp_path))
    assert again.path == first.path, "a restarted engine takes the slot its predecessor freed"
    again.release()
    second.release()


def test_the_weights_fingerprint_follows_the_weights(tmp_path):
    pytest.importorskip("safetensors")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.kv_weights import KvSensitiveLlama, write_kv_sensitive_model

    a = dn.weights_fingerprint(str(write_kv_sensitive_model(tmp_path / "a", KvSensitiveLlama(seed=0))))
    again = dn.weights_fingerprint(str(write_kv_sensitive_model(tmp_path / "b", KvSensitiveLlama(seed=0))))
    other = dn.weights_fingerprint(str(write_kv_sensitive_model(tmp_path / "a", KvSensitiveLlama(seed=1))))
    assert a == again and a != other, "same weights, same namespace; a new revision at the same path, another"
    assert dn.weights_fingerprint(str(tmp_path / "missing")) is None
    sampled = tmp_path / "big"
    sampled.mkdir()
    with open(sampled / "model.safetensors", "wb") as f:
        f.truncate(dn.FULL_HASH_BYTES + 1)  # sparse: sampled, not read whole
    first = dn.weights_fingerprint(str(sampled))
    with open(sampled / "model.safetensors", "r+b") as f:
        f.seek(dn.FULL_HASH_BYTES // 2)
        f.write(b"x")
    assert dn.weights_fingerprint(str(sampled)) != first, "a changed tensor in a sampled file is seen"
