"""SpillwayOffloadingConnector: vLLM's OffloadingConnector plus the metrics it lacks.

Drop-in: same kv_connector_extra_config keys as OffloadingConnector (cpu_bytes_to_use,
eviction_policy, block_size, spec_name/spec_module_path, ...), and one of its own,
spillway_recompute_below_tokens (ShortHitFloor, off unless set); load it with
  --kv-transfer-config '{"kv_connector": "SpillwayOffloadingConnector",
    "kv_connector_module_path": "spillway_connector.connector", "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": ...}}'
Its metrics travel in vLLM's own connector stats and appear on vLLM's /metrics with
vLLM's engine labels (see spillway_connector.names and docs/connector.md).
"""
from __future__ import annotations

from typing import Any

from spillway_connector import names
from spillway_connector.async_loads import first_chunk_held
from spillway_connector.compat import (
    FAST_HIT_SOURCES,
    KVConnectorRole,
    OffloadingConnector,
    OffloadingConnectorStats,
)
from spillway_connector.disk_tier import engine_config, guarded_tiers
from spillway_connector.hit_sources import external_hit_sources
from spillway_connector.kv_event_order import parents_first
from spillway_connector.metrics import SpillwayPromMetrics
from spillway_connector.probes import PoolProbe, TransferProbe
from spillway_connector.source_guard import logger
from spillway_connector.transfer_config import EXTRA_RECOMPUTE_BELOW_TOKENS, EXTRA_SPEC_NAME


class PreemptionReloads:
    """Counts preempted requests that resume from the CPU pool, the way vLLM's scheduler
    counts external prefix-cache queries: a lookup is recorded when the request is admitted."""

    def __init__(self) -> None:
        self._queried: dict[str, int] = {}  # request id -> tokens its last lookup asked for
        self._stats: OffloadingConnectorStats | None = None

    def looked_up(self, request: Any, num_computed_tokens: int) -> None:
        if request.num_preemptions > 0:
            self._queried[request.request_id] = request.num_tokens - num_computed_tokens

    def admitted(self, request: Any, num_external_tokens: int) -> None:
        queried = self._queried.pop(request.request_id, 0)
        if queried <= 0:
            return
        if self._stats is None:
            self._stats = OffloadingConnectorStats()
        self._stats.increase_counter(names.PREEMPTED_QUERIED_TOKENS, queried)
        if num_external_tokens > 0:
            self._stats.increase_counter(names.PREEMPTED_RELOAD_REQUESTS, 1)
            self._stats.increase_counter(names.PREEMPTED_RELOAD_TOKENS, num_external_tokens)

    def finished(self, request: Any) -> None:
        self._queried.pop(request.request_id, None)

    def take_stats(self) -> OffloadingConnectorStats | None:
        """The counts since the last call; None when there are none."""
        stats, self._stats = self._stats, None
        return stats


class ShortHitFloor:
    """Recompute a CPU hit shorter than `tokens` instead of loading it.

    A load has a fixed cost beside its copy (the engine steps between starting it and noticing it finished), so
    below some length the prefill is faster than the load; where that length lies is measured per release and
    configuration (bench/short-prompts: vLLM 0.33 eager loads a 1K-token prompt in 90 ms and
    recomputes it in 49; -r7: with CUDA graphs it loads it in 21 and recomputes it in 33, so the planner leaves
    the floor off). The hit is reported to vLLM as none, so vLLM's own hit counters and the prefill agree;
    the pool keeps the chunks (they are stored already) and the recomputed tokens are counted."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._stats: OffloadingConnectorStats | None = None

    @classmethod
    def from_extra_config(cls, extra_config: dict[str, Any] | None) -> ShortHitFloor:
        raw = (extra_config or {}).get(EXTRA_RECOMPUTE_BELOW_TOKENS, 0)
        if type(raw) is not int or raw < 0:  # bool is an int subclass: refused by the exact type check
            raise ValueError(f"kv_connector_extra_config {EXTRA_RECOMPUTE_BELOW_TOKENS} must be a whole number of "
                             f"tokens >= 0 (0: load every hit), got {raw!r}")
        return cls(raw)

    def apply(self, matched: tuple[int | None, bool]) -> tuple[int | None, bool]:
        hit = matched[0]
        if not hit or hit >= self.tokens:
            return matched
        if self._stats is None:
            self._stats = OffloadingConnectorStats()
        self._stats.increase_counter(names.SHORT_HIT_TOKENS_RECOMPUTED, hit)
        return 0, False

    def take_stats(self) -> OffloadingConnectorStats | None:
        stats, self._stats = self._stats, None
        return stats


def _merge(first: Any, second: Any) -> Any:
    """One stats object holding both (either may be None)."""
    if second is None:
        return first
    if first is None:
        return second
    return first.aggregate(second)


def _without_probes(side: str, vllm_config: Any) -> None:
    extra = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_connector_extra_config", None) or {}
    logger.warning("spillway_connector: the offloading spec %r is not one of Spillway's (spillway_connector.spec), "
                   "so its %s carries no probe: the pool and transfer metrics are off; set spec_name and "
                   "spec_module_path as the planner writes them", extra.get(EXTRA_SPEC_NAME, "CPUOffloadingSpec"), side)


class SpillwayOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        with engine_config(vllm_config):  # the disk tier's namespace reads the model's identity from it
            super().__init__(vllm_config, role, kv_cache_config)
        self._vllm_config = vllm_config
        self._reloads = PreemptionReloads()
        self._floor = ShortHitFloor.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        self._pool: PoolProbe | None = None
        self._transfers: TransferProbe | None = None
        self._disk_tiers: list = []
        if self.connector_scheduler is not None:
            pool = self.connector_scheduler.manager
            # The pool probe comes with Spillway's offloading specs (spillway_connector/spec.py), which the planner
            # names in spec_name/spec_module_path; another spec leaves vLLM's manager bare and these metrics off.
            if isinstance(pool, PoolProbe):
                self._pool = pool
            else:
                _without_probes("manager", vllm_config)
            # Spillway's tiering spec built the bounded disk tier (disk_tier.SpillwayFsTier); its stats go out here
            manager = pool.inner if isinstance(pool, PoolProbe) else pool
            self._disk_tiers = guarded_tiers(manager, vllm_config.kv_transfer_config.kv_connector_extra_config)

    # -- worker side --------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Any) -> None:
        super().register_kv_caches(kv_caches)
        self._find_transfer_probe()

    def register_cross_layers_kv_cache(self, *args: Any, **kwargs: Any) -> None:  # vLLM 0.26
        super().register_cross_layers_kv_cache(*args, **kwargs)
        self._find_transfer_probe()

    def _find_transfer_probe(self) -> None:
        worker = self.connector_worker
        if worker is not None and worker.worker is not None:
            if isinstance(worker.worker, TransferProbe):
                self._transfers = worker.worker
            else:
                _without_probes("worker", self._vllm_config)

    # -- scheduler side -------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        matched = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if matched[0] is not None:
            self._reloads.looked_up(request, num_computed_tokens)
        return self._floor.apply(matched)

    def may_load_async(self, request: Any) -> bool:
        # vLLM 0.34 asks this of every waiting request; with --max-num-inflight-kv-loads a pool hit then loads while
        # the batch is full instead of after a slot frees (spillway_connector/async_loads.py)
        scheduler = self.connector_scheduler
        if scheduler is not None and first_chunk_held(scheduler, request):
            return True
        base = getattr(super(), "may_load_async", None)  # 0.34+: P/D remote prefills; older vLLM never asks
        return base(request) if base is not None else False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        result = super().update_state_after_alloc(request, blocks, num_external_tokens)
        self._reloads.admitted(request, num_external_tokens)
        return result

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> Any:
        # vLLM's answer from the same request state with one range per run of chunks instead of one per chunk
        # (spillway_connector/hit_sources.py); the equivalence test runs both on a real engine.
        scheduler = self.connector_scheduler
        if not FAST_HIT_SOURCES or scheduler is None or num_external_tokens == 0:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        state = scheduler._req_status[request.request_id]
        start, context, load_source = state.num_locally_computed_tokens, state.req_context, scheduler.manager.get_load_source
        return external_hit_sources(state.load_key_ranges, start, start + num_external_tokens,
                                    lambda key: load_source(key, context))

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self._reloads.finished(request)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self._reloads.finished(request)
        return super().request_finished_all_groups(request, block_ids)

    def take_events(self) -> Any:
        # vllm-router indexes a stored block only after its parent (spillway_connector/kv_event_order.py)
        return parents_first(super().take_events())

    # -- stats ----------------------------------------------------------------------
    def get_kv_connector_stats(self) -> Any:
        if self.connector_scheduler is None:
            return self._transfers.take_stats() if self._transfers is not None else None
        stats = _merge(_merge(super().get_kv_connector_stats(), self._reloads.take_stats()), self._floor.take_stats())
        for label, tier in self._disk_tiers:
            stats = _merge(stats, tier.take_stats(label))
        return _merge(stats, self._pool.take_stats()) if self._pool is not None else stats

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any, per_engine_labelvalues: Any):
        return SpillwayPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
