"""Which routing policy balances the replicas and keeps prefix locality: `spillway route` (kv-aware mode's own
router) against vllm-router's policies (the measurement behind the kv-aware router, docs/routing.md).

Three real vLLM CPU replicas (tiny random-weight Llama, offloading through the Spillway connector, KV events on,
no GPU prefix caching: every hit is a CPU-pool hit) behind `spillway route` or the real vllm-router from PyPI.
Each policy gets a fresh router and its own never-seen prompts through `spillway loadtest prefix-groups`:

- "tenants": 6 prefixes of 8 blocks x 8 prompts with their own sub-block suffixes, random order, no warm-up
  (every prefix is new when it first arrives), at 1 and at 3 in flight;
- "groups": the routing test's first workload, 12 prefixes of 6 blocks x 4 prompts, warm-up, 1 in flight.

Policies named *_tenant send each prompt with its tenant in an x-session-id header (the session key of the
sticky, hashing and affinity policies); vllm-router 0.1.17's candidates were measured and the
other candidates on the tenants workload.

    .venv/bin/python bench/routing/routing_policies.py [--out DIR] [--policies NAME ...] [--workloads tenants groups]
    (about 12 minutes on 2 cores; bench/routing/results was measured with --out there)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "connector"), str(REPO / "operator"), str(REPO / "tests")]

from routing.replicas import (
    BLOCK,
    DEBUG_LOG,
    GROUPS_WORKLOAD,
    TENANTS,
    best_cpu_hit,
    kv_decisions,
    spillway_router,
    start_replicas,
)
from spillway.core import router_api as R
from support.tools import require_binary
from support.vllm_router import VllmRouter

# name: (policy, router flags, load-test flags). TENANT_KEY: each prompt names its tenant (prefix group) in an
# x-session-id header, the session key vllm-router's affinity, sticky and hashing policies read.
TENANT_KEY = ["--tenant-session"]
SPILLWAY = "spillway"  # `spillway route` with the flags given
POLICIES = {
    "spillway": (SPILLWAY, [], []),
    # No pod above the mean in flight (the bound never below 2): what locality costs when the bound bites.
    "spillway_load1": (SPILLWAY, ["--load-factor", "1"], []),
    "round_robin": (R.POLICY_ROUND_ROBIN, [], []),
    "kv_aware": (R.POLICY_KV_AWARE, [], []),
    "kv_aware_t0.1": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "0.1"], []),
    "kv_aware_t0.3": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "0.3"], []),
    "kv_aware_t1": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "1"], []),
    "kv_aware_t0.1_host1": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "0.1", R.FLAG_KV_PENALTY_HOST, "1"], []),
    # A weaker CPU-hit credit: whether a busy holder then loses a known prefix to an idle replica (balance).
    "kv_aware_t0.1_host0.3": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "0.1", R.FLAG_KV_PENALTY_HOST, "0.3"], []),
    "cache_aware": (R.POLICY_CACHE_AWARE, [], []),
    # Load-balance on any difference in in-flight requests: whether the thresholds can spread new prefixes.
    "cache_aware_balance_any": (R.POLICY_CACHE_AWARE,
                                [R.FLAG_BALANCE_ABS_THRESHOLD, "0", R.FLAG_BALANCE_REL_THRESHOLD, "1"], []),
    "kv_aware_t0.1_affinity_tenant": (R.POLICY_KV_AWARE, [R.FLAG_ROUTER_TEMPERATURE, "0.1",
                                                          R.FLAG_KV_AWARE_SESSION_AFFINITY_TTL, "300"], TENANT_KEY),
    "sticky_least_loaded": (R.POLICY_STICKY_LEAST_LOADED, [], []),
    "sticky_least_loaded_tenant": (R.POLICY_STICKY_LEAST_LOADED, [], TENANT_KEY),
    "consistent_hash_tenant": (R.POLICY_CONSISTENT_HASH, [], TENANT_KEY),
}


def run(replicas, name: str, workload: dict, concurrency: int, out: Path, repeat: int = 0) -> dict:
    policy, extra, client_args = POLICIES[name]
    urls = [s.base_url for s in replicas]
    events = {s.base_url: s.kv_events_endpoint for s in replicas} if policy == R.POLICY_KV_AWARE else None
    # Its own route name per run: the prompts are drawn from it, so no run finds another's blocks in the pools.
    route = f"{workload['name']}-{name}-c{concurrency}" + (f"-r{repeat}" if repeat else "")
    output = out / f"{route}.json"
    # kv_aware's debug log says, per request, how many prompt tokens it credited to the replica it chose.
    if policy == SPILLWAY:
        router = spillway_router(replicas, extra)
    else:
        router = VllmRouter(urls, policy=policy, binary=require_binary(R.ROUTER_COMMAND), event_sources=events,
                            block_size=BLOCK if events else None, model=replicas[0].model if events else None,
                            extra_args=[*extra, *(DEBUG_LOG if events else ())])
    with router:
        cmd = [sys.executable, "-m", "spillway.cli", "loadtest", "prefix-groups", "run",
               "--route", f"{route}={router.base_url}", "--router-metrics", f"{route}={router.metrics_url}",
               *[a for u in urls for a in ("--replica", u)], *workload["args"], *client_args,
               "--concurrency", str(concurrency), "--seed", "1", "--progress", "none", "--no-plot", "--output", str(output)]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"{name}: {done.stdout}\n{done.stderr}\n{router.log_tail()}")
        decisions = kv_decisions(router) if events else []
    route = json.loads(output.read_text())["routes"][0]
    credited: dict[int, int] = {}
    for _, credit in decisions[-route["ok"]:] if decisions else ():
        credited[credit] = credited.get(credit, 0) + 1
    return {"workload": workload["name"], "policy": name, "concurrency": concurrency, "repeat": repeat,
            "tenant_key": client_args == TENANT_KEY,
            "cpu_hit_rate": route["cpu_hit_rate"], "best_cpu_hit_rate": best_cpu_hit(workload),
            "requests_per_replica": [r["requests"] for r in route["replicas"]],
            "cpu_hit_per_replica": [r["cpu_hit_rate"] for r in route["replicas"]],
            "prompt_tokens_per_s": route["prompt_tokens_per_s"], "ttft_p50_s": route["ttft_s"]["p50"],
            "errors": route["errors"], "warmup_requests_per_replica": route["warmup"].get("requests_per_replica"),
            # timed requests by the prompt tokens kv_aware credited to the replica it chose (0: it knew no holder)
            "credited_tokens": {str(k): v for k, v in sorted(credited.items())},
            "router": route["router"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="where the JSON goes (default: a new temporary directory)")
    p.add_argument("--policies", nargs="*", default=list(POLICIES))
    p.add_argument("--workloads", nargs="*", default=["tenants", "groups"])
    p.add_argument("--repeats", type=int, default=1, help="runs of each line, each with its own prompts")
    args = p.parse_args()
    args.out = args.out or Path(tempfile.mkdtemp(prefix="routing-policies-"))
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"results in {args.out}", flush=True)
    rows = []
    with start_replicas() as replicas:
        for repeat in range(args.repeats):
            for name in args.policies:
                for concurrency in (1, 3) if "tenants" in args.workloads else ():
                    rows.append(run(replicas, name, TENANTS, concurrency, args.out, repeat))
                    print(json.dumps(rows[-1]), flush=True)
            for name in args.policies if "groups" in args.workloads else ():
                rows.append(run(replicas, name, GROUPS_WORKLOAD, 1, args.out, repeat))
                print(json.dumps(rows[-1]), flush=True)
    (args.out / f"summary-{'-'.join(args.workloads)}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
