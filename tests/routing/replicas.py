"""The routing tests' three real vLLM CPU replicas and their workloads, shared by the tests and
bench/routing/routing_policies.py.

Sizes make locality measurable on two cores: the engines run without GPU prefix caching, so every prefix hit
is a CPU-pool hit and every KV event a router indexes is CPU-medium; each prompt's own part is shorter than a
block, so only prefixes are offloaded.
"""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from spillway.core import affinity as A
from spillway.core import router_api as R
from spillway.core import routing
from spillway.core import vllm_api as V
from spillway.loadtest import prefix_groups
from spillway.loadtest.prompts import PromptSource
from spillway_connector.disk_namespace import SHARE_ENV
from spillway_connector.host_backend import cpu_offload_args
from spillway_connector.host_tiering import cpu_disk_tier_args
from support import TinyLlama, VllmServer, require_vllm
from support.tools import require_binary
from support.vllm_router import SpillwayRouter, VllmRouter
from support.vllm_server import free_port

BLOCK = 32  # the CPU attention kernel takes multiples of 32
GPU_BLOCKS = 20  # two 272-token prompts at a time (max_num_seqs 2)
MAX_MODEL_LEN = (GPU_BLOCKS - 1) * BLOCK
POOL_CHUNKS = 38  # per replica: kv-aware's share of either workload fits, round robin's copies of all do not
REPLICAS = 3
MODEL = TinyLlama()
QUESTION_LEN = 16
DISK_BOUND_BYTES = 256 << 20  # per replica's slot: far more than the tests store (chunks of 16 KiB)

# 6 tenants' prefixes of 8 blocks x 8 prompts, random order, no warm-up: every prefix is new when it arrives.
TENANTS = {"name": "tenants", "groups": 6, "prompts_per_group": 8, "prefix_blocks": 8, "warmup": False}
# 12 prefixes of 6 blocks x 4 prompts after a warm-up that sends one prompt per prefix at once.
GROUPS_WORKLOAD = {"name": "groups", "groups": 12, "prompts_per_group": 4, "prefix_blocks": 6, "warmup": True}
for _w in (TENANTS, GROUPS_WORKLOAD):
    _w["args"] = ["--groups", str(_w["groups"]), "--prompts-per-group", str(_w["prompts_per_group"]),
                  "--prefix-len", str(_w["prefix_blocks"] * BLOCK), "--question-len", str(QUESTION_LEN),
                  *([] if _w["warmup"] else ["--no-warmup"])]


def best_cpu_hit(workload: dict) -> float:
    """The CPU-pool hit rate of a router that always finds the prefix: a prefix's first prompt (the warm-up's,
    where there is one) misses, every later one reads the whole prefix from the pool."""
    prefix = workload["prefix_blocks"] * BLOCK
    prompts = workload["prompts_per_group"]
    hitting = prompts if workload["warmup"] else prompts - 1
    return hitting * prefix / (prompts * (prefix + QUESTION_LEN))


def replica(disk_root: Path | None = None) -> VllmServer:
    """One replica; with `disk_root`, its pool over the node-disk tier there: replicas given the same root share
    it as one ModelServer's pods share a volume, each writing a slot of its own and reading the others'."""
    port = free_port()
    pool_bytes, extra = POOL_CHUNKS * BLOCK * MODEL.kv_bytes_per_token, {V.EXTRA_SELF_DESCRIBING_KV_EVENTS: True}
    offload = (cpu_offload_args(pool_bytes, extra=extra) if disk_root is None
               else cpu_disk_tier_args(pool_bytes, str(disk_root), DISK_BOUND_BYTES, extra=extra))
    server = VllmServer(
        model=MODEL, num_gpu_blocks=GPU_BLOCKS, block_size=BLOCK, max_model_len=MAX_MODEL_LEN, max_num_seqs=2,
        prefix_caching=False,
        # one model path, as a ModelServer's pods all name one model: vLLM names the tier's files after it
        model_dir=None if disk_root is None else disk_root.with_name(f"{disk_root.name}-model"),
        extra_args=[*offload, V.FLAG_KV_EVENTS_CONFIG, routing.kv_events_flag_value(port)],
        # one hash seed: every replica's chunk files are named alike; one share: each reads the others' slots
        env={V.ENV_PYTHONHASHSEED: V.PYTHONHASHSEED_VALUE, **({SHARE_ENV: "fleet"} if disk_root else {})},
    )
    server.kv_events_endpoint = f"tcp://127.0.0.1:{port}"  # the publisher binds tcp://*:port
    server.disk_root = disk_root
    return server


@contextlib.contextmanager
def start_replicas(count: int = REPLICAS, disk_root: Path | None = None) -> Iterator[list[VllmServer]]:
    require_vllm()
    if disk_root is not None:
        disk_root.mkdir(parents=True, exist_ok=True)
    servers = [replica(disk_root) for _ in range(count)]
    try:
        for server in servers:  # all start at once, from this thread (they stop when their launcher ends)
            server.launch()
        for server in servers:
            server.wait_started()
        yield servers
    finally:
        for server in servers:
            server.close()


# Scaled from 2 to 3 replicas between two passes of the same prompts (route name and seed): 6 prefixes of 6
# blocks x 4 prompts, warm-up included.
SCALE = {"name": "scale", "groups": 6, "prompts_per_group": 4, "prefix_blocks": 6, "warmup": True}
SCALE["args"] = ["--groups", "6", "--prompts-per-group", "4", "--prefix-len", str(6 * BLOCK),
                 "--question-len", str(QUESTION_LEN)]


def owned_groups(replicas: list[VllmServer], workload: dict, route: str, seed: int) -> list[int]:
    """How many of the workload's prefixes the router's ring gives each replica under this seed: the
    placement is a function of the prompts and the replicas' addresses alone (core/affinity.py)."""
    ring = A.Ring([s.base_url for s in replicas])
    prompts = PromptSource(seed)
    owners = []
    for group in range(workload["groups"]):
        ids = prompts.token_ids(workload["prefix_blocks"] * BLOCK, prefix_groups.EXPERIMENT, route, group, "prefix")
        blocks = A.prompt_blocks({"prompt": ids}, BLOCK)
        owners.append(next(ring.walk(blocks[min(len(blocks), A.DEFAULT_KEY_BLOCKS) - 1])))
    return [owners.count(s.base_url) for s in replicas]


def fitting_seed(replicas: list[VllmServer], workload: dict, route: str) -> int:
    """The first prompt seed under which no replica owns more prefixes than its pool holds. The replicas'
    ports are drawn at random, and with them the ring: 12 prefixes over 3 replicas put 7 on one (42 blocks in
    a pool of 38) in about one run in four, and that replica then evicts what the router rightly sent it.
    Balance is the ring's business (tests/routing/test_affinity.py); these tests measure locality."""
    fits = POOL_CHUNKS // workload["prefix_blocks"]
    return next(seed for seed in range(1, 1000) if max(owned_groups(replicas, workload, route, seed)) <= fits)


def prefix_groups_command(routes: dict[str, VllmRouter], replicas: list[VllmServer], workload: dict,
                          concurrency: int, output: Path, seed: int = 1) -> list[str]:
    """`spillway loadtest prefix-groups run` through each named router, figures from every replica."""
    cmd = [sys.executable, "-m", "spillway.cli", "loadtest", "prefix-groups", "run"]
    for name, router in routes.items():
        cmd += ["--route", f"{name}={router.base_url}", "--router-metrics", f"{name}={router.metrics_url}"]
    return [*cmd, *[a for s in replicas for a in ("--replica", s.base_url)], *workload["args"],
            "--concurrency", str(concurrency), "--seed", str(seed), "--progress", "none", "--no-plot",
            "--output", str(output)]


def run_prefix_groups(routes: dict[str, VllmRouter], replicas: list[VllmServer], workload: dict,
                      concurrency: int, output: Path, seed: int = 1) -> dict:
    """The result JSON, with the command's stdout (the report table) under "stdout"."""
    done = subprocess.run(prefix_groups_command(routes, replicas, workload, concurrency, output, seed),
                          check=False, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"{name} router:\n{r.log_tail()}" for name, r in routes.items())
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
    result = json.loads(output.read_text())
    result["stdout"] = done.stdout
    return result


def router(replicas: list[VllmServer], policy: str, extra: Sequence[str] = ()) -> VllmRouter:
    """vllm-router over these replicas with one of its policies; kv_aware with each replica's KV event source
    (bench/routing/routing_policies.py compares them)."""
    kv = policy == R.POLICY_KV_AWARE
    return VllmRouter([s.base_url for s in replicas], policy=policy, binary=require_binary(R.ROUTER_COMMAND),
                      event_sources={s.base_url: s.kv_events_endpoint for s in replicas} if kv else None,
                      block_size=BLOCK if kv else None, model=replicas[0].model if kv else None, extra_args=extra)


def spillway_router(replicas: list[VllmServer], extra: Sequence[str] = ()) -> SpillwayRouter:
    """`spillway route` over these replicas, with the pool's blocks as the index bound, as the operator runs it."""
    return SpillwayRouter([s.base_url for s in replicas], block_size=BLOCK,
                          extra_args=["--index-blocks", str(POOL_CHUNKS), *extra])


# kv_aware's debug log names the worker it chose for each request and the prompt tokens it credited there.
DEBUG_LOG = (R.FLAG_LOG_LEVEL, "debug")
_DECISION = re.compile(rf'{R.LOG_KV_DECISION}.*?worker="([^"]+)".*?{R.LOG_CREDITED_PREFIX_TOKENS}=(\d+)')


def kv_decisions(router: VllmRouter) -> list[tuple[str, int]]:
    """(worker, credited prompt tokens) per request the kv_aware router routed, in order (needs DEBUG_LOG)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", router.log_path.read_text(errors="replace"))  # its log is coloured
    return [(m.group(1), int(m.group(2))) for m in _DECISION.finditer(text)]
