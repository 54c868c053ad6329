"""The connector's one-pass pin and release of a load against vLLM's own CPUOffloadingManager.prepare_load and
complete_load.

Two of vLLM's CPU managers (LRU) get the same random sequence of requests that store, look up, load (pinning
chunks, sometimes two loads of one chunk at once), finish and evict (the pool is small); one pins and releases
loads with vLLM's prepare_load and complete_load, the other with spillway_connector.batched_pin's and
batched_release's (each alone, and both). Every answer (lookups, chunks and
evictions of each store, chunks of each load) and the pools at the end must be the same. test_vllm_sources.py
runs this file on 0.33's and 0.34's sources too; on 0.26, whose manager is another, it skips.
"""
from __future__ import annotations

import random

import pytest
from spillway_connector.batched_pin import batched_prepare_load
from spillway_connector.batched_release import batched_complete_load
from spillway_connector.compat import lru_manager_functions

pytestmark = pytest.mark.skipif(not lru_manager_functions(), reason="vLLM 0.26's manager: vLLM's path only")


def _managers(capacity: int, policy: str = "lru"):
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    return CPUOffloadingManager(capacity, cache_policy=policy), CPUOffloadingManager(capacity, cache_policy=policy)


def _key(i: int):
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(i.to_bytes(16, "big"), 0)


def _drive(manager, release, steps: list, pin=None) -> list:
    """Run `steps` on `manager`, pinning loads with `pin` (default: the manager's prepare_load) and releasing them
    with `release`; everything it answered."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    answers, pinned = [], []
    for step, (req, prefix) in enumerate(steps):
        context = ReqContext(req_id=f"r{step}")
        manager.on_new_request(context)
        keys = [_key(req * 100 + i) for i in range(prefix)]
        for position, key in enumerate(keys, 1):
            context.set_offload_key_position(key, position * 32)
        hits = []
        for key in keys:
            result = manager.lookup(key, context)
            answers.append(result.name)
            if result is not LookupResult.HIT:
                break
            hits.append(key)
        if hits:
            answers.append([int(b) for b in (pin or manager.prepare_load)(hits, context).block_ids])
            pinned.append((hits, context))
        if len(pinned) > 1 or (pinned and step % 3 == 0):  # loads overlap: a chunk can have two readers
            done, done_context = pinned.pop(0)
            release(done, done_context)
        output = manager.prepare_store(keys, context)
        if output is None:
            answers.append(None)
        else:
            answers.append((list(output.keys_to_store), list(output.evicted_keys),
                            [int(b) for b in output.store_spec.block_ids]))
            manager.complete_store(output.keys_to_store, context)
        manager.on_request_finished(context)
    for done, done_context in pinned:
        release(done, done_context)
    policy = manager._policy
    answers.append((sorted(policy.chunks), sorted(policy._evictable), manager._num_evictable_cache_chunks))
    answers.append([key for key, _ in policy.evict(len(policy._evictable), set())])  # the whole eviction order
    return answers


@pytest.mark.parametrize("batched", [batched_complete_load, batched_prepare_load])
def test_it_applies_to_vllms_manager_with_lru_only(batched):
    plain, _ = _managers(8)
    assert batched(plain) is not None
    arc, _ = _managers(8, "arc")
    assert batched(arc) is None
    assert batched(object()) is None


@pytest.mark.parametrize("seed", range(6))
def test_same_answers_and_pool_as_vllms_complete_load(seed):
    rng = random.Random(seed)
    steps = [(rng.randrange(0, 12), rng.randrange(1, 14)) for _ in range(300)]
    theirs, ours = _managers(48)
    expected = _drive(theirs, theirs.complete_load, steps)
    assert _drive(ours, batched_complete_load(ours), steps) == expected
    assert any(isinstance(a, tuple) and a[1] for a in expected), "the workload never evicted"
    assert any(isinstance(a, list) and a and isinstance(a[0], int) for a in expected), "the workload never loaded"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("both", [False, True], ids=["pin", "pin-and-release"])
def test_same_answers_and_pool_as_vllms_prepare_load(seed, both):
    rng = random.Random(100 + seed)
    steps = [(rng.randrange(0, 12), rng.randrange(1, 14)) for _ in range(300)]
    theirs, ours = _managers(48)
    expected = _drive(theirs, theirs.complete_load, steps)
    release = batched_complete_load(ours) if both else ours.complete_load
    assert _drive(ours, release, steps, pin=batched_prepare_load(ours)) == expected
    assert any(isinstance(a, list) and a and isinstance(a[0], int) for a in expected), "the workload never loaded"


def test_pinning_a_chunk_not_ready_fails_as_vllms_does():
    from vllm.v1.kv_offload.base import ReqContext

    theirs, ours = _managers(8)
    for manager in (theirs, ours):
        context = ReqContext(req_id="r")
        manager.on_new_request(context)
        output = manager.prepare_store([_key(1)], context)  # stored, not yet complete: not ready to read
        assert list(output.keys_to_store) == [_key(1)]
    with pytest.raises(AssertionError, match="not ready for reading"):
        theirs.prepare_load([_key(1)], ReqContext(req_id="t"))
    with pytest.raises(AssertionError, match="not ready for reading"):
        batched_prepare_load(ours)([_key(1)], ReqContext(req_id="o"))
