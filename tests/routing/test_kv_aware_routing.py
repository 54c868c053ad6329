"""Two real vLLM CPU replicas with CPU offloading and KV events, behind the real vllm-router (PyPI wheel).

The same multi-tenant workload (12 prefix groups x 4 prompts, `spillway loadtest prefix-groups`) goes through
a round_robin router and a kv_aware router in front of the same two replicas, one request at a time. Sizes make
the difference measurable on two cores:
- the engines run without GPU prefix caching, so every prefix hit is a CPU-pool hit and every KV event the
  router indexes is a CPU-medium one (vLLM publishes GPU-medium events only for its prefix cache);
- each replica's CPU pool holds 38 chunks: the 6 groups of 6 chunks that kv_aware keeps on one replica fit;
  round_robin spreads all 12 over both, so a group's next prompt often lands where LRU has evicted it.
The figures of both policies print with the test (the table of `spillway loadtest prefix-groups report`).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from spillway.core import router_api as R
from spillway.core import routing
from spillway.core import vllm_api as V
from spillway.loadtest import prefix_groups
from spillway_connector.host_backend import cpu_offload_args
from support import TinyLlama, VllmServer, require_vllm
from support.tools import require_binary
from support.vllm_router import VllmRouter
from support.vllm_server import free_port

pytestmark = pytest.mark.engine

BLOCK = 32  # the CPU attention kernel takes multiples of 32
GPU_BLOCKS = 9  # 8 usable: one 208-token prompt at a time
MAX_MODEL_LEN = (GPU_BLOCKS - 1) * BLOCK
POOL_CHUNKS = 38
GROUPS, PROMPTS_PER_GROUP = 12, 4
PREFIX_LEN, QUESTION_LEN = 6 * BLOCK, 16  # the question is shorter than a block: only prefixes are offloaded
REPLICAS = 2
MODEL = TinyLlama()


def _replica() -> VllmServer:
    port = free_port()
    server = VllmServer(
        model=MODEL, num_gpu_blocks=GPU_BLOCKS, block_size=BLOCK, max_model_len=MAX_MODEL_LEN, max_num_seqs=2,
        prefix_caching=False,
        extra_args=[*cpu_offload_args(POOL_CHUNKS * BLOCK * MODEL.kv_bytes_per_token,
                                      extra={V.EXTRA_SELF_DESCRIBING_KV_EVENTS: True}),
                    V.FLAG_KV_EVENTS_CONFIG, routing.kv_events_flag_value(port)],
        env={V.ENV_PYTHONHASHSEED: V.PYTHONHASHSEED_VALUE},
    )
    server.kv_events_endpoint = f"tcp://127.0.0.1:{port}"  # the publisher binds tcp://*:port
    return server


@pytest.fixture(scope="module")
def replicas():
    require_vllm()
    servers = [_replica() for _ in range(REPLICAS)]
    try:
        for server in servers:  # both start at once, from this thread (they stop when their launcher ends)
            server.launch()
        for server in servers:
            server.wait_started()
        yield servers
    finally:
        for server in servers:
            server.close()


@pytest.fixture(scope="module")
def run(replicas, tmp_path_factory) -> dict:
    binary = require_binary(R.ROUTER_COMMAND)
    urls = [s.base_url for s in replicas]
    output = tmp_path_factory.mktemp("prefix-groups") / "result.json"
    with VllmRouter(urls, policy=R.POLICY_ROUND_ROBIN, binary=binary) as rr, \
         VllmRouter(urls, policy=R.POLICY_KV_AWARE, binary=binary, block_size=BLOCK, model=replicas[0].model,
                    event_sources={s.base_url: s.kv_events_endpoint for s in replicas}) as kv:
        cmd = [sys.executable, "-m", "spillway.cli", "loadtest", prefix_groups.EXPERIMENT, "run",
               "--route", f"{rr.policy}={rr.base_url}", "--route", f"{kv.policy}={kv.base_url}",
               "--router-metrics", f"{rr.policy}={rr.metrics_url}", "--router-metrics", f"{kv.policy}={kv.metrics_url}",
               *[arg for url in urls for arg in ("--replica", url)],
               "--groups", str(GROUPS), "--prompts-per-group", str(PROMPTS_PER_GROUP),
               "--prefix-len", str(PREFIX_LEN), "--question-len", str(QUESTION_LEN), "--concurrency", "1",
               "--seed", "1", "--progress", "none", "--output", str(output)]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nround_robin router:\n{rr.log_tail()}\n" \
                                     f"kv_aware router:\n{kv.log_tail()}"
    result = json.loads(output.read_text())
    result["stdout"] = done.stdout
    return result


def _route(result: dict, name: str) -> dict:
    return next(r for r in result["routes"] if r["name"] == name)


def test_prints_both_policies(run, capsys):
    with capsys.disabled():
        print(f"\n{run['stdout']}")
    assert [r["name"] for r in run["routes"]] == [R.POLICY_ROUND_ROBIN, R.POLICY_KV_AWARE]
    for route in run["routes"]:
        assert route["errors"] == 0 and route["ok"] == GROUPS * PROMPTS_PER_GROUP
        assert route["prompt_tokens_per_s"] > 0 and route["ttft_s"]["p50"] > 0


def test_kv_aware_beats_round_robin_by_a_clear_margin(run):
    """Each pool holds the 6 groups kv_aware keeps on its replica. Under round_robin a group's prompt finds its
    prefix only where one of its recent prompts landed: with two replicas and random order that is about 60% of
    the time (a window of ~1.4 of its prompts, each on this replica with odds 1/2), so the expected ratio is about
    1.6x; runs measured 1.6x and 1.9x. 1.4x still fails a router that ignores the events (it ties with
    round_robin)."""
    rr, kv = _route(run, R.POLICY_ROUND_ROBIN), _route(run, R.POLICY_KV_AWARE)
    assert kv["cpu_hit_rate"] >= 1.4 * rr["cpu_hit_rate"], (rr["cpu_hit_rate"], kv["cpu_hit_rate"])
    # 6 of a prompt's 6.5 blocks are its group's prefix: kv_aware finds nearly all of them.
    assert kv["cpu_hit_rate"] > 0.85


def test_round_robin_balances_and_kv_aware_still_uses_both_replicas(run):
    rr, kv = _route(run, R.POLICY_ROUND_ROBIN), _route(run, R.POLICY_KV_AWARE)
    assert [x["requests"] for x in rr["replicas"]] == [GROUPS * PROMPTS_PER_GROUP / REPLICAS] * REPLICAS
    assert all(x["requests"] > 0 for x in kv["replicas"]), kv["replicas"]


def test_the_router_credited_cpu_medium_blocks(run):
    """The kv_aware router found prefixes in its index of the replicas' KV events; without GPU prefix caching
    the only events the replicas publish are their CPU pools' (medium CPU)."""
    kv = _route(run, R.POLICY_KV_AWARE)
    decisions = {k: v for k, v in kv["router"].items() if k.startswith(R.METRIC_PREFIX_ROUTING_DECISIONS)}
    assert sum(decisions.values()) >= GROUPS * PROMPTS_PER_GROUP, kv["router"]
    hits = sum(v for k, v in kv["router"].items() if k.startswith(R.METRIC_KV_PLACEMENT_LOOKUPS) and "hit" in k)
    assert hits > 0, kv["router"]
