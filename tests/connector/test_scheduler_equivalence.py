"""Spillway's cheaper scheduler side does what vLLM's OffloadingConnector does, on real `vllm serve` engines.

The same workload runs, one request at a time (so both engines schedule the same steps), on an engine with vLLM's
own OffloadingConnector and on one with SpillwayOffloadingConnector, both over the host-memory backend, stats on,
GPU prefix caching on with an engine cache too small to keep every prompt: prompts are stored to the pool, then
asked again whole (served from the pool, or partly from the engine's cache), by a prefix (a partial pool hit) and
fresh (a miss). Equal greedy outputs, equal hits per tier (vllm:prompt_tokens_cached_by_source, which the
connector's get_external_cache_hit_sources feeds), equal pool hits and queries, equal bytes and counts loaded and
stored.
"""
from __future__ import annotations

import pytest
from spillway.core import vllm_api as V
from spillway_connector import transfer_config as tc
from spillway_connector.host_backend import kv_transfer_config
from support import VllmServer, require_vllm
from support.kv_weights import KvSensitiveLlama
from support.ms_cluster import eventually
from support.offload_workload import complete
from support.promtext import total

pytestmark = pytest.mark.engine

BLOCK = 32
MODEL = KvSensitiveLlama()  # weights under which KV decides the output (support/kv_weights.py)
ENGINE_BLOCKS = 40  # 39 usable: the 6 stored prompts (52 blocks) do not all stay in the engine's cache
PROMPTS = [(seed, blocks * BLOCK + tail) for seed, (blocks, tail) in enumerate([(8, 1), (9, 7), (8, 0), (10, 13),
                                                                                  (8, 5), (7, 31)])]
OUTPUT = 8
COUNTERS = [V.Metric.EXTERNAL_HITS, "vllm:external_prefix_cache_queries", V.Metric.OFFLOAD_LOAD_BYTES,
            V.Metric.OFFLOAD_STORE_BYTES, "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"]
HISTOGRAM_COUNTS = ["vllm:kv_offload_load_size_count", "vllm:kv_offload_store_size_count"]
SOURCES = ["device", "host", "disk", "p2p", "external_unspecified"]


def _run(connector: str) -> dict:
    config = kv_transfer_config(256 * BLOCK * MODEL.kv_bytes_per_token)  # 256 chunks: no eviction from the pool
    if connector == tc.OFFLOADING_CONNECTOR:
        config[tc.KV_CONNECTOR_KEY] = tc.OFFLOADING_CONNECTOR
        config.pop(tc.KV_CONNECTOR_MODULE_PATH_KEY)
    with VllmServer(model=MODEL, block_size=BLOCK, num_gpu_blocks=ENGINE_BLOCKS, max_model_len=16 * BLOCK,
                    max_num_seqs=4, extra_args=[tc.FLAG_KV_TRANSFER_CONFIG, tc.flag_value(config)]) as server:
        prompts = [server.token_ids(tokens, seed=seed) for seed, tokens in PROMPTS]
        outputs = []

        def stored() -> float:
            return total(server.metrics_text(), V.Metric.OFFLOAD_STORE_BYTES + "_total")

        for prompt in prompts:
            outputs.append(complete(server, prompt, OUTPUT))
        full_blocks = sum(len(p) // BLOCK for p in prompts)
        # stores finish after the requests return; a request must not race its own prompt's store
        eventually(lambda: stored() >= full_blocks * BLOCK * MODEL.kv_bytes_per_token, timeout=120,
                   what="every prompt's full blocks stored")
        asked = [*prompts, prompts[1][: 3 * BLOCK] + server.token_ids(40, seed=100),
                 prompts[3][: 6 * BLOCK + 5] + server.token_ids(70, seed=101), server.token_ids(200, seed=102),
                 prompts[0], prompts[4]]
        for prompt in asked:
            outputs.append(complete(server, prompt, OUTPUT))
        # the last request's stats and stores reach /metrics a step or two after it returns
        eventually(lambda: total(server.metrics_text(), "vllm:request_success_total") >= len(outputs), timeout=60,
                   what="every request counted")
        text = server.metrics_text()
        settled = total(text, V.Metric.OFFLOAD_STORE_BYTES + "_total")
        eventually(lambda: stored() == settled and total(server.metrics_text(), "vllm:prompt_tokens_total")
                   == total(text, "vllm:prompt_tokens_total"), timeout=30, what="the counters settled")
        text = server.metrics_text()
    figures = {name: total(text, name + "_total") for name in COUNTERS}
    figures |= {name: total(text, name) for name in HISTOGRAM_COUNTS}
    figures |= {f"cached_by_source[{source}]": total(text, V.Metric.PROMPT_TOKENS_CACHED_BY_SOURCE + "_total",
                                                      source=source) for source in SOURCES}
    return {"outputs": outputs, "figures": figures}


@pytest.fixture(scope="module")
def runs() -> dict:
    require_vllm()
    return {connector: _run(connector) for connector in (tc.OFFLOADING_CONNECTOR, tc.SPILLWAY_CONNECTOR)}


def test_the_workload_hits_the_pool_and_the_engine_cache(runs):
    figures = runs[tc.OFFLOADING_CONNECTOR]["figures"]
    assert figures["cached_by_source[host]"] > 0, figures
    assert figures[V.Metric.EXTERNAL_HITS] == figures["cached_by_source[host]"], figures
    assert figures[V.Metric.OFFLOAD_LOAD_BYTES] > 0, figures
    # a partial pool hit: fewer tokens hit than asked for beyond the engine's cache
    assert figures[V.Metric.EXTERNAL_HITS] < figures["vllm:external_prefix_cache_queries"], figures


def test_same_hits_loads_and_stores_as_vllms_connector(runs):
    assert runs[tc.SPILLWAY_CONNECTOR]["figures"] == runs[tc.OFFLOADING_CONNECTOR]["figures"]


def test_same_greedy_outputs_as_vllms_connector(runs):
    theirs, ours = runs[tc.OFFLOADING_CONNECTOR]["outputs"], runs[tc.SPILLWAY_CONNECTOR]["outputs"]
    assert all(len(tokens) == OUTPUT for tokens in theirs)
    assert ours == theirs
