"""Offload events in chain order: a block's BlockStored after its parent's.

vLLM's offloading scheduler keeps a store job's keys in a set (`TransferJobStatus.keys`,
vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, 0.26 to 0.33), so the self-describing
BlockStored events of one job come out in hash order, not prefix order; vLLM calls them self-contained
("key order is free", offloading/events.py). vllm-router 0.1.17 is not so lenient: it indexes a block only
if it already knows the block's parent and drops the others for good ("kv_index: unknown parent; skipping
unanchored store" in its debug log), and a block that stays in the pool is never announced again. Its index
then held 1 to 3 of a 6-block prefix (credited 25 to 76 of 192 prefix tokens, measured on
three CPU replicas with bench/routing/routing_policies.py, 2026-12-02), a holder looked barely cheaper than any other replica, and routing depended on the
sampling temperature. Reordering within each run of BlockStored events keeps every other event where it was.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def parents_first(events: Iterable[Any]) -> list[Any]:
    """The events with every run of stores reordered parent-first; removals and clears keep their place."""
    out: list[Any] = []
    run: list[Any] = []
    for event in events:
        if hasattr(event, "parent_block_hash") and hasattr(event, "block_hashes"):
            run.append(event)
            continue
        out += _chain_order(run)
        run = []
        out.append(event)
    return out + _chain_order(run)


def _chain_order(stored: list[Any]) -> list[Any]:
    """Each store after the store in this run whose last block is its parent; otherwise in arrival order."""
    by_last = {}
    for i, event in enumerate(stored):
        if event.block_hashes:
            by_last.setdefault(event.block_hashes[-1], i)
    placed = [False] * len(stored)
    ordered: list[Any] = []
    for i in range(len(stored)):
        chain = []
        j: int | None = i
        while j is not None and not placed[j]:
            placed[j] = True
            chain.append(j)
            parent = stored[j].parent_block_hash
            j = by_last.get(parent) if parent is not None else None
        ordered += [stored[k] for k in reversed(chain)]
    return ordered
