"""`spillway route` as a fleet's front door on three real vLLM CPU replicas: hit share, per-replica share and
TTFT with 1 and 3 router pods on a Zipf workload, a replica added, a replica restarted, a hot prefix, a replica
that dies for good.

The replicas are the routing tests' (tests/routing/replicas.py: tiny random-weight Llama, CPU offloading
through the Spillway connector, 38 pool blocks of 32 tokens each, 2 sequences at a time, no GPU prefix
caching, so every prefix hit is a CPU-pool hit); the traffic is tests/routing/fleet_load.py's (12 prefixes of
3 blocks by default, Zipf(1.1) popularity, a 16-token question each, one token out, each request to one router pod at
random as a Service picks one). Every scenario has its own never-seen prompts; hit share and shares come from
the replicas' own /metrics, TTFT from the client.

    flock /tmp/spillway-engine.lock .venv/bin/python bench/fleet/engines.py [--requests 240] [--disk-tier off|on|both]
        [--scenarios restart] [--repeats-restart 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "connector"), str(REPO / "operator"), str(REPO / "tests")]

from routing import fleet_load as F
from routing.replicas import start_replicas

SCENARIOS = ("zipf", "scale", "restart", "hot", "die")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def line(name: str, r: dict, extra: str = "") -> str:
    shares = "/".join(f"{100 * s:.0f}" for s in r["replica_shares"])
    ttft = r.get("ttft_ms", {})
    waits = "/".join("-" if w is None else f"{w:g}" for w in r["queue_wait_ms"])
    return (f"{name:<28} hit {_pct(r['cpu_hit_share']):>6}  shares % {shares:<9} TTFT p50/p90 "
            f"{ttft.get('p50')}/{ttft.get('p90')} ms  queue ms {waits:<14} errors {r.get('client_errors', 0)}"
            f"{extra}")


async def main(args: argparse.Namespace) -> dict:
    out: dict = {"settings": {k: v for k, v in vars(args).items() if k != "out"},
                 "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
                 "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "scenarios": []}
    n, c = args.requests, args.concurrency
    shape = {"prefixes": args.prefixes, "prefix_blocks": args.prefix_blocks}

    def record(result: dict, text: str) -> None:
        out["scenarios"].append({"disk_tier": tier, **result})
        print(text, flush=True)

    for tier in (("off", "on") if args.disk_tier == "both" else (args.disk_tier,)):
        print(f"-- node-disk tier {tier}", flush=True)
        with tempfile.TemporaryDirectory(prefix="spillway-node-disk-") as disk, \
                start_replicas(disk_root=Path(disk) / "root" if tier == "on" else None) as servers:
            urls = [s.base_url for s in servers]
            # 1 and 3 pods alternate: the machine's load falls on both alike
            for repeat in range(args.repeats if "zipf" in args.scenarios else 0):
                for pods in (1, 3):
                    name = f"zipf-{pods}-r{repeat}"
                    w = F.Workload(name, seed=F.balanced_seed(name, urls, 0.2, **shape), **shape)
                    r = await F.zipf(servers, pods, w, requests=n, concurrency=c)
                    record(r, line(f"Zipf, {pods} router pod{'s' * (pods > 1)} (r{repeat})", r,
                                   f"  (best {_pct(r['best_hit_share'])}, overloaded {r['overloaded']})"))
            for pods in (1, 3) if "scale" in args.scenarios else ():
                name = f"scale-{pods}"
                w = F.Workload(name, seed=F.balanced_seed(name, urls, 0.2, **shape), **shape)
                r = await F.scale_up(servers, pods, w, requests=2 * n, concurrency=c)  # n after the join
                record(r, line(f"2 -> 3 replicas, {pods} pod{'s' * (pods > 1)}", r,
                               f"  (joined replica {100 * r['joined_share']:.0f}% in {r['window_s']} s, its arcs drew "
                               f"{100 * r['joined_drawn_share']:.0f}%, overloaded to {r['overloaded_to']}; hit shares "
                                   f"{r['replica_hit_shares']}, chunks read from siblings {r['sibling_chunks']})"))
            restart_runs = [(repeat, pods) for repeat in range(args.repeats_restart) for pods in (1, 3)]
            for repeat, pods in restart_runs if "restart" in args.scenarios else ():
                name = f"restart-{pods}" + (f"-r{repeat}" if repeat else "")
                w = F.Workload(name, seed=F.balanced_seed(name, urls, 0.2, **shape), **shape)
                r = await F.restart(servers, pods, w, restarted=0, before_requests=n // 2,
                                    down_requests=args.down_requests, after_requests=n, concurrency=c)
                down = r["down"]
                record(r, line(f"restart, {pods} pod{'s' * (pods > 1)}: before", r["before"]) + "\n"
                       + f"{'  down':<28} {down['requests']} requests over {down['seconds']} s, errors "
                         f"{down['client_errors']}, retries {r['retries']}, restarts seen {r['restarts_seen']}\n"
                       + line("  after Ready", r["after"], f"  (restarted replica first served at "
                              f"{r['restarted_first_request_s']} s, window {r['window_s']} s)") + "\n"
                       + f"  restarted replica's hit share per slice after Ready: "
                         f"{[(x['end_s'], x['hit_share'], x['disk_hit_chunks']) for x in r['warm']['slices']]} "
                             f"(s, share, disk chunks); fleet steady "
                         f"{r['warm']['steady_hit_share']}; at >= {F.WARM_FRACTION:.0%} of it from "
                         f"{r['warm']['warm_after_s']} s on")
            hot_runs = [(repeat, pods) for repeat in range(args.repeats_hot) for pods in (1, 3)]
            for repeat, pods in hot_runs if "hot" in args.scenarios else ():
                name = f"hot-{pods}" + (f"-r{repeat}" if repeat else "")
                w = F.Workload(name, hot=args.hot, seed=F.balanced_seed(name, urls, 0.2, **shape),
                               output_tokens=args.hot_output_tokens, **shape)
                r = await F.hot(servers, pods, w, requests=n, concurrency=c)
                record(r, line(f"hot prefix {args.hot:.0%}, {pods} pod{'s' * (pods > 1)} (r{repeat})", r,
                               f"  (owner {r['hot_owner']}: drawn {r['owner_drawn']}, served {r['owner_served']}, "
                               f"passed on {r['owner_passed_on']}, overloaded {r['overloaded']}; in flight peak "
                               f"{'/'.join(map(str, r['in_flight_peaks']))}, mean "
                               f"{'/'.join(map(str, r['in_flight_means']))}, above {r['bound']} "
                               f"{'/'.join(f'{100 * x:.0f}%' for x in r['above_bound_shares'])})"))
            if "die" in args.scenarios:
                name = "die-3"
                w = F.Workload(name, seed=F.balanced_seed(name, urls, 0.2, **shape), **shape)
                try:
                    r = await F.die(servers, 3, w, died=2, listed_requests=n // 2, after_requests=n // 2,
                                    concurrency=c)
                finally:
                    F.gone(servers[2], len(servers) - 1)
                    servers[2].launch()
                    servers[2].wait_started()
                record(r, line("replica 2 dies, 3 pods: listed", r["listed"], f"  (retries {r['retries']})") + "\n"
                       + line("  after DNS drops it", r["after"], f"  (forgotten: {r['forgotten']})"))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=240, help="requests per scenario (per phase of a restart; "
                        "after the join of a scale-up)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefixes", type=int, default=12)
    parser.add_argument("--prefix-blocks", type=int, default=3, help="blocks of 32 tokens per prefix (a pool holds 38)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of the Zipf comparison")
    parser.add_argument("--down-requests", type=int, default=40, help="requests sent while a replica restarts")
    parser.add_argument("--hot", type=float, default=0.6, help="the hot prefix's share of the requests")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--repeats-restart", type=int, default=1, help="runs of the restart scenario")
    parser.add_argument("--disk-tier", choices=("off", "on", "both"), default="off",
                        help="the replicas' pools over one node-disk tier (a directory they share as a ModelServer's "
                        "pods share a volume: each writes its own slot and reads the others'); both: off, then on")
    parser.add_argument("--repeats-hot", type=int, default=1, help="runs of the hot-prefix comparison")
    parser.add_argument("--hot-output-tokens", type=int, default=16, help="tokens each hot-prefix answer generates "
                        "(fleet_load.Workload.output_tokens)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--load-poll-seconds", type=float, default=F.LOAD_POLL_S,
                        help="the router pods' --load-poll-seconds (0: leave the flag out, for a router without it)")
    args = parser.parse_args()
    F.LOAD_POLL_S = args.load_poll_seconds
    result = asyncio.run(main(args))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
