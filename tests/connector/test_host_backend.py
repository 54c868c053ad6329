"""HostOffloadingWorker: KV pages move between the engine's cache tensors and the host pool exactly."""
from __future__ import annotations

import json

import numpy as np
import torch
from support import require_vllm

require_vllm(allow_module_level=True)

from spillway.core import vllm_api as V
from spillway_connector.compat import worker_device_side
from spillway_connector.connector import SpillwayOffloadingConnector
from spillway_connector.host_backend import (
    HostOffloadingSpec,
    HostOffloadingWorker,
    cpu_offload_args,
    kv_transfer_config,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

PAGE = 48
NUM_BLOCKS = 12


def kv_caches(num_tensors: int, groups: list[list[int]]) -> tuple[list[torch.Tensor], CanonicalKVCaches]:
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randint(-128, 127, (NUM_BLOCKS, PAGE), dtype=torch.int8, generator=generator)
               for _ in range(num_tensors)]
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(tensor, PAGE) for tensor in tensors],
        [[CanonicalKVCacheRef(index, PAGE) for index in group] for group in groups],
    )
    return tensors, caches


def device(caches: CanonicalKVCaches, block_ids: list[int], group_sizes: list[int], block_indices: list[int]):
    """The worker's device side for these blocks, as this vLLM's connector hands it over (a spec, or pointers)."""
    return worker_device_side(GPULoadStoreSpec(block_ids, group_sizes=group_sizes, block_indices=block_indices), caches)


def test_store_then_load_restores_exactly_the_stored_blocks():
    tensors, caches = kv_caches(2, [[0, 1]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=8)
    original = [tensor.clone() for tensor in tensors]
    blocks, chunks = [4, 9, 2], [7, 0, 3]
    worker.submit_store(11, device(caches, blocks, [3], [0]), CPULoadStoreSpec(chunks))
    (stored,) = worker.get_finished()
    assert (stored.job_id, stored.success, stored.transfer_size) == (11, True, 3 * PAGE * 2)
    assert stored.transfer_time > 0
    for tensor in tensors:
        tensor.zero_()
    targets = [1, 5, 6]
    worker.submit_load(12, CPULoadStoreSpec(chunks), device(caches, targets, [3], [0]))
    (loaded,) = worker.get_finished()
    assert (loaded.job_id, loaded.transfer_size) == (12, 3 * PAGE * 2)
    for tensor, before in zip(tensors, original):
        assert torch.equal(tensor[targets], before[blocks])
        untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
        assert not tensor[untouched].any()
    assert worker.get_finished() == []


def test_chunks_of_several_blocks_start_part_way_for_an_unaligned_first_block():
    tensors, caches = kv_caches(1, [[0]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=4, num_chunks=3)
    # Request blocks 6..10 (block index 6 is the 3rd block of chunk 1): chunks [2, 0] hold them.
    assert worker.host_rows(np.array([2, 0]), first_block_index=6, num_blocks=5).tolist() == [10, 11, 0, 1, 2]
    blocks = [3, 8, 1, 0, 11]
    original = tensors[0].clone()
    worker.submit_store(1, device(caches, blocks, [5], [6]), CPULoadStoreSpec([2, 0]))
    tensors[0].zero_()
    worker.submit_load(2, CPULoadStoreSpec([2, 0]), device(caches, blocks, [5], [6]))
    assert [r.transfer_size for r in worker.get_finished()] == [5 * PAGE, 5 * PAGE]
    assert torch.equal(tensors[0][blocks], original[blocks])


def test_each_group_copies_only_its_own_tensors():
    tensors, caches = kv_caches(2, [[0], [1]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=4)
    original = [tensor.clone() for tensor in tensors]
    spec = GPULoadStoreSpec([2, 7], group_sizes=[1, 1], block_indices=[0, 0])
    worker.submit_store(1, worker_device_side(spec, caches), CPULoadStoreSpec([0, 1]))
    for tensor in tensors:
        tensor.zero_()
    worker.submit_load(2, CPULoadStoreSpec([0, 1]), worker_device_side(spec, caches))
    assert torch.equal(tensors[0][2], original[0][2]) and not tensors[0][7].any()
    assert torch.equal(tensors[1][7], original[1][7]) and not tensors[1][2].any()


def test_server_arguments_name_the_plugin_and_the_backend():
    flag, payload = cpu_offload_args(1 << 20)
    assert flag == V.FLAG_KV_TRANSFER_CONFIG
    config = kv_transfer_config(1 << 20)
    assert json.loads(payload) == config
    assert config[V.KV_CONNECTOR_KEY] == V.SPILLWAY_CONNECTOR == SpillwayOffloadingConnector.__name__
    assert config[V.KV_CONNECTOR_MODULE_PATH_KEY] == V.SPILLWAY_CONNECTOR_MODULE
    extra = config[V.KV_CONNECTOR_EXTRA_CONFIG_KEY]
    assert extra[V.EXTRA_SPEC_NAME] == V.HOST_OFFLOADING_SPEC == HostOffloadingSpec.__name__
    assert extra[V.EXTRA_SPEC_MODULE_PATH] == V.HOST_OFFLOADING_SPEC_MODULE
    assert extra[V.EXTRA_CPU_BYTES] == 1 << 20
