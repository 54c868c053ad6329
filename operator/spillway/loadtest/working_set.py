"""Experiment "working-set": more prompts than the CPU pool holds, each served from CPU, from disk or recomputed.

N never-seen prompts of L tokens are sent once (all misses), then R requests each pick one of them at random (a
seeded draw with replacement, so the gaps between repeats vary). With a pool of P tokens and N x L well above P,
a repeat finds its prompt in the pool only when few others came since; a disk tier under the pool
(spec.offload.disk) still holds the rest. Requests go one at a time, streamed,
each bracketed by /metrics scrapes, so vLLM's vllm:prompt_tokens_cached_by_source (source host: the pool, disk:
the disk tier, device: the GPU prefix cache) says which tier served it. The report gives, for each of cpu, disk,
gpu and miss: requests, TTFT percentiles and prompt throughput (prompt tokens / seconds spent serving them).

    spillway loadtest working-set run --endpoint http://llama:8000 --prompts 4000 --prompt-len 8192 -o ws.json
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any

from ..core.vllm_api import Metric, OffloadConfigInfoLabel
from .client import EndpointError, OpenAIClient
from .experiment import Experiment, ExperimentPlan, around, run_on_endpoint, scrape, whole_number
from .experiment import table as frame
from .metrics import SERVING_TIERS, serving_tier
from .progress import log
from .prompts import PromptSource
from .report import num
from .results import ResultSink, percentiles

SCHEMA = "spillway.loadtest.working-set/v1"
EXPERIMENT = "working-set"


@dataclass(kw_only=True)
class WorkingSetPlan(ExperimentPlan):
    prompts: int = whole_number(1000, "prompts")
    requests: int | None = whole_number(None, "requests")  # repeats after the first pass; None: 2 x prompts
    prompt_len: int = whole_number(2048, "prompt length")
    request_timeout_s: float = 3600.0

    def validate(self) -> WorkingSetPlan:
        if self.requests is None:
            self.requests = 2 * self.prompts
        return super().validate()


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in SERVING_TIERS:
        mine = [s for s in samples if s["class"] == name and s["ok"]]
        busy = sum(s["latency_s"] for s in mine)
        prompt_tokens = sum(s["prompt_tokens"] or 0 for s in mine)
        out[name] = {"requests": len(mine), "ttft_s": percentiles([s["ttft_s"] for s in mine if s["ttft_s"]]),
                     "prompt_tokens_per_s": prompt_tokens / busy if busy > 0 else None,
                     "cached_tokens": sum(sum(s["cached_tokens"].values()) for s in mine)}
    return out


async def run_async(url: str, plan: WorkingSetPlan, **kwargs: Any) -> dict[str, Any]:
    """kwargs: model, api_key, output, labels (experiment.run_on_endpoint)."""
    return await run_on_endpoint(url, plan, SCHEMA, EXPERIMENT, _measure, samples=[], **kwargs)


async def _measure(plan: WorkingSetPlan, client: OpenAIClient, source: PromptSource, sink: ResultSink) -> None:
    result = sink.result
    (first,) = await scrape([client])
    pool = first.info_labels(Metric.OFFLOAD_CONFIG_INFO) if first else {}
    result["pool_tokens"] = int(pool[OffloadConfigInfoLabel.SIZE_TOKENS]) if pool.get(
        OffloadConfigInfoLabel.SIZE_TOKENS) else None
    result["working_set_tokens"] = plan.prompts * plan.prompt_len
    draw = random.Random(plan.seed)
    log(f"working set: {plan.prompts} prompts once, then {plan.requests} repeats")
    for i in range(plan.prompts):
        await _sample(client, source, plan, result, 0, i)
    sink.publish()
    for n in range(plan.requests):
        await _sample(client, source, plan, result, 1, draw.randrange(plan.prompts))
        if n % 100 == 99:
            sink.publish()
    result["by_tier"] = summarize([s for s in result["samples"] if s["round"] > 0])
    result["first_round"] = summarize([s for s in result["samples"] if s["round"] == 0])


async def _sample(client: OpenAIClient, source: PromptSource, plan: WorkingSetPlan, result: dict, round_: int,
                  index: int) -> None:
    prompt = source.prompt(plan.prompt_len, EXPERIMENT, index)
    reply, (before,), (after,) = await around(client.complete(prompt, plan.output_tokens, stream=True), [client])
    served_by, tokens = serving_tier(before, after)
    result["samples"].append({"round": round_, "prompt": index, "class": served_by, "ok": reply.ok,
                              "ttft_s": reply.ttft_s, "latency_s": reply.latency_s,
                              "prompt_tokens": reply.prompt_tokens or plan.prompt_len, "cached_tokens": tokens})
    if not reply.ok:
        raise EndpointError(f"working-set request (round {round_}, prompt {index}) failed: {reply.error}")


def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    title = (f"Working set: {plan.get('prompts')} prompts x {plan.get('prompt_len')} tokens = "
             f"{result.get('working_set_tokens')} tokens (CPU pool: {result.get('pool_tokens') or '?'} tokens), "
             f"{plan.get('requests')} repeats after the first pass")
    header = ["served by", "requests", "TTFT p50 s", "TTFT p99 s", "prompt tok/s"]
    rows = []
    for name, row in (result.get("by_tier") or {}).items():
        ttft = row.get("ttft_s") or {}
        rows.append([name, str(row["requests"]), num(ttft.get("p50"), "{:.3f}"), num(ttft.get("p99"), "{:.3f}"),
                     num(row.get("prompt_tokens_per_s"), "{:.0f}")])
    return frame(title, result, header, rows)


def _add_flags(run: argparse.ArgumentParser, plan: Any) -> None:
    defaults = WorkingSetPlan()
    plan.add_argument("--prompts", type=int, default=defaults.prompts, help="prompts in the working set")
    plan.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    plan.add_argument("--requests", type=int, help="repeats after the first pass, each a random prompt of the set "
                      "(default: 2 x prompts)")


COMMAND = Experiment(
    name=EXPERIMENT, schema=SCHEMA, plan=WorkingSetPlan, add_flags=_add_flags, run_async=run_async, table=table,
    help="a working set larger than the CPU pool: hits from CPU, from disk and misses, with TTFT and throughput each",
    run_help="run against one server, one request at a time")
