"""Experiment "preemption": a decode-heavy load that overflows the GPU KV cache, with and without offloading.

N never-seen prompts of L tokens, each generating O tokens (ignore_eos), all sent at once (or with the
plan's concurrency): once the running sequences' KV outgrows the GPU cache, vLLM preempts some and resumes
them later. Without offloading a resumed request recomputes its prompt and the tokens it had generated;
with the CPU pool it loads what was stored. /metrics around the run gives vLLM's own `vllm:num_preemptions`
and the connector's preempted-reload counters (requests and tokens resumed from the CPU pool), beside the
client's throughput (output tokens/s) and latency percentiles. Size the GPU cache below N x (L + O) tokens
to see preemptions (vLLM's --num-gpu-blocks-override or --kv-cache-memory-bytes on the server).

    spillway loadtest preemption run --endpoint http://offload:8000 --baseline-endpoint http://plain:8000 -o p.json
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spillway_connector import names as connector_names

from .experiment import (
    ConcurrentPlan,
    Experiment,
    around,
    check_errors,
    endpoint,
    phase_figures,
    run_experiment,
    whole_number,
)
from .experiment import table as frame
from .metrics import counter_deltas, hit_summary
from .progress import Progress, log
from .report import num

SCHEMA = "spillway.loadtest.preemption/v1"
EXPERIMENT = "preemption"


@dataclass(kw_only=True)
class PreemptionPlan(ConcurrentPlan):
    requests: int = whole_number(256, "requests")
    prompt_len: int = whole_number(1024, "prompt length")
    output_tokens: int = 1024
    concurrency: int = 256


async def run_endpoint(url: str, plan: PreemptionPlan, role: str, *, model: str | None = None,
                       api_key: str | None = None, progress: str = "auto") -> dict[str, Any]:
    """One endpoint's run: its counters and client figures (errors raise EndpointError)."""
    async with endpoint(url, plan, EXPERIMENT, prompt_len=plan.prompt_len, model=model, api_key=api_key,
                        concurrency=plan.concurrency) as (client, prompts, facts):
        bodies = [client.body(prompts.prompt(plan.prompt_len, EXPERIMENT, role, i), plan.output_tokens)
                  for i in range(plan.requests)]
        label = f"{role}: {plan.requests} x {plan.prompt_len}+{plan.output_tokens} tokens"
        (results, elapsed), (before,), (after,) = await around(
            client.send_phase(bodies, plan.concurrency, Progress(label, len(bodies), progress)), [client])
    deltas = counter_deltas(before, after)
    run = {
        "role": role, **facts, "metrics": before is not None, **phase_figures(results, elapsed, plan.prompt_len),
        "counters": deltas,
        "achieved": hit_summary(deltas, plan.requests * plan.prompt_len),
        "preempted_reload_tokens": deltas.get(connector_names.PREEMPTED_RELOAD_TOKENS),
        "preempted_queried_tokens": deltas.get(connector_names.PREEMPTED_QUERIED_TOKENS),
    }
    check_errors(plan.max_error_rate, [run], f"at {url}")
    return run


async def run_async(endpoints: list[tuple[str, str]], plan: PreemptionPlan, *, model: str | None = None,
                    api_key: str | None = None, output: Path | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto") -> dict[str, Any]:
    """endpoints: (role, url) pairs, measured in order; the result is written after each."""

    async def measure(sink) -> None:
        for role, url in endpoints:
            log(f"preemption: {role} at {url}")
            sink.result["runs"].append(await run_endpoint(url, plan, role, model=model, api_key=api_key,
                                                          progress=progress))
            sink.publish()

    return await run_experiment(SCHEMA, plan, measure, output=output, labels=labels, runs=[])


def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    title = (f"Preemption: {plan.get('requests')} requests x {plan.get('prompt_len')} prompt + "
             f"{plan.get('output_tokens')} output tokens, concurrency {plan.get('concurrency')}")
    header = ["run", "output tok/s", "p50 s", "p99 s", "preemptions", "reloads", "reload tok", "load GB", "store GB",
              "errors"]
    rows = []
    for run in result.get("runs", []):
        a, lat = run.get("achieved", {}), run.get("latency_s") or {}
        rows.append([run["role"], num(run.get("output_tokens_per_s"), "{:.0f}"), num(lat.get("p50"), "{:.2f}"),
                     num(lat.get("p99"), "{:.2f}"), num(a.get("preemptions"), "{:.0f}"),
                     num(a.get("preempted_reload_requests"), "{:.0f}"), num(run.get("preempted_reload_tokens"), "{:.0f}"),
                     num(_gb(a.get("offload_load_bytes")), "{:.2f}"), num(_gb(a.get("offload_store_bytes")), "{:.2f}"),
                     str(run.get("errors", 0))])
    return frame(title, result, header, rows)


def _gb(value: float | None) -> float | None:
    return value / 1e9 if value is not None else None


# -- command line ------------------------------------------------------------------------------------
def _add_flags(run: argparse.ArgumentParser, plan: Any) -> None:
    run.add_argument("--role", default="offload", help="the first endpoint's name in the result (default: offload)")
    run.add_argument("--baseline-endpoint", help="a server without offloading, measured after the first")
    defaults = PreemptionPlan()
    plan.add_argument("--requests", type=int, default=defaults.requests)
    plan.add_argument("--prompt-len", type=int, default=defaults.prompt_len)


def _start(args: argparse.Namespace, plan: PreemptionPlan, labels: dict[str, str]):
    endpoints = [(args.role, args.endpoint)] + ([("baseline", args.baseline_endpoint)] if args.baseline_endpoint else [])
    return run_async(endpoints, plan, model=args.model, api_key=args.api_key, output=args.output, labels=labels,
                     progress=args.progress)


COMMAND = Experiment(
    name=EXPERIMENT, schema=SCHEMA, plan=PreemptionPlan, add_flags=_add_flags, run_async=run_async, start=_start,
    table=table, endpoint_help="base URL of the offloading server",
    progress=True, help="decode-heavy load past the GPU KV cache: preemptions and reloads from the CPU pool, against "
                        "a server without offloading",
    run_help="run against the offloading server (and a baseline without offloading, after it)")
