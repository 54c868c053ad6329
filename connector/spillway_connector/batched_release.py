"""Release a finished load's chunks in one pass instead of one LRU update per chunk.

When a load finishes, vLLM's CPUOffloadingManager.complete_load unpins each chunk and, for each one whose last
reader it was, calls LRUCachePolicy.mark_evictable: add the key to the evictable set, push a heap entry, and check
whether the heap needs compacting. At 100% CPU hit every loaded chunk takes that path, and the per-chunk calls
were the larger part of update_connector_output (bench/scheduler-side). This does the
same per chunk (asserts, reference counts, the evictable count, one heap entry each) and checks compaction once.
Eviction is unchanged: LRUCachePolicy.evict takes the smallest (rank, key) entries that are current (key
evictable, rank its rank), each key once, so which keys it evicts does not depend on when the heap was compacted
or on stale and duplicate entries in it, only on each evictable key having a current entry, which both give.

Only for vLLM's own manager and LRU policy, exactly (a subclass or ARC keeps vLLM's path), where complete_load,
mark_evictable, _push_evictable and _maybe_compact_heap read as in 0.32.0, 0.33.0 and 0.34.0 (compat.LRU_MANAGER_CODE;
vllm/v1/kv_offload/cpu/manager.py, vllm/v1/kv_offload/cpu/policies/lru.py). PATCHES.md: why, and when it goes.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from typing import Any

from spillway_connector.compat import is_vllms_lru_manager


def batched_complete_load(manager: Any) -> Callable[[Collection[Any], Any], None] | None:
    """A complete_load for `manager` that does vLLM's work with one compaction check; None where it does not
    apply (another manager or policy, another vLLM)."""
    if not is_vllms_lru_manager(manager):
        return None

    def complete_load(keys: Collection[Any], req_context: Any) -> None:
        policy = manager._policy  # each call reads the policy's state afresh, as vLLM's methods do
        chunks = policy.chunks
        released = []
        for key in keys:
            chunk = chunks.get(key)
            assert chunk is not None, f"Chunk {key!r} not found"
            assert chunk.ref_cnt > 0, f"Chunk {key!r} ref_cnt is already 0"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                released.append(key)
        if not released:
            return
        manager._num_evictable_cache_chunks += len(released)
        policy._evictable.update(released)
        heap, ranks = policy._heap, policy._ranks
        for key in released:
            heapq.heappush(heap, (ranks[key], key))
        policy._maybe_compact_heap()

    return complete_load
