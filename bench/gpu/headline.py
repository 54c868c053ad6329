#!/usr/bin/env python3
"""The headline figures over several engine starts: medians with their spread, from `spillway loadtest` files.

    python3 bench/gpu/headline.py --spillway A.json B.json ... --stock C.json D.json ... --no-offload E.json

Each file is one engine start's `spillway loadtest run` result (ttft and throughput experiments). Every pass at
100% CPU hit of every start counts once, as does every TTFT repetition; a ratio is of medians (Spillway's median
over the other engine's). Starts whose files hold fewer passes (a run cut at its deadline) count what they hold.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _spread(values: list[float]) -> dict | None:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} if values else None


def engine(paths: list[str]) -> dict:
    results = [json.loads(Path(p).read_text()) for p in paths]
    out: dict = {"starts": len(results), "files": [Path(p).name for p in paths]}
    for rate, key in ((1.0, "hit100_tok_s"), (0.0, "hit0_tok_s")):
        out[key] = _spread([p["prompt_tokens_per_s"] for r in results for p in r.get("throughput", {}).get("points", [])
                            if p["target_hit_rate"] == rate and p["ok"]])
    lengths = sorted({s["length"] for r in results for s in r.get("ttft", {}).get("samples", [])})
    out["ttft_ms"] = {}
    for length in lengths:
        samples = [s for r in results for s in r["ttft"]["samples"] if s["length"] == length and s["ok"]]
        row = {phase: _spread([s["ttft_s"] * 1e3 for s in samples if s["phase"] == phase])
               for phase in ("cold", "warm")}
        phased = [s["server"] for s in samples if s["phase"] == "warm" and s.get("server")]
        if phased:  # where a repeat's time went (spillway loadtest 2026-12-03 on)
            client = statistics.median(s["ttft_s"] for s in samples if s["phase"] == "warm" and s.get("server"))
            row["warm_phases_ms"] = {k: round(statistics.median(p[k] for p in phased) * 1e3, 1)
                                     for k in ("intake_s", "queue_s", "copy_s", "prefill_s", "ttft_s")}
            row["warm_phases_ms"]["outside"] = round((client - statistics.median(p["ttft_s"] for p in phased)) * 1e3, 1)
        out["ttft_ms"][length] = row
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
    for length, row in ours["ttft_ms"].items():
        report.setdefault("ttft_speedup", {})[length] = ratio(row["cold"], row["warm"])
    if args.stock:
        stock = engine(args.stock)
        report["stock"] = stock
        report["hit100_vs_stock"] = ratio(ours["hit100_tok_s"], stock["hit100_tok_s"])
        report["ttft_from_cpu_vs_stock"] = {length: ratio(stock["ttft_ms"][length]["warm"], row["warm"])
                                            for length, row in ours["ttft_ms"].items() if length in stock["ttft_ms"]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
