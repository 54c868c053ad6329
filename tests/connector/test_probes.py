"""The plugin's own bookkeeping, against vLLM's real worker/manager classes where it wraps them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support import require_vllm

require_vllm(allow_module_level=True)

from spillway_connector import names
from spillway_connector.compat import pool_capacity_chunks, stats_sections, worker_device_side
from spillway_connector.connector import PreemptionReloads
from spillway_connector.host_backend import HostOffloadingWorker
from spillway_connector.probes import PoolProbe, TransferProbe, throughput_gbps
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

PAGE = 4096


def data(stats) -> dict:
    return stats_sections(stats.data)[1] if stats is not None else {}


CACHES = CanonicalKVCaches([CanonicalKVCacheTensor(torch.ones((16, PAGE), dtype=torch.int8), PAGE)],
                           [[CanonicalKVCacheRef(0, PAGE)]])


def host_worker() -> HostOffloadingWorker:
    return HostOffloadingWorker(CACHES, blocks_per_chunk=1, num_chunks=16)


def device(block_ids: list[int]):
    """The worker's device side for these blocks, as this vLLM's connector hands it over."""
    return worker_device_side(GPULoadStoreSpec(block_ids, group_sizes=[len(block_ids)], block_indices=[0]), CACHES)


def test_throughput_is_bytes_per_second_in_gb():
    assert throughput_gbps(2_000_000_000, 0.5) == pytest.approx(4.0)
    assert throughput_gbps(1000, 0.0) is None
    assert throughput_gbps(0, 1.0) is None


def test_transfer_probe_records_one_observation_per_finished_transfer_by_direction():
    probe = TransferProbe(host_worker())
    probe.submit_store(1, device([1, 2, 3]), CPULoadStoreSpec([0, 1, 2]))
    probe.submit_store(2, device([4]), CPULoadStoreSpec([3]))
    probe.submit_load(3, CPULoadStoreSpec([0, 1]), device([5, 6]))
    results = probe.get_finished()
    assert sorted(r.job_id for r in results) == [1, 2, 3]  # passed through unchanged
    observed = data(probe.take_stats())[names.TRANSFER_THROUGHPUT]
    assert len(observed[(names.DIRECTION_STORE,)]) == 2
    assert len(observed[(names.DIRECTION_LOAD,)]) == 1
    load = next(r for r in results if r.job_id == 3)
    assert observed[(names.DIRECTION_LOAD,)][0] == pytest.approx(load.transfer_size / load.transfer_time / 1e9)
    assert names.TRANSFER_BYTES not in data(probe.take_stats())  # vLLM exports bytes/time itself
    assert probe.take_stats() is None  # nothing new


def test_transfer_probe_counts_bytes_and_seconds_when_vllm_does_not():
    probe = TransferProbe(host_worker(), count_bytes_and_seconds=True)
    probe.submit_store(1, device([1, 2]), CPULoadStoreSpec([0, 1]))
    (result,) = probe.get_finished()
    values = data(probe.take_stats())
    assert values[names.TRANSFER_BYTES][(names.DIRECTION_STORE,)] == 2 * PAGE == result.transfer_size
    assert values[names.TRANSFER_SECONDS][(names.DIRECTION_STORE,)] == result.transfer_time


def test_pool_probe_follows_vllms_cpu_manager_through_stores_and_evictions():
    manager = CPUOffloadingManager(4)
    pool = PoolProbe(manager, pool_capacity_chunks(manager))
    assert pool.capacity_chunks == 4
    context = ReqContext(req_id="r1")
    pool.on_new_request(context)
    keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(7)]
    assert pool.prepare_store(keys[:3], context).keys_to_store == keys[:3]
    pool.complete_store(keys[:3], context)
    assert pool.resident_chunks == 3
    output = pool.prepare_store(keys[3:6], context)  # needs 3, 1 free: 2 evicted
    assert len(output.evicted_keys) == 2
    assert pool.resident_chunks == 4

    values = data(pool.take_stats())
    assert values[names.POOL_CAPACITY_CHUNKS][()] == 4
    assert values[names.POOL_RESIDENT_CHUNKS][()] == 4
    assert values[names.POOL_EVICTED_CHUNKS][()] == 2
    assert pool.take_stats() is None  # nothing changed since
    pool.complete_store(keys[3:6], context)
    assert pool.prepare_store(keys[6:], context) is not None
    pool.reset_cache()
    assert pool.resident_chunks == 0
    assert pool.lookup(keys[0], context).name == "MISS"  # the manager itself was reset


def request(request_id: str, preemptions: int, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, num_preemptions=preemptions, num_tokens=tokens)


def test_preemption_reloads_count_resumed_requests_at_admission():
    reloads = PreemptionReloads()
    fresh, resumed, missed, dropped = (
        request("fresh", 0, 300), request("resumed", 1, 300), request("missed", 2, 200), request("dropped", 1, 100)
    )
    reloads.looked_up(fresh, 0)
    reloads.admitted(fresh, 256)  # not preempted: vLLM's external_prefix_cache_* count it
    reloads.looked_up(resumed, 0)
    reloads.looked_up(resumed, 64)  # looked up again before admission: the last lookup counts
    reloads.admitted(resumed, 192)
    reloads.looked_up(missed, 0)
    reloads.admitted(missed, 0)
    reloads.looked_up(dropped, 0)
    reloads.finished(dropped)  # aborted while waiting
    reloads.admitted(dropped, 64)
    values = data(reloads.take_stats())
    assert values[names.PREEMPTED_RELOAD_REQUESTS][()] == 1
    assert values[names.PREEMPTED_RELOAD_TOKENS][()] == 192
    assert values[names.PREEMPTED_QUERIED_TOKENS][()] == (300 - 64) + 200
    assert reloads.take_stats() is None
