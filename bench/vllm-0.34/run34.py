#!/usr/bin/env python3
"""Engine starts on vLLM 0.34, each bracketed by a fixed CPU calibration, and their medians with the slow starts apart.

Each engine of the engine set runs through the bench's serve_bench.run_engine (the plan's or the stock args, the
bench flags, `spillway loadtest run`), with calibrate.py's fixed Python work timed just before its start and just
after its stop. A start whose slower calibration is more than SLOW_FACTOR times the reference (the fastest
calibration of the call, or --calib-ref-s when that is faster) is marked slow: it is reported, and the pooled
medians are given twice, over every start and over the starts not marked slow.

An engine with "check": "reload" must also show, in serve_bench's own TTFT experiment (a fresh prompt, then the same
prompt again), a completion and a reload from the CPU pool on vLLM's /metrics (kv_offload load bytes > 0), else the
run stops there: the smoke test of the staged tree.

An engine with "compile_cache": {"shared": DIR, "local": DIR} starts as a pod with `compileCache.claimName` does: its
VLLM_CACHE_ROOT is `local`, emptied first (a new pod's emptyDir), with Triton's cache below it; the image's
compile_cache.py seeds it from `shared` before the start and publishes to `shared` once the server answers its health
check; both are timed and recorded. With "pod": DIR the start also gets a fresh HOME and TMPDIR below DIR, as a new
pod's emptyDirs are (so nothing an earlier start left in the machine's home or /tmp helps it); with "restart": true
nothing is emptied (a container restarted in its pod: the emptyDirs kept). What the start wrote below the root, the
home and the temp dir is listed file by file in the record's "written".

    python3 bench/vllm-0.34/run34.py --spec bench/vllm-0.34/engines.json --out /tmp/work34 --json $OUT/run34.json \
        --deadline-s 520 [--only a,b] [--calib-ref-s 0.3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from calibrate import calibrate

SLOW_FACTOR = 1.25


def _find(pattern: str) -> Path:
    """A bench file by name wherever the bench's per-question layout keeps it."""
    found = sorted(ROOT.glob(f"bench/**/{pattern}"))
    if not found:
        raise SystemExit(f"run34: no bench/**/{pattern} in {ROOT}")
    return found[0]


SERVE_BENCH = _find("serve_bench.py")
sys.path.insert(0, str(SERVE_BENCH.parent))
import serve_bench as sb


def model_dir(given: str) -> str:
    path = ROOT / given
    if (path / "config.json").exists():
        return str(path.resolve())
    return str(_find(f"{Path(given).name}/config.json").parent.resolve())


def reload_check(res: dict) -> str | None:
    """None when the TTFT experiment answered and the repeat loaded from the CPU pool, else what is missing."""
    rows = [r for length in res.get("ttft", {}).get("lengths", {}).values() for r in length.get("rows", [])]
    if not rows:
        return "no TTFT row (no completion)"
    loaded = [r for r in rows if r.get("second_metrics", {}).get("load_bytes", 0) > 0]
    stored = [r for r in rows if r.get("first_metrics", {}).get("store_bytes", 0) > 0]
    if not stored:
        return "the first request stored nothing (kv_offload store bytes 0)"
    if not loaded:
        return "the repeat loaded nothing from the CPU pool (kv_offload load bytes 0)"
    return None


COMPILE_CACHE = ROOT / "images" / "vllm" / "compile_cache.py"


def seed_compile_cache(engine: dict, port: int) -> tuple[dict, Any]:
    """As the image's entrypoint does for a pod with a compile-cache claim: a fresh local root seeded from the shared
    one, and the publisher started beside the server. Returns (the record so far, the publisher process)."""
    import shutil
    import subprocess

    cc = engine["compile_cache"]
    dirs = pod_dirs(cc)
    if not cc.get("restart"):
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    for d in dirs.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    from spillway.core import vllm_api as api

    # as the operator renders it: Triton's cache below the root (manifests.vllm_env)
    triton = f"{cc['local']}/{api.TRITON_CACHE_BELOW_ROOT}"
    engine.setdefault("extra_env", {}).update({api.ENV_CACHE_ROOT: cc["local"], api.ENV_TRITON_CACHE_DIR: triton})
    if cc.get("pod"):
        engine["extra_env"].update(HOME=dirs["home"], TMPDIR=dirs["tmp"])
    t = time.time()
    seeded = subprocess.run([sys.executable, str(COMPILE_CACHE), "seed", cc["shared"], cc["local"]],
                            capture_output=True, text=True, check=False)
    record = {**cc, "seed_s": round(time.time() - t, 3), "seed_log": seeded.stderr.strip().splitlines(),
              "before": {k: inventory(d) for k, d in dirs.items()}}
    publisher = subprocess.Popen([sys.executable, str(COMPILE_CACHE), "publish", cc["shared"], cc["local"],
                                  "--after-ready", f"http://127.0.0.1:{port}/health", "--wait-s", "500"],
                                 stderr=subprocess.PIPE, text=True)
    return record, publisher


def pod_dirs(cc: dict) -> dict[str, str]:
    """The cache root, and with "pod" the home and temp dir a new pod's emptyDirs would be."""
    dirs = {"root": cc["local"]}
    if cc.get("pod"):
        dirs.update(home=f"{cc['pod']}/home", tmp=f"{cc['pod']}/tmp")
    return dirs


def inventory(folder: str) -> dict[str, int]:
    """Every file below folder by its path there, with its size."""
    root = Path(folder).expanduser()
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def written(before: dict[str, int], after: dict[str, int], limit: int = 400) -> dict:
    """What a start added or resized, summed by the first three path parts and listed file by file (the largest
    first, up to limit)."""
    changed = {name: size for name, size in after.items() if before.get(name) != size}
    groups: dict[str, list[int]] = {}
    for name, size in changed.items():
        g = groups.setdefault("/".join(Path(name).parts[:3]), [0, 0])
        g[0] += 1
        g[1] += size
    return {"files": len(changed), "bytes": sum(changed.values()), "total_files": len(after),
            "total_bytes": sum(after.values()),
            "by_dir": {k: {"files": n, "bytes": b} for k, (n, b) in sorted(groups.items())},
            "listing": sorted(changed.items(), key=lambda kv: -kv[1])[:limit]}


def published(record: dict, publisher: Any, ready: bool) -> dict:
    """The publisher's log, and what the start wrote below the root (and the pod's home and temp dir)."""
    out = _published(record, publisher, ready)
    before = out.pop("before", {})
    out["written"] = {k: written(before.get(k, {}), inventory(d)) for k, d in pod_dirs(record).items()}
    return out


def _published(record: dict, publisher: Any, ready: bool) -> dict:
    """The publisher's log (once ready), then the preStop hook's: a pod publishes again when it stops, while the
    server still answers. Here the engine is already stopped then, so the root is published as it was left, if
    the start reached ready (an engine stopped right after ready may also be gone before the publisher's next look
    at its health)."""
    import subprocess

    try:
        _, err = publisher.communicate(timeout=15)
        log = err.strip().splitlines()
    except subprocess.TimeoutExpired:
        publisher.kill()
        publisher.communicate()
        log = ["the publisher saw no answer before the stop"]
    if not ready:
        return {**record, "publish_log": [*log, "the engine never answered: nothing published at the stop"]}
    done = subprocess.run([sys.executable, str(COMPILE_CACHE), "publish", record["shared"], record["local"]],
                          capture_output=True, text=True, check=False)
    return {**record, "publish_log": [*log, "at the stop", *done.stderr.strip().splitlines()]}


def loadtest_result(res: dict, out_dir: Path) -> dict | None:
    name = (res.get("loadtest") or {}).get("result_file")
    if not name or not (out_dir / name).exists():
        return None
    return json.loads((out_dir / name).read_text())


# -- summaries -------------------------------------------------------------------------------------------
def per_start(start: dict) -> dict:
    lt = start.get("loadtest_result") or {}
    points = lt.get("throughput", {}).get("points", [])
    row: dict[str, Any] = {"name": start["name"], "kind": start.get("kind"), "slow": start.get("slow"),
                           "calibration_s": [start.get("calibration_before", {}).get("python_s"),
                                             start.get("calibration_after", {}).get("python_s")],
                           "startup_s": start.get("startup_s")}
    for rate, key in ((1.0, "hit100_tok_s"), (0.0, "hit0_tok_s")):
        vals = [p["prompt_tokens_per_s"] for p in points if p["target_hit_rate"] == rate and p["ok"]]
        if vals:
            row[key] = {"median": statistics.median(vals), "passes": vals}
    for length, t in summary_ttft([start]).items():
        row.setdefault("ttft_ms", {})[length] = {
            "recompute": _ms(t.get("recompute_s")), "from_cpu": _ms(t.get("repeat_s"))}
    return row


def _ms(spread: dict | None) -> float | None:
    return round(spread["median"] * 1e3, 1) if spread else None


def summary_ttft(starts: list[dict]) -> dict:
    from spillway.loadtest.results import summarize_ttft

    samples = [s for st in starts for s in (st.get("loadtest_result") or {}).get("ttft", {}).get("samples", [])]
    return {str(row["length"]): row for row in summarize_ttft(samples)}


def pooled(starts: list[dict]) -> dict:
    """Every 100%-hit (and 0%-hit) pass of every start once, every TTFT repetition once (bench/headline/headline.py's
    rule), over the given starts."""
    from spillway.loadtest.results import spread

    out: dict[str, Any] = {"starts": [s["name"] for s in starts]}
    for rate, key in ((1.0, "hit100_tok_s"), (0.0, "hit0_tok_s")):
        out[key] = spread([p["prompt_tokens_per_s"] for s in starts
                           for p in (s.get("loadtest_result") or {}).get("throughput", {}).get("points", [])
                           if p["target_hit_rate"] == rate and p["ok"]])
    out["ttft"] = {length: {"recompute_s": row["recompute_s"], "from_cpu_s": row["repeat_s"]}
                   for length, row in summary_ttft(starts).items()}
    return out


def ratio(a: dict | None, b: dict | None) -> float | None:
    return round(a["median"] / b["median"], 2) if a and b and b.get("median") else None


def summarize(starts: list[dict]) -> dict:
    measured = [s for s in starts if s.get("loadtest_result")]
    kinds = sorted({s.get("kind", s["name"]) for s in measured})
    out: dict[str, Any] = {"per_start": [per_start(s) for s in measured], "pooled": {}, "pooled_not_slow": {}}
    for k in kinds:
        mine = [s for s in measured if s.get("kind", s["name"]) == k]
        out["pooled"][k] = pooled(mine)
        fast = [s for s in mine if not s.get("slow")]
        out["pooled_not_slow"][k] = pooled(fast) if fast else None
    for group in ("pooled", "pooled_not_slow"):
        g = out[group]
        base = (g.get("no-offload") or {}).get("hit0_tok_s")
        ratios: dict[str, Any] = {}
        for k in ("spillway", "stock-native"):
            if g.get(k):
                ratios[f"{k}_hit100_vs_no_offload"] = ratio(g[k]["hit100_tok_s"], base)
                ratios[f"{k}_ttft_speedup"] = {length: ratio(t["recompute_s"], t["from_cpu_s"])
                                               for length, t in g[k]["ttft"].items()}
        if g.get("spillway") and g.get("stock-native"):
            ratios["spillway_hit100_vs_stock"] = ratio(g["spillway"]["hit100_tok_s"], g["stock-native"]["hit100_tok_s"])
            ratios["stock_ttft_from_cpu_over_spillway"] = {
                length: ratio(g["stock-native"]["ttft"][length]["from_cpu_s"], t["from_cpu_s"])
                for length, t in g["spillway"]["ttft"].items() if length in g["stock-native"]["ttft"]}
        out[group + "_ratios"] = ratios
    # like for like: each Spillway start over the stock start of the same suffix (spillway-a / stock-native-a),
    # run back to back in one call
    by_name = {s["name"]: s for s in out["per_start"]}
    out["pairs"] = [{"spillway": r["name"], "stock": f"stock-native-{r['name'].rsplit('-', 1)[-1]}",
                     "hit100_vs_stock": ratio(r.get("hit100_tok_s"),
                                              by_name[f"stock-native-{r['name'].rsplit('-', 1)[-1]}"].get("hit100_tok_s"))}
                    for r in out["per_start"] if r.get("kind") == "spillway"
                    and f"stock-native-{r['name'].rsplit('-', 1)[-1]}" in by_name]
    return out


def mark_slow(starts: list[dict], ref_s: float | None) -> float | None:
    cal = [c["python_s"] for s in starts for c in (s.get("calibration_before"), s.get("calibration_after")) if c]
    best = min([*cal, *([ref_s] if ref_s else [])], default=None)
    for s in starts:
        mine = [c["python_s"] for c in (s.get("calibration_before"), s.get("calibration_after")) if c]
        if best and mine:
            s["calibration_vs_reference"] = round(max(mine) / best, 3)
            s["slow"] = max(mine) > SLOW_FACTOR * best
    return best


# -- the run ---------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True, help="work folder (logs, loadtest files)")
    p.add_argument("--json", required=True, help="the results file, written after every engine")
    p.add_argument("--deadline-s", type=float, default=520)
    p.add_argument("--only", help="comma-separated engine names")
    p.add_argument("--calib-ref-s", type=float, help="a reference calibration (s) from an earlier call")
    p.add_argument("--smoke", action="store_true", help="each engine's start and check only, no load test")
    a = p.parse_args()
    t0 = time.time()
    spec_path = Path(a.spec)
    spec = json.loads(spec_path.read_text())
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    common = spec["common"]
    common.setdefault("node_memory", sb.node_memory())
    common.setdefault("pythonpath", sb.os.environ.get("PYTHONPATH", ""))
    common["model_dir"] = model_dir(common["model_dir"])
    if common.get("words_tokenizer"):
        from word_tokenizer import build

        common["words_model_dir"] = str(build(Path(common["model_dir"]), out_dir / "model-words"))
    import vllm

    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "vllm": vllm.__version__, "spec_file": str(spec_path), "engine_set": spec,
                               "serve_bench": str(SERVE_BENCH.relative_to(ROOT)), "slow_factor": SLOW_FACTOR,
                               "calib_ref_s": a.calib_ref_s, "smoke": a.smoke, "engines": []}
    only = set(a.only.split(",")) if a.only else None

    def save() -> None:
        results["calibration_reference_s"] = mark_slow(results["engines"], a.calib_ref_s)
        results["summary"] = summarize(results["engines"])
        results["seconds"] = round(time.time() - t0, 1)
        Path(a.json).write_text(json.dumps(results, indent=1))

    for engine in spec["engines"]:
        if only and engine["name"] not in only:
            continue
        if a.smoke:
            engine = {k: v for k, v in engine.items() if k != "loadtest"}
        if time.time() - t0 + engine.get("min_seconds", 60) > a.deadline_s:
            results["engines"].append({"name": engine["name"], "kind": engine.get("kind"),
                                       "skipped": "not enough time left in this call"})
            sb.log(f"engine {engine['name']}: skipped (time)")
            save()
            continue
        before = calibrate()
        sb.log(f"calibration before {engine['name']}: {before['python_s']} s (uptime {before['host_uptime_s']:.0f} s)")
        cc = seed_compile_cache(engine, common["port"]) if engine.get("compile_cache") else None
        watched = {k: inventory(d) for k, d in engine.get("watch", {}).items()}
        res = asyncio.run(sb.run_engine(engine, common, out_dir, t0 + a.deadline_s))
        if cc:
            res["compile_cache"] = published(*cc, ready=bool(res.get("startup_s")))
            sb.log(f"compile cache of {engine['name']}: seed {res['compile_cache']['seed_log']}, publish "
                   f"{res['compile_cache']['publish_log']}, written "
                   f"{ {k: (w['files'], w['bytes']) for k, w in res['compile_cache']['written'].items()} }")
        if watched:  # an engine's caches where no pod keeps them (stock's root, ~/.triton, /tmp): what it wrote
            res["written"] = {k: written(watched[k], inventory(d)) for k, d in engine["watch"].items()}
        after = calibrate()
        sb.log(f"calibration after {engine['name']}: {after['python_s']} s")
        res.update(kind=engine.get("kind"), calibration_before=before, calibration_after=after,
                   loadtest_result=loadtest_result(res, out_dir))
        results["engines"].append(res)
        if engine.get("check") == "reload":
            res["check"] = {"reload": reload_check(res) or "ok"}
            if res["check"]["reload"] != "ok" or res.get("error"):
                results["stopped"] = f"{engine['name']}: {res.get('error') or res['check']['reload']}"
                sb.log(f"STOP: {results['stopped']}")
                save()
                return 1
            sb.log(f"  reload check ok: {engine['name']}")
        save()
    save()
    for row in results["summary"]["per_start"]:
        sb.log(f"start {row['name']}: slow={row['slow']} calib={row['calibration_s']} "
               f"hit100={(row.get('hit100_tok_s') or {}).get('median')} hit0={(row.get('hit0_tok_s') or {}).get('median')} "
               f"ttft={row.get('ttft_ms')}")
    sb.log(f"ratios: {json.dumps(results['summary']['pooled_ratios'])}")
    sb.log(f"ratios (not slow): {json.dumps(results['summary']['pooled_not_slow_ratios'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
