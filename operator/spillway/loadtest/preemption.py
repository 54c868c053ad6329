"""Experiment "preemption": a decode-heavy load that overflows the GPU KV cache, with and without offloading.

N never-seen prompts of L tokens, each generating O tokens (ignore_eos), all sent at once (or with the
plan's concurrency): once the running sequences' KV outgrows the GPU cache, vLLM preempts some and resumes
them later. Without offloading a resumed request recomputes its prompt and the tokens it had generated;
with the CPU pool it loads what was stored. /metrics around the run gives vLLM's own `vllm:num_preemptions`
and the connector's preempted-reload counters (requests and tokens resumed from the CPU pool), beside the
client's throughput (output tokens/s) and latency percentiles. Size the GPU cache below N x (L + O) tokens
to see preemptions (vLLM's --num-gpu-blocks-override or --kv-cache-memory-bytes on the server).

    spillway loadtest preemption --endpoint http://offload:8000 --baseline-endpoint http://plain:8000 -o p.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spillway_connector import names as connector_names

from ..core.errors import InvalidSpec
from .client import EndpointError, OpenAIClient
from .http1 import DEFAULT_REQUEST_TIMEOUT_S
from .job import ENV_API_KEY
from .metrics import counter_deltas, hit_summary
from .plan import Plan
from .progress import log
from .prompts import DEFAULT_ID_RANGE, PromptSource
from .results import percentiles, write_atomic
from .target import Target, check_fits, error_samples

SCHEMA = "spillway.loadtest.preemption/v1"
EXPERIMENT = "preemption"


@dataclass
class PreemptionPlan:
    requests: int = 256
    prompt_len: int = 1024
    output_tokens: int = 1024
    concurrency: int = 256
    id_range: int = DEFAULT_ID_RANGE
    seed: int | None = None  # None: drawn when the run starts
    max_error_rate: float = 0.01
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def validate(self) -> PreemptionPlan:
        for what, value in (("requests", self.requests), ("prompt length", self.prompt_len),
                            ("output tokens", self.output_tokens), ("concurrency", self.concurrency),
                            ("token id range", self.id_range)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{what} must be a whole number >= 1; got {value!r}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise InvalidSpec(f"max error rate {self.max_error_rate:g} is outside 0..1")
        return self


async def run_endpoint(endpoint: str, plan: PreemptionPlan, role: str, *, model: str | None = None,
                       api_key: str | None = None, progress: str = "auto") -> dict[str, Any]:
    """One endpoint's run: its counters and client figures (errors raise EndpointError)."""
    async with OpenAIClient(endpoint, api_key=api_key, concurrency=plan.concurrency,
                            request_timeout_s=plan.request_timeout_s) as client:
        entry = await client.resolve_model(model)
        check_fits("prompt length", plan.prompt_len, plan.output_tokens, entry.get("max_model_len"), client.model)
        prompts = PromptSource(plan.seed, plan.id_range)
        prompts.fmt = await client.probe_prompt_format(prompts.token_ids(16, "probe", role))
        target = Target(client, Plan(concurrency=plan.concurrency, output_tokens=plan.output_tokens), prompts, progress)
        version = await client.version()
        bodies = [client.body(prompts.prompt(plan.prompt_len, EXPERIMENT, role, i), plan.output_tokens)
                  for i in range(plan.requests)]
        before = await target.snapshot()
        results, elapsed = await target.send_encoded(f"{role}: {plan.requests} x {plan.prompt_len}+"
                                                     f"{plan.output_tokens} tokens", bodies)
        after = await target.snapshot()
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    deltas = counter_deltas(before, after)
    run = {
        "role": role, "endpoint": client.base_url, "model": client.model, "vllm_version": version,
        "metrics": before is not None, "requests": plan.requests, "ok": len(ok), "errors": len(results) - len(ok),
        "error_samples": error_samples(results), "elapsed_s": elapsed, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / elapsed if elapsed > 0 else None,
        "requests_per_s": len(ok) / elapsed if elapsed > 0 else None,
        "latency_s": percentiles([r.latency_s for r in ok]),
        "counters": deltas,
        "achieved": hit_summary(deltas, plan.requests * plan.prompt_len),
        "preempted_reload_tokens": deltas.get(connector_names.PREEMPTED_RELOAD_TOKENS),
        "preempted_queried_tokens": deltas.get(connector_names.PREEMPTED_QUERIED_TOKENS),
    }
    if run["errors"] > plan.max_error_rate * plan.requests:
        raise EndpointError(f"{run['errors']} of {plan.requests} requests failed at {endpoint}; first: "
                            f"{run['error_samples'][0]}")
    return run


async def run_async(endpoints: list[tuple[str, str]], plan: PreemptionPlan, *, model: str | None = None,
                    api_key: str | None = None, output: Path | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto") -> dict[str, Any]:
    """endpoints: (role, url) pairs, measured in order; the result is written after each."""
    plan.validate()
    if plan.seed is None:
        plan.seed = int.from_bytes(os.urandom(4), "little")
    result: dict[str, Any] = {"schema": SCHEMA, "status": "running", "error": None, "plan": asdict(plan),
                              "labels": labels or {}, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "runs": []}

    def publish() -> None:
        if output is not None:
            write_atomic(output, _dumps(result))

    try:
        for role, url in endpoints:
            log(f"preemption: {role} at {url}")
            result["runs"].append(await run_endpoint(url, plan, role, model=model, api_key=api_key,
                                                     progress=progress))
            publish()
    except BaseException as exc:
        result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
        publish()
        raise
    result["status"] = "complete"
    publish()
    return result


def _dumps(result: dict) -> str:
    return json.dumps(result, indent=1)


def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    lines = [(f"Preemption: {plan.get('requests')} requests x {plan.get('prompt_len')} prompt + "
             f"{plan.get('output_tokens')} output tokens, concurrency {plan.get('concurrency')} "
             f"(status {result.get('status')})"),
             (f"{'run':<12} {'output tok/s':>12} {'p50 s':>7} {'p99 s':>7} {'preemptions':>11} "
             f"{'reloads':>8} {'reload tok':>10} {'load GB':>8} {'store GB':>8} {'errors':>6}")]
    for run in result.get("runs", []):
        a, lat = run.get("achieved", {}), run.get("latency_s") or {}

        def num(value: float | None, fmt: str) -> str:
            return format(value, fmt) if value is not None else "-"

        lines.append(f"{run['role']:<12} {num(run.get('output_tokens_per_s'), '12.0f')} {num(lat.get('p50'), '7.2f')} "
                     f"{num(lat.get('p99'), '7.2f')} {num(a.get('preemptions'), '11.0f')} "
                     f"{num(a.get('preempted_reload_requests'), '8.0f')} {num(run.get('preempted_reload_tokens'), '10.0f')} "
                     f"{num(_gb(a.get('offload_load_bytes')), '8.2f')} {num(_gb(a.get('offload_store_bytes')), '8.2f')} "
                     f"{run.get('errors', 0):6d}")
    return "\n".join(lines)


def _gb(value: float | None) -> float | None:
    return value / 1e9 if value is not None else None


# -- command line ------------------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(EXPERIMENT, help="decode-heavy load past the GPU KV cache: preemptions and reloads from "
                                          "the CPU pool, against a server without offloading")
    run.add_argument("--endpoint", required=True, help="base URL of the offloading server")
    run.add_argument("--role", default="offload", help="the first endpoint's name in the result (default: offload)")
    run.add_argument("--baseline-endpoint", help="a server without offloading, measured after the first")
    run.add_argument("--model", help="served model id (default: the only one the endpoint serves)")
    run.add_argument("--api-key", default=os.environ.get(ENV_API_KEY), help=f"bearer token (default: ${ENV_API_KEY})")
    defaults = PreemptionPlan()
    g = run.add_argument_group("plan")
    g.add_argument("--requests", type=int, default=defaults.requests)
    g.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    g.add_argument("--output-tokens", type=int, default=defaults.output_tokens, help="tokens each request generates")
    g.add_argument("--concurrency", type=int, default=defaults.concurrency)
    g.add_argument("--id-range", type=int, default=defaults.id_range, help="token ids drawn from [10, 10+N)")
    g.add_argument("--seed", type=int, help="prompt seed (default: random)")
    g.add_argument("--max-error-rate", type=float, default=defaults.max_error_rate)
    g.add_argument("--request-timeout-s", type=float, default=defaults.request_timeout_s)
    o = run.add_argument_group("output")
    o.add_argument("--output", "-o", type=Path, default=Path("preemption.json"), help="result JSON")
    o.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="recorded with the result")
    o.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import stopped_by_signals

    plan = PreemptionPlan(requests=args.requests, prompt_len=args.prompt_len, output_tokens=args.output_tokens,
                          concurrency=args.concurrency, id_range=args.id_range, seed=args.seed,
                          max_error_rate=args.max_error_rate, request_timeout_s=args.request_timeout_s).validate()
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--label expects KEY=VALUE, got {item!r}")
        labels[key] = value
    endpoints = [(args.role, args.endpoint)] + ([("baseline", args.baseline_endpoint)] if args.baseline_endpoint else [])
    result = asyncio.run(stopped_by_signals(run_async(endpoints, plan, model=args.model, api_key=args.api_key,
                                                       output=args.output, labels=labels, progress=args.progress)))
    print(f"result: {args.output}", file=sys.stderr)
    print(table(result))
    return 0

