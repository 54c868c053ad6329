"""A real `vllm serve` on the CPU with SpillwayOffloadingConnector and the host-memory backend.

One engine for the module. A tiny GPU KV cache (16 blocks of 32 tokens, prefix caching off, so
every cache hit comes from the CPU pool) and four concurrent requests of 160 tokens force
preemptions. Phase "alone" runs each prompt by itself: nothing is in the pool for it and its 5
blocks fit, so no KV is loaded from the pool (checked on /metrics) and its greedy output is the
output without offloading. Phase "pressure" runs the same prompts together: they are served from
the pool, preempted, and reloaded; their greedy outputs must not change.
"""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from promtext import samples, total
from spillway import vllm_api as V
from spillway_connector import names
from spillway_connector.host_backend import cpu_offload_args
from support import SERVED_MODEL_NAME, TinyLlama, VllmServer, vllm_server_fixture

pytestmark = pytest.mark.engine

BLOCK_TOKENS = 32
GPU_BLOCKS = 16
PROMPT_TOKENS = 3 * BLOCK_TOKENS
OUTPUT_TOKENS = 2 * BLOCK_TOKENS
NUM_PROMPTS = 6
CONCURRENCY = 4  # 4 x 5 blocks > 15 usable blocks: preemption
CHUNK_BYTES = TinyLlama().kv_bytes_per_token * BLOCK_TOKENS
POOL_CHUNKS = 64
POOL_BYTES = POOL_CHUNKS * CHUNK_BYTES

server = vllm_server_fixture(
    num_gpu_blocks=GPU_BLOCKS,
    block_size=BLOCK_TOKENS,
    max_model_len=8 * BLOCK_TOKENS,
    max_num_seqs=CONCURRENCY,
    prefix_caching=False,
    extra_args=cpu_offload_args(POOL_BYTES),
)


def complete(server: VllmServer, prompt: list[int]) -> list[int]:
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        server.url(V.COMPLETIONS_PATH), json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def run(server: VllmServer) -> dict:
    prompts = [server.token_ids(PROMPT_TOKENS, seed=seed) for seed in range(NUM_PROMPTS)]
    alone = [complete(server, prompt) for prompt in prompts]
    after_alone = server.metrics_text()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        pressure = list(pool.map(lambda prompt: complete(server, prompt), prompts))
    return {"alone": alone, "after_alone": after_alone, "pressure": pressure, "final": server.metrics_text()}


def test_alone_phase_loads_nothing_from_the_pool(run):
    text = run["after_alone"]
    assert total(text, V.Metric.OFFLOAD_STORE_BYTES + "_total") > 0, "prompts were not stored to the pool"
    assert total(text, V.Metric.OFFLOAD_LOAD_BYTES + "_total") == 0
    assert total(text, V.Metric.PREEMPTIONS + "_total") == 0


def test_greedy_outputs_match_the_run_without_pool_loads(run):
    assert all(len(tokens) == OUTPUT_TOKENS for tokens in run["alone"])
    assert run["pressure"] == run["alone"]


def test_pressure_preempts_and_reloads_from_the_pool(run):
    text = run["final"]
    assert total(text, V.Metric.PREEMPTIONS + "_total") > 0
    assert total(text, V.Metric.EXTERNAL_HITS + "_total") > 0, "fresh requests got no CPU-pool hits"
    assert total(text, V.Metric.OFFLOAD_LOAD_BYTES + "_total") > 0
    requests = total(text, names.exported(names.PREEMPTED_RELOAD_REQUESTS))
    tokens = total(text, names.exported(names.PREEMPTED_RELOAD_TOKENS))
    queried = total(text, names.exported(names.PREEMPTED_QUERIED_TOKENS))
    assert requests >= 1
    assert tokens >= requests * BLOCK_TOKENS  # whole chunks
    assert tokens % BLOCK_TOKENS == 0
    assert queried >= tokens


def test_throughput_histogram_has_one_observation_per_transfer(run):
    text = run["final"]
    for direction, size_metric in ((names.DIRECTION_STORE, "vllm:kv_offload_store_size"),
                                   (names.DIRECTION_LOAD, "vllm:kv_offload_load_size")):
        observed = total(text, names.TRANSFER_THROUGHPUT + "_count", direction=direction)
        assert observed > 0, direction
        assert observed == total(text, size_metric + "_count"), direction
        assert total(text, names.TRANSFER_THROUGHPUT + "_sum", direction=direction) > 0


def test_metrics_carry_vllm_engine_labels(run):
    found = samples(run["final"], names.exported(names.PREEMPTED_RELOAD_REQUESTS))
    assert found
    labels = found[0][0]
    assert labels.get("model_name") == SERVED_MODEL_NAME
    assert labels.get("engine") == "0"


def test_pool_gauges(run):
    text = run["final"]
    assert total(text, names.POOL_CAPACITY_CHUNKS) == POOL_CHUNKS
    resident = total(text, names.POOL_RESIDENT_CHUNKS)
    assert NUM_PROMPTS * PROMPT_TOKENS // BLOCK_TOKENS <= resident <= POOL_CHUNKS
    assert total(text, names.exported(names.POOL_EVICTED_CHUNKS)) == 0  # the pool holds every prompt
