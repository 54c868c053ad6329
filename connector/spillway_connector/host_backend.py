"""Host-memory transfer backend for vLLM's offloading on the CPU platform.

vLLM's CPUOffloadingSpec refuses to build its worker unless the KV cache lives on a
CUDA/XPU device. HostOffloadingSpec (Spillway's spec, spec.py, on vLLM's) keeps everything else of it — pool sizing from
`cpu_bytes_to_use`, vLLM's real CPUOffloadingManager with its LRU/ARC policy, its
metric definitions — and supplies a worker that copies KV pages between the
engine's KV-cache tensors and a host buffer with torch index_select/index_copy_.
With it the real scheduler, OffloadingConnector and CPU offloading manager run end
to end on a CPU-only machine.

Load it through kv_connector_extra_config: `"spec_name": "HostOffloadingSpec",
"spec_module_path": "spillway_connector.host_backend"`; `kv_transfer_config()` and
`cpu_offload_args()` build the whole --kv-transfer-config.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from spillway_connector import transfer_config as tc
from spillway_connector.compat import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    DevicePointers,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
    spec_pool_chunks,
)
from spillway_connector.spec import SpillwayOffloadingSpec


def _request_amx_permission() -> None:
    """Ask Linux for AMX tile state in this worker process before any request runs.

    vLLM's CPU attention picks its AMX kernel for bfloat16 on AMX machines (vllm/v1/attention/backends/cpu_attn.py,
    `_get_attn_isa`) but never asks for the tile state Linux hands out per process (arch_prctl
    ARCH_REQ_XCOMP_PERM); a oneDNN matmul usually asks first. When an engine's first request is served from the
    pool, the prefix attention runs before anything asked, and the worker dies with SIGILL (exit code -4): a
    restarted engine whose first request hits the disk tier did, on a Sapphire Rapids machine. Asking is
    idempotent and a no-op where AMX is absent."""
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


class HostOffloadingWorker(OffloadingWorker):
    """Copies KV pages between the engine's KV-cache tensors and a host buffer.

    Transfers run synchronously at submission (a host memcpy has no engine to queue
    on); their results are handed out by the next get_finished(), as an async worker's
    would be. The host buffer of tensor t has one row per GPU block slot:
    row = chunk_id * blocks_per_chunk + block-within-chunk.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int,
                 host_views: Any = None):
        """host_views(chunk_bytes) -> a (num_chunks, chunk_bytes) int8 tensor per KV-cache tensor, in order: the
        host buffer lives there (vLLM's shared offload region, which a secondary tier reads); None: private."""
        _request_amx_permission()
        self._blocks_per_chunk = blocks_per_chunk
        self._device_tensors: list[torch.Tensor] = []
        self._host_tensors: list[torch.Tensor] = []  # (num_chunks, blocks_per_chunk, page bytes)
        for canonical in kv_caches.tensors:
            page = canonical.page_size_bytes
            device = canonical.tensor.view(torch.int8).view((-1, page))
            self._device_tensors.append(device)
            if host_views is None:
                host = torch.zeros((num_chunks, blocks_per_chunk, page), dtype=torch.int8)
            else:
                host = host_views(blocks_per_chunk * page).view(num_chunks, blocks_per_chunk, page)
            self._host_tensors.append(host)
        # Per KV-cache group: the tensors its layers live in (each copied once).
        self._group_tensors: list[tuple[int, ...]] = [
            tuple(dict.fromkeys(ref.tensor_idx for ref in refs)) for refs in kv_caches.group_data_refs
        ]
        # vLLM 0.34 hands the worker device pointers, base + block * stride(0) of each canonical tensor
        # (vllm/v1/kv_offload/pointer_utils.py resolve_device_pointers): the same terms turn them back into blocks.
        self._group_refs: list[tuple[int, ...]] = [tuple(ref.tensor_idx for ref in refs)
                                                   for refs in kv_caches.group_data_refs]
        self._pointer_bases = [(canonical.tensor.data_ptr(), canonical.tensor.stride(0))
                               for canonical in kv_caches.tensors]
        self._finished: list[TransferResult] = []

    # -- OffloadingWorker -------------------------------------------------------
    # The device side is a GPULoadStoreSpec up to vLLM 0.33 and DevicePointers from 0.34 (vLLM PR 56076).
    def submit_store(self, job_id: int, src: Any, dst_spec: LoadStoreSpec) -> bool:
        self._finished.append(self._transfer(job_id, src, dst_spec, to_host=True))
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst: Any, expedited: bool = False) -> bool:
        self._finished.append(self._transfer(job_id, dst, src_spec, to_host=False))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every submitted transfer has already completed

    def shutdown(self) -> None:
        self._finished.clear()
        self._host_tensors.clear()
        self._device_tensors.clear()

    # -- copies -----------------------------------------------------------------
    def host_rows(self, chunk_ids: np.ndarray, first_block_index: int, num_blocks: int) -> np.ndarray:
        """Host-buffer rows of `num_blocks` consecutive blocks of a request, starting at
        request block `first_block_index`, stored in the given chunks (the first chunk may
        be entered part-way when a chunk spans several blocks)."""
        per_chunk = self._blocks_per_chunk
        skip = first_block_index % per_chunk
        rows = (chunk_ids.astype(np.int64)[:, None] * per_chunk + np.arange(per_chunk, dtype=np.int64)).ravel()
        return rows[skip : skip + num_blocks]

    def _device_groups(self, device: Any) -> list[tuple[int, int, int, dict[int, np.ndarray]]]:
        """(group, blocks, first block index, tensor -> device blocks) per group with blocks, in order."""
        groups = []
        if isinstance(device, GPULoadStoreSpec):
            offset = 0
            for group, (size, first) in enumerate(zip(device.group_sizes, device.block_indices)):
                if size:
                    blocks = device.block_ids[offset : offset + size].astype(np.int64)
                    groups.append((group, size, first, dict.fromkeys(self._group_tensors[group], blocks)))
                offset += size
            assert offset == len(device.block_ids), "spec sizes disagree"
            return groups
        assert DevicePointers is not None and isinstance(device, DevicePointers), type(device)
        offset = 0
        for group, (size, num_refs, first) in enumerate(
            zip(device.group_block_counts, device.group_data_ref_counts, device.block_indices)
        ):
            if not size:
                continue
            assert num_refs == len(self._group_refs[group]), "pointer groups disagree with the KV caches"
            tensors: dict[int, np.ndarray] = {}
            for ref, tensor_idx in enumerate(self._group_refs[group]):
                base, stride = self._pointer_bases[tensor_idx]
                pointers = device.ptrs[offset + ref * size : offset + (ref + 1) * size].astype(np.int64)
                tensors.setdefault(tensor_idx, (pointers - base) // stride)
            groups.append((group, size, first, tensors))
            offset += size * num_refs
        assert offset == len(device.ptrs), "pointer counts disagree"
        return groups

    def _transfer(self, job_id: int, device: Any, host_spec: LoadStoreSpec, to_host: bool) -> TransferResult:
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        started = time.perf_counter()
        chunk_ids = host_spec.block_ids
        chunk_offset = 0
        num_bytes = 0
        for _group, group_size, first_block_index, tensors in self._device_groups(device):
            skip = first_block_index % self._blocks_per_chunk
            num_chunks = -(-(group_size + skip) // self._blocks_per_chunk)
            host_rows = torch.from_numpy(
                self.host_rows(chunk_ids[chunk_offset : chunk_offset + num_chunks], first_block_index, group_size)
            )
            # (chunk, block-within-chunk) pairs: the shared region's rows are strided, so they cannot be flattened
            chunk_index, block_index = host_rows // self._blocks_per_chunk, host_rows % self._blocks_per_chunk
            for tensor_idx, blocks in tensors.items():
                device_rows = torch.from_numpy(blocks)
                device_tensor, host = self._device_tensors[tensor_idx], self._host_tensors[tensor_idx]
                if to_host:
                    host[chunk_index, block_index] = device_tensor.index_select(0, device_rows)
                else:
                    device_tensor.index_copy_(0, device_rows, host[chunk_index, block_index])
                num_bytes += group_size * device_tensor.shape[1]
            chunk_offset += num_chunks
        assert chunk_offset == len(chunk_ids), "spec sizes disagree"
        return TransferResult(
            job_id=job_id, success=True, transfer_size=num_bytes, transfer_time=time.perf_counter() - started
        )


class HostOffloadingSpec(SpillwayOffloadingSpec):
    """Spillway's CPU offloading spec (vLLM's pool sizing, CPUOffloadingManager, LRU/ARC and metrics, with the
    connector's probes) with a host-memory worker, so it runs where the KV cache itself is in host memory."""

    def __init__(self, config: Any):
        super().__init__(config)
        if getattr(config, "canonical_layout", False):
            raise ValueError(f"{type(self).__name__} does not implement canonical_layout; leave it unset")

    def _build_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        return HostOffloadingWorker(kv_caches, self.blocks_per_chunk, spec_pool_chunks(self))


def kv_transfer_config(
    cpu_bytes: int, eviction_policy: str = "lru", extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The --kv-transfer-config object that runs SpillwayOffloadingConnector with this
    backend and a `cpu_bytes` pool."""
    backend = {tc.EXTRA_SPEC_NAME: HostOffloadingSpec.__name__, tc.EXTRA_SPEC_MODULE_PATH: __name__}
    return tc.kv_transfer_config(cpu_bytes, eviction_policy, extra={**backend, **(extra or {})})


def cpu_offload_args(cpu_bytes: int, eviction_policy: str = "lru", extra: dict[str, Any] | None = None) -> list[str]:
    """`vllm serve` arguments that enable offloading on the CPU platform with this backend."""
    return [tc.FLAG_KV_TRANSFER_CONFIG, tc.flag_value(kv_transfer_config(cpu_bytes, eviction_policy, extra))]
