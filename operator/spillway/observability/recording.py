"""Recording rules: per-pod rates and ratios the dashboards and alerts read.

Every recorded series carries namespace, pod and model_name (summed over vLLM's
engine label); transfer series add direction (load: CPU->GPU, store: GPU->CPU).
Names follow Prometheus' level:metric:operation convention, level `spillway_pod`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spillway_connector import names as connector

from spillway.core.vllm_api import CacheHitSource, Metric, TieringMetric

from .promql import BY_POD, DIRECTION, POD_KEY, WINDOW, by, counter, quantile, rate_sum

LOAD = connector.DIRECTION_LOAD
STORE = connector.DIRECTION_STORE


@dataclass(frozen=True)
class Recorded:
    record: str
    expr: str
    meaning: str  # one line for docs/metrics.md
    labels: dict[str, str] = field(default_factory=dict)


def _level(metric: str, operation: str) -> str:
    return f"spillway_pod:{metric}:{operation}"


# -- names of the recorded series (dashboards and alerts import these) ---------------
OFFLOAD_BYTES_RATE = _level("kv_offload_bytes", f"rate{WINDOW}")
DMA_GBPS_MEAN = _level("kv_offload_dma_gbps", f"mean{WINDOW}")
DMA_GBPS_P50 = _level("kv_offload_dma_gbps", f"p50_{WINDOW}")
DMA_GBPS_P99 = _level("kv_offload_dma_gbps", f"p99_{WINDOW}")
HIT_RATIO = _level("kv_offload_hit_ratio", f"rate{WINDOW}")
QUERIED_TOKENS_RATE = _level("kv_offload_queried_tokens", f"rate{WINDOW}")
HIT_TOKENS_RATE = _level("kv_offload_hit_tokens", f"rate{WINDOW}")
CACHED_TOKENS_BY_SOURCE_RATE = _level("prompt_tokens_cached_by_source", f"rate{WINDOW}")
ALLOCATION_FAILURES_RATE = _level("kv_offload_allocation_failures", f"rate{WINDOW}")
POOL_RESIDENT_RATIO = _level("kv_offload_pool_resident", "ratio")
PREEMPTIONS_RATE = _level("preemptions", f"rate{WINDOW}")
PREEMPTED_RELOADS_RATE = _level("preempted_reload_requests", f"rate{WINDOW}")
PREEMPTED_RELOAD_TOKENS_RATE = _level("preempted_reload_tokens", f"rate{WINDOW}")
PREEMPTED_QUERIED_TOKENS_RATE = _level("preempted_queried_tokens", f"rate{WINDOW}")
POOL_EVICTIONS_RATE = _level("kv_offload_pool_evicted_chunks", f"rate{WINDOW}")
PROMPT_TOKENS_RATE = _level("prompt_tokens", f"rate{WINDOW}")
GENERATION_TOKENS_RATE = _level("generation_tokens", f"rate{WINDOW}")
TTFT_P50 = _level("time_to_first_token_seconds", f"p50_{WINDOW}")
TTFT_P99 = _level("time_to_first_token_seconds", f"p99_{WINDOW}")
# Secondary tiers (the disk tier), by vLLM's tier label.
TIER_USED_RATIO = _level("kv_offload_tier_used", "ratio")
TIER_HIT_CHUNKS_RATE = _level("kv_offload_tier_hit_chunks", f"rate{WINDOW}")
TIER_HIT_RATIO = _level("kv_offload_tier_hit_ratio", f"rate{WINDOW}")
TIER_EVICTED_CHUNKS_RATE = _level("kv_offload_tier_evicted_chunks", f"rate{WINDOW}")
TIER_EVICTED_BYTES_RATE = _level("kv_offload_tier_evicted_bytes", f"rate{WINDOW}")
TIER_WRITE_BYTES_RATE = _level("kv_offload_tier_write_bytes", f"rate{WINDOW}")
TIER_READ_GBPS = _level("kv_offload_tier_read_gbps", f"mean{WINDOW}")
TIER_STORE_FAILURES_RATE = _level("kv_offload_tier_store_failures", f"rate{WINDOW}")
TIER_LOAD_FAILURES_RATE = _level("kv_offload_tier_load_failures", f"rate{WINDOW}")
TIER_CHECKSUM_MISMATCHES_RATE = _level("kv_offload_tier_checksum_mismatches", f"rate{WINDOW}")
TIER_EVICTOR_FAULTS_RATE = _level("kv_offload_tier_evictor_faults", f"rate{WINDOW}")

_VLLM_BYTES = {LOAD: Metric.OFFLOAD_LOAD_BYTES, STORE: Metric.OFFLOAD_STORE_BYTES}
_VLLM_SECONDS = {LOAD: Metric.OFFLOAD_LOAD_TIME, STORE: Metric.OFFLOAD_STORE_TIME}


def _ratio(numerator: str, denominator: str) -> str:
    return f"{numerator}\n/\n{denominator}"


def _per_direction() -> list[Recorded]:
    rules: list[Recorded] = []
    for direction in (LOAD, STORE):
        labels = {DIRECTION: direction}
        rules.append(Recorded(
            OFFLOAD_BYTES_RATE,
            rate_sum(counter(_VLLM_BYTES[direction])),
            "Bytes per second copied between GPU and CPU pool, by direction.",
            labels,
        ))
        rules.append(Recorded(
            DMA_GBPS_MEAN,
            _ratio(rate_sum(counter(_VLLM_BYTES[direction])), rate_sum(counter(_VLLM_SECONDS[direction])))
            + " / 1e9",
            "Mean copy throughput while copying (bytes / transfer seconds), GB/s, by direction.",
            labels,
        ))
    transfer_key = (*POD_KEY, DIRECTION)
    for q, record in ((0.5, DMA_GBPS_P50), (0.99, DMA_GBPS_P99)):
        rules.append(Recorded(
            record,
            quantile(q, connector.TRANSFER_THROUGHPUT, transfer_key),
            f"Per-transfer copy throughput, {int(q * 100)}th percentile, GB/s, by direction.",
        ))
    return rules


def _tiers() -> list[Recorded]:
    tier_key = by(*POD_KEY, TieringMetric.LABEL)
    secondary = f'{TieringMetric.LABEL}!="{TieringMetric.PRIMARY}"'

    def tier_rate(metric: str) -> str:
        return rate_sum(f"{counter(metric)}{{{secondary}}}", tier_key)

    # Two counters summed per pod and tier: each rate gets a label of its own first, since without their names
    # the two would be one labelset, which `or` keeps once and a vector may not hold twice.
    evictor_faults = " or ".join(
        f'label_replace(rate({counter(metric)}[{WINDOW}]), "fault", "{fault}", "", "")'
        for metric, fault in ((connector.TIER_DELETE_ERRORS, "delete"), (connector.TIER_EVICTOR_ERRORS, "loop")))

    return [
        Recorded(TIER_USED_RATIO, _ratio(f"sum {tier_key} ({connector.TIER_USED_BYTES})",
                                         f"sum {tier_key} ({connector.TIER_CAPACITY_BYTES})"),
                 "Fraction of a secondary tier's bound its chunk files hold, by tier."),
        Recorded(TIER_HIT_CHUNKS_RATE, tier_rate(TieringMetric.CHUNK_HITS),
                 "Chunks per second found in a secondary tier (and promoted to the CPU pool), by tier."),
        Recorded(TIER_HIT_RATIO, _ratio(tier_rate(TieringMetric.CHUNK_HITS), tier_rate(TieringMetric.CHUNK_QUERIES)),
                 "A secondary tier's hit rate: chunks found / chunks looked up there, by tier."),
        Recorded(TIER_EVICTED_CHUNKS_RATE, rate_sum(counter(connector.TIER_EVICTED_CHUNKS), tier_key),
                 "Chunk files per second the connector's evictor deleted, by tier."),
        Recorded(TIER_EVICTED_BYTES_RATE, rate_sum(counter(connector.TIER_EVICTED_BYTES), tier_key),
                 "Bytes per second the connector's evictor deleted, by tier."),
        Recorded(TIER_WRITE_BYTES_RATE, tier_rate(TieringMetric.WRITE_BYTES),
                 "Bytes per second written from the CPU pool to a secondary tier, by tier."),
        Recorded(TIER_READ_GBPS, _ratio(tier_rate(TieringMetric.READ_BYTES), tier_rate(TieringMetric.READ_TIME))
                 + " / 1e9", "Mean read throughput from a secondary tier into the CPU pool while reading, GB/s."),
        Recorded(TIER_STORE_FAILURES_RATE, tier_rate(TieringMetric.CASCADE_JOB_FAILURES),
                 "Failed writes of the CPU pool's chunks to a secondary tier per second (vLLM's cascade jobs), by tier."),
        Recorded(TIER_LOAD_FAILURES_RATE, tier_rate(TieringMetric.PROMOTION_JOB_FAILURES),
                 "Failed reads of a secondary tier's chunks into the CPU pool per second (vLLM's promotion jobs), "
                 "by tier: those prompts are recomputed."),
        Recorded(TIER_CHECKSUM_MISMATCHES_RATE, rate_sum(counter(connector.TIER_CHECKSUM_MISMATCHES), tier_key),
                 "Chunk files per second that failed their checksum (removed, their prompts recomputed), by tier."),
        Recorded(TIER_EVICTOR_FAULTS_RATE, f"sum {tier_key} ({evictor_faults})",
                 "Files per second the evictor could not delete plus errors in its loop, by tier."),
    ]


def rules() -> list[Recorded]:
    hits = rate_sum(counter(Metric.EXTERNAL_HITS))
    queries = rate_sum(counter(Metric.EXTERNAL_QUERIES))
    return [
        *_per_direction(),
        Recorded(QUERIED_TOKENS_RATE, queries, "Prompt tokens per second looked up in the CPU pool."),
        Recorded(HIT_TOKENS_RATE, hits, "Prompt tokens per second found in the CPU pool (loaded, not recomputed)."),
        Recorded(HIT_RATIO, _ratio(hits, queries), "CPU pool hit rate: tokens found / tokens looked up."),
        Recorded(
            CACHED_TOKENS_BY_SOURCE_RATE,
            rate_sum(counter(Metric.PROMPT_TOKENS_CACHED_BY_SOURCE), by(*POD_KEY, CacheHitSource.LABEL)),
            "Prompt tokens per second served from a cache, by the tier that held them (label source: device, "
            "host, disk, p2p; vLLM 0.32+).",
        ),
        Recorded(
            ALLOCATION_FAILURES_RATE,
            rate_sum(counter(Metric.OFFLOAD_ALLOCATION_FAILURE)),
            "Stores per second the CPU pool refused for want of free space.",
        ),
        Recorded(
            POOL_RESIDENT_RATIO,
            _ratio(
                f"sum {BY_POD} ({connector.POOL_RESIDENT_CHUNKS})",
                f"sum {BY_POD} ({connector.POOL_CAPACITY_CHUNKS})",
            ),
            "Fraction of the CPU pool holding KV (stored or being stored).",
        ),
        Recorded(
            POOL_EVICTIONS_RATE,
            rate_sum(counter(connector.POOL_EVICTED_CHUNKS)),
            "CPU pool chunks evicted per second to make room for new stores.",
        ),
        Recorded(PREEMPTIONS_RATE, rate_sum(counter(Metric.PREEMPTIONS)), "Requests preempted per second."),
        Recorded(
            PREEMPTED_RELOADS_RATE,
            rate_sum(counter(connector.PREEMPTED_RELOAD_REQUESTS)),
            "Preempted requests per second that resumed with KV loaded from the CPU pool.",
        ),
        Recorded(
            PREEMPTED_RELOAD_TOKENS_RATE,
            rate_sum(counter(connector.PREEMPTED_RELOAD_TOKENS)),
            "Tokens of resumed preempted requests loaded from the CPU pool instead of recomputed, per second.",
        ),
        Recorded(
            PREEMPTED_QUERIED_TOKENS_RATE,
            rate_sum(counter(connector.PREEMPTED_QUERIED_TOKENS)),
            "Tokens of resumed preempted requests looked up in the CPU pool, per second.",
        ),
        Recorded(PROMPT_TOKENS_RATE, rate_sum(counter(Metric.PROMPT_TOKENS)), "Prompt tokens processed per second."),
        Recorded(
            GENERATION_TOKENS_RATE, rate_sum(counter(Metric.GENERATION_TOKENS)), "Tokens generated per second."
        ),
        Recorded(TTFT_P50, quantile(0.5, Metric.TTFT), "Time to first token, median, seconds."),
        Recorded(TTFT_P99, quantile(0.99, Metric.TTFT), "Time to first token, 99th percentile, seconds."),
        *_tiers(),
    ]


