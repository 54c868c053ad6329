"""Read a vLLM server's Prometheus /metrics: counters before/after a load point, cache facts.

The text is read by prometheus_client's parser (the exposition format's own reference implementation, a
dependency of the operator). Metric names come from spillway.core.vllm_api.Metric (vLLM) and
spillway_connector.names (the connector); both are written without the `_total` suffix that counters are
exported with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from spillway_connector import names as connector_names

from ..core.vllm_api import CacheHitSource, Metric

# Counters whose deltas every load point records (name without _total).
VLLM_COUNTERS = (
    Metric.EXTERNAL_HITS,
    Metric.EXTERNAL_QUERIES,
    Metric.PREFIX_HITS,
    Metric.PREFIX_QUERIES,
    Metric.PREEMPTIONS,
    Metric.PROMPT_TOKENS,
    Metric.GENERATION_TOKENS,
    Metric.OFFLOAD_LOAD_BYTES,
    Metric.OFFLOAD_STORE_BYTES,
    Metric.OFFLOAD_LOAD_TIME,
    Metric.OFFLOAD_STORE_TIME,
    Metric.OFFLOAD_ALLOCATION_FAILURE,
)
CONNECTOR_COUNTERS = connector_names.COUNTERS
# Sums and counts of the histograms that split a request's time to first token into the server's phases
# (Metric.TTFT, REQUEST_QUEUE_TIME, REQUEST_PREFILL_TIME): their deltas over one request are that request's.
PHASE_HISTOGRAMS = (Metric.TTFT, Metric.REQUEST_QUEUE_TIME, Metric.REQUEST_PREFILL_TIME)
PHASE_SERIES = tuple(f"{name}_{part}" for name in PHASE_HISTOGRAMS for part in ("sum", "count"))
COUNTERS = (VLLM_COUNTERS + tuple(name for name in CONNECTOR_COUNTERS if name not in VLLM_COUNTERS)
            + PHASE_SERIES)


# The tiers a request's cached prompt tokens come from (vllm:prompt_tokens_cached_by_source), and "miss".
SERVING_TIERS = ("cpu", "disk", "gpu", "miss")
# In the order a request is put with: a prompt partly on disk waited for the disk, one partly in the pool for it.
_SOURCE_TIER = ((CacheHitSource.DISK, "disk"), (CacheHitSource.HOST, "cpu"), (CacheHitSource.DEVICE, "gpu"))


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition. A line the parser refuses is skipped, not the scrape: the
    server's other series still count (the parser stops at the first bad line, so the rest is read line by line)."""
    try:
        return _samples(text)
    except ValueError:
        samples = []
        for line in text.splitlines():
            try:
                samples += _samples(line + "\n")
            except ValueError:
                continue
        return samples


def _samples(text: str) -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


@dataclass
class Snapshot:
    """One scrape of /metrics."""

    samples: list[Sample] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str) -> Snapshot:
        return cls(parse(text))

    def counter(self, name: str, **labels: str) -> float | None:
        """Sum over label sets (those matching `labels`) of a counter exported as name_total.

        None when the server lacks it."""
        values = [s.value for s in self.samples if s.name in (name + "_total", name)
                  and all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(values) if values else None

    def info_labels(self, name: str) -> dict[str, str]:
        for sample in self.samples:
            if sample.name == name:
                return dict(sample.labels)
        return {}

    def has(self, name: str) -> bool:
        return any(s.name.startswith(name) for s in self.samples)


def counter_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, float]:
    """after - before for every known counter the server exports after the point."""
    if before is None or after is None:
        return {}
    deltas = {}
    for name in COUNTERS:
        if name in connector_names.BY_DIRECTION:
            for direction in connector_names.DIRECTIONS:
                _put_delta(deltas, _direction_key(name, direction), before, after,
                           name, {connector_names.LABEL_DIRECTION: direction})
        else:
            _put_delta(deltas, name, before, after, name, {})
    return deltas


def _put_delta(deltas: dict[str, float], key: str, before: Snapshot, after: Snapshot, name: str,
               labels: dict[str, str]) -> None:
    a, b = after.counter(name, **labels), before.counter(name, **labels)
    if a is not None:
        deltas[key] = a - (b or 0.0)  # counters with labels appear at their first increment


def _direction_key(name: str, direction: str) -> str:
    return f"{name}{{{connector_names.LABEL_DIRECTION}={direction}}}"


def server_phases(deltas: dict[str, float]) -> dict[str, float] | None:
    """One request's time to first token on the server's clocks, in seconds, from the deltas over that request
    alone; None unless each phase histogram counted exactly one request (another request, or a scrape before the
    request's stats were recorded, would mix or miss it).

    ttft: the API server's arrival to the first token; queue: engine-core queue to first scheduled (a load from
    the CPU pool, from lookup to the step that sees it finished, falls here); copy: the connector's own transfer
    time (vllm:kv_offload_load_time); prefill: scheduled to the first token (the forward of what was not loaded).
    """
    if any(deltas.get(f"{name}_count") != 1 for name in PHASE_HISTOGRAMS):
        return None
    ttft, queue, prefill = (deltas[f"{name}_sum"] for name in PHASE_HISTOGRAMS)
    return {"ttft_s": ttft, "queue_s": queue, "prefill_s": prefill,
            "copy_s": deltas.get(Metric.OFFLOAD_LOAD_TIME), "intake_s": ttft - queue - prefill}


def hit_summary(deltas: dict[str, float], prompt_tokens: int) -> dict[str, float | None]:
    """What the server says it served, over the prompt tokens this client sent.

    cpu_hit_rate: tokens loaded by the connector (external prefix cache hits) per prompt token sent.
    gpu_hit_rate: tokens found in the engine's own prefix cache per prompt token sent.
    Requests resumed after preemption are not counted in either (vLLM keeps them apart).
    """
    def ratio(name: str) -> float | None:
        if name not in deltas or prompt_tokens <= 0:
            return None
        return deltas[name] / prompt_tokens

    return {
        "cpu_hit_rate": ratio(Metric.EXTERNAL_HITS),
        "gpu_hit_rate": ratio(Metric.PREFIX_HITS),
        "cpu_hit_tokens": deltas.get(Metric.EXTERNAL_HITS),
        "gpu_hit_tokens": deltas.get(Metric.PREFIX_HITS),
        "offload_load_bytes": _transfer_bytes(deltas, Metric.OFFLOAD_LOAD_BYTES, connector_names.DIRECTION_LOAD),
        "offload_store_bytes": _transfer_bytes(deltas, Metric.OFFLOAD_STORE_BYTES, connector_names.DIRECTION_STORE),
        "preemptions": deltas.get(Metric.PREEMPTIONS),
        "preempted_reload_requests": deltas.get(connector_names.PREEMPTED_RELOAD_REQUESTS),
        "pool_evicted_chunks": deltas.get(connector_names.POOL_EVICTED_CHUNKS),
    }


def _transfer_bytes(deltas: dict[str, float], vllm_name: str, direction: str) -> float | None:
    """vLLM's offload byte counter, else the connector's (exported only where vLLM lacks its own)."""
    if vllm_name in deltas:
        return deltas[vllm_name]
    return deltas.get(_direction_key(connector_names.TRANSFER_BYTES, direction))


@dataclass(frozen=True)
class CacheFacts:
    """The engine's KV cache as vLLM reports it in vllm:cache_config_info."""

    num_gpu_blocks: int | None
    block_size: int | None
    prefix_caching: bool | None
    labels: dict[str, str]

    @property
    def gpu_tokens(self) -> int | None:
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> CacheFacts:
        labels = snapshot.info_labels(Metric.CACHE_CONFIG_INFO)

        def integer(key: str) -> int | None:
            try:
                return int(labels[key])
            except (KeyError, ValueError):
                return None

        caching = labels.get("enable_prefix_caching")
        return cls(
            num_gpu_blocks=integer("num_gpu_blocks"),
            block_size=integer("block_size"),
            prefix_caching=None if caching is None else caching == "True",
            labels=labels,
        )


def serving_tier(before: Snapshot | None, after: Snapshot | None) -> tuple[str, dict[str, float]]:
    """The tier that served one request, from the cached-by-source deltas around it (scrapes with no other
    request between them), and the tokens each source gave: disk wins over cpu over gpu; miss when none served
    a token."""
    if before is None or after is None:
        return "miss", {}
    tokens = {}
    for source, _ in _SOURCE_TIER:
        now = after.counter(Metric.PROMPT_TOKENS_CACHED_BY_SOURCE, **{CacheHitSource.LABEL: source}) or 0.0
        then = before.counter(Metric.PROMPT_TOKENS_CACHED_BY_SOURCE, **{CacheHitSource.LABEL: source}) or 0.0
        tokens[source] = now - then
    for source, name in _SOURCE_TIER:
        if tokens[source] > 0:
            return name, tokens
    return "miss", tokens
