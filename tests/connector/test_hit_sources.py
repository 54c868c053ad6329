"""Spillway's answer to "which tier did each loaded token come from" against vLLM's own, on random load plans.

vLLM's OffloadingConnectorScheduler.get_external_cache_hit_sources runs on a bare scheduler object holding only
the request state it reads; spillway_connector.hit_sources must give the same tiers, counts and order for any
ranges (overlapping, with gaps, mixed tiers, partly outside the hit). test_vllm_sources.py runs this file on
0.33's and 0.34's sources too; on 0.26, which has no hit sources, it skips.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from spillway_connector.compat import CacheHitSource
from spillway_connector.hit_sources import external_hit_sources

pytestmark = pytest.mark.skipif(CacheHitSource is None, reason="this vLLM has no external cache hit sources")


def _vllm_answer(key_ranges, start: int, num_tokens: int, tiers: dict) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler

    scheduler = OffloadingConnectorScheduler.__new__(OffloadingConnectorScheduler)  # its state: only what it reads
    context = object()
    scheduler._req_status = {"r": SimpleNamespace(num_locally_computed_tokens=start, load_key_ranges=key_ranges,
                                                  req_context=context)}

    def get_load_source(key, req_context):
        assert req_context is context
        return tiers[key]

    scheduler.manager = SimpleNamespace(get_load_source=get_load_source)
    return scheduler.get_external_cache_hit_sources(SimpleNamespace(request_id="r"), num_tokens)


def _plan(rng: random.Random) -> tuple[list, dict]:
    ranges, tiers, position = [], {}, rng.randrange(0, 64)
    choices = list(CacheHitSource)[: rng.randrange(1, len(CacheHitSource) + 1)]
    for key in range(rng.randrange(0, 10)):
        lo = position + rng.randrange(-24, 24) if rng.random() < 0.3 else position
        hi = lo + rng.randrange(0, 48)
        ranges.append((lo, hi, key))
        tiers[key] = rng.choice(choices)
        position = hi
    return ranges, tiers


def test_random_load_plans_get_vllms_tiers_counts_and_order():
    rng = random.Random(28)
    for _ in range(5000):
        ranges, tiers = _plan(rng)
        start, num_tokens = rng.randrange(0, 64), rng.randrange(1, 256)
        theirs = _vllm_answer(ranges, start, num_tokens, tiers)
        ours = external_hit_sources(ranges, start, start + num_tokens, tiers.__getitem__)
        assert list(ours.items()) == list(theirs.items()), (ranges, tiers, start, num_tokens)


def test_a_full_hit_of_consecutive_host_chunks_is_one_host_count():
    ranges = [(i * 32, (i + 1) * 32, i) for i in range(16)]
    host = {i: CacheHitSource.HOST for i in range(16)}
    assert external_hit_sources(ranges, 0, 512, host.__getitem__) == {CacheHitSource.HOST: 512}
    assert external_hit_sources(ranges[4:], 64, 512, host.__getitem__) == {
        CacheHitSource.EXTERNAL_UNSPECIFIED: 64, CacheHitSource.HOST: 384}
