"""The connector's Prometheus metrics, registered beside vLLM's offloading metrics.

vLLM builds this object in the API server from the connector class
(build_prom_metrics) and feeds it each engine's connector stats; metrics therefore
carry vLLM's own labels (model_name, engine) and appear on vLLM's /metrics.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from spillway_connector import names
from spillway_connector.compat import OffloadPromMetrics, split_stats_payload, stats_sections

_DOCS = {
    names.PREEMPTED_RELOAD_REQUESTS: "Preempted requests that resumed with KV loaded from the CPU pool.",
    names.PREEMPTED_RELOAD_TOKENS: "Prompt and output tokens of preempted requests loaded from the CPU pool "
    "instead of being recomputed.",
    names.PREEMPTED_QUERIED_TOKENS: "Tokens of resumed preempted requests looked up in the CPU pool "
    "(reload_tokens / queried_tokens is the pool's hit rate for preemptions).",
    names.SHORT_HIT_TOKENS_RECOMPUTED: "Tokens found in the CPU pool but recomputed, because the hit was shorter "
    "than the connector's spillway_recompute_below_tokens.",
    names.TRANSFER_THROUGHPUT: "Throughput of each finished KV transfer between GPU and CPU pool, in GB/s "
    "(bytes / transfer time / 1e9), by direction (load: CPU->GPU, store: GPU->CPU).",
    names.TRANSFER_BYTES: "Bytes transferred between GPU and CPU pool, by direction.",
    names.TRANSFER_SECONDS: "Seconds spent in transfers between GPU and CPU pool, by direction.",
    names.POOL_CAPACITY_CHUNKS: "Chunks the CPU pool holds (one chunk = the KV of block_size tokens).",
    names.POOL_RESIDENT_CHUNKS: "Chunks of the CPU pool holding KV, stored or being stored.",
    names.POOL_EVICTED_CHUNKS: "Chunks evicted from the CPU pool to make room for new stores.",
    names.TIER_CAPACITY_BYTES: "Bytes a secondary tier may hold (the disk tier's planned bound), by tier.",
    names.TIER_USED_BYTES: "Bytes of chunk files a secondary tier holds or is writing, by tier.",
    names.TIER_EVICTED_BYTES: "Bytes of least recently used chunk files the evictor deleted, by tier.",
    names.TIER_EVICTED_CHUNKS: "Chunk files the evictor deleted, by tier.",
    names.TIER_REFUSED_CHUNKS: "Chunk stores dropped because the tier had no idle chunk left to delete, by tier.",
    names.TIER_LOADED_CHUNKS: "Chunks read from a secondary tier back into the CPU pool, by tier.",
    names.TIER_SIBLING_LOADED_CHUNKS: "Of those, chunks read from another replica's slot of the tier, by tier.",
    names.TIER_BREAK_EVEN_GBPS: "Disk read rate (GB/s) below which a hit from the tier costs more than recomputing "
    "it, as planned, by tier.",
    names.TIER_CHECKSUM_MISMATCHES: "Chunk files of a secondary tier that failed their checksum: removed, and the "
    "chunk recomputed, by tier.",
    names.TIER_DELETE_ERRORS: "Chunk files the disk tier's evictor could not delete (skipped, retried), by tier.",
    names.TIER_EVICTOR_ERRORS: "Errors in the disk tier evictor's loop (it goes on), by tier.",
    names.TIER_EVICTOR_RESTARTS: "Disk tier evictor threads restarted after dying, by tier.",
    names.TIER_VOLUME_FREE_BYTES: "Free bytes of the disk tier's volume (statvfs), by tier.",
    names.TIER_WRITABLE: "1 while the disk tier's volume is writable, 0 while it is read-only, by tier.",
    names.TIER_READ_THROUGHPUT: "Throughput of each finished load from a secondary tier into the CPU pool, GB/s.",
}
_OURS = frozenset(names.ALL)


class SpillwayPromMetrics(OffloadPromMetrics):
    """vLLM's offloading metrics (unchanged) plus the names in spillway_connector.names."""

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: list[str], per_engine_labelvalues: Any):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        kinds = {name: metric_types[Counter] for name in names.COUNTERS}
        kinds.update({name: metric_types[Gauge] for name in names.GAUGES})
        kinds.update({name: metric_types[Histogram] for name in names.HISTOGRAMS})
        self._spillway: dict[str, Any] = {}
        for name, metric_cls in kinds.items():
            kwargs: dict[str, Any] = {
                "name": name,
                "documentation": _DOCS[name],
                "labelnames": list(labelnames) + ([names.LABEL_DIRECTION] if name in names.BY_DIRECTION else [])
                + ([names.LABEL_TIER] if name in names.BY_TIER else []),
            }
            if name in names.HISTOGRAMS:
                kwargs["buckets"] = list(names.THROUGHPUT_BUCKETS_GBPS)
            if name in names.GAUGES:
                kwargs["multiprocess_mode"] = "mostrecent"  # several API servers: the newest write wins
            self._spillway[name] = metric_cls(**kwargs)
        self._children: dict[tuple[int, str, tuple], Any] = {}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        theirs, ours = split_stats_payload(transfer_stats_data, _OURS)
        super().observe(theirs, engine_idx)
        if ours:
            self._observe_ours(ours, engine_idx)

    def _observe_ours(self, payload: dict[str, Any], engine_idx: int) -> None:
        _, data = stats_sections(payload)
        for name, by_labels in data.items():
            for labelvalues, value in by_labels.items():
                child = self._child(name, tuple(labelvalues), engine_idx)
                if name in names.COUNTERS:
                    child.inc(value)
                elif name in names.GAUGES:
                    child.set(value)
                else:
                    for observation in value:
                        child.observe(observation)

    def _child(self, name: str, labelvalues: tuple, engine_idx: int) -> Any:
        key = (engine_idx, name, labelvalues)
        child = self._children.get(key)
        if child is None:
            engine_labels = list(self.per_engine_labelvalues[engine_idx])
            child = self._spillway[name].labels(*engine_labels, *labelvalues)
            self._children[key] = child
        return child
