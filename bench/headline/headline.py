#!/usr/bin/env python3
"""The headline figures over several engine starts: medians with their spread, from `spillway loadtest` files.

    python3 bench/headline/headline.py --spillway A.json B.json ... --stock C.json D.json ... --no-offload E.json

Each file is one engine start's `spillway loadtest run` result (ttft and throughput experiments). Every pass at
100% CPU hit of every start counts once, as does every TTFT repetition; a ratio is of medians (Spillway's median
over the other engine's). Starts whose files hold fewer passes (a run cut at its deadline) count what they hold.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from spillway.loadtest.results import spread, summarize_ttft


def engine(paths: list[str]) -> dict:
    results = [json.loads(Path(p).read_text()) for p in paths]
    out: dict = {"starts": len(results), "files": [Path(p).name for p in paths]}
    for rate, key in ((1.0, "hit100_tok_s"), (0.0, "hit0_tok_s")):
        out[key] = spread([p["prompt_tokens_per_s"] for r in results for p in r.get("throughput", {}).get("points", [])
                           if p["target_hit_rate"] == rate and p["ok"]])
    # Every start's TTFT samples pooled, summarised as the load test summarises one run's (seconds): recompute,
    # repeat from CPU, and where a repeat's time went on the server's clocks (runs of 2026-12-03 on).
    samples = [s for r in results for s in r.get("ttft", {}).get("samples", [])]
    out["ttft"] = {row["length"]: row for row in summarize_ttft(samples)}
    for length, row in out["ttft"].items():
        # The client's repeat less the server's own TTFT, as the load test reports it, over the same repeats: the
        # starts that recorded server phases.
        phased = [s["ttft_s"] for s in samples if s["length"] == length and s["phase"] == "warm" and s["ok"]
                  and s.get("server")]
        if phased:
            row["repeat_server_s"]["outside_s"] = statistics.median(phased) - row["repeat_server_s"]["ttft_s"]
    return out


def ratio(a: dict | None, b: dict | None) -> float | None:
    return round(a["median"] / b["median"], 2) if a and b and b["median"] else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spillway", nargs="+", required=True)
    parser.add_argument("--stock", nargs="*", default=[])
    parser.add_argument("--no-offload", nargs="*", default=[])
    args = parser.parse_args()
    ours = engine(args.spillway)
    report: dict = {"spillway": ours}
    if args.no_offload:
        base = engine(args.no_offload)
        report["no_offload"] = base
        report["hit100_vs_no_offload"] = ratio(ours["hit100_tok_s"], base["hit0_tok_s"])
    for length, row in ours["ttft"].items():
        report.setdefault("ttft_speedup", {})[length] = ratio(row["recompute_s"], row["repeat_s"])
    if args.stock:
        stock = engine(args.stock)
        report["stock"] = stock
        report["hit100_vs_stock"] = ratio(ours["hit100_tok_s"], stock["hit100_tok_s"])
        report["ttft_from_cpu_vs_stock"] = {length: ratio(stock["ttft"][length]["repeat_s"], row["repeat_s"])
                                            for length, row in ours["ttft"].items() if length in stock["ttft"]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
