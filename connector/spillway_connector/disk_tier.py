"""The connector's hold on vLLM's node-disk ("fs") tier: its bound (disk_evictor.DiskTierIndex), its namespace
(disk_namespace), a checksum per chunk (chunk_integrity) and its metrics.

The planner puts the tier's bound in kv_connector_extra_config (EXTRA_DISK_TIER_BYTES); the connector then wraps
the fs tier vLLM's TieringOffloadingManager built, in the engine core:
  - the root must hold nothing but the tier's own entries (refused with one line otherwise); the engine takes a
    replica slot of its own in it and moves vLLM's file mapper there, into a namespace whose digest covers the
    model's identity (weights, dtype, vLLM release, ...), so no other replica's or revision's files are touched;
  - every file carries a checksum of its chunk under its name, verified on load (a mismatch is a miss);
  - every store is admitted by the index before vLLM writes it (a store that cannot fit is dropped from the job,
    so vLLM never writes it), every load pins its files until it finished, and every hit the CPU pool serves (the
    manager's prepare_load) makes its files young again; the evictor thread is restarted if it dies.
The tier's own class is vLLM's, so vLLM's vllm:kv_offload_tiering_* metrics stay as they are; ours carry the
same tier label ("1:fs").
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import numpy as np

from spillway_connector import chunk_integrity, disk_namespace, names
from spillway_connector.compat import OffloadingConnectorStats
from spillway_connector.disk_evictor import DiskTierIndex
from spillway_connector.probes import throughput_gbps
from spillway_connector.transfer_config import EXTRA_DISK_TIER_BREAK_EVEN_GBPS, EXTRA_DISK_TIER_BYTES

_STORE, _LOAD = "store", "load"
logger = logging.getLogger(__name__)


def disk_tier_bound(extra_config: dict[str, Any] | None) -> int | None:
    """The planned bound in bytes, or None when the connector should not bound a disk tier."""
    raw = (extra_config or {}).get(EXTRA_DISK_TIER_BYTES)
    if raw is None:
        return None
    if type(raw) is not int or raw <= 0:
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BYTES} must be a whole number of bytes > 0, "
                         f"got {raw!r}")
    return raw


def fs_tiers(manager: Any) -> list[tuple[str, Any]]:
    """(label, tier) of the file-system tiers under a TieringOffloadingManager (none under another manager). The
    label is vLLM's own tier label, "<position>:<type>" with the CPU pool at 0 (vllm/v1/kv_offload/tiering/
    metrics.py tier_label), so our series and vLLM's vllm:kv_offload_tiering_* join on it."""
    tiers = getattr(manager, "secondary_tiers", ())
    return [(f"{index + 1}:{tier.tier_type}", tier) for index, tier in enumerate(tiers) if hasattr(tier, "file_mapper")]


class FsTierGuard:
    """Wraps one vLLM FileSystemTierManager (its submit_store, submit_load and get_finished_jobs)."""

    def __init__(self, manager: Any, tier: Any, capacity_bytes: int, label: str,
                 break_even_gbps: float | None = None, vllm_config: Any = None,
                 extra_config: dict[str, Any] | None = None):
        self.tier = tier
        self.break_even_gbps = break_even_gbps
        self.label = (label,)
        self.chunk_bytes = chunk_integrity.file_bytes(int(tier._block_size))  # the pool's row and its trailer
        root = os.path.dirname(tier.file_mapper.base_path)  # base_path = <root_dir>/<model>_<digest>
        disk_namespace.check_root(root)
        chunk_integrity.install(sys.modules[type(tier).__module__])
        self.slot = disk_namespace.claim_slot(root)
        fields = disk_namespace.identity(tier._offloading_spec.config, vllm_config, extra_config)
        base = disk_namespace.rebase(tier.file_mapper, self.slot.path, fields)
        logger.info("disk tier: chunks under %s (namespace fields %s)", base, fields)
        self.index = DiskTierIndex(self.slot.path, capacity_bytes, namespace=os.path.basename(base))
        self.index.scan()
        self.index._check_volume()
        self.index.start()
        self._mismatches = 0
        chunk_integrity.add_listener(self.slot.path, self._on_mismatch)
        self._jobs: dict[Any, tuple[str, list[str]]] = {}
        self._stats = OffloadingConnectorStats()
        self._reported: tuple | None = None
        self._restarts = 0
        self._submit_store, self._submit_load = tier.submit_store, tier.submit_load
        self._get_finished_jobs, self._shutdown = tier.get_finished_jobs, tier.shutdown
        tier.submit_store, tier.submit_load = self.submit_store, self.submit_load
        tier.get_finished_jobs, tier.shutdown = self.get_finished_jobs, self.shutdown
        self._prepare_load = manager.prepare_load
        manager.prepare_load = self.prepare_load

    def _on_mismatch(self, path: str, reason: str) -> None:
        """A tier I/O thread's: a chunk file failed its checksum and was removed."""
        self._mismatches += 1  # one writer per call under the GIL; read by take_stats
        self.index.forget(path)

    def _paths(self, keys: Any) -> list[str]:
        return [self.tier.file_mapper.get_file_name(key) for key in keys]

    def submit_store(self, job: Any) -> None:
        keys = list(job.keys)
        paths = self._paths(keys)
        admitted = self.index.reserve(paths, self.chunk_bytes)
        if not all(admitted):
            keep = np.array(admitted, dtype=bool)
            keys = [key for key, ok in zip(keys, admitted) if ok]
            paths = [path for path, ok in zip(paths, admitted) if ok]
            job = dataclasses.replace(job, keys=keys, chunk_ids=np.asarray(job.chunk_ids)[keep])
        self._jobs[job.job_id] = (_STORE, paths)
        self._submit_store(job)

    def prepare_load(self, keys: Any, *args: Any, **kwargs: Any) -> Any:
        """The manager's: a CPU-pool hit about to be loaded to the GPU."""
        keys = list(keys)
        self.index.touch(self._paths(keys))
        return self._prepare_load(keys, *args, **kwargs)

    def submit_load(self, job: Any) -> None:
        paths = self._paths(job.keys)
        self.index.pin(paths)
        self._jobs[job.job_id] = (_LOAD, paths)
        self._submit_load(job)

    def get_finished_jobs(self) -> Any:
        results = list(self._get_finished_jobs())
        for result in results:
            kind, paths = self._jobs.pop(result.job_id, (None, []))
            if kind == _STORE:
                self.index.release(paths, stored=bool(result.success))
            elif kind == _LOAD:
                self.index.release(paths)
                loaded = len(result.successful_keys) if result.successful_keys is not None else (
                    len(paths) if result.success else 0)
                if loaded:
                    self._stats.increase_counter(names.TIER_LOADED_CHUNKS, loaded, self.label)
                seconds, size = result.transfer_time, result.transfer_bytes
                gbps = throughput_gbps(size or 0, seconds or 0.0)
                if gbps is not None and result.success:
                    self._stats.observe_histogram(names.TIER_READ_THROUGHPUT, gbps, self.label)
        return results

    def shutdown(self) -> None:
        chunk_integrity.remove_listener(self._on_mismatch)
        self.index.stop()
        self._shutdown()
        self.slot.release()

    def take_stats(self) -> OffloadingConnectorStats | None:
        if self.index.ensure_running():
            self._stats.increase_counter(names.TIER_EVICTOR_RESTARTS, 1, self.label)
        counts = self.index.take_counts()
        stats, self._stats = self._stats, OffloadingConnectorStats()
        mismatches, self._mismatches = self._mismatches, 0
        if mismatches:
            stats.increase_counter(names.TIER_CHECKSUM_MISMATCHES, mismatches, self.label)
        free = self.index.free_bytes
        gauges = (self.index.capacity_bytes, self.index.used_bytes, free, not self.index.read_only)
        if gauges != self._reported:
            stats.set_gauge(names.TIER_CAPACITY_BYTES, gauges[0], self.label)
            stats.set_gauge(names.TIER_USED_BYTES, gauges[1], self.label)
            stats.set_gauge(names.TIER_WRITABLE, int(gauges[3]), self.label)
            if free is not None:
                stats.set_gauge(names.TIER_VOLUME_FREE_BYTES, free, self.label)
            if self.break_even_gbps is not None:
                stats.set_gauge(names.TIER_BREAK_EVEN_GBPS, self.break_even_gbps, self.label)
            self._reported = gauges
        if counts.evicted_bytes:
            stats.increase_counter(names.TIER_EVICTED_BYTES, counts.evicted_bytes, self.label)
        if counts.evicted_chunks:
            stats.increase_counter(names.TIER_EVICTED_CHUNKS, counts.evicted_chunks, self.label)
        if counts.refused_chunks:
            stats.increase_counter(names.TIER_REFUSED_CHUNKS, counts.refused_chunks, self.label)
        if counts.delete_errors:
            stats.increase_counter(names.TIER_DELETE_ERRORS, counts.delete_errors, self.label)
        if counts.loop_errors:
            stats.increase_counter(names.TIER_EVICTOR_ERRORS, counts.loop_errors, self.label)
        return None if stats.is_empty() else stats


def guard_disk_tiers(manager: Any, extra_config: dict[str, Any] | None, vllm_config: Any = None) -> list[FsTierGuard]:
    """Bound the manager's fs tier when the config plans a bound; one clear error when it cannot."""
    bound = disk_tier_bound(extra_config)
    if bound is None:
        return []
    tiers = fs_tiers(manager)
    if len(tiers) != 1:
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BYTES} bounds one 'fs' secondary tier, but "
                         f"the offloading manager has {len(tiers)} (set spec_name TieringOffloadingSpec and one "
                         "secondary_tiers entry of type 'fs')")
    label, tier = tiers[0]
    break_even = (extra_config or {}).get(EXTRA_DISK_TIER_BREAK_EVEN_GBPS)
    if break_even is not None and (isinstance(break_even, bool) or not isinstance(break_even, (int, float))
                                   or break_even <= 0):
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BREAK_EVEN_GBPS} must be a rate in GB/s > 0, "
                         f"got {break_even!r}")
    if vllm_config is None:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
    return [FsTierGuard(manager, tier, bound, label, float(break_even) if break_even is not None else None,
                        vllm_config, extra_config)]
