"""A real Prometheus scraping a real vLLM (CPU engine, offloading through the Spillway connector's
host-memory backend) under a workload that preempts, re-reads prompts and overflows the pool, and the
kv-aware router (`spillway route`) in front of it for the re-read prompts: every dashboard query and every
recording rule must return data, and every rule must evaluate.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import time
import urllib.request

import pytest
from obs_files import RULE_FILES, alerting_rules, load_boards, query_panels, recording_rules, require_binary
from prometheus_server import JOB, PrometheusServer
from spillway.core import k8s_names, routing
from spillway.core import vllm_api as V
from spillway.observability import dashboards
from spillway.observability import recording as rec
from support import TinyLlama, VllmServer, require_vllm
from support.vllm_router import SpillwayRouter

pytestmark = pytest.mark.engine

# Labels a PodMonitor scrape would add; the static scrape config below adds the same.
NAMESPACE, POD = "spillway-observability", "tiny-llama-0"
ROUTER_POD = "tiny-llama-router-0"  # its series name the worker by URL; the dashboard names it as POD
# Engine: 48 blocks of 32 tokens (CPU attention wants multiples of 32), no GPU-side prefix cache, so a
# re-read prompt can only come back from the CPU pool. Pool: 32 chunks (one block each).
BLOCK_SIZE, GPU_BLOCKS, POOL_CHUNKS, MAX_MODEL_LEN, MAX_SEQS = 32, 48, 32, 1280, 8
ROUNDS = 2  # counters created on first use need an increase after their first scrape to have a rate
# Whether a preempted request's blocks are still in the pool when it resumes depends on the order in which the
# 8 requests run and are preempted, which a loaded machine moves: a round may reload none, and a counter first
# raised in the last round has no rate yet. Rounds go on, up to this many, until that rate shows.
MAX_ROUNDS = 4
# This engine has a CPU pool and no disk tier, so the disk tier's series (ours and vLLM's tiering metrics)
# cannot have data here; tests/connector/test_disk_tier_engine.py reads them from an engine that has one.
DISK_TIER_SERIES = "kv_offload_tier"
VERSION_PATH = "/version"


def _post(server: VllmServer, prompt: list[int], max_tokens: int, via: str | None = None) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0}
    url = f"{via}{V.COMPLETIONS_PATH}" if via else server.url(V.COMPLETIONS_PATH)
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["usage"]


def drive(server: VllmServer, router: SpillwayRouter, round_index: int) -> None:
    seed = 1000 * round_index
    # 8 requests of 5 prompt blocks growing to 12: more than the 48 GPU blocks, so vLLM preempts;
    # their KV is stored in the pool as it is computed and reloaded when they resume.
    prompts = [server.token_ids(160, seed=seed + i) for i in range(MAX_SEQS)]
    with concurrent.futures.ThreadPoolExecutor(MAX_SEQS) as pool:
        list(pool.map(lambda prompt: _post(server, prompt, 200), prompts))
    # A prompt read twice: the second read finds its 4 blocks in the pool. Through the router: a new prefix,
    # then its 4 blocks matched where they were sent.
    reread = server.token_ids(4 * BLOCK_SIZE + 8, seed=seed + 500)
    _post(server, reread, 1, via=router.base_url)
    _post(server, reread, 1, via=router.base_url)
    # A prompt of more blocks than the pool holds: its stores fail to allocate.
    _post(server, server.token_ids((POOL_CHUNKS + 6) * BLOCK_SIZE, seed=seed + 900), 1)


@pytest.fixture(scope="module")
def engine():
    prometheus_binary = require_binary("prometheus")  # before the slow engine start
    require_vllm()
    from spillway_connector.host_backend import cpu_offload_args

    pool_bytes = POOL_CHUNKS * BLOCK_SIZE * TinyLlama().kv_bytes_per_token
    server = VllmServer(num_gpu_blocks=GPU_BLOCKS, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN,
                        max_num_seqs=MAX_SEQS, prefix_caching=False, extra_args=cpu_offload_args(pool_bytes))
    with server, SpillwayRouter([server.base_url], block_size=BLOCK_SIZE) as router:
        yield server, router, prometheus_binary


@pytest.fixture(scope="module")
def prometheus(engine):
    server, router, binary = engine
    assert routing.ROUTER_METRICS_PATH == V.METRICS_PATH  # one scrape job for both
    targets = [(f"127.0.0.1:{server.port}", {"namespace": NAMESPACE, "pod": POD, "container": k8s_names.CONTAINER_VLLM}),
               (f"127.0.0.1:{router.metrics_port}", {"namespace": NAMESPACE, "pod": ROUTER_POD, "container": k8s_names.CONTAINER_ROUTER})]
    with PrometheusServer(binary, targets, RULE_FILES, metrics_path=V.METRICS_PATH) as prom:
        assert prom.wait_for(f'count(up{{job="{JOB}"}} == 1) == 2'), prom.log_tail()
        started = time.monotonic()
        rounds = 0
        while rounds < ROUNDS or (rounds < MAX_ROUNDS and not _positive(prom, rec.PREEMPTED_RELOADS_RATE)):
            drive(server, router, rounds)
            prom.wait_for_evaluation(since=time.time())  # a scrape and a rule evaluation after each round
            rounds += 1
        print(f"\nworkload: {time.monotonic() - started:.0f}s for {rounds} rounds")
        yield prom


def _positive(prom: PrometheusServer, expr: str) -> bool:
    return any(v > 0 for v in finite_values(prom.query(expr)))


@pytest.fixture(scope="module")
def vllm_version(engine) -> tuple[int, int]:
    server, _, _ = engine
    with urllib.request.urlopen(server.url(VERSION_PATH), timeout=30) as response:
        major, minor = json.load(response)["version"].split(".")[:2]
    return int(major), int(minor)


def substitute(expr: str) -> str:
    """What Grafana sends with this pod selected in the template variables."""
    values = {dashboards.NAMESPACE_VAR: NAMESPACE, dashboards.MODEL_VAR: "tiny-llama", dashboards.POD_VAR: POD}
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr.replace(dashboards.RATE_INTERVAL, "1m")


def finite_values(result: list[dict]) -> list[float]:
    return [float(sample["value"][1]) for sample in result if math.isfinite(float(sample["value"][1]))]


def _targets() -> list:
    cases = []
    for filename, board in load_boards().items():
        for panel in query_panels(board):
            for target in panel["targets"]:
                case_id = f"{filename}:{panel['title']}:{target['refId']}"
                cases.append(pytest.param(target["expr"], id=case_id))
    return cases


@pytest.mark.parametrize("expr", _targets())
def test_dashboard_query_returns_data(prometheus, vllm_version, expr):
    if DISK_TIER_SERIES in expr:
        pytest.skip("a disk-tier series: this engine runs without the tier")
    for metric, minimum in dashboards.MIN_VLLM.items():
        if metric in expr and vllm_version < minimum:
            pytest.skip(f"{metric} is exported from vLLM {minimum[0]}.{minimum[1]}; this engine runs "
                        f"{vllm_version[0]}.{vllm_version[1]}")
    result = prometheus.query(substitute(expr))
    assert result, f"no data: {substitute(expr)}"
    assert all(sample["metric"].get("pod") == POD for sample in result)
    assert finite_values(result), result


@pytest.mark.parametrize("record", sorted({rule["record"] for rule in recording_rules()}))
def test_recording_rule_returns_data(prometheus, record):
    if DISK_TIER_SERIES in record:
        pytest.skip("a disk-tier series: this engine runs without the tier")
    result = prometheus.query(record)
    assert result, f"no data for {record}"
    assert finite_values(result), result


def test_template_variables_find_the_pod(prometheus):
    board = next(iter(load_boards().values()))
    variables = {v["name"]: v for v in board["templating"]["list"] if v["type"] == "query"}
    expected = {dashboards.NAMESPACE_VAR: NAMESPACE, dashboards.MODEL_VAR: "tiny-llama", dashboards.POD_VAR: POD}
    for name, value in expected.items():
        query = variables[name]["query"]  # label_values(<selector>, <label>)
        selector, label = query[len("label_values("):-1].rsplit(", ", 1)
        assert value in prometheus.label_values(label, substitute(selector)), query


def test_every_rule_evaluates_without_error(prometheus):
    rules = prometheus.rules()
    assert len(rules) == len(recording_rules()) + len(alerting_rules())
    bad = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert not bad, bad


def test_workload_exercised_offloading(prometheus):
    """The data above is offloading at work: preemptions, reloads, hits, failures, both copy directions."""
    from spillway.observability import recording as rec

    def value(expr: str) -> float:
        values = finite_values(prometheus.query(expr))
        assert values, expr
        return max(values)

    figures = {
        "preemptions/s": value(rec.PREEMPTIONS_RATE),
        "preempted reloads/s": value(rec.PREEMPTED_RELOADS_RATE),
        "CPU hit rate": value(rec.HIT_RATIO),
        "prompt tokens/s from the host tier": value(f'{rec.CACHED_TOKENS_BY_SOURCE_RATE}{{source="{V.CacheHitSource.HOST}"}}'),
        "allocation failures/s": value(rec.ALLOCATION_FAILURES_RATE),
        "store GB/s (mean)": value(f'{rec.DMA_GBPS_MEAN}{{direction="{rec.STORE}"}}'),
        "load GB/s (mean)": value(f'{rec.DMA_GBPS_MEAN}{{direction="{rec.LOAD}"}}'),
        "load GB/s (p50)": value(f'{rec.DMA_GBPS_P50}{{direction="{rec.LOAD}"}}'),
    }
    print("\n" + "\n".join(f"{name}: {figure:.4g}" for name, figure in figures.items()))
    assert all(figure > 0 for figure in figures.values()), figures
