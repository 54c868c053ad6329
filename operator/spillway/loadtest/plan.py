"""What a load test run asks for: experiments and their knobs, validated before any request is sent."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..core.errors import InvalidSpec
from .http1 import DEFAULT_REQUEST_TIMEOUT_S

EXPERIMENTS = ("ttft", "throughput")
# Defaults from vLLM's blog post on the KV offloading connector: single-request TTFT over prompt lengths; 10 000 unique 512-token
# prompts swept over CPU hit rates.
LONGEST = "max"  # a TTFT length: the longest whole-block prompt the server's max_model_len takes (128K on Llama 3.1)
DEFAULT_TTFT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, LONGEST)
DEFAULT_TTFT_REPETITIONS = 5
DEFAULT_NUM_PROMPTS = 10_000
DEFAULT_PROMPT_LEN = 512
DEFAULT_HIT_RATES = (0.0, 0.25, 0.5, 0.8, 1.0)
DEFAULT_CONCURRENCY = 256
FLUSH_FACTOR = 1.25  # a flush allocates this many times the GPU KV capacity
AUTO = "auto"


# How the GPU copies of prompts are evicted before they are re-read (so repeats come from the CPU pool):
#   reset: POST /reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1; the CPU pool is kept)
#   flush: never-seen prompts of ~1.25x the GPU KV capacity (they pass through the CPU pool too)
#   none:  nothing (a server without GPU prefix caching)
#   auto:  none without GPU prefix caching, else reset where the server offers it, else flush
EVICT_METHODS = (AUTO, "reset", "flush", "none")


@dataclass
class TtftPlan:
    lengths: list[int | str] = field(default_factory=lambda: list(DEFAULT_TTFT_LENGTHS))
    repetitions: int = DEFAULT_TTFT_REPETITIONS


@dataclass
class ThroughputPlan:
    num_prompts: int = DEFAULT_NUM_PROMPTS
    prompt_len: int = DEFAULT_PROMPT_LEN
    hit_rates: list[float] = field(default_factory=lambda: list(DEFAULT_HIT_RATES))


@dataclass
class Plan:
    experiments: list[str] = field(default_factory=lambda: list(EXPERIMENTS))
    ttft: TtftPlan = field(default_factory=TtftPlan)
    throughput: ThroughputPlan = field(default_factory=ThroughputPlan)
    evict_gpu: str = AUTO
    flush_tokens: int | str = AUTO  # size of a flush; auto: from the server's GPU KV capacity
    concurrency: int = DEFAULT_CONCURRENCY
    output_tokens: int = 1
    prompt_format: str = AUTO  # auto | ids | text
    id_range: int = 1000
    seed: int | None = None  # None: a random seed, drawn when the run starts
    settle_s: float = 1.0  # pause after warm-ups and flushes: offload stores finish asynchronously
    block_size: int | str = AUTO  # tokens per KV block (hit granularity); auto: the server's
    gpu_kv_tokens: int | str = AUTO  # the server's GPU KV capacity; auto: from its /metrics
    max_error_rate: float = 0.01
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> Plan:
        unknown = [e for e in self.experiments if e not in EXPERIMENTS]
        if unknown or not self.experiments:
            raise InvalidSpec(f"experiments must be among {', '.join(EXPERIMENTS)}; got {', '.join(self.experiments) or 'none'}")
        for rate in self.throughput.hit_rates:
            if not 0.0 <= rate <= 1.0:
                hint = f" (hit rates are fractions: {rate / 100:g} means {rate:g}%)" if 1 < rate <= 100 else ""
                raise InvalidSpec(f"hit rate {rate:g} is outside 0..1{hint}")
        if not self.throughput.hit_rates:
            raise InvalidSpec("give at least one hit rate")
        _positive("concurrency", self.concurrency)
        _positive("output tokens", self.output_tokens)
        _positive("TTFT repetitions", self.ttft.repetitions)
        _positive("number of prompts", self.throughput.num_prompts)
        _positive("prompt length", self.throughput.prompt_len)
        _positive("token id range", self.id_range)
        for length in self.ttft.lengths:
            if length != LONGEST:
                _positive("TTFT prompt length", length)
        if not self.ttft.lengths:
            raise InvalidSpec("give at least one TTFT prompt length")
        for name, value in (("--block-size", self.block_size), ("--gpu-kv-tokens", self.gpu_kv_tokens),
                            ("--flush-tokens", self.flush_tokens)):
            if value != AUTO and (not isinstance(value, int) or value < 0):
                raise InvalidSpec(f"{name} must be '{AUTO}' or a whole number >= 0; got {value!r}")
        if self.evict_gpu not in EVICT_METHODS:
            raise InvalidSpec(f"GPU eviction must be one of {', '.join(EVICT_METHODS)}; got {self.evict_gpu!r}")
        if self.prompt_format not in (AUTO, "ids", "text"):
            raise InvalidSpec(f"prompt format must be auto, ids or text; got {self.prompt_format!r}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise InvalidSpec(f"max error rate {self.max_error_rate:g} is outside 0..1")
        if not (math.isfinite(self.settle_s) and self.settle_s >= 0):
            raise InvalidSpec(f"--settle-s must be a finite number of seconds >= 0; got {self.settle_s:g}")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise InvalidSpec(f"--request-timeout-s must be a finite number of seconds > 0; got {self.request_timeout_s:g}")
        return self


def _positive(what: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise InvalidSpec(f"{what} must be a whole number >= 1; got {value!r}")


def prefix_tokens(hit_rate: float, prompt_len: int, block_size: int) -> int:
    """Tokens of a prompt placed in the CPU pool beforehand for a target hit rate (whole blocks)."""
    return int(hit_rate * prompt_len) // block_size * block_size


def hittable_tokens(prefix: int, prompt_len: int, block_size: int) -> int:
    """Tokens the server can serve from cache at least: whole blocks short of the prompt's last token.

    Some vLLM versions load a fully cached prompt whole (the last token's logits are recomputed from
    loaded KV); others recompute its last block. The achieved rate lies between this and prefix/len."""
    return min(prefix, (prompt_len - 1) // block_size * block_size)


def labels_from_args(items: list[str]) -> dict[str, str]:
    """--label KEY=VALUE flags: what a run is tagged with in its results file."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--label expects KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels
