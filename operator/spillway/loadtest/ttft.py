"""Experiment "ttft": a prompt's first request (recompute) against its repeat once the GPU copy is gone.

Per repetition: every length's first request, one at a time; eviction of the GPU prefix cache (a reset
where the server offers it, else a flush of never-seen prompts; nothing where it keeps no GPU prefix
cache); every length's repeat. Before each request the server is settled (no offload transfer of an
earlier request still running: see Target.settle). With offloading the
repeat loads the prompt's KV from the CPU pool; without it, the repeat recomputes. Each request is
streamed (TTFT = first token on the client) and bracketed by /metrics scrapes, so each sample carries
the hits the server reports for it and, where the server's histograms counted it alone, where its time to first
token went on the server's clocks (metrics.server_phases).
"""
from __future__ import annotations

from .client import EndpointError
from .metrics import server_phases
from .results import ResultSink
from .target import Target, measured


async def run(target: Target, sink: ResultSink) -> None:
    plan = target.plan
    lengths = sorted(plan.ttft.lengths)
    section = sink.result["ttft"]
    section["evictions"] = []
    for rep in range(plan.ttft.repetitions):
        for length in lengths:
            await _sample(target, sink, length, rep, "cold")
        section["evictions"].append(await target.evict_gpu(("ttft", rep)))
        for length in lengths:
            await _sample(target, sink, length, rep, "warm")
        sink.publish()


async def _sample(target: Target, sink: ResultSink, length: int, rep: int, phase: str) -> None:
    prompt = target.prompts.prompt(length, "ttft", length, rep)
    settled = await target.settle(("ttft", length, rep, phase))  # no earlier store may share the link
    before = await target.snapshot()
    result = await target.client.complete(prompt, target.plan.output_tokens, stream=True)
    after = await target.snapshot()
    sample = {"length": length, "repetition": rep, "phase": phase, "ok": result.ok, "ttft_s": result.ttft_s,
              "latency_s": result.latency_s, "prompt_tokens": result.prompt_tokens, "error": result.error,
              "settle": settled}
    sample.update(measured(before, after, result.prompt_tokens or length))
    sample["server"] = server_phases(sample["counters"])
    sink.result["ttft"]["samples"].append(sample)
    if not result.ok:
        raise EndpointError(f"TTFT request of {length} tokens ({phase}, repetition {rep}) failed: {result.error}")
