"""Names of the metrics the Spillway connector adds to vLLM's /metrics.

Dependency-free on purpose: dashboards, alerts, the load test and the operator
import these without vLLM. Names are as exported, without the `_total`,
`_bucket`, `_sum` or `_count` suffixes that Prometheus clients append.
Every metric also carries vLLM's own engine labels (`model_name`, `engine`).
"""
from __future__ import annotations

# -- preempted requests served from the CPU pool (counters) --------------------
# vLLM keeps these apart from vllm:external_prefix_cache_* and never exports them.
PREEMPTED_RELOAD_REQUESTS = "spillway:kv_offload_preempted_reload_requests"
PREEMPTED_RELOAD_TOKENS = "spillway:kv_offload_preempted_reload_tokens"
PREEMPTED_QUERIED_TOKENS = "spillway:kv_offload_preempted_queried_tokens"

# Tokens found in the pool but recomputed: the hit was shorter than the connector's
# spillway_recompute_below_tokens (a short load can cost more than its prefill).
SHORT_HIT_TOKENS_RECOMPUTED = "spillway:kv_offload_short_hit_tokens_recomputed"

# -- transfers ------------------------------------------------------------------
# Histogram of each finished transfer's bytes / seconds, in GB/s (1e9 bytes/s).
TRANSFER_THROUGHPUT = "spillway:kv_offload_transfer_throughput_gbps"
# Counters, exported only on a vLLM that lacks vllm:kv_offload_{load,store}_{bytes,time}.
TRANSFER_BYTES = "spillway:kv_offload_transfer_bytes"
TRANSFER_SECONDS = "spillway:kv_offload_transfer_seconds"

# -- the CPU pool -----------------------------------------------------------------
POOL_CAPACITY_CHUNKS = "spillway:kv_offload_pool_capacity_chunks"  # gauge
POOL_RESIDENT_CHUNKS = "spillway:kv_offload_pool_resident_chunks"  # gauge: chunks holding KV
POOL_EVICTED_CHUNKS = "spillway:kv_offload_pool_evicted_chunks"  # counter

# -- secondary tiers (the node-disk "fs" tier), labelled by vLLM's tier label ----------------------------
# Next to vLLM's own vllm:kv_offload_tiering_{chunk_hits,read_bytes,read_time,...}{tier}.
TIER_CAPACITY_BYTES = "spillway:kv_offload_tier_capacity_bytes"  # gauge: the planned bound
TIER_USED_BYTES = "spillway:kv_offload_tier_used_bytes"  # gauge: chunk files held (and being written)
TIER_EVICTED_BYTES = "spillway:kv_offload_tier_evicted_bytes"  # counter: deleted by the evictor
TIER_EVICTED_CHUNKS = "spillway:kv_offload_tier_evicted_chunks"  # counter
TIER_REFUSED_CHUNKS = "spillway:kv_offload_tier_refused_chunks"  # counter: stores dropped, no room
TIER_LOADED_CHUNKS = "spillway:kv_offload_tier_loaded_chunks"  # counter: chunks read back into the CPU pool
TIER_SIBLING_LOADED_CHUNKS = "spillway:kv_offload_tier_sibling_loaded_chunks"  # counter: of those, from siblings
TIER_READ_THROUGHPUT = "spillway:kv_offload_tier_read_throughput_gbps"  # histogram: tier -> CPU pool, per load
TIER_BREAK_EVEN_GBPS = "spillway:kv_offload_tier_break_even_read_gbps"  # gauge: the planned rate that pays
# Faults of the disk tier, each also named by one log line (connector/spillway_connector/disk_evictor.py,
# chunk_integrity.py): chunk files that failed their checksum (removed, recomputed), files the evictor could not
# delete, errors in the evictor's loop, evictor threads restarted after dying.
TIER_CHECKSUM_MISMATCHES = "spillway:kv_offload_tier_checksum_mismatches"  # counter
TIER_DELETE_ERRORS = "spillway:kv_offload_tier_delete_errors"  # counter
TIER_EVICTOR_ERRORS = "spillway:kv_offload_tier_evictor_errors"  # counter
TIER_EVICTOR_RESTARTS = "spillway:kv_offload_tier_evictor_restarts"  # counter
TIER_VOLUME_FREE_BYTES = "spillway:kv_offload_tier_volume_free_bytes"  # gauge: statvfs of the tier's volume
TIER_WRITABLE = "spillway:kv_offload_tier_writable"  # gauge: 1, or 0 while the volume is read-only

# -- labels -------------------------------------------------------------------------
LABEL_DIRECTION = "direction"
DIRECTION_LOAD = "load"  # CPU pool -> GPU
DIRECTION_STORE = "store"  # GPU -> CPU pool
DIRECTIONS = (DIRECTION_LOAD, DIRECTION_STORE)
LABEL_TIER = "tier"  # vLLM's own label of its tiers: "<position>:<type>", "1:fs" for the disk tier under the pool

# Histogram buckets of TRANSFER_THROUGHPUT, GB/s: host memcpy on small pages up to
# PCIe Gen5 x16 (~64 GB/s) and NVLink-C2C hosts.
THROUGHPUT_BUCKETS_GBPS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 200.0)

COUNTERS = (
    PREEMPTED_RELOAD_REQUESTS,
    PREEMPTED_RELOAD_TOKENS,
    PREEMPTED_QUERIED_TOKENS,
    SHORT_HIT_TOKENS_RECOMPUTED,
    TRANSFER_BYTES,
    TRANSFER_SECONDS,
    POOL_EVICTED_CHUNKS,
    TIER_EVICTED_BYTES,
    TIER_EVICTED_CHUNKS,
    TIER_REFUSED_CHUNKS,
    TIER_LOADED_CHUNKS,
    TIER_SIBLING_LOADED_CHUNKS,
    TIER_CHECKSUM_MISMATCHES,
    TIER_DELETE_ERRORS,
    TIER_EVICTOR_ERRORS,
    TIER_EVICTOR_RESTARTS,
)
GAUGES = (POOL_CAPACITY_CHUNKS, POOL_RESIDENT_CHUNKS, TIER_CAPACITY_BYTES, TIER_USED_BYTES, TIER_BREAK_EVEN_GBPS,
          TIER_VOLUME_FREE_BYTES, TIER_WRITABLE)
HISTOGRAMS = (TRANSFER_THROUGHPUT, TIER_READ_THROUGHPUT)
ALL = COUNTERS + GAUGES + HISTOGRAMS
# Metrics labelled by direction (besides vLLM's engine labels).
BY_DIRECTION = (TRANSFER_THROUGHPUT, TRANSFER_BYTES, TRANSFER_SECONDS)
# Metrics labelled by tier.
BY_TIER = (TIER_CAPACITY_BYTES, TIER_USED_BYTES, TIER_EVICTED_BYTES, TIER_EVICTED_CHUNKS, TIER_REFUSED_CHUNKS,
           TIER_LOADED_CHUNKS, TIER_SIBLING_LOADED_CHUNKS, TIER_READ_THROUGHPUT, TIER_BREAK_EVEN_GBPS, TIER_CHECKSUM_MISMATCHES,
           TIER_DELETE_ERRORS, TIER_EVICTOR_ERRORS, TIER_EVICTOR_RESTARTS, TIER_VOLUME_FREE_BYTES, TIER_WRITABLE)


def exported(name: str) -> str:
    """The sample name a Prometheus scrape shows for a counter (`_total`) or other metric."""
    return name + "_total" if name in COUNTERS else name
