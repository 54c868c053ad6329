#!/usr/bin/env python3
"""Figures and tables from the H200 runs (files that bench/gpu/call_*.sh brought back).

    python3 bench/gpu/analyze.py RUN_DIR [more run dirs]

Writes summary.json and PNG plots into each run directory. Reads: qualify_*.json (spillway qualify),
transfer_sweep.json, serve_bench.json, transfers.jsonl.gz (the engine's transfer log), loadtest-*.json.
"""
from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
ANCHOR = json.loads((HERE.parent / "copy-rates" / "results" / "anchor_h200_transfer.json").read_text())
MiB = 2**20


def med(xs):
    return statistics.median(xs) if xs else None


def qualify_rows(run: Path) -> list[dict]:
    rows = []
    for f in sorted(run.glob("qualify_*.json")):
        doc = json.loads(f.read_text())
        for r in doc["rows"]:
            rows.append({**r, "file": f.name, "bidir_submit": doc.get("bidir_submit", "interleaved")})
    return rows


def compare_anchor(rows: list[dict]) -> list[dict]:
    """dma and kernel cells against the reference table: best of the repeats vs its best of 5."""
    out = []
    for r in rows:
        if r["method"] not in ("dma", "kernel") or "best_gbps" not in r or r["host"] != "alloc":
            continue
        try:
            i = ANCHOR["block_bytes"].index(r["block_bytes"])
        except ValueError:
            continue
        ref = ANCHOR[r["method"]][r["direction"]][i]
        out.append({"method": r["method"], "direction": r["direction"], "block_bytes": r["block_bytes"],
                    "bidir_submit": r["bidir_submit"], "best": r["best_gbps"], "median": r["median_gbps"],
                    "anchor_best": ref, "gap_pct": round((r["best_gbps"] - ref) / ref * 100, 1)})
    return out


def plot_qualify(rows: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for ax, direction in zip(axes, ("g2c", "c2g", "bidir")):
        for method, style in (("vllm", "-o"), ("dma", "-s"), ("kernel", "-^")):
            pts = sorted((r["block_bytes"], r["median_gbps"]) for r in rows if r["method"] == method
                         and r["direction"] == direction and r["host"] == "alloc" and "median_gbps" in r
                         and r["bidir_submit"] == "interleaved")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{method} (H200)")
            if method in ANCHOR:
                ax.plot(ANCHOR["block_bytes"], ANCHOR[method][direction], ":", color="grey", alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_title({"g2c": "GPU -> CPU", "c2g": "CPU -> GPU", "bidir": "both at once"}[direction])
        ax.set_xlabel("block size (bytes)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (median of repeats; dotted: reference table)")
    axes[0].legend()
    fig.suptitle("spillway qualify on the H200: 1000 scattered blocks per transfer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def transfers(run: Path) -> list[dict]:
    """The engine's transfer log: in the run directory, or one shared by the calls of a session (parent)."""
    f = run / "transfers.jsonl.gz"
    if not f.exists():
        f = run.parent / "transfers.jsonl.gz"
    if not f.exists():
        return []
    with gzip.open(f, "rt") as fh:
        return [json.loads(line) for line in fh]


def engine_summary(e: dict, log: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": e["name"], "startup_s": e.get("startup_s"), "error": e.get("error"),
                           "vllm_args": e.get("vllm_args"), "vllm_env": e.get("vllm_env"),
                           "plan_env_dropped": e.get("plan_env_dropped"), "plan_command": e.get("plan_command")}
    if "ttft" in e:
        out["ttft_ms"] = {L: {"recompute": round(v["recompute_s"]["median"] * 1e3, 1),
                              "recompute_spread_pct": round(v["recompute_s"]["spread_pct"], 1),
                              "second": round(v["second_s"]["median"] * 1e3, 1),
                              "second_spread_pct": round(v["second_s"]["spread_pct"], 1),
                              "n": v["second_s"]["n"],
                              "cpu_hit_tokens": [r["second_metrics"].get("external_hits") for r in v["rows"]]}
                          for L, v in e["ttft"]["lengths"].items() if v["rows"]}
        ttft_breakdown = []
        for L, v in e["ttft"]["lengths"].items():
            for r in v["rows"]:
                t0, t1 = r["second_t0"], r["second_t0"] + r["second_s"]
                loads = [t for t in log if t["dir"] == "c2g" and t0 - 0.001 <= t["submit_t"] <= t1]
                if loads:
                    t = loads[0]
                    ttft_breakdown.append({"len": int(L), "ttft_ms": r["second_s"] * 1e3,
                                           "to_submit_ms": (t["submit_t"] - t0) * 1e3,
                                           "submit_cpu_ms": t["submit_cpu_s"] * 1e3, "dma_gpu_ms": t["gpu_s"] * 1e3,
                                           "after_load_ms": (t1 - t["done_seen_t"]) * 1e3,
                                           "load_gbps": t["bytes"] / t["gpu_s"] / 1e9})
        if ttft_breakdown:
            by_len: dict[int, list[dict]] = {}
            for b in ttft_breakdown:
                by_len.setdefault(b["len"], []).append(b)
            out["ttft_from_cpu_breakdown_ms"] = {
                L: {k: round(med([b[k] for b in bs]), 1) for k in bs[0] if k != "len"} for L, bs in by_len.items()}
    if "throughput" in e:
        tp = e["throughput"]
        out["throughput"] = {"warm_tok_s": round(tp["warm"]["tok_s"])}
        for h, p in tp["passes"].items():
            rows = p["rows"]
            if not rows:
                continue
            cell = {"tok_s_median": round(p["tok_s"]["median"]), "tok_s_min": round(p["tok_s"]["min"]),
                    "tok_s_max": round(p["tok_s"]["max"]), "n": p["tok_s"]["n"],
                    "server_hit_rate": [round(r["metrics"].get("external_hit_rate", 0), 3) for r in rows],
                    "load_gbps_counters": [round(r["metrics"]["load_gbps"], 1) for r in rows
                                           if r["metrics"].get("load_gbps")],
                    "preemptions": [r["metrics"].get("preemptions", 0) for r in rows]}
            busy = []
            for r in rows:
                if "t0" not in r:
                    continue
                loads = [t for t in log if t["dir"] == "c2g" and r["t0"] <= t["submit_t"] <= r["t0"] + r["wall_s"]]
                if loads:
                    busy.append({"loads": len(loads), "dma_busy_frac": sum(t["gpu_s"] for t in loads) / r["wall_s"],
                                 "submit_cpu_frac": sum(t["submit_cpu_s"] for t in loads) / r["wall_s"],
                                 "load_gbps": sum(t["bytes"] for t in loads) / sum(t["gpu_s"] for t in loads) / 1e9})
            if busy:
                cell["engine_log"] = {k: round(med([b[k] for b in busy]), 3) for k in busy[0]}
            out["throughput"][h] = cell
    if "loadtest" in e:
        out["loadtest"] = e["loadtest"]
    return out


def engine_window(e: dict) -> tuple[float, float] | None:
    """Wall-clock span of an engine's measured requests (the transfer log is shared by a session's calls)."""
    times = []
    for v in e.get("ttft", {}).get("lengths", {}).values():
        for r in v["rows"]:
            times += [r["first_t0"], r["second_t0"] + r["second_s"]]
    for p in e.get("throughput", {}).get("passes", {}).values():
        for r in p["rows"]:
            if "t0" in r:
                times += [r["t0"], r["t0"] + r["wall_s"]]
    return (min(times) - 30, max(times) + 30) if times else None


def transfer_stats(log: list[dict]) -> dict[str, Any]:
    out = {}
    for d in ("c2g", "g2c"):
        xs = [t for t in log if t["dir"] == d and t["gpu_s"]]
        if not xs:
            continue
        out[d] = {"transfers": len(xs), "bytes": sum(t["bytes"] for t in xs),
                  "gbps_aggregate": round(sum(t["bytes"] for t in xs) / sum(t["gpu_s"] for t in xs) / 1e9, 1),
                  "gbps_median": round(med([t["bytes"] / t["gpu_s"] / 1e9 for t in xs]), 1),
                  "submit_cpu_ms_median": round(med([t["submit_cpu_s"] * 1e3 for t in xs]), 2),
                  "submit_cpu_us_per_2mib_median": round(med([t["submit_cpu_s"] * 1e6 / (t["bytes"] / (2 * MiB))
                                                              for t in xs]), 1)}
    return out


def loadtest_summary(d: dict) -> dict[str, Any]:
    """`spillway loadtest` result: TTFT medians per length and phase, throughput points as it reported them."""
    by: dict[tuple[int, str], list[float]] = {}
    hits: dict[tuple[int, str], list[float]] = {}
    for s in d["ttft"]["samples"]:
        if s["ok"]:
            by.setdefault((s["length"], s["phase"]), []).append(s["ttft_s"] * 1e3)
            hits.setdefault((s["length"], s["phase"]), []).append(s["achieved"]["cpu_hit_rate"])
    ttft = {}
    for (length, phase), xs in sorted(by.items()):
        ttft.setdefault(str(length), {})[phase] = {"median_ms": round(med(xs), 1), "min_ms": round(min(xs), 1),
                                                   "max_ms": round(max(xs), 1), "n": len(xs),
                                                   "cpu_hit_rate": hits[(length, phase)]}
    points = [{k: p.get(k) for k in ("target_hit_rate", "requests", "ok", "errors", "prompt_tokens_per_s",
                                     "elapsed_s", "achieved")} for p in d.get("throughput", {}).get("points", [])]
    return {"status": d["status"], "error": d.get("error"), "ttft": ttft, "throughput_points": points}


def plot_serve(engines: list[dict], path: Path) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    for e in engines:
        t = e.get("ttft_ms")
        if t:
            lens = sorted(int(x) for x in t)
            a.plot(lens, [t[str(L)]["recompute"] for L in lens], "--o", label=f"{e['name']}: fresh prompt (recompute)")
            if e["name"].startswith(("plugin", "offload")):
                a.plot(lens, [t[str(L)]["second"] for L in lens], "-o", label=f"{e['name']}: repeat (from CPU)")
        tp = e.get("throughput")
        if tp:
            hs = sorted(float(h) for h in tp if h != "warm_tok_s")
            b.plot([h * 100 for h in hs], [tp[str(h)]["tok_s_median"] / 1e3 for h in hs], "-o", label=e["name"])
    a.set_xscale("log", base=2)
    a.set_xlabel("prompt tokens")
    a.set_ylabel("TTFT, ms (median)")
    a.set_yscale("log")
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    a.set_title("Exp. 1: TTFT, one request at a time")
    b.set_xlabel("CPU hit rate of the pass, % (server-counted rates in summary.json)")
    b.set_ylabel("prompt tokens/s (thousands, median of 3 passes)")
    b.grid(alpha=0.3)
    b.legend(fontsize=7)
    b.set_title("Exp. 2: 800 x 512-token prompts at once")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    for arg in argv:
        run = Path(arg)
        summary: dict[str, Any] = {"run": run.name}
        rows = qualify_rows(run)
        if rows:
            summary["qualify_vs_anchor"] = compare_anchor(rows)
            plot_qualify(rows, run / "qualify.png")
            summary["qualify_vllm_c2g_2mib"] = next((r["median_gbps"] for r in rows if r["method"] == "vllm"
                                                     and r["direction"] == "c2g" and r["block_bytes"] == 2 * MiB
                                                     and "median_gbps" in r), None)
        sweep = run / "transfer_sweep.json"
        if sweep.exists():
            summary["transfer_sweep"] = {h: {"per_call": {n: c["median"] for n, c in r["per_call"].items()},
                                             "chained": {k: c["median"] for k, c in r["chained"].items()},
                                             "chained_with_store": {k: c["median"] for k, c in
                                                                    r["chained_with_store"].items()}}
                                         for h, r in json.loads(sweep.read_text())["runs"].items()}
        bench = run / "serve_bench.json"
        if bench.exists():
            log = transfers(run)
            doc = json.loads(bench.read_text())
            engines = [engine_summary(e, log)
                       for e in doc["engines"] if "skipped" not in e]
            summary["engines"] = engines
            windows = [w for w in (engine_window(e) for e in doc["engines"]) if w]
            summary["transfer_log"] = transfer_stats([t for t in log if any(a <= t["submit_t"] <= b
                                                                             for a, b in windows)])
            plot_serve(engines, run / "serve.png")
        loadtests = {f.stem: loadtest_summary(json.loads(f.read_text())) for f in sorted(run.glob("loadtest-*.json"))}
        if loadtests:
            summary["loadtest"] = loadtests
        (run / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"{run}: summary.json, plots")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
