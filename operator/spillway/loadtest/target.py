"""The server under test: what it serves and reports, and the request phases every experiment uses."""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.errors import InvalidSpec
from ..core.vllm_api import ENV_SERVER_DEV_MODE, RESET_PREFIX_CACHE_PATH, Metric
from .client import Completion, EndpointError, OpenAIClient
from .metrics import CacheFacts, Snapshot, counter_deltas, hit_summary
from .plan import AUTO, FLUSH_FACTOR, LONGEST, Plan
from .progress import Progress
from .prompts import PromptSource

PROBE_TOKENS = 16
SETTLE_QUIET_S = 0.25  # between nudges: longer than a store of the largest prompt takes (4 GB: 80 ms)
SETTLE_TIMEOUT_S = 60.0
RESET_RETRY_S = 60.0
ERROR_SAMPLES = 5


def check_fits(what: str, length: int, output_tokens: int, limit: object, model: str | None) -> None:
    """A prompt and its output within the server's max_model_len (when the server says it), else InvalidSpec:
    vLLM would refuse every request of the run."""
    if isinstance(limit, int) and length + output_tokens > limit:
        raise InvalidSpec(f"{what} {length} + {output_tokens} output tokens exceeds the server's "
                          f"max_model_len {limit} for {model!r}")


@dataclass
class Target:
    client: OpenAIClient
    plan: Plan
    prompts: PromptSource
    progress_mode: str = "auto"
    model: dict = field(default_factory=dict)
    version: str | None = None
    cache: CacheFacts | None = None
    has_metrics: bool = False
    block_size: int = 16
    gpu_kv_tokens: int | None = None
    evict_method: str = "none"

    @property
    def max_model_len(self) -> int | None:
        value = self.model.get("max_model_len")
        return int(value) if isinstance(value, int) else None

    async def discover(self, requested_model: str | None) -> None:
        """Model, version, cache facts; then one real completion. Raises EndpointError/InvalidSpec."""
        self.model = await self.client.resolve_model(requested_model)
        self.version = await self.client.version()
        snapshot = await self.snapshot()
        self.has_metrics = snapshot is not None
        self.cache = CacheFacts.from_snapshot(snapshot) if snapshot is not None else None
        self.block_size = _resolve(self.plan.block_size, self.cache and self.cache.block_size, 16)
        self.gpu_kv_tokens = _resolve(self.plan.gpu_kv_tokens, self.cache and self.cache.gpu_tokens, None)
        self._check_lengths()
        fmt = await self.client.probe_prompt_format(self.prompts.token_ids(PROBE_TOKENS, "probe"),
                                                    self.plan.prompt_format)
        self.prompts.fmt = fmt
        await self.resolve_eviction()

    def _check_lengths(self) -> None:
        limit = self.max_model_len
        self._resolve_longest(limit)
        if limit is None:
            return
        longest = []
        if "ttft" in self.plan.experiments:
            longest.append(("TTFT prompt length", max(self.plan.ttft.lengths)))
        if "throughput" in self.plan.experiments:
            longest.append(("prompt length", self.plan.throughput.prompt_len))
        for what, length in longest:
            check_fits(what, length, self.plan.output_tokens, limit, self.client.model)

    def _resolve_longest(self, limit: int | None) -> None:
        """`max` among the TTFT lengths becomes the longest prompt of whole blocks that leaves room for the
        output, so a 128K model is measured at 128K (131,008 tokens at 64-token blocks) and its repeat can load
        every block; it is left out where the server does not say its max_model_len."""
        lengths = self.plan.ttft.lengths
        if LONGEST not in lengths or "ttft" not in self.plan.experiments:
            return
        if limit is None:  # a server that does not say its limit: the lengths named are all there is to measure
            self.plan.ttft.lengths = [x for x in lengths if x != LONGEST]
            if not self.plan.ttft.lengths:
                raise InvalidSpec(f"TTFT length '{LONGEST}' needs the server's max_model_len, which "
                                  f"{self.client.base_url}/v1/models does not give; name the lengths instead")
            return
        block = max(1, self.block_size or 1)
        longest = (limit - self.plan.output_tokens) // block * block
        if longest <= 0:
            raise InvalidSpec(f"the server's max_model_len {limit} leaves no whole {block}-token block for a prompt")
        self.plan.ttft.lengths = sorted({*(x for x in lengths if x != LONGEST), longest})

    def environment(self) -> dict:
        cache_keys = ("num_gpu_blocks", "block_size", "enable_prefix_caching", "kv_offloading_backend",
                      "kv_offloading_size", "num_cpu_blocks", "cache_dtype", "kv_cache_memory_bytes",
                      "gpu_memory_utilization")
        labels = self.cache.labels if self.cache else {}
        return {
            "endpoint": self.client.base_url,
            "model": self.client.model,
            "max_model_len": self.max_model_len,
            "model_root": self.model.get("root"),
            "vllm_version": self.version,
            "metrics": self.has_metrics,
            "server_cache": {k: labels[k] for k in cache_keys if k in labels},
            "block_size": self.block_size,
            "gpu_kv_tokens": self.gpu_kv_tokens,
            "prompt_format": self.prompts.fmt,
            "evict_gpu": self.evict_method,
        }

    async def snapshot(self) -> Snapshot | None:
        text = await self.client.metrics_text()
        return Snapshot.from_text(text) if text is not None else None

    # -- request phases ---------------------------------------------------------------------------
    async def send_all(self, label: str, prompts: Iterable[list[int] | str]) -> tuple[list[Completion], float]:
        """Send prompts with the plan's concurrency; (results in order, seconds from first send to last reply).

        Request bodies are encoded before the clock starts."""
        return await self.send_encoded(label, [self.client.body(p, self.plan.output_tokens) for p in prompts])

    async def send_encoded(self, label: str, bodies: list[bytes]) -> tuple[list[Completion], float]:
        return await self.client.send_phase(bodies, self.plan.concurrency,
                                            Progress(label, len(bodies), self.progress_mode))

    async def settle(self, key: object) -> dict:
        """Wait until the server has no offload transfer running, so none overlaps the next timed request.

        vLLM submits a finished request's store at the start of its next engine step, and an idle engine
        takes none: a nudge (a never-seen prompt shorter than a block, which stores nothing) makes it take
        one; then /metrics is read until the store and load byte counters stop moving."""
        start = time.perf_counter()
        if not self.has_metrics:
            await asyncio.sleep(self.plan.settle_s)
            return {"method": "sleep", "waited_s": time.perf_counter() - start}
        first = last = await self.snapshot()
        nudges = 0
        while True:
            # a step also polls finished transfers: their bytes reach /metrics only through one
            nudge = self.prompts.prompt(max(1, self.block_size // 2), "nudge", key, nudges)
            result = await self.client.complete(nudge, 1)
            nudges += 1
            if not result.ok:
                raise EndpointError(f"settle request failed: {result.error}")
            now = await self.snapshot()
            moved = hit_summary(counter_deltas(last, now), 1)
            last = now
            quiet = not moved["offload_store_bytes"] and not moved["offload_load_bytes"]
            if (quiet and nudges >= 2) or time.perf_counter() - start > SETTLE_TIMEOUT_S:
                break
            await asyncio.sleep(SETTLE_QUIET_S)
        total = hit_summary(counter_deltas(first, last), 1)
        return {"method": "nudge", "nudges": nudges, "waited_s": time.perf_counter() - start,
                "store_bytes": total["offload_store_bytes"], "load_bytes": total["offload_load_bytes"]}

    # -- evicting the GPU copies ------------------------------------------------------------------
    async def resolve_eviction(self) -> None:
        """Pick how GPU copies are evicted (plan.evict_gpu), checking that the server allows it."""
        method = self.plan.evict_gpu
        no_gpu_cache = self.cache is not None and self.cache.prefix_caching is False
        if method == AUTO and no_gpu_cache:
            method = "none"
        if method in (AUTO, "reset"):
            available = await self._reset_gpu_cache()
            if available:
                method = "reset"
            elif method == "reset":
                raise InvalidSpec(f"{self.client.base_url} offers no {RESET_PREFIX_CACHE_PATH} (start vLLM with "
                                  f"{ENV_SERVER_DEV_MODE}=1) to evict the GPU prefix cache; use --evict-gpu flush")
            else:
                method = "flush"
        if method == "flush" and self.plan.flush_tokens == AUTO and self.gpu_kv_tokens is None:
            raise InvalidSpec(f"cannot size the GPU cache flush: {self.client.base_url} reports no "
                              f"{Metric.CACHE_CONFIG_INFO}; pass --gpu-kv-tokens or --flush-tokens")
        self.evict_method = method

    async def _reset_gpu_cache(self) -> bool:
        """True once the GPU prefix cache is empty, False where the server offers no reset."""
        deadline = time.monotonic() + RESET_RETRY_S
        while True:
            done = await self.client.reset_prefix_cache()
            if done is None:
                return False
            if done:
                return True
            if time.monotonic() > deadline:
                raise EndpointError(f"{self.client.base_url}{RESET_PREFIX_CACHE_PATH} kept refusing for "
                                    f"{RESET_RETRY_S:.0f}s (blocks still held by requests or transfers)")
            await asyncio.sleep(0.5)

    async def evict_gpu(self, key: object, working_set_tokens: int | None = None) -> dict:
        """Evict the GPU copies of everything sent so far; the CPU pool keeps its copies.

        working_set_tokens: tokens about to be re-read in the order they were written; twice the GPU
        capacity or more evicts itself under LRU, and no flush is sent."""
        await asyncio.sleep(self.plan.settle_s)  # offload stores complete asynchronously
        if self.evict_method == "none":
            return {"method": "none"}
        if self.evict_method == "reset":
            await self._reset_gpu_cache()
            return {"method": "reset"}
        tokens = self._flush_size(working_set_tokens)
        return {"method": "flush", **(await self._flush(tokens, key))}

    def _flush_size(self, working_set_tokens: int | None) -> int:
        if self.plan.flush_tokens != AUTO:
            return int(self.plan.flush_tokens)
        if working_set_tokens is not None and working_set_tokens >= 2 * self.gpu_kv_tokens:
            return 0
        return math.ceil(FLUSH_FACTOR * self.gpu_kv_tokens)

    async def _flush(self, tokens: int, key: object) -> dict:
        """Send `tokens` tokens of never-seen prompts so the GPU prefix cache evicts what came before."""
        if tokens <= 0:
            return {"tokens": 0}
        chunk = self._flush_chunk()
        count = math.ceil(tokens / chunk)
        prompts = (self.prompts.prompt(chunk, "flush", key, i) for i in range(count))
        results, elapsed = await self.send_all(f"flush {count}x{chunk}", prompts)
        failed = [r for r in results if not r.ok]
        if failed:
            raise EndpointError(f"{len(failed)} of {count} cache-flush requests failed: {failed[0].error}")
        await asyncio.sleep(self.plan.settle_s)
        return {"tokens": chunk * count, "requests": count, "elapsed_s": elapsed}

    def _flush_chunk(self) -> int:
        limit = (self.max_model_len or 8192) - self.plan.output_tokens - 1
        share = max(self.block_size, (self.gpu_kv_tokens or limit) // 4)
        return max(1, min(limit, share, 8192))


def measured(before: Snapshot | None, after: Snapshot | None, prompt_tokens: int) -> dict:
    deltas = counter_deltas(before, after)
    return {"counters": deltas, "achieved": hit_summary(deltas, prompt_tokens)}


def error_samples(results: list[Completion]) -> list[str]:
    return [r.error for r in results if not r.ok][:ERROR_SAMPLES]


def _resolve(requested: int | str, reported: int | None, fallback: int | None) -> int | None:
    if requested != AUTO:
        return int(requested)
    return reported if reported is not None else fallback

