"""Pin a load's chunks in one pass instead of two policy calls and three ctypes reads per chunk.

When the scheduler admits a request whose prefix is in the pool, vLLM's CPUOffloadingManager.prepare_load pins
every chunk of the load: per chunk a policy `get`, the `is_ready` property and two more reads of the ctypes
reference count, a `mark_non_evictable` call for a chunk no one else reads, and the evictable count checked
after each step. A 128K-token prompt loads 2,047 chunks, and on the H200 that per-chunk Python sat between the
request's arrival and its copy (bench/tail, py-spy of the engine core). This does the
same per chunk (the same asserts, the same reference counts, the chunk leaves the evictable set exactly when its
count goes 0 -> 1) with one read of each count, and checks the evictable count once; what the load records about
the request (`_record_request_cache_access`) and the transfer spec it returns are vLLM's own calls, unchanged.

Only for vLLM's own manager and LRU policy, exactly (a subclass or ARC keeps vLLM's path), where _prepare_load,
mark_non_evictable and the rest it redoes read as in 0.32.0, 0.33.0 and 0.34.0 (compat.LRU_MANAGER_CODE;
vllm/v1/kv_offload/cpu/manager.py, vllm/v1/kv_offload/cpu/policies/lru.py). PATCHES.md: why, and when it goes.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from spillway_connector.compat import is_vllms_lru_manager


def batched_prepare_load(manager: Any) -> Callable[[Collection[Any], Any], Any] | None:
    """A prepare_load for `manager` that does vLLM's work with one read of each chunk's count; None where it does
    not apply (another manager or policy, another vLLM)."""
    if not is_vllms_lru_manager(manager):
        return None

    def prepare_load(keys: Collection[Any], req_context: Any) -> Any:
        policy = manager._policy  # each call reads the policy's state afresh, as vLLM's methods do
        find, evictable = policy.chunks.get, policy._evictable
        pinned = []
        unpinned_evictable = 0
        for key in keys:
            chunk = find(key)
            assert chunk is not None, f"Chunk {key!r} not found in cache"
            count = chunk.ref_cnt
            assert count >= 0, f"Chunk {key!r} is not ready for reading"
            if count == 0:
                evictable.remove(key)  # LRUCachePolicy.mark_non_evictable
                unpinned_evictable += 1
            chunk.ref_cnt = count + 1
            pinned.append(chunk)
        manager._num_evictable_cache_chunks -= unpinned_evictable  # ref_cnt 0 -> 1, once per chunk
        assert manager._num_evictable_cache_chunks >= 0
        manager._record_request_cache_access(keys, req_context, reused_keys=keys)
        return manager._get_load_store_spec(keys, pinned)

    return prepare_load
