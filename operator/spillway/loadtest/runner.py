"""Run a plan against one endpoint; the result survives errors and interruptions.

Importable with the standard library and aiohttp only (no Kubernetes client, no matplotlib):

    from spillway.loadtest.runner import run_endpoint
    result = run_endpoint("http://localhost:8000", Plan(experiments=["ttft"]), output=Path("ttft.json"))
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TextIO

from . import throughput, ttft
from .client import OpenAIClient
from .experiment import run_experiment, stopped_by_signals
from .plan import Plan
from .progress import log
from .prompts import PromptSource
from .results import SCHEMA, ResultSink, summarize_ttft
from .target import Target


async def run_async(endpoint: str, plan: Plan, *, model: str | None = None, api_key: str | None = None,
                    output: Path | None = None, emit: TextIO | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto", root: dict | None = None) -> dict:
    """root: the finished result this run is the baseline of (published with this one inside)."""

    async def measure(sink: ResultSink) -> None:
        async with OpenAIClient(endpoint, api_key=api_key, concurrency=plan.concurrency,
                                request_timeout_s=plan.request_timeout_s) as client:
            target = Target(client, plan, PromptSource(plan.seed, plan.id_range), progress)
            await target.discover(model)
            sink.result["environment"].update(target.environment())
            sink.publish()
            log(f"{endpoint}: model {client.model}, vLLM {target.version or '?'}, block {target.block_size} tokens, "
                f"GPU KV {target.gpu_kv_tokens or '?'} tokens, prompts as {target.prompts.fmt}")
            for name in plan.experiments:
                log(f"experiment {name}")
                await {"ttft": ttft.run, "throughput": throughput.run}[name](target, sink)

    return await run_experiment(SCHEMA, plan, measure, output=output, labels=labels, emit=emit, root=root,
                                prepare=_summarize, ttft={"samples": [], "summary": []}, throughput={"points": []})


def _summarize(result: dict) -> None:
    result["ttft"]["summary"] = summarize_ttft(result["ttft"]["samples"])


def run_endpoint(endpoint: str, plan: Plan, **kwargs) -> dict:
    """run_async in a fresh event loop that a stop signal cancels, keeping the partial result."""
    return asyncio.run(stopped_by_signals(run_async(endpoint, plan, **kwargs)))
