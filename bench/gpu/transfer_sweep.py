#!/usr/bin/env python3
"""Where in-engine CPU->GPU loads can lose time, measured outside the engine with vLLM's own copy op.

1. blocks per call: one swap_blocks_batch of n 2 MiB blocks, n = 1 .. 2048 (vLLM issues one call per
   request's load job: a 512-token prompt is 32 blocks, a 32K prompt 2048).
2. chained jobs: J jobs of n blocks submitted like vLLM's offload handler does (each on its own stream,
   waiting on the previous job's end event), timed from the first start to the last end.
3. loads while stores run: the same chained loads while a GPU->CPU store stream copies at the same time.

Host memory: cudaHostAlloc (as vLLM 0.26's pool) and a registered /dev/shm mmap (as vLLM >= 0.27's pool).
Prints a table; --json writes every sample. GB/s = 1e9 B/s; medians of --repeats with spread.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from spillway.qualify.cuda import Qualifier
from spillway.qualify.measure import MiB, block_pointers, gbps, scatter

BLOCK = 2 * MiB


def summarize(samples: list[float]) -> dict:
    med = statistics.median(samples)
    return {"median": round(med, 2), "best": round(max(samples), 2), "worst": round(min(samples), 2),
            "spread_pct": round((max(samples) - min(samples)) / med * 100, 1), "samples": [round(s, 2) for s in samples]}


class Chains:
    def __init__(self, q: Qualifier):
        self.q, self.torch = q, q.torch
        q._method("vllm")
        self.ops = q._vllm_ops

    def _job_args(self, n: int, pool: int, to_gpu: bool):
        q = self.q
        gpu, host = q.gpu.data_ptr(), q.host.tensor.data_ptr()
        src_base, dst_base = (host, gpu) if to_gpu else (gpu, host)
        src = block_pointers(src_base, scatter(q.rng, pool, n), BLOCK)
        dst = block_pointers(dst_base, scatter(q.rng, pool, n), BLOCK)
        return q._prepare("vllm", src, dst, BLOCK)

    def run(self, jobs: int, n: int, pool: int, with_store: bool) -> float:
        """GB/s of the loads (CPU->GPU bytes only) from the first job's start to the last one's end."""
        torch = self.torch
        loads = [self._job_args(n, pool, True) for _ in range(jobs)]
        store = self._job_args(min(pool, jobs * n), pool, False) if with_store else None
        streams = [torch.cuda.Stream() for _ in range(jobs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(jobs)]
        first = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if store is not None:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                self.ops.swap_blocks_batch(*store, is_src_access_order_any=False)
        prev = None
        for k, (args, stream) in enumerate(zip(loads, streams)):
            if prev is not None:
                stream.wait_event(prev)
            with torch.cuda.stream(stream):
                if k == 0:
                    first.record(stream)
                self.ops.swap_blocks_batch(*args, is_src_access_order_any=True)
                ends[k].record(stream)
            prev = ends[k]
        torch.cuda.synchronize()
        return gbps(jobs * n * BLOCK, first.elapsed_time(ends[-1]) / 1e3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host-memory", default="alloc,shm")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    a = p.parse_args()
    sizes = [1, 4, 16, 32, 64, 128, 512, 2048]
    chains = [(64, 32), (8, 256), (1, 2048)]  # (jobs, blocks per job): 512-token requests, 4K, one 32K prompt
    out: dict = {"block_bytes": BLOCK, "repeats": a.repeats, "runs": {}}
    t0 = time.time()
    for host in a.host_memory.split(","):
        pool = 4096  # 8 GiB on each side
        q = Qualifier(pool * BLOCK, pool * BLOCK, host)
        try:
            res: dict = {"per_call": {}, "chained": {}, "chained_with_store": {}}
            for n in sizes:
                q.transfer("vllm", "c2g", BLOCK, n, check=True)
                res["per_call"][n] = summarize(
                    [gbps(n * BLOCK, q.transfer("vllm", "c2g", BLOCK, n)) for _ in range(a.repeats)])
            ch = Chains(q)
            for jobs, n in chains:
                ch.run(jobs, n, pool, False)
                res["chained"][f"{jobs}x{n}"] = summarize([ch.run(jobs, n, pool, False) for _ in range(a.repeats)])
                res["chained_with_store"][f"{jobs}x{n}"] = summarize(
                    [ch.run(jobs, n, pool, True) for _ in range(a.repeats)])
            out["runs"][host] = res
        finally:
            q.close()
    out["seconds"] = round(time.time() - t0, 1)
    print(f"CPU->GPU, vLLM swap_blocks_batch, 2 MiB blocks: median GB/s (spread %), {a.repeats} repeats")
    for host, res in out["runs"].items():
        print(f"host memory: {host}")
        print("  blocks per call: " + "  ".join(f"{n}: {r['median']:.1f} ({r['spread_pct']:.0f}%)"
                                               for n, r in res["per_call"].items()))
        for key in res["chained"]:
            c, s = res["chained"][key], res["chained_with_store"][key]
            print(f"  chained {key:>7s}: {c['median']:.1f} ({c['spread_pct']:.0f}%), with a store running: "
                  f"{s['median']:.1f} ({s['spread_pct']:.0f}%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
