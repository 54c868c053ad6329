"""Spillway's node-disk ("fs") tier: vLLM's FileSystemTierManager with a bound (disk_evictor.DiskTierIndex), a
namespace (disk_namespace), a checksum per chunk (chunk_integrity) and its metrics.

Built through vLLM's seams only. The planner puts the tier's bound in kv_connector_extra_config
(EXTRA_DISK_TIER_BYTES) beside vLLM's own `secondary_tiers` entry of type "fs"; Spillway's tiering spec
(spec.SpillwayTieringOffloadingSpec.get_manager) then names this module's SpillwayFsTier for that entry the way
vLLM takes an out-of-tree tier (`type` = the class, `module_path` = its module: SecondaryTierFactory.get_tier_class,
vllm/v1/kv_offload/tiering/factory.py), and vLLM's own get_manager builds it in the engine core:
  - the root must hold nothing but the tier's own entries (refused with one line otherwise); the engine takes a
    replica slot of its own in it and its file mapper lives there, in a namespace whose digest covers the model's
    identity (weights, dtype, vLLM release, ...), so no other replica's or revision's files are touched;
  - every file carries a checksum of its chunk under its name, verified on load (a mismatch is a miss);
  - every store is admitted by the index before vLLM writes it (a store that cannot fit is dropped from the job,
    so vLLM never writes it), every load pins its files until it finished, and every hit the CPU pool serves (the
    manager's prepare_load, through the spec's pool probe) makes its files young again; the evictor thread is
    restarted if it dies.
Nothing of vLLM is replaced after it was built. The bound only adds work before and after vLLM's own
submit_store, submit_load and get_finished_jobs (super()). The checksum cannot: vLLM's submit_store and
submit_load hand their I/O thread pool vLLM's io functions by name, so SpillwayFsTier redoes those two methods
with chunk_integrity's writer and reader. That redo runs only where vLLM's tier and io code read as in the releases
verified (FS_TIER_CODE, source_guard.py; PATCHES.md entry 9); elsewhere the tier is still bounded but writes and
reads vLLM's own files (a namespace of their own: the format is part of the digest), and one warning says why.
The tier's type stays "fs", so vLLM's vllm:kv_offload_tiering_* metrics keep their label ("1:fs") and ours carry
the same.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from spillway_connector import chunk_integrity, disk_namespace, names
from spillway_connector.compat import VLLM_MINOR, OffloadingConnectorStats
from spillway_connector.disk_evictor import DiskTierIndex
from spillway_connector.probes import throughput_gbps
from spillway_connector.source_guard import verified
from spillway_connector.transfer_config import (
    EXTRA_DISK_TIER_BREAK_EVEN_GBPS,
    EXTRA_DISK_TIER_BYTES,
    EXTRA_SECONDARY_TIERS,
    FS_TIER_TYPE,
)

try:  # vLLM's tiered offloading: 0.32+
    from vllm.v1.kv_offload.tiering.fs import io as fs_io
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
except ImportError:  # 0.26
    fs_io = FileSystemTierManager = None  # type: ignore[assignment,misc]

_STORE, _LOAD = "store", "load"
TIER_CLASS = "SpillwayFsTier"  # the `type` of the fs tier's entry Spillway's spec hands vLLM's factory
CHECKSUM = "the disk tier's checksum (disk_tier.py)"
PLAIN_FORMAT = "vllm"  # the namespace's format field where the tier writes vLLM's own files
logger = logging.getLogger(__name__)

# The code SpillwayFsTier's submit_store and submit_load redo, by release (vllm/v1/kv_offload/tiering/fs/manager.py
# and io.py): the state __init__ sets up and get_finished_jobs reads, the store and load they queue, and the io
# functions chunk_integrity's writer and reader stand in for. One fingerprint for 0.32.0 and 0.33.0 and one for
# 0.34.0 (which keeps every store job for its lookup cache), where the two differ; io's _store_block took a
# retry of the rename in 0.33.0 (a shared file system's EEXIST), which store_chunks does too.
FS_TIER_CODE = {
    "FileSystemTierManager.__init__": frozenset({"6f54c9dea6cc711d", "220d15d3c291cbb0"}),
    "FileSystemTierManager.submit_store": frozenset({"5d14af469ad9264b", "ac7214d68bb6e97c"}),
    "FileSystemTierManager.submit_load": frozenset({"7dae84bd3f75d047"}),
    "FileSystemTierManager.get_finished_jobs": frozenset({"96d17877f8ffc379", "907ee5b1c119fc92"}),
    "io.batch_store_block": frozenset({"363d75cce2498287"}),
    "io._store_block": frozenset({"21238b5f48f67f02", "5ffe763faf7d8399"}),
    "io.batch_load_block": frozenset({"54a9cc3f01739e42"}),
    "io._load_block": frozenset({"e7a7afb1150a5f58"}),
}


def fs_tier_functions(tier_cls: Any = None, io: Any = None) -> dict[str, Any]:
    """vLLM's functions FS_TIER_CODE names (`tier_cls`, `io`: another release's, in tests); {} without tiering."""
    tier_cls = FileSystemTierManager if tier_cls is None else tier_cls
    io = fs_io if io is None else io
    if tier_cls is None or io is None:
        return {}
    return {name: vars(tier_cls).get(name.split(".")[1]) if name.startswith("FileSystemTierManager.")
            else getattr(io, name.split(".")[1], None) for name in FS_TIER_CODE}


def disk_tier_bound(extra_config: Any) -> int | None:
    """The planned bound in bytes, or None when the connector should not bound a disk tier."""
    raw = (extra_config or {}).get(EXTRA_DISK_TIER_BYTES)
    if raw is None:
        return None
    if type(raw) is not int or raw <= 0:
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BYTES} must be a whole number of bytes > 0, "
                         f"got {raw!r}")
    return raw


def break_even_gbps(extra_config: Any) -> float | None:
    raw = (extra_config or {}).get(EXTRA_DISK_TIER_BREAK_EVEN_GBPS)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BREAK_EVEN_GBPS} must be a rate in GB/s > 0, "
                         f"got {raw!r}")
    return float(raw)


def _one_fs_tier_error(found: int) -> ValueError:
    return ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BYTES} bounds one 'fs' secondary tier, but "
                      f"the offloading manager has {found} (set spec_name TieringOffloadingSpec, which Spillway's "
                      "connector runs as spillway_connector.spec.SpillwayTieringOffloadingSpec, and one "
                      f"{EXTRA_SECONDARY_TIERS} entry of type 'fs')")


def guarded_tier_configs(tier_configs: list[dict[str, Any]], extra_config: Any) -> list[dict[str, Any]]:
    """The spec's secondary tier configs with the one "fs" tier built as SpillwayFsTier where the config plans a
    bound (unchanged where it does not); one clear error where there is not exactly one fs tier to bound."""
    bound = disk_tier_bound(extra_config)
    if bound is None:
        return tier_configs
    break_even_gbps(extra_config)  # refused here, before any tier is built
    if FileSystemTierManager is None or VLLM_MINOR < (0, 32):  # 0.26's tier takes other jobs (no TransferJob)
        raise ValueError(f"kv_connector_extra_config {EXTRA_DISK_TIER_BYTES}: the connector bounds the fs tier of "
                         "vLLM 0.32 and later")
    fs = [index for index, config in enumerate(tier_configs)
          if config.get("type") == FS_TIER_TYPE and "module_path" not in config]
    if len(fs) != 1:
        raise _one_fs_tier_error(len(fs))
    configs = list(tier_configs)
    configs[fs[0]] = {**tier_configs[fs[0]], "type": TIER_CLASS, "module_path": __name__}
    return configs


# The engine's VllmConfig while Spillway's connector builds vLLM's (the spec's get_manager runs inside vLLM's
# OffloadingConnector.__init__, and vLLM hands the spec only its OffloadingConfig): the namespace reads the
# model's revision, dtype and quantization from it. None under another connector: those fields stay empty.
_ENGINE_CONFIG: contextvars.ContextVar[Any] = contextvars.ContextVar("spillway_engine_config", default=None)


@contextlib.contextmanager
def engine_config(vllm_config: Any) -> Iterator[None]:
    token = _ENGINE_CONFIG.set(vllm_config)
    try:
        yield
    finally:
        _ENGINE_CONFIG.reset(token)


def fs_tiers(manager: Any) -> list[tuple[str, Any]]:
    """(label, tier) of the file-system tiers under a TieringOffloadingManager (none under another manager). The
    label is vLLM's own tier label, "<position>:<type>" with the CPU pool at 0 (vllm/v1/kv_offload/tiering/
    metrics.py tier_label), so our series and vLLM's vllm:kv_offload_tiering_* join on it."""
    tiers = getattr(manager, "secondary_tiers", ())
    return [(f"{index + 1}:{tier.tier_type}", tier) for index, tier in enumerate(tiers) if hasattr(tier, "file_mapper")]


def guarded_tiers(manager: Any, extra_config: Any = None) -> list[tuple[str, SpillwayFsTier]]:
    """(label, tier) of the manager's Spillway fs tier; where `extra_config` plans a bound, exactly one or a clear
    error (a bound under a spec that did not build Spillway's tier would otherwise go unheeded)."""
    tiers = [(label, tier) for label, tier in fs_tiers(manager)
             if FileSystemTierManager is not None and isinstance(tier, SpillwayFsTier)]
    if extra_config is not None and disk_tier_bound(extra_config) is not None and len(tiers) != 1:
        raise _one_fs_tier_error(len(tiers))
    return tiers


if FileSystemTierManager is not None:

    class SpillwayFsTier(FileSystemTierManager):
        """vLLM's fs tier, bounded, in a slot and namespace of its own, its chunks checksummed."""

        def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, root_dir: str,
                     **kwargs: Any):
            # vLLM's factory passes the entry's type, this class's name; vLLM's label and ours stay "<n>:fs".
            super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                             tier_type=FS_TIER_TYPE, root_dir=root_dir, **kwargs)
            self.spillway_slot: disk_namespace.Slot | None = None
            try:
                self._spillway_setup(offloading_spec, root_dir)
            except BaseException:  # vLLM cleans up only the tiers it got back: stop this one's threads here
                chunk_integrity.remove_listener(self._on_mismatch)
                if getattr(self, "spillway_index", None) is not None:
                    self.spillway_index.stop()
                with contextlib.suppress(Exception):
                    super().shutdown()
                if self.spillway_slot is not None:
                    self.spillway_slot.release()
                raise

        def _spillway_setup(self, offloading_spec: Any, root_dir: str) -> None:
            extra = offloading_spec.extra_config
            self.spillway_bound = disk_tier_bound(extra)
            if self.spillway_bound is None:
                raise _one_fs_tier_error(0)
            self.break_even_gbps = break_even_gbps(extra)
            self.checksums = verified(CHECKSUM, fs_tier_functions(), FS_TIER_CODE)
            # a file is the pool's row and, with the checksum, its trailer page
            self.chunk_bytes = chunk_integrity.file_bytes(self._block_size) if self.checksums else self._block_size
            # vLLM's mapper named <root_dir>/<model>_<digest> and wrote its config.json there (a stub check_root
            # allows); the chunks go to this engine's slot, under a digest that also covers the model's identity
            disk_namespace.check_root(root_dir)
            self.spillway_slot = disk_namespace.claim_slot(root_dir)
            # Sibling reads need the checksum path: there this class writes and reads its own paths, and vLLM
            # only looks up through the mapper (without it, vLLM's submit_store would write where a lookup found)
            share = disk_namespace.share() if self.checksums else None
            fields = disk_namespace.identity(offloading_spec.config, _ENGINE_CONFIG.get(), extra,
                                             file_format=None if self.checksums else PLAIN_FORMAT, share=share)
            base = disk_namespace.rebase(self.file_mapper, self.spillway_slot.path, fields)
            own = self.spillway_slot.path
            self._own_file = self.file_mapper.get_file_name
            self._siblings = None if share is None else disk_namespace.SiblingFiles(self.file_mapper, root_dir, own)
            if self._siblings is not None:
                self.file_mapper = self._siblings  # vLLM's lookup names files through it
            logger.info("disk tier: chunks under %s (namespace fields %s), checksum %s, sibling slots %s", base,
                        fields, "on" if self.checksums else "off", "read" if share is not None else "not read")
            self.spillway_index = DiskTierIndex(own, self.spillway_bound, namespace=os.path.basename(base),
                                                orphans=lambda: disk_namespace.orphaned_slots(root_dir, own))
            self.spillway_index.scan()
            self.spillway_index._check_volume()
            self.spillway_index.start()
            self._spillway_mismatches = 0
            chunk_integrity.add_listener(self.spillway_slot.path, self._on_mismatch)
            self._spillway_jobs: dict[Any, tuple[str, list[str]]] = {}  # job id -> (kind, its files)
            self._spillway_loaded = 0  # chunks read back into the pool since the last take_stats
            self._spillway_sibling_loaded = 0  # of which from sibling slots
            self._spillway_sibling_jobs: dict[Any, int] = {}  # load job id -> its chunks in sibling slots
            self._spillway_read_gbps: list[float] = []  # each load's disk -> pool rate since then
            self._spillway_reported: tuple | None = None

        def _on_mismatch(self, path: str, reason: str) -> None:
            """A tier I/O thread's: a chunk file failed its checksum and was removed."""
            self._spillway_mismatches += 1  # one writer per call under the GIL; read by take_stats
            self.spillway_index.forget(path)

        def _paths(self, keys: Any) -> list[str]:
            """The keys' files in this engine's own slot: what it stores, bounds, pins and ages."""
            return [self._own_file(key) for key in keys]

        def submit_store(self, job_metadata: Any) -> None:
            job, keys = job_metadata, list(job_metadata.keys)
            paths = self._paths(keys)
            admitted = self.spillway_index.reserve(paths, self.chunk_bytes)
            if not all(admitted):
                keep = np.array(admitted, dtype=bool)
                keys = [key for key, ok in zip(keys, admitted) if ok]
                paths = [path for path, ok in zip(paths, admitted) if ok]
                job = dataclasses.replace(job, keys=keys, chunk_ids=np.asarray(job.chunk_ids)[keep])
            self._spillway_jobs[job.job_id] = (_STORE, paths)
            if not self.checksums:
                super().submit_store(job)
                return
            # vLLM's FileSystemTierManager.submit_store (0.32-0.34), its writer chunk_integrity.store_chunks
            if hasattr(self, "_store_jobs"):  # 0.34: every store job, for the lookup cache and the events
                self._store_jobs[job.job_id] = job
            elif self.events is not None:  # 0.32, 0.33: the keys, for the events
                self._store_job_keys[job.job_id] = keys
            task = functools.partial(chunk_integrity.store_chunks, paths, self._primary_kv_view,
                                     [int(cid) * self._block_size for cid in job.chunk_ids], self._block_size,
                                     self._use_o_direct)
            self._job_block_counts[job.job_id] = len(keys)
            self._pool.enqueue_store(job.job_id, 1, [task])

        def submit_load(self, job_metadata: Any) -> None:
            job_id, keys = job_metadata.job_id, list(job_metadata.keys)
            paths = self._paths(keys)
            self.spillway_index.pin(paths)
            self._spillway_jobs[job_id] = (_LOAD, paths)
            if not self.checksums:
                super().submit_load(job_metadata)
                return
            # vLLM's FileSystemTierManager.submit_load (0.32-0.34), its reader chunk_integrity.load_chunks; the
            # files where the mapper finds them (a sibling slot's, with sibling reads)
            self._load_job_keys[job_id] = keys
            self._job_block_counts[job_id] = len(keys)
            offsets = [int(cid) * self._block_size for cid in job_metadata.chunk_ids]
            found = paths if self._siblings is None else [self._siblings.locate(path) for path in paths]
            siblings = sum(f != p for f, p in zip(found, paths))
            if siblings:
                self._spillway_sibling_jobs[job_id] = siblings

            def load_task() -> None:
                try:
                    chunk_integrity.load_chunks(found, self._primary_kv_view, offsets, self._block_size,
                                                self._use_o_direct)
                except OSError as exc:  # on the pool's thread, before it publishes the job (vLLM's comment)
                    self._load_progress[job_id] = getattr(exc, "num_succeeded", 0)
                    raise

            self._pool.enqueue_load(job_id, 1, [load_task])

        def get_finished_jobs(self) -> Any:
            results = list(super().get_finished_jobs())
            index = self.spillway_index
            for result in results:
                kind, paths = self._spillway_jobs.pop(result.job_id, (None, []))
                if kind == _STORE:
                    index.release(paths, stored=bool(result.success))
                elif kind == _LOAD:
                    index.release(paths)
                    self._spillway_loaded += len(result.successful_keys) if result.successful_keys is not None \
                        else (len(paths) if result.success else 0)
                    siblings = self._spillway_sibling_jobs.pop(result.job_id, 0)
                    self._spillway_sibling_loaded += siblings if result.success else 0
                    gbps = throughput_gbps(result.transfer_bytes or 0, result.transfer_time or 0.0)
                    if gbps is not None and result.success:
                        self._spillway_read_gbps.append(gbps)
            return results

        def touching(self, prepare_load: Any) -> Any:
            """The manager's prepare_load (a CPU-pool hit about to be loaded to the GPU), which first makes the
            chunks' files the youngest: the pool forgets a prefix long before the disk does."""

            def prepare(keys: Any, *args: Any, **kwargs: Any) -> Any:
                keys = list(keys)
                self.spillway_index.touch(self._paths(keys))
                return prepare_load(keys, *args, **kwargs)

            return prepare

        def shutdown(self) -> None:
            chunk_integrity.remove_listener(self._on_mismatch)
            self.spillway_index.stop()
            super().shutdown()
            if self.spillway_slot is not None:
                self.spillway_slot.release()

        def take_stats(self, label: str) -> OffloadingConnectorStats | None:
            """The tier's stats since the last call, labelled `label` (vLLM's label of this tier); None when none."""
            labels = (label,)
            index = self.spillway_index
            stats = OffloadingConnectorStats()
            if index.ensure_running():
                stats.increase_counter(names.TIER_EVICTOR_RESTARTS, 1, labels)
            counts = index.take_counts()
            loaded, self._spillway_loaded = self._spillway_loaded, 0
            if loaded:
                stats.increase_counter(names.TIER_LOADED_CHUNKS, loaded, labels)
            sibling, self._spillway_sibling_loaded = self._spillway_sibling_loaded, 0
            if sibling:
                stats.increase_counter(names.TIER_SIBLING_LOADED_CHUNKS, sibling, labels)
            read_gbps, self._spillway_read_gbps = self._spillway_read_gbps, []
            for gbps in read_gbps:
                stats.observe_histogram(names.TIER_READ_THROUGHPUT, gbps, labels)
            mismatches, self._spillway_mismatches = self._spillway_mismatches, 0
            if mismatches:
                stats.increase_counter(names.TIER_CHECKSUM_MISMATCHES, mismatches, labels)
            free = index.free_bytes
            gauges = (index.capacity_bytes, index.used_bytes, free, not index.read_only)
            if gauges != self._spillway_reported:
                stats.set_gauge(names.TIER_CAPACITY_BYTES, gauges[0], labels)
                stats.set_gauge(names.TIER_USED_BYTES, gauges[1], labels)
                stats.set_gauge(names.TIER_WRITABLE, int(gauges[3]), labels)
                if free is not None:
                    stats.set_gauge(names.TIER_VOLUME_FREE_BYTES, free, labels)
                if self.break_even_gbps is not None:
                    stats.set_gauge(names.TIER_BREAK_EVEN_GBPS, self.break_even_gbps, labels)
                self._spillway_reported = gauges
            for name, value in ((names.TIER_EVICTED_BYTES, counts.evicted_bytes),
                                (names.TIER_EVICTED_CHUNKS, counts.evicted_chunks),
                                (names.TIER_REFUSED_CHUNKS, counts.refused_chunks),
                                (names.TIER_DELETE_ERRORS, counts.delete_errors),
                                (names.TIER_EVICTOR_ERRORS, counts.loop_errors)):
                if value:
                    stats.increase_counter(name, value, labels)
            return None if stats.is_empty() else stats
