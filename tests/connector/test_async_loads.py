"""may_load_async (vLLM 0.34's `--max-num-inflight-kv-loads` path) asks the pool for the chunk vLLM would look up first.

The truth is vLLM's own keying: `RequestOffloadState.update_offload_keys` turns a request's block hashes into the
offload keys its lookup asks the manager for, in order. For random requests, chunk sizes and group indexes and a
random subset of those keys held by the pool, Spillway's answer must be "held" exactly when vLLM's first key is.
test_vllm_sources.py runs this file on 0.33's and 0.34's sources too.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

from spillway_connector.async_loads import first_chunk_held
from spillway_connector.compat import LookupResult


class _Pool:
    """The manager's lookup over a set of held keys; records every key it was asked for."""

    def __init__(self, held: set, pending: set = frozenset()):
        self.held, self.pending, self.asked = held, pending, []

    def lookup(self, key, req_context):
        self.asked.append(key)
        if key in self.pending:
            return LookupResult.HIT_PENDING
        return LookupResult.HIT if key in self.held else LookupResult.MISS


def _vllm_keys(block_hashes: list[bytes], hashes_per_chunk: int, group_idx: int) -> list:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        RequestGroupState,
        RequestOffloadState,
    )

    state = RequestOffloadState.__new__(RequestOffloadState)  # only what update_offload_keys reads
    state.config = SimpleNamespace(kv_group_configs=(SimpleNamespace(
        group_idx=group_idx, hashes_per_chunk=hashes_per_chunk, tokens_per_chunk=16 * hashes_per_chunk),))
    state.req = SimpleNamespace(block_hashes=block_hashes)
    state.req_context = SimpleNamespace(set_offload_key_position=lambda key, tokens: None)
    state.group_states = (RequestGroupState(),)
    state.update_offload_keys()
    return state.group_states[0].offload_keys


def _scheduler(pool: _Pool, hashes_per_chunk: int, group_idx: int, request_id: str, **state) -> SimpleNamespace:
    group = SimpleNamespace(group_idx=group_idx, hashes_per_chunk=hashes_per_chunk)
    req_state = SimpleNamespace(req_context=object(), **state)
    return SimpleNamespace(config=SimpleNamespace(kv_group_configs=(group,)), manager=pool,
                           _req_status={request_id: req_state})


def test_held_exactly_when_vllms_first_lookup_key_is_held():
    rng = random.Random(34)
    seen = {True: 0, False: 0}
    for case in range(2000):
        hashes_per_chunk, group_idx = rng.choice([1, 2, 4]), rng.randrange(0, 3)
        block_hashes = [rng.randbytes(8) for _ in range(rng.randrange(0, 12))]
        keys = _vllm_keys(block_hashes, hashes_per_chunk, group_idx)
        held = {key for key in keys if rng.random() < 0.5}
        # a key of a neighbouring block or group, held, must not make the answer "held"
        decoys = {k for k in _vllm_keys(block_hashes, 1, group_idx) + _vllm_keys(block_hashes, hashes_per_chunk,
                                                                                 group_idx + 1) if k not in keys}
        pool = _Pool(held | decoys)
        request = SimpleNamespace(request_id=f"r{case}", block_hashes=block_hashes)
        ours = first_chunk_held(_scheduler(pool, hashes_per_chunk, group_idx, request.request_id), request)
        expected = bool(keys) and keys[0] in held
        assert ours == expected, (hashes_per_chunk, group_idx, len(block_hashes), keys[:1], pool.asked)
        assert len(pool.asked) <= 1  # one lookup: vLLM asks this every time a request enters a waiting queue
        seen[ours] += 1
    assert seen[True] > 200 and seen[False] > 200


def test_a_chunk_still_being_stored_counts_as_held():
    hashes = [bytes([i]) * 8 for i in range(4)]
    first = _vllm_keys(hashes, 2, 0)[0]
    request = SimpleNamespace(request_id="r", block_hashes=hashes)
    assert first_chunk_held(_scheduler(_Pool(set(), pending={first}), 2, 0, "r"), request)


def test_requests_vllm_would_not_load_for_are_not_named():
    hashes = [bytes([i]) * 8 for i in range(4)]
    held = set(_vllm_keys(hashes, 1, 0))
    request = SimpleNamespace(request_id="r", block_hashes=hashes)
    assert first_chunk_held(_scheduler(_Pool(held), 1, 0, "r"), request)
    assert not first_chunk_held(_scheduler(_Pool(held), 1, 0, "r", load_failed=True), request)
    skipping = SimpleNamespace(request_id="r", block_hashes=hashes, skip_reading_external_kv=True)
    assert not first_chunk_held(_scheduler(_Pool(held), 1, 0, "r"), skipping)
    assert not first_chunk_held(_scheduler(_Pool(held), 1, 0, "other"), request)  # no state: not asked yet
