"""vLLM's tiered offloading (CPU pool over secondary tiers such as the node-disk "fs" tier) on the CPU platform.

vLLM's TieringOffloadingSpec keeps the CPU pool in one shared memory region: the engine core's tiers read and write it
(the fs tier copies chunks between it and files), the worker copies KV between it and the engine's cache. Its
worker copies with CUDA streams, so on the CPU platform this spec (Spillway's tiering spec, spec.py, on vLLM's)
keeps vLLM's manager, tiers and region and gives the worker host-memory copies into that same region (host_backend.HostOffloadingWorker). Tests use it to
run the real tiering manager, the real fs tier and the connector's disk evictor end to end without a GPU.

Load it through kv_connector_extra_config: `"spec_name": "HostTieringOffloadingSpec",
"spec_module_path": "spillway_connector.host_tiering"`, with `secondary_tiers` as for vLLM's own spec.
"""
from __future__ import annotations

from typing import Any

from spillway_connector import transfer_config as tc
from spillway_connector.compat import CanonicalKVCaches, OffloadingWorker, TieringOffloadingSpec
from spillway_connector.host_backend import HostOffloadingWorker

if TieringOffloadingSpec is None:  # pragma: no cover - only on a release without tiering
    raise ImportError("spillway_connector.host_tiering needs vLLM's tiered offloading (vLLM 0.32 or newer)")

from spillway_connector.spec import SpillwayTieringOffloadingSpec, tiering_region


class HostTieringOffloadingSpec(SpillwayTieringOffloadingSpec):
    def __init__(self, config: Any):
        super().__init__(config)
        if getattr(config, "canonical_layout", False):
            raise ValueError(f"{type(self).__name__} does not implement canonical_layout; leave it unset")
        self._region: Any = None

    def _build_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        self._region = tiering_region(self)  # vLLM's region, pre-faulted as on the GPU (spec.shared_region)
        return HostOffloadingWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                    host_views=self._region.create_next_worker_view)


def cpu_disk_tier_args(cpu_bytes: int, root_dir: str, bound_bytes: int, read_threads: int = 2,
                       write_threads: int = 2, eviction_policy: str = "lru",
                       extra: dict[str, Any] | None = None) -> list[str]:
    """`vllm serve` arguments for a `cpu_bytes` CPU pool over a bounded fs tier at `root_dir`, CPU platform;
    `extra`: more kv_connector_extra_config keys."""
    extra = {**tc.disk_tier_extra(root_dir, bound_bytes, read_threads, write_threads,
                                  spec_name=HostTieringOffloadingSpec.__name__, spec_module_path=__name__),
             **(extra or {})}
    return [tc.FLAG_KV_TRANSFER_CONFIG, tc.flag_value(tc.kv_transfer_config(cpu_bytes, eviction_policy, extra=extra))]
