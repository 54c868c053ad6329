"""Spillway's offloading specs: vLLM's own specs, whose manager and worker carry the connector's probes.

Selected through vLLM's spec seam (`kv_connector_extra_config` `spec_name` + `spec_module_path`,
vllm/v1/kv_offload/factory.py); the planner writes them (transfer_config.kv_transfer_config):
  - SpillwayOffloadingSpec (module spillway_connector.spec): vLLM's CPUOffloadingSpec, the GPU pool;
  - SpillwayTieringOffloadingSpec: vLLM's TieringOffloadingSpec, the pool over secondary tiers (the node disk).
What each adds, and nothing else:
  - get_manager() wraps vLLM's manager in the pool probe (probes.PoolProbe: resident, capacity and evicted chunks),
    which does a load's pin and release in one pass where the manager is vLLM's LRU one and its code reads as
    verified (batched_pin.py, batched_release.py; PATCHES.md entries 1 and 2); vLLM's own CPUOffloadingSpec wraps
    its manager the same way (FilterReusedOffloadingManager).
  - get_worker() wraps vLLM's worker in the transfer probe (probes.TransferProbe: throughput per direction).
  - the worker's shared region is pre-faulted from several threads instead of one (shared_region below;
    PATCHES.md entry 5), and lives on 2 MiB huge pages where the plan put it there (hugetlb_pool.py; entry 10).
  - SpillwayTieringOffloadingSpec.get_manager() has vLLM build the fs tier as Spillway's bounded, checksummed
    tier (disk_tier.SpillwayFsTier, through the factory's out-of-tree tier path) where the config plans a bound,
    and its pool probe makes a pool hit's disk files young (PATCHES.md entry 9).
The connector (SpillwayOffloadingConnector) reads the probes from its scheduler's manager and worker; it wraps
nothing itself.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spillway_connector.batched_pin import batched_prepare_load
from spillway_connector.batched_release import batched_complete_load
from spillway_connector.compat import (
    VLLM_EXPORTS_TRANSFER_COUNTERS,
    CanonicalKVCaches,
    CPUOffloadingSpec,
    OffloadingWorker,
    SharedOffloadRegion,
    TieringOffloadingSpec,
    pool_capacity_chunks,
)
from spillway_connector.disk_tier import guarded_tier_configs, guarded_tiers
from spillway_connector.hugetlb_pool import HUGE_PAGE, huge_page_check, not_placed_line, placement
from spillway_connector.probes import PoolProbe, TransferProbe
from spillway_connector.source_guard import logger, verified

PREFAULT_THREADS_ENV = "SPILLWAY_PREFAULT_THREADS"  # spillway.core.vllm_api.ENV_PREFAULT_THREADS
MAX_PREFAULT_THREADS = 64
_PIECE = 256 << 20  # bytes a thread faults in one madvise call: small enough to balance the threads
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+)

# The code shared_region relies on, by release (vllm/v1/kv_offload/cpu/shared_offload_region.py,
# vllm/v1/kv_offload/cpu/spec.py, vllm/v1/kv_offload/tiering/spec.py): 0.33.0 and 0.34.0. 0.32's region has no
# populate_shard and pre-faults differently; its CPU platform never maps the region.
REGION_CODE = {
    "SharedOffloadRegion.__init__": frozenset({"060b13faebb3d2b3", "77acfdf279323ecc"}),
    "SharedOffloadRegion.iter_worker_slot_ranges": frozenset({"0ded56fd1d81de43"}),
}
# The specs' create_worker, which SpillwayOffloadingSpec and SpillwayTieringOffloadingSpec redo with shared_region:
# 0.33.0 and 0.34.0 (cpu/spec.py; tiering/spec.py, the same in 0.32.0 and 0.33.0).
CPU_WORKER_CODE = {"CPUOffloadingSpec.create_worker": frozenset({"467a6da60520fb35", "d2f1ee65a2724760"})}
TIERING_WORKER_CODE = {"TieringOffloadingSpec.create_worker": frozenset({"17342654af6d60dd", "2fbaf5b9212c61c8"})}


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def region_functions(region_cls: Any = None) -> dict[str, Any]:
    region_cls = SharedOffloadRegion if region_cls is None else region_cls
    if region_cls is None:
        return {}
    return {name: vars(region_cls).get(name.split(".")[1]) for name in REGION_CODE}


def prefault_threads() -> int:
    """SPILLWAY_PREFAULT_THREADS (the operator sets the replica's cores), else the CPUs this process may run on,
    at most 16 (bench/pool-setup/results/pool_setup*.json: 16 threads fault 64 GiB in 7.2-7.8 s, one in 41-68 s)."""
    raw = os.environ.get(PREFAULT_THREADS_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return min(int(raw), MAX_PREFAULT_THREADS)
    return max(1, min(len(os.sched_getaffinity(0)), 16))


def _madvise() -> Any:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def prefault(base: int, ranges: list[tuple[int, int]], threads: int, page: int = mmap.PAGESIZE) -> int:
    """MADV_POPULATE_WRITE the (offset, length) `ranges` of the mapping at `base` from up to `threads` threads,
    each a contiguous share (so threads work in different files: page-cache inserts serialise per file). ctypes
    releases the GIL, mmap.madvise does not. Returns the threads used; raises OSError as vLLM's own call does.
    `page`: the mapping's page size; on huge pages each range grows to whole pages, so no two threads fault one."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        start, end = offset - offset % page, _round_up(offset + length, page)
        if merged and merged[-1][0] + merged[-1][1] >= start:
            merged[-1][1] = max(merged[-1][1], end - merged[-1][0])
        else:
            merged.append([start, end - start])
    total = sum(length for _, length in merged)
    piece = max(page, min(_PIECE, _round_up(_cdiv(total, max(threads, 1)), page)))
    pieces = [(offset + at, min(piece, length - at)) for offset, length in merged for at in range(0, length, piece)]
    threads = max(1, min(threads, len(pieces)))
    madvise = _madvise()

    def fault(share: list[tuple[int, int]]) -> None:
        for offset, length in share:
            if madvise(base + offset, length, _MADV_POPULATE_WRITE) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"madvise(MADV_POPULATE_WRITE): {os.strerror(err)}")

    shares = [pieces[len(pieces) * i // threads:len(pieces) * (i + 1) // threads] for i in range(threads)]
    if threads == 1:
        fault(shares[0])
        return 1
    with ThreadPoolExecutor(threads, thread_name_prefix="spillway-prefault") as pool:
        for done in [pool.submit(fault, share) for share in shares]:
            done.result()
    return threads


def _populate_write_supported(base: int) -> bool:
    return _madvise()(base, mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0


def shared_region(threads: int | None = None, region_cls: Any = None, huge_pages: bool = True, **kwargs: Any) -> Any:
    """vLLM's SharedOffloadRegion(**kwargs), with the pages vLLM would pre-fault (this worker's slots, its shard of
    a replicated region, or the whole region) faulted from several threads. vLLM's constructor is told to fault
    none (populate_shard with no share of its own, which adds one barrier, on every worker alike), the same ranges
    are faulted here, and a replicated region's workers meet once more after, as vLLM's do after their shards.
    Where the region's code does not read as verified, or the kernel lacks MADV_POPULATE_WRITE, vLLM's own
    constructor does all of it. Where the plan put the pool on huge pages (SPILLWAY_POOL_HUGEPAGES_DIR), its file
    is on that hugetlbfs mount (hugetlb_pool.py), unless `huge_pages` is off. `region_cls`: vLLM's class (tests pass
    another release's)."""
    region_cls = SharedOffloadRegion if region_cls is None else region_cls
    if not huge_pages:
        placed, line = None, not_placed_line()
    else:
        placed, line = placement(kwargs, region_cls) if region_cls is not None else (None, "")
    if line:
        (logger.info if placed is not None else logger.warning)(line)
    if placed is None:
        return _shared_region(threads, region_cls, mmap.PAGESIZE, **kwargs)
    with huge_page_check(region_cls):
        return _shared_region(threads, region_cls, HUGE_PAGE, **placed)


def _shared_region(threads: int | None, region_cls: Any, page: int, **kwargs: Any) -> Any:
    if not verified("the parallel pre-fault (spec.py)", region_functions(region_cls), REGION_CODE):
        return region_cls(**kwargs)
    threads = prefault_threads() if threads is None else threads
    shard = kwargs.pop("populate_shard", None)
    count = shard[1] if shard is not None else 1
    region = region_cls(**kwargs, populate_shard=(count, count))
    started = time.perf_counter()
    total = region.total_size_bytes
    if shard is not None:  # vLLM's shard arithmetic (SharedOffloadRegion.__init__)
        share = _round_up(_cdiv(total, count), mmap.PAGESIZE)
        start = min(shard[0] * share, total)
        ranges = [(start, min(share, total - start))] if start < total else []
    elif kwargs.get("rank") is not None:
        ranges = list(region.iter_worker_slot_ranges())
    else:
        ranges = [(0, total)]
    base = region.base_tensor.data_ptr()
    if ranges and not _populate_write_supported(base):  # vLLM's per-page fallback, one thread
        populate = sys.modules[region_cls.__module__]._get_populate_write_fn(region.mmap_obj)
        for offset, length in ranges:
            populate(region.mmap_obj, offset, length)
        used = 1
    else:
        used = prefault(base, ranges, threads, page) if ranges else 0
    if shard is not None and kwargs.get("barrier") is not None:
        kwargs["barrier"]()
    logger.info("spillway_connector: pre-faulted the CPU offload region (%.2f GB, %s pages) in %.3f s with %d "
                "thread(s)", sum(length for _, length in ranges) / 1e9, "2 MiB" if page == HUGE_PAGE else "4 KiB",
                time.perf_counter() - started, used)
    return region


class _Probed:
    """vLLM's spec with its manager and worker wrapped in the connector's probes (each built once)."""

    _spillway_pool: PoolProbe | None = None
    _spillway_transfers: TransferProbe | None = None

    def get_manager(self) -> Any:
        if self._spillway_pool is None:
            manager = super().get_manager()  # type: ignore[misc]
            pin, release = batched_prepare_load(manager), batched_complete_load(manager)
            prepare_load = pin
            for _, tier in guarded_tiers(manager):  # a pool hit makes the disk tier's files young too
                prepare_load = tier.touching(prepare_load or manager.prepare_load)
            self._spillway_pool = PoolProbe(manager, pool_capacity_chunks(manager), prepare_load=prepare_load,
                                            complete_load=release)
            logger.info("spillway_connector: %s's manager %s with the pool probe; batched pin %s, release %s",
                        type(self).__name__, type(manager).__name__, "on" if pin else "off",
                        "on" if release else "off")
        return self._spillway_pool

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._spillway_transfers is None:
            worker = self._build_worker(kv_caches)
            self._spillway_transfers = TransferProbe(worker, count_bytes_and_seconds=not VLLM_EXPORTS_TRANSFER_COUNTERS)
        return self._spillway_transfers

    def _build_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """The worker the probe wraps: vLLM's (the CPU-platform specs of host_backend.py give their own)."""
        return super().get_worker(kv_caches)  # type: ignore[misc]


class SpillwayOffloadingSpec(_Probed, CPUOffloadingSpec):
    def create_worker(self, kv_caches: CanonicalKVCaches) -> Any:
        """vLLM's CPUOffloadingSpec.create_worker (0.33, 0.34), its region built by shared_region."""
        if not verified("the parallel pre-fault (spec.py)", {"CPUOffloadingSpec.create_worker":
                        vars(CPUOffloadingSpec).get("create_worker")}, CPU_WORKER_CODE):
            return super().create_worker(kv_caches)
        from vllm.v1.kv_offload.cpu import spec as cpu_spec
        from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker

        mmap_region = None
        if self._uses_shared_region() and self.num_chunks > 0:
            world_size, worker_index = self.config.parallel.world_size, self.config.parallel.rank
            segments = getattr(cpu_spec, "REGION_SEGMENTS", None) or cpu_spec._REGION_SEGMENTS  # 0.34, 0.33
            mmap_region = shared_region(
                engine_id=self.config.engine_id, num_chunks=self.num_chunks,
                rank=0 if self.replicated_layout else worker_index, kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker, barrier=cpu_spec._all_workers_barrier,
                num_segments=segments,
                populate_shard=(worker_index, world_size) if self.replicated_layout else None,
            )
        try:
            return CPUOffloadingWorker(kv_caches=kv_caches, blocks_per_chunk=self.blocks_per_chunk,
                                       num_cpu_chunks=self.num_chunks, mmap_region=mmap_region)
        except Exception:
            if mmap_region is not None:
                mmap_region.cleanup()
            raise


def tiering_region(spec: Any) -> Any:
    """The region vLLM's TieringOffloadingSpec.create_worker builds for `spec`'s worker, by shared_region, never on
    huge pages: vLLM's tiering get_manager maps the same region in the engine core (rank None, at its own
    /dev/shm path: tiering/spec.py), which the connector does not build. A worker's region on the hugetlbfs mount
    would be another file, and the disk tier would store bytes the workers never wrote and load chunks where the
    workers never read them. The planner keeps a pool with a disk tier on 4 KiB pages (footprint.pool_pages)."""
    rank = 0 if spec.replicated_layout else spec.config.parallel.rank
    return shared_region(engine_id=spec._engine_id, num_chunks=spec.num_chunks, rank=rank,
                         kv_bytes_per_chunk=spec.kv_bytes_per_chunk, cpu_page_size=spec.cpu_page_size_per_worker,
                         huge_pages=False)


def tiering_create_worker_verified() -> bool:
    return TieringOffloadingSpec is not None and verified(
        "the parallel pre-fault (spec.py)",
        {"TieringOffloadingSpec.create_worker": vars(TieringOffloadingSpec).get("create_worker")},
        TIERING_WORKER_CODE)


if TieringOffloadingSpec is not None:

    class SpillwayTieringOffloadingSpec(_Probed, TieringOffloadingSpec):
        def get_manager(self) -> Any:
            """vLLM's tiering manager, its fs tier Spillway's bounded one where the config plans a bound: vLLM's
            own get_manager builds the tier named in the entry (disk_tier.guarded_tier_configs)."""
            if self._spillway_pool is None:
                self.secondary_tier_configs = guarded_tier_configs(self.secondary_tier_configs, self.extra_config)
            return super().get_manager()

        def create_worker(self, kv_caches: CanonicalKVCaches) -> Any:
            """vLLM's TieringOffloadingSpec.create_worker (0.32-0.34), its region built by shared_region."""
            if not tiering_create_worker_verified():
                return super().create_worker(kv_caches)
            from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker
            from vllm.v1.kv_offload.tiering import spec as tiering_spec

            reject = getattr(tiering_spec, "_reject_workers_across_nodes", None)  # 0.34
            if reject is not None and self.secondary_tier_configs and self.config.parallel.world_size > 1:
                reject()
            worker_mmap = tiering_region(self)
            try:
                if self.config.canonical_layout:
                    self._validate_canonical_refs(kv_caches)
                return CPUOffloadingWorker(kv_caches=kv_caches, blocks_per_chunk=self.blocks_per_chunk,
                                           num_cpu_chunks=self.num_chunks, mmap_region=worker_mmap,
                                           canonical_layout=self.config.canonical_layout)
            except Exception:
                worker_mmap.cleanup()
                raise
