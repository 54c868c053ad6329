"""The bounded, checksummed disk tier is built by vLLM itself, behind Spillway's tiering spec (PATCHES.md entry 9).

SpillwayTieringOffloadingSpec.get_manager() names disk_tier.SpillwayFsTier for the planner's "fs" entry the way
vLLM takes an out-of-tree tier, and vLLM's own TieringOffloadingSpec.get_manager builds it: nothing is replaced
on a live object afterwards. These tests run vLLM's real spec, tiering manager, fs tier and I/O thread pool (no
engine), on the installed vLLM and, through test_vllm_sources.py, on the 0.33 and 0.34 trees: the tier keeps vLLM's
label, writes and verifies the trailer through vLLM's own job bookkeeping (its events, 0.34's lookup cache),
drops a store the bound cannot hold before vLLM writes it, and where vLLM's tier code reads otherwise than in
the releases verified it stays bounded but writes vLLM's own files, in a namespace of their own.
"""
from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
from support import require_vllm

require_vllm(allow_module_level=True)

from spillway_connector import compat, disk_tier, source_guard

if compat.TieringOffloadingSpec is None or compat.VLLM_MINOR < (0, 32):
    pytest.skip("vLLM 0.26's fs tier takes other jobs; the connector bounds 0.32's and later",
                allow_module_level=True)

from spillway_connector import chunk_integrity, names
from spillway_connector.spec import SpillwayTieringOffloadingSpec
from vllm.v1.kv_offload import config as oc
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

BLOCK = 16384  # KV bytes of one block, one block per chunk: the pool's row
POOL_CHUNKS = 8


def offloading_config(root: Path, bound: int | None, events: bool = False) -> oc.OffloadingConfig:
    extra = {"cpu_bytes_to_use": POOL_CHUNKS * BLOCK, "eviction_policy": "lru",
             "secondary_tiers": [{"type": "fs", "root_dir": str(root), "n_read_threads": 1, "n_write_threads": 1,
                                  "enable_kv_events": events}]}
    if bound is not None:
        extra["spillway_disk_tier_bytes"] = bound
    return oc.OffloadingConfig(
        groups=(oc.OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=BLOCK, enable_kv_cache_events=events, extra_config=extra,
        engine_id=f"spillway-fs-tier-test-{os.getpid()}-{random.randrange(1 << 30)}",
        model=oc.OffloadingModelConfig(name="org/model", dtype="bfloat16"),
        cache=oc.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=oc.OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                             data_parallel_index=0, data_parallel_size=1,
                                             data_parallel_rank_local=None, is_parallelism_agnostic=True))


@pytest.fixture
def build(tmp_path):
    """build(bound, events) -> (the spec's manager: the pool probe, its fs tier); shut down afterwards."""
    built = []

    def make(bound: int | None = 1 << 20, events: bool = False):
        root = tmp_path / "tier"
        root.mkdir(exist_ok=True)
        probe = SpillwayTieringOffloadingSpec(offloading_config(root, bound, events)).get_manager()
        built.append(probe.inner)
        return probe, probe.inner.secondary_tiers[0]

    yield make
    for manager in built:
        manager.shutdown()


def key(n: int) -> bytes:
    return make_offload_key(n.to_bytes(32, "big"), 0)


def fill(tier, chunk: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(tier._block_size)
    view = tier._primary_kv_view.cast("B")
    view[chunk * tier._block_size:(chunk + 1) * tier._block_size] = data
    return data


def row(tier, chunk: int) -> bytes:
    return bytes(tier._primary_kv_view.cast("B")[chunk * tier._block_size:(chunk + 1) * tier._block_size])


def job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> TransferJob:
    return TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(chunks, dtype=np.int64),
                       is_promotion=promotion, req_context=ReqContext(req_id=f"req-{job_id}"))


def finished(tier, job_id: int, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for result in tier.get_finished_jobs():
            if result.job_id == job_id:
                return result
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} did not finish within {timeout_s} s")


def stats_data(stats) -> dict:
    return {} if stats is None else compat.stats_sections(stats.data)[1]


def test_vllm_builds_spillways_tier_for_the_planned_fs_entry_and_no_other(build):
    probe, tier = build()
    assert type(tier) is disk_tier.SpillwayFsTier and tier.tier_type == "fs"
    assert disk_tier.guarded_tiers(probe.inner, {"spillway_disk_tier_bytes": 1}) == [("1:fs", tier)]
    assert tier.checksums, "this vLLM's fs tier reads as verified (disk_tier.FS_TIER_CODE)"
    assert probe.prepare_load.__qualname__.startswith("SpillwayFsTier.touching"), "a pool hit touches the files"
    slot = Path(tier.spillway_slot.path)
    assert slot.name == "replica-0" and tier.file_mapper.base_path.startswith(str(slot) + os.sep)
    spillway = json.loads(Path(tier.file_mapper.get_config_file_path()).read_text())["spillway"]
    assert spillway["format"] == chunk_integrity.MAGIC.decode()


def test_without_a_bound_the_tier_is_vllms_own(build):
    probe, tier = build(bound=None)
    assert type(tier) is FileSystemTierManager
    assert disk_tier.guarded_tiers(probe.inner, {}) == []
    with pytest.raises(ValueError, match="bounds one 'fs' secondary tier"):
        disk_tier.guarded_tiers(probe.inner, {"spillway_disk_tier_bytes": 1 << 20})


def test_a_bound_without_an_fs_tier_is_refused():
    with pytest.raises(ValueError, match="has 0"):
        disk_tier.guarded_tier_configs([{"type": "obj"}], {"spillway_disk_tier_bytes": 1 << 20})
    with pytest.raises(ValueError, match="rate in GB/s"):
        disk_tier.guarded_tier_configs([{"type": "fs"}], {"spillway_disk_tier_bytes": 1, "spillway_disk_tier_"
                                                          "break_even_gbps": 0})


def test_chunks_are_stored_with_their_checksum_and_a_bad_one_is_a_miss_through_vllms_bookkeeping(build):
    _probe, tier = build(events=True)
    keys = [key(n) for n in range(3)]
    stored = [fill(tier, n, n) for n in range(3)]
    tier.submit_store(job(1, keys, [0, 1, 2], False))
    assert finished(tier, 1).success
    paths = [tier.file_mapper.get_file_name(k) for k in keys]
    assert all(os.path.getsize(p) == chunk_integrity.file_bytes(tier._block_size) for p in paths), \
        "each file is the chunk and its trailer"
    events = list(tier.take_events())
    assert [list(e.keys) for e in events] == [keys], "vLLM's tier still announces what it stored, in job order"

    with open(paths[1], "r+b") as f:  # one flipped bit in the middle chunk
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 1]))
    for n in (3, 4, 5):
        tier._primary_kv_view.cast("B")[n * tier._block_size:(n + 1) * tier._block_size] = b"\xff" * tier._block_size
    tier.submit_load(job(2, keys, [3, 4, 5], True))
    result = finished(tier, 2)
    assert not result.success and list(result.successful_keys) == keys[:1], "vLLM keeps the chunk before the bad one"
    assert row(tier, 3) == stored[0] and row(tier, 4) == bytes(tier._block_size), "the bad bytes never stay"
    assert not os.path.exists(paths[1]) and os.path.exists(paths[2])
    data = stats_data(tier.take_stats("1:fs"))
    assert data[names.TIER_CHECKSUM_MISMATCHES] == {("1:fs",): 1}
    assert data[names.TIER_LOADED_CHUNKS] == {("1:fs",): 1}
    assert tier.spillway_index._busy == {}, "the load's pins are released"

    tier.submit_load(job(3, keys[:1], [6], True))
    assert finished(tier, 3).success and row(tier, 6) == stored[0]


def test_a_store_the_bound_cannot_hold_is_dropped_before_vllm_writes_it(build):
    _probe, tier = build(bound=2 * (chunk_integrity.file_bytes(BLOCK) + 2 * 4096))
    keys = [key(n) for n in range(10, 14)]
    for n in range(4):
        fill(tier, n, n)
    tier.submit_store(job(1, keys, [0, 1, 2, 3], False))  # one job: none of its chunks is idle to evict
    assert finished(tier, 1).success
    written = [k for k in keys if os.path.exists(tier.file_mapper.get_file_name(k))]
    assert 1 <= len(written) < len(keys) and written == keys[:len(written)]
    data = stats_data(tier.take_stats("1:fs"))
    assert data[names.TIER_REFUSED_CHUNKS] == {("1:fs",): len(keys) - len(written)}
    assert tier.spillway_index.used_bytes <= tier.spillway_index.capacity_bytes


def test_a_pool_hit_makes_its_disk_files_the_youngest(build):
    probe, tier = build()
    keys = [key(n) for n in range(20, 22)]
    for n in range(2):
        fill(tier, n, n)
    tier.submit_store(job(1, keys, [0, 1], False))
    assert finished(tier, 1).success
    paths = [tier.file_mapper.get_file_name(k) for k in keys]
    assert list(tier.spillway_index._files)[-2:] == paths
    with pytest.raises(Exception):  # noqa: B017 - the keys are not in the pool: vLLM refuses after the touch
        probe.prepare_load([keys[0]], ReqContext(req_id="hit"))
    assert list(tier.spillway_index._files)[-1] == paths[0]


def test_where_vllms_tier_code_differs_the_tier_stays_bounded_and_writes_vllms_own_files(build, monkeypatch,
                                                                                           caplog):
    changed = dict(disk_tier.FS_TIER_CODE, **{"FileSystemTierManager.submit_load": frozenset({"another release"})})
    monkeypatch.setattr(disk_tier, "FS_TIER_CODE", changed)
    monkeypatch.setattr(source_guard, "_refused", set())
    with caplog.at_level(logging.WARNING, logger="spillway_connector"):
        _probe, tier = build()
    assert type(tier) is disk_tier.SpillwayFsTier and not tier.checksums
    warnings = [r.getMessage() for r in caplog.records if "checksum" in r.getMessage()]
    assert len(warnings) == 1 and "FileSystemTierManager.submit_load" in warnings[0]
    spillway = json.loads(Path(tier.file_mapper.get_config_file_path()).read_text())["spillway"]
    assert spillway["format"] == disk_tier.PLAIN_FORMAT, "vLLM's files never share a namespace with trailered ones"
    keys = [key(30)]
    stored = fill(tier, 0, 30)
    tier.submit_store(job(1, keys, [0], False))
    assert finished(tier, 1).success
    assert os.path.getsize(tier.file_mapper.get_file_name(keys[0])) == tier._block_size, "vLLM's own file"
    assert tier.spillway_index.used_bytes > 0, "still bounded"
    tier.submit_load(job(2, keys, [1], True))
    assert finished(tier, 2).success and row(tier, 1) == stored


def test_a_root_that_is_not_the_tiers_own_is_refused_when_vllm_builds_the_tier(tmp_path):
    from spillway_connector import disk_namespace

    root = tmp_path / "tier"
    root.mkdir()
    (root / "pytorch_model.bin").write_bytes(b"weights")
    spec = SpillwayTieringOffloadingSpec(offloading_config(root, 1 << 20))
    with pytest.raises(disk_namespace.TierRootError, match="pytorch_model.bin"):
        spec.get_manager()
    (root / "pytorch_model.bin").unlink()
    slot = disk_namespace.claim_slot(str(root))
    assert os.path.basename(slot.path) == "replica-0", "the refused tier held no slot"
    slot.release()


def _lookup(tier, keys: list[bytes], timeout_s: float = 20.0) -> list[bool]:
    """vLLM's own lookup of the keys in the tier (its async lookup thread), as the tiering manager asks it."""
    from vllm.v1.kv_offload.tiering.base import LookupResult

    context, deadline = ReqContext(req_id=f"lookup-{random.randrange(1 << 30)}"), time.monotonic() + timeout_s
    while True:
        results = [tier.lookup(k, context) for k in keys]
        if LookupResult.RETRY not in results:
            return [r == LookupResult.HIT for r in results]
        assert time.monotonic() < deadline, "vLLM's lookup never answered"
        tier.on_schedule_end(None)  # flushes the step's lookups to the lookup thread
        time.sleep(0.01)


def test_replicas_of_one_share_read_each_others_chunks_and_write_only_their_own(build, monkeypatch):
    """Two engines in one root (as two replicas on one volume) of the share SPILLWAY_DISK_TIER_SHARE names: the
    second finds the first's chunks through vLLM's own lookup and reads them into its pool, counted as sibling
    loads; it stores into its own slot only, its bound never counts the sibling's files, and a file the
    sibling's evictor deletes between the lookup and the read is a failed load (vLLM recomputes it)."""
    from spillway.core import vllm_api
    from spillway_connector import disk_namespace

    assert disk_namespace.SHARE_ENV == vllm_api.ENV_DISK_TIER_SHARE, "the variable the operator sets"
    monkeypatch.setenv(disk_namespace.SHARE_ENV, "team-a/llama")
    _, first = build()
    _, second = build()
    assert Path(first.spillway_slot.path).name == "replica-0" and Path(second.spillway_slot.path).name == "replica-1"
    keys = [key(n) for n in range(40, 44)]
    stored = [fill(first, n, 40 + n) for n in range(4)]
    first.submit_store(job(1, keys, [0, 1, 2, 3], False))
    assert finished(first, 1).success
    own = second._paths(keys)
    assert not any(os.path.exists(p) for p in own)
    assert _lookup(second, keys) == [True] * 4, "vLLM's lookup finds the sibling's files"

    Path(first._paths(keys[3:])[0]).unlink()  # the sibling's evictor, after the lookup
    second.submit_load(job(2, keys, [4, 5, 6, 7], True))
    result = finished(second, 2)
    assert not result.success and list(result.successful_keys) == keys[:3], "the deleted chunk is recomputed"
    assert [row(second, n) for n in (4, 5, 6)] == stored[:3], "the sibling's bytes, verified, in this pool"
    data = stats_data(second.take_stats("1:fs"))
    assert data[names.TIER_LOADED_CHUNKS] == {("1:fs",): 3}
    assert names.TIER_SIBLING_LOADED_CHUNKS not in data, "a failed load's sibling chunks are not counted"
    second.submit_load(job(3, keys[:2], [0, 1], True))
    assert finished(second, 3).success
    assert stats_data(second.take_stats("1:fs"))[names.TIER_SIBLING_LOADED_CHUNKS] == {("1:fs",): 2}
    assert not any(os.path.exists(p) for p in own), "a read writes nothing into its own slot"

    fresh = fill(second, 2, 99)
    second.submit_store(job(4, [key(45)], [2], False))
    assert finished(second, 4).success
    assert os.path.exists(second._paths([key(45)])[0]) and not os.path.exists(first._paths([key(45)])[0])
    assert len(second.spillway_index) == 1, "the bound holds this engine's own file only"
    assert _lookup(first, [key(45)]) == [True] and row(second, 2) == fresh, "and the first reads the second's"


@pytest.mark.parametrize("second_share", ["team-b/llama", None])
def test_replicas_of_another_share_or_none_read_only_their_own(build, monkeypatch, second_share):
    """Another ModelServer's replicas (another share: a namespace of their own) or an engine without a share
    (sibling reads off) on the same volume never find the first's chunks."""
    from spillway_connector import disk_namespace

    monkeypatch.setenv(disk_namespace.SHARE_ENV, "team-a/llama")
    _, first = build()
    if second_share is None:
        monkeypatch.delenv(disk_namespace.SHARE_ENV)
    else:
        monkeypatch.setenv(disk_namespace.SHARE_ENV, second_share)
    _, second = build()
    keys = [key(50)]
    fill(first, 0, 50)
    first.submit_store(job(1, keys, [0], False))
    assert finished(first, 1).success and os.path.exists(first._paths(keys)[0])
    assert _lookup(second, keys) == [False]
    assert isinstance(second.file_mapper, disk_namespace.SiblingFiles) == (second_share is not None)
