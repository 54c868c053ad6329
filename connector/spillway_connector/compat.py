"""Every difference between the supported vLLM versions, in one place.

Importing this module checks the installed vLLM first and raises
UnsupportedVLLMVersion (one clear line) on a version the connector was not built for.
The rest of the package imports vLLM only through here.
"""
from __future__ import annotations

from typing import Any

import vllm

from spillway_connector.source_guard import verified
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
        LookupResult,
        OffloadingSpec,
        OffloadingWorker,
        TransferResult,
        make_offload_key,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
except ImportError as error:  # a patched or partial vLLM build of a supported number
    raise UnsupportedVLLMVersion(
        f"spillway_connector cannot load vLLM {VLLM_VERSION}'s offloading classes ({error}); "
        "install a supported vLLM release or use vLLM's own OffloadingConnector"
    ) from error

# A pool lookup that says the chunk will load: ready, or still being stored (the load waits for the store).
HELD_LOOKUPS = frozenset({LookupResult.HIT, LookupResult.HIT_PENDING})

# vLLM's tiered offloading (a CPU primary tier over secondary tiers such as "fs", the node-disk tier): 0.32+.
try:
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError:  # 0.26
    SharedOffloadRegion = TieringOffloadingSpec = None  # type: ignore[assignment,misc]

# The worker's device side (vLLM PR 56076, 0.34+): pointers the connector resolved from the GPULoadStoreSpec.
try:
    from vllm.v1.kv_offload.base import DevicePointers
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
except ImportError:  # 0.33 and older hand the worker the GPULoadStoreSpec itself
    DevicePointers = resolve_device_pointers = None  # type: ignore[assignment,misc]


def worker_device_side(spec: Any, kv_caches: Any) -> Any:
    """What this vLLM's connector hands OffloadingWorker.submit_store/submit_load for a GPULoadStoreSpec."""
    return spec if resolve_device_pointers is None else resolve_device_pointers(spec, kv_caches)


# Hit sources per tier (0.32+; 0.26's scheduler never asks). OffloadingConnectorScheduler's
# get_external_cache_hit_sources reads two fields of its per-request state, `num_locally_computed_tokens` and
# `load_key_ranges` ((first token, end token, key) per loaded key); the connector answers it from the same fields
# (spillway_connector/hit_sources.py) where the method reads as in the releases verified (PATCHES.md).
try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # 0.26
    CacheHitSource = None  # type: ignore[assignment,misc]

# The code each replacement redoes, by release: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py,
# vllm/v1/kv_offload/cpu/manager.py and cpu/policies/{base,lru}.py read the same in 0.32.0, 0.33.0 and 0.34.0
# (source_guard.fingerprint; tests/connector/test_source_guard.py checks every tree).
HIT_SOURCES_CODE = {"get_external_cache_hit_sources": frozenset({"99690554f4604e0d"})}
LRU_MANAGER_CODE = {
    "CPUOffloadingManager.prepare_load": frozenset({"ae4ecbe1057fdd4a"}),
    "CPUOffloadingManager._prepare_load": frozenset({"a23045e1bc5b08ac"}),
    "CPUOffloadingManager.complete_load": frozenset({"4195748916eba16b"}),
    "LRUCachePolicy.get": frozenset({"8f2686336c2727b3"}),
    "LRUCachePolicy.mark_evictable": frozenset({"5d9ceafc04a5854c"}),
    "LRUCachePolicy.mark_non_evictable": frozenset({"6e56968a8769aa49"}),
    "LRUCachePolicy._push_evictable": frozenset({"65970da9306a11b2"}),
    "LRUCachePolicy._maybe_compact_heap": frozenset({"5abac0cc329cc22a"}),
    "ChunkStatus.is_ready": frozenset({"930498b885ab908c"}),
}


def hit_sources_functions() -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler

    return {"get_external_cache_hit_sources": vars(OffloadingConnectorScheduler).get("get_external_cache_hit_sources")}


def lru_manager_functions() -> dict[str, Any]:
    """The functions of vLLM's CPU manager and LRU policy that the batched pin and release redo, by name."""
    try:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
        from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy
    except ImportError:  # 0.26: another manager
        return {}
    owners = {"CPUOffloadingManager": CPUOffloadingManager, "LRUCachePolicy": LRUCachePolicy, "ChunkStatus": ChunkStatus}
    return {name: vars(owners[name.split(".")[0]]).get(name.split(".")[1]) for name in LRU_MANAGER_CODE}


FAST_HIT_SOURCES: bool = CacheHitSource is not None and verified(
    "the one-pass hit sources (hit_sources.py)", hit_sources_functions(), HIT_SOURCES_CODE)


def is_vllms_lru_manager(manager: Any) -> bool:
    """vLLM's own CPUOffloadingManager with its LRU policy, exactly (a subclass, ARC or another manager is not),
    whose prepare_load and complete_load the connector's batched pin and release redo, where that code reads as
    in the releases verified."""
    functions = lru_manager_functions()
    if not functions:
        return False
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    if type(manager) is not CPUOffloadingManager or type(getattr(manager, "_policy", None)) is not LRUCachePolicy:
        return False
    return verified("the batched pin and release (batched_pin.py, batched_release.py)", functions, LRU_MANAGER_CODE)


__all__ = [
    "FAST_HIT_SOURCES",
    "HELD_LOOKUPS",
    "VLLM_EXPORTS_TRANSFER_COUNTERS",
    "VLLM_MINOR",
    "VLLM_VERSION",
    "BlockIDsLoadStoreSpec",
    "CPUOffloadingSpec",
    "CacheHitSource",
    "CanonicalKVCaches",
    "DevicePointers",
    "GPULoadStoreSpec",
    "KVConnectorRole",
    "LoadStoreSpec",
    "LookupResult",
    "OffloadPromMetrics",
    "OffloadingConnector",
    "OffloadingConnectorStats",
    "OffloadingSpec",
    "OffloadingWorker",
    "SharedOffloadRegion",
    "TieringOffloadingSpec",
    "TransferResult",
    "is_vllms_lru_manager",
    "make_offload_key",
    "pool_capacity_chunks",
    "spec_pool_chunks",
    "split_stats_payload",
    "worker_device_side",
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
