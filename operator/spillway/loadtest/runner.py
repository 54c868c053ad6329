"""Run a plan against one endpoint; the result survives errors and interruptions.

Importable with the standard library and aiohttp only (no Kubernetes client, no matplotlib):

    from spillway.loadtest.runner import run_endpoint
    result = run_endpoint("http://localhost:8000", Plan(experiments=["ttft"]), output=Path("ttft.json"))
"""
from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import TextIO

from ..core.errors import SpillwayError
from . import throughput, ttft
from .client import OpenAIClient
from .plan import Plan
from .progress import log
from .prompts import PromptSource
from .results import STATUS_COMPLETE, STATUS_FAILED, STATUS_INTERRUPTED, ResultSink, new_result
from .target import Target


class Interrupted(SpillwayError):
    reason = "Interrupted"


async def run_async(endpoint: str, plan: Plan, *, model: str | None = None, api_key: str | None = None,
                    output: Path | None = None, emit: TextIO | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto", root: dict | None = None) -> dict:
    """root: the finished result this run is the baseline of (published with this one inside)."""
    plan.validate()
    if plan.seed is None:
        plan.seed = random.SystemRandom().randrange(2**32)
    sink = ResultSink(new_result(plan.to_dict(), labels or {}), output, emit, root)
    try:
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
    except SpillwayError as exc:
        sink.finish(STATUS_FAILED, str(exc))
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        sink.finish(STATUS_INTERRUPTED, "interrupted")
        raise Interrupted(f"interrupted; partial result kept{f' in {output}' if output else ''}") from None
    except BaseException as exc:
        sink.finish(STATUS_FAILED, f"{type(exc).__name__}: {exc}")
        raise
    sink.finish(STATUS_COMPLETE)
    return sink.result


# Ctrl-C and a deleted Job (SIGTERM) end the run, result kept. Handling SIGINT here too makes an interrupt work
# even where the process inherited SIGINT ignored (commands started in the background by a non-interactive shell).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_endpoint(endpoint: str, plan: Plan, **kwargs) -> dict:
    """run_async in a fresh event loop that a stop signal cancels, keeping the partial result."""
    return asyncio.run(stopped_by_signals(run_async(endpoint, plan, **kwargs)))


async def stopped_by_signals(coro):
    """Await `coro` as a task that SIGINT or SIGTERM cancels (the caller keeps what it had measured)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, task.cancel)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        return await task
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
