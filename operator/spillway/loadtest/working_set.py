"""Experiment "working-set": more prompts than the CPU pool holds, each served from CPU, from disk or recomputed.

N never-seen prompts of L tokens are sent once (all misses), then R requests each pick one of them at random (a
seeded draw with replacement, so the gaps between repeats vary). With a pool of P tokens and N x L well above P,
a repeat finds its prompt in the pool only when few others came since; a disk tier under the pool
(spec.offload.disk) still holds the rest. Requests go one at a time, streamed,
each bracketed by /metrics scrapes, so vLLM's vllm:prompt_tokens_cached_by_source (source host: the pool, disk:
the disk tier, device: the GPU prefix cache) says which tier served it. The report gives, for each of cpu, disk,
gpu and miss: requests, TTFT percentiles and prompt throughput (prompt tokens / seconds spent serving them).

    spillway loadtest working-set --endpoint http://llama:8000 --prompts 4000 --prompt-len 8192 -o ws.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.errors import InvalidSpec
from ..core.vllm_api import CacheHitSource, Metric, OffloadConfigInfoLabel
from .client import EndpointError, OpenAIClient
from .job import ENV_API_KEY
from .metrics import Snapshot
from .progress import log
from .prompts import DEFAULT_ID_RANGE, PromptSource
from .results import percentiles, write_atomic
from .target import check_fits

SCHEMA = "spillway.loadtest.working-set/v1"
EXPERIMENT = "working-set"
CLASSES = ("cpu", "disk", "gpu", "miss")
_SOURCE_CLASS = ((CacheHitSource.DISK, "disk"), (CacheHitSource.HOST, "cpu"), (CacheHitSource.DEVICE, "gpu"))


@dataclass
class WorkingSetPlan:
    prompts: int = 1000
    prompt_len: int = 2048
    requests: int | None = None  # repeats after the first pass; None: 2 x prompts
    output_tokens: int = 1
    id_range: int = DEFAULT_ID_RANGE
    seed: int | None = None
    request_timeout_s: float = 3600.0

    def validate(self) -> WorkingSetPlan:
        if self.requests is None:
            self.requests = 2 * self.prompts
        for what, value in (("prompts", self.prompts), ("prompt length", self.prompt_len), ("requests", self.requests),
                            ("output tokens", self.output_tokens), ("token id range", self.id_range)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{what} must be a whole number >= 1; got {value!r}")
        return self


def classify(before: Snapshot | None, after: Snapshot | None) -> tuple[str, dict[str, float]]:
    """The tier that served a request, from the cached-by-source deltas around it: disk wins over cpu over gpu
    (a prompt partly on disk waited for the disk); miss when none served a token."""
    if before is None or after is None:
        return "miss", {}
    tokens = {}
    for source, _ in _SOURCE_CLASS:
        now = after.counter(Metric.PROMPT_TOKENS_CACHED_BY_SOURCE, **{CacheHitSource.LABEL: source}) or 0.0
        then = before.counter(Metric.PROMPT_TOKENS_CACHED_BY_SOURCE, **{CacheHitSource.LABEL: source}) or 0.0
        tokens[source] = now - then
    for source, name in _SOURCE_CLASS:
        if tokens[source] > 0:
            return name, tokens
    return "miss", tokens


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in CLASSES:
        mine = [s for s in samples if s["class"] == name and s["ok"]]
        busy = sum(s["latency_s"] for s in mine)
        prompt_tokens = sum(s["prompt_tokens"] or 0 for s in mine)
        out[name] = {"requests": len(mine), "ttft_s": percentiles([s["ttft_s"] for s in mine if s["ttft_s"]]),
                     "prompt_tokens_per_s": prompt_tokens / busy if busy > 0 else None,
                     "cached_tokens": sum(sum(s["cached_tokens"].values()) for s in mine)}
    return out


async def run_async(endpoint: str, plan: WorkingSetPlan, *, model: str | None = None, api_key: str | None = None,
                    output: Path | None = None) -> dict[str, Any]:
    plan.validate()
    if plan.seed is None:
        plan.seed = int.from_bytes(os.urandom(4), "little")
    result: dict[str, Any] = {"schema": SCHEMA, "status": "running", "error": None, "plan": asdict(plan),
                              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "samples": []}

    def publish() -> None:
        if output is not None:
            write_atomic(output, json.dumps(result, indent=1))

    try:
        async with OpenAIClient(endpoint, api_key=api_key, concurrency=1,
                                request_timeout_s=plan.request_timeout_s) as client:
            entry = await client.resolve_model(model)
            check_fits("prompt length", plan.prompt_len, plan.output_tokens, entry.get("max_model_len"),
                       client.model)
            source = PromptSource(plan.seed, plan.id_range)
            source.fmt = await client.probe_prompt_format(source.token_ids(16, "probe"))
            first = await client.metrics_text()
            pool = Snapshot.from_text(first).info_labels(Metric.OFFLOAD_CONFIG_INFO) if first else {}
            result["pool_tokens"] = int(pool[OffloadConfigInfoLabel.SIZE_TOKENS]) if pool.get(
                OffloadConfigInfoLabel.SIZE_TOKENS) else None
            result["working_set_tokens"] = plan.prompts * plan.prompt_len
            draw = random.Random(plan.seed)
            log(f"working set: {plan.prompts} prompts once, then {plan.requests} repeats")
            for i in range(plan.prompts):
                await _sample(client, source, plan, result, 0, i)
            publish()
            for n in range(plan.requests):
                await _sample(client, source, plan, result, 1, draw.randrange(plan.prompts))
                if n % 100 == 99:
                    publish()
    except BaseException as exc:
        result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
        publish()
        raise
    result["by_tier"] = summarize([s for s in result["samples"] if s["round"] > 0])
    result["first_round"] = summarize([s for s in result["samples"] if s["round"] == 0])
    result["status"] = "complete"
    publish()
    return result


async def _sample(client: OpenAIClient, source: PromptSource, plan: WorkingSetPlan, result: dict, round_: int,
                  index: int) -> None:
    text = await client.metrics_text()
    before = Snapshot.from_text(text) if text is not None else None
    reply = await client.complete(source.prompt(plan.prompt_len, EXPERIMENT, index), plan.output_tokens, stream=True)
    text = await client.metrics_text()
    after = Snapshot.from_text(text) if text is not None else None
    served_by, tokens = classify(before, after)
    result["samples"].append({"round": round_, "prompt": index, "class": served_by, "ok": reply.ok,
                              "ttft_s": reply.ttft_s, "latency_s": reply.latency_s,
                              "prompt_tokens": reply.prompt_tokens or plan.prompt_len, "cached_tokens": tokens})
    if not reply.ok:
        raise EndpointError(f"working-set request (round {round_}, prompt {index}) failed: {reply.error}")


def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    lines = [(f"Working set: {plan.get('prompts')} prompts x {plan.get('prompt_len')} tokens = "
              f"{result.get('working_set_tokens')} tokens (CPU pool: {result.get('pool_tokens') or '?'} tokens), "
              f"{plan.get('requests')} repeats after the first pass (status {result.get('status')})"),
             f"{'served by':<10} {'requests':>8} {'TTFT p50 s':>10} {'TTFT p99 s':>10} {'prompt tok/s':>12}"]
    for name, row in (result.get("by_tier") or {}).items():
        ttft = row.get("ttft_s") or {}

        def num(value: float | None, fmt: str) -> str:
            return format(value, fmt) if value is not None else "-"

        lines.append(f"{name:<10} {row['requests']:>8} {num(ttft.get('p50'), '10.3f')} {num(ttft.get('p99'), '10.3f')} "
                     f"{num(row.get('prompt_tokens_per_s'), '12.0f')}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(EXPERIMENT, help="a working set larger than the CPU pool: hits from CPU, from disk and "
                                          "misses, with TTFT and throughput each")
    run.add_argument("--endpoint", required=True, help="base URL of the server")
    run.add_argument("--model", help="served model id (default: the only one the endpoint serves)")
    run.add_argument("--api-key", default=os.environ.get(ENV_API_KEY), help=f"bearer token (default: ${ENV_API_KEY})")
    defaults = WorkingSetPlan()
    g = run.add_argument_group("plan")
    g.add_argument("--prompts", type=int, default=defaults.prompts, help="prompts in the working set")
    g.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    g.add_argument("--requests", type=int, help="repeats after the first pass, each a random prompt of the set "
                   "(default: 2 x prompts)")
    g.add_argument("--output-tokens", type=int, default=defaults.output_tokens)
    g.add_argument("--id-range", type=int, default=defaults.id_range, help="token ids drawn from [10, 10+N)")
    g.add_argument("--seed", type=int, help="prompt seed (default: random)")
    g.add_argument("--request-timeout-s", type=float, default=defaults.request_timeout_s)
    run.add_argument("--output", "-o", type=Path, default=Path("working-set.json"), help="result JSON")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import stopped_by_signals

    plan = WorkingSetPlan(args.prompts, args.prompt_len, args.requests, args.output_tokens, args.id_range, args.seed,
                          args.request_timeout_s).validate()
    result = asyncio.run(stopped_by_signals(run_async(args.endpoint, plan, model=args.model, api_key=args.api_key,
                                                       output=args.output)))
    print(f"result: {args.output}", file=sys.stderr)
    print(table(result))
    return 0
