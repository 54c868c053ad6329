"""Which tier a loaded external hit came from, without sweeping every chunk's range.

With stats on (`vllm serve`'s default), vLLM's scheduler asks the connector, for every request that loads from
the pool, how many of its loaded tokens came from which tier. OffloadingConnectorScheduler answers by sorting
two endpoints per loaded chunk and building, at each endpoint, the list of active tiers and its outermost one:
at 100% CPU hit that was the connector's costliest scheduler-side hook per request after the load itself
(bench/scheduler-side). A request's chunks are consecutive and nearly always from one
tier, so this first merges each run of touching or overlapping ranges of the same tier (which leaves the tier
of every token unchanged) and sweeps the few ranges left, or none when one is left.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from spillway_connector.compat import CacheHitSource


def external_hit_sources(
    key_ranges: Iterable[tuple[int, int, Any]], start: int, end: int, load_source: Callable[[Any], Any]
) -> dict[Any, int]:
    """vLLM's OffloadingConnectorScheduler.get_external_cache_hit_sources (0.32 and 0.33 alike) for the hit
    [start, end): tokens per tier, where a token's tier is the outermost tier of the ranges covering it and
    `external_unspecified` where none does; in the order each tier first appears from `start` on.
    `key_ranges`: (first token, end token, key) per loaded key; `load_source(key)`: its tier."""
    unspecified = CacheHitSource.EXTERNAL_UNSPECIFIED
    merged: list[list[Any]] = []  # [lo, hi, tier]
    for lo, hi, key in key_ranges:
        lo, hi = max(start, lo), min(end, hi)
        if lo >= hi:
            continue
        tier = CacheHitSource(load_source(key))
        if merged:
            last = merged[-1]
            if last[2] is tier and lo <= last[1] and hi >= last[0]:
                last[0], last[1] = min(lo, last[0]), max(hi, last[1])
                continue
        merged.append([lo, hi, tier])
    sources: dict[Any, int] = {}
    if len(merged) <= 1:
        lo, hi, tier = merged[0] if merged else (end, end, unspecified)
        if lo > start:
            sources[unspecified] = lo - start
        if hi > lo:
            sources[tier] = sources.get(tier, 0) + hi - lo
        if end > hi:
            sources[unspecified] = sources.get(unspecified, 0) + end - hi
        return sources
    # vLLM's sweep, over the merged ranges
    events: list[tuple[int, int, Any]] = [(end, 0, unspecified)]
    for lo, hi, tier in merged:
        events.extend(((lo, 1, tier), (hi, -1, tier)))
    active: Counter = Counter()
    position = start
    for boundary, delta, tier in sorted(events):
        if boundary > position:
            tiers = [t for t, count in active.items() if count > 0]
            outer = CacheHitSource.outermost(tiers) if tiers else unspecified
            sources[outer] = sources.get(outer, 0) + boundary - position
        active[tier] += delta
        position = boundary
    return sources
