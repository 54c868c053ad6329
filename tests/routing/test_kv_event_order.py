"""The connector publishes a store job's offload events parent-first (spillway_connector/kv_event_order.py):
vllm-router 0.1.17 drops a block whose parent it has not indexed yet, and vLLM emits a job's blocks in set
order. Real vLLM event types; the routing tests show what it does to the router's index."""
from __future__ import annotations

import random

import pytest
from support import require_vllm


@pytest.fixture(scope="module")
def events_api():
    require_vllm()
    from vllm.distributed import kv_events

    return kv_events


def _chain(api, first: int, n: int, parent: int | None = None) -> list:
    stored = []
    for h in range(first, first + n):
        stored.append(api.BlockStored(block_hashes=[h], parent_block_hash=parent, token_ids=list(range(32)),
                                      block_size=32, lora_id=None, medium="CPU", lora_name=None))
        parent = h
    return stored


def _indexable(events) -> int:
    """How many stores a router that needs each block's parent first would keep (vllm-router 0.1.17)."""
    known, kept = set(), 0
    for e in events:
        if hasattr(e, "parent_block_hash") and (e.parent_block_hash is None or e.parent_block_hash in known):
            known.update(e.block_hashes)
            kept += 1
    return kept


def test_shuffled_chains_come_out_parent_first(events_api):
    from spillway_connector.kv_event_order import parents_first

    two = _chain(events_api, 100, 6) + _chain(events_api, 200, 8)
    shuffled = random.Random(7).sample(two, len(two))
    assert _indexable(shuffled) < len(two)  # what vLLM's set order does to such a router
    ordered = parents_first(shuffled)
    assert sorted(map(id, ordered)) == sorted(map(id, two))
    assert _indexable(ordered) == len(two)


def test_removals_and_clears_keep_their_place(events_api):
    from spillway_connector.kv_event_order import parents_first

    a, b = _chain(events_api, 10, 3), _chain(events_api, 20, 2)
    removed = events_api.BlockRemoved(block_hashes=[10, 11, 12], medium="CPU")
    cleared = events_api.AllBlocksCleared()
    ordered = parents_first([a[2], a[0], a[1], removed, b[1], cleared, b[0]])
    assert ordered == [a[0], a[1], a[2], removed, b[1], cleared, b[0]]  # b's halves are split by the clear


def test_a_store_whose_parent_is_in_an_earlier_batch_stays_in_place(events_api):
    from spillway_connector.kv_event_order import parents_first

    later = _chain(events_api, 5, 3, parent=4)
    assert parents_first([later[1], later[2], later[0]]) == later
    assert parents_first([]) == []
