"""Experiment "throughput": N unique prompts of L tokens, swept over target CPU hit rates.

For a target hit rate h, every prompt is a prefix of h*L tokens (whole blocks) followed by a fresh
suffix. Warm-up (not timed) sends the prefixes alone, so their KV is stored in the CPU pool. Hits must
come from the CPU pool, not the GPU prefix cache: the GPU copies are evicted after the warm-up (a reset
where the server offers it; else, unless the working set is at least twice the GPU KV capacity, which
re-read in the same order evicts itself under LRU, a flush of never-seen prompts). The timed phase sends all N prompts with the plan's
concurrency, once no store of the warm-up is still running. /metrics scraped around the timed phase gives the hit rate the server achieved.
Every point uses its own prompts: nothing carries over between points.
"""
from __future__ import annotations

from .experiment import check_errors, per_second, phase_figures
from .plan import hittable_tokens, prefix_tokens
from .progress import log
from .results import ResultSink
from .target import Target, error_samples, measured

MISS_TOLERANCE = 0.05


async def run(target: Target, sink: ResultSink) -> None:
    plan = target.plan
    for index, rate in enumerate(plan.throughput.hit_rates):
        point = await _point(target, index, rate)
        sink.result["throughput"]["points"].append(point)
        sink.publish()
        _warn_if_missed(point, plan.throughput.num_prompts, plan.throughput.prompt_len)
        check_errors(plan.max_error_rate, (point, point["warmup"]), f"at target hit rate {rate:g}")


async def _point(target: Target, index: int, rate: float) -> dict:
    tp = target.plan.throughput
    length, n = tp.prompt_len, tp.num_prompts
    prefix = prefix_tokens(rate, length, target.block_size)
    label = f"hit {rate:.0%}"
    prompts = target.prompts

    def prefix_of(i: int) -> list[int]:
        return prompts.token_ids(prefix, "tp", index, i, "prefix")

    warmup: dict = {"requests": 0, "errors": 0}
    if prefix:
        results, elapsed = await target.send_all(f"{label} warm-up", (prompts.render(prefix_of(i)) for i in range(n)))
        warmup = {"requests": n, "errors": sum(not r.ok for r in results), "elapsed_s": elapsed,
                  "tokens": prefix * n, "error_samples": error_samples(results)}
        warmup["eviction"] = await target.evict_gpu(("tp", index), prefix * n)

    timed = (prompts.render(prefix_of(i) + prompts.token_ids(length - prefix, "tp", index, i, "suffix"))
             for i in range(n))
    settled = await target.settle(("tp", index))  # the warm-up's last stores are submitted only now
    before = await target.snapshot()
    results, elapsed = await target.send_all(f"{label} timed", timed)
    after = await target.snapshot()

    figures = phase_figures(results, elapsed, length)
    point = {
        "target_hit_rate": rate,
        "prefix_tokens": prefix,
        "placed_rate": prefix / length,  # prompt tokens placed in the CPU pool by the warm-up
        "hittable_rate": hittable_tokens(prefix, length, target.block_size) / length,  # at least served from it
        **figures,
        "tokens_per_s": per_second(figures["prompt_tokens"] + figures["output_tokens"], elapsed),
        "warmup": warmup,
        "settle": settled,
    }
    point.update(measured(before, after, figures["prompt_tokens"]))
    return point


def _warn_if_missed(point: dict, n: int, length: int) -> None:
    achieved = point["achieved"]["cpu_hit_rate"]
    if achieved is None:
        log(f"hit {point['target_hit_rate']:.0%}: the server reports no external prefix cache hits "
            "(no offloading connector?)")
    elif achieved < point["hittable_rate"] - MISS_TOLERANCE:
        log(f"hit {point['target_hit_rate']:.0%}: achieved CPU hit rate {achieved:.1%} is below the "
            f"{point['hittable_rate']:.1%} placed in the pool: the pool holds less than this point's working set "
            f"({n} x {length} = {n * length} tokens, prefixes and the timed phase's own stores)")
