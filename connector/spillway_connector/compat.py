"""Every difference between the supported vLLM versions, in one place.

Importing this module checks the installed vLLM first and raises
UnsupportedVLLMVersion (one clear line) on a version the connector was not built for.
The rest of the package imports vLLM only through here.
"""
from __future__ import annotations

from typing import Any

import vllm

from spillway_connector.versions import UnsupportedVLLMVersion, require_supported

VLLM_VERSION: str = vllm.__version__
VLLM_MINOR: tuple[int, int] = require_supported(VLLM_VERSION)

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
        OffloadPromMetrics,
        _StatsKey,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.v1.kv_offload.base import (
        BlockIDsLoadStoreSpec,
        CanonicalKVCaches,
        GPULoadStoreSpec,
        LoadStoreSpec,
        OffloadingWorker,
        TransferResult,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
except ImportError as error:  # a patched or partial vLLM build of a supported number
    raise UnsupportedVLLMVersion(
        f"spillway_connector cannot load vLLM {VLLM_VERSION}'s offloading classes ({error}); "
        "install a supported vLLM release or use vLLM's own OffloadingConnector"
    ) from error

# vLLM's tiered offloading (a CPU primary tier over secondary tiers such as "fs", the node-disk tier): 0.32+.
try:
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError:  # 0.26
    SharedOffloadRegion = TieringOffloadingSpec = None  # type: ignore[assignment,misc]

# Hit sources per tier (0.32+; 0.26's scheduler never asks). OffloadingConnectorScheduler's
# get_external_cache_hit_sources reads two fields of its per-request state, `num_locally_computed_tokens` and
# `load_key_ranges` ((first token, end token, key) per loaded key), in 0.32.0 and 0.33.0 alike (the method is the
# same text in both: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py); the connector answers
# it from the same fields (spillway_connector/hit_sources.py) on these minors only.
try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # 0.26
    CacheHitSource = None  # type: ignore[assignment,misc]
FAST_HIT_SOURCES: bool = VLLM_MINOR in ((0, 32), (0, 33))


def is_vllms_lru_manager(manager: Any) -> bool:
    """vLLM's own CPUOffloadingManager with its LRU policy, exactly (a subclass, ARC or another manager is not), on
    0.32 or 0.33: the manager whose prepare_load and complete_load the connector's batched pin and release redo
    (their text and mark_(non_)evictable's are the same in both: vllm/v1/kv_offload/cpu/manager.py,
    vllm/v1/kv_offload/cpu/policies/lru.py)."""
    if VLLM_MINOR not in ((0, 32), (0, 33)):
        return False
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    return type(manager) is CPUOffloadingManager and type(getattr(manager, "_policy", None)) is LRUCachePolicy

__all__ = [
    "FAST_HIT_SOURCES",
    "VLLM_EXPORTS_TRANSFER_COUNTERS",
    "VLLM_MINOR",
    "VLLM_VERSION",
    "BlockIDsLoadStoreSpec",
    "CPUOffloadingSpec",
    "CacheHitSource",
    "CanonicalKVCaches",
    "GPULoadStoreSpec",
    "KVConnectorRole",
    "LoadStoreSpec",
    "OffloadPromMetrics",
    "OffloadingConnector",
    "OffloadingConnectorStats",
    "OffloadingWorker",
    "SharedOffloadRegion",
    "TieringOffloadingSpec",
    "TransferResult",
    "is_vllms_lru_manager",
    "pool_capacity_chunks",
    "spec_pool_chunks",
    "split_stats_payload",
]

# vllm:kv_offload_{load,store}_{bytes,time} exist in every supported minor, so the
# connector's own byte/second counters stay off. A future minor without them flips this.
VLLM_EXPORTS_TRANSFER_COUNTERS: bool = VLLM_MINOR >= (0, 26)


def split_stats_payload(payload: dict[str, Any], names: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split an OffloadingConnectorStats payload into (vLLM's part, the part named in `names`).

    Each part keeps the payload's shape ({types: {...}, data: {...}} plus whatever else
    the version carries, e.g. 0.33's config info, which stays with vLLM's part).
    """
    types = payload.get(_StatsKey.TYPES, {})
    data = payload.get(_StatsKey.DATA, {})
    ours_data = {name: values for name, values in data.items() if name in names}
    if not ours_data:
        return payload, {}
    theirs = dict(payload)
    theirs[_StatsKey.TYPES] = {name: kind for name, kind in types.items() if name not in names}
    theirs[_StatsKey.DATA] = {name: values for name, values in data.items() if name not in names}
    ours = {_StatsKey.TYPES: {name: types[name] for name in ours_data}, _StatsKey.DATA: ours_data}
    return theirs, ours


def stats_sections(payload: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[tuple, Any]]]:
    """(metric name -> kind, metric name -> {label values -> value}) of a stats payload."""
    return payload.get(_StatsKey.TYPES, {}), payload.get(_StatsKey.DATA, {})


def spec_pool_chunks(spec: Any) -> int:
    """Chunks in the CPU pool a CPUOffloadingSpec sized (0.26 calls them blocks)."""
    return int(spec.num_chunks if hasattr(spec, "num_chunks") else spec.num_blocks)


def pool_capacity_chunks(manager: Any) -> int | None:
    """Chunks in the pool of vLLM's CPUOffloadingManager; None for another manager."""
    for attribute in ("_num_chunks", "_num_blocks"):  # 0.32+, 0.26
        value = getattr(manager, attribute, None)
        if isinstance(value, int):
            return value
    return None
