"""Observers wrapped around vLLM's offloading worker and manager.

Each probe forwards every call unchanged to the object it wraps and records what
the connector's metrics need into an OffloadingConnectorStats payload, which
vLLM carries from the worker and the scheduler to the API server's /metrics.
"""
from __future__ import annotations

from typing import Any

from spillway_connector import names
from spillway_connector.compat import (
    LoadStoreSpec,
    OffloadingConnectorStats,
    OffloadingWorker,
    TransferResult,
)


def throughput_gbps(num_bytes: int, seconds: float) -> float | None:
    """GB/s (1e9 bytes per second) of one transfer; None when it has no measurable time."""
    if seconds <= 0 or num_bytes <= 0:
        return None
    return num_bytes / seconds / 1e9


class TransferProbe(OffloadingWorker):
    """Wraps the spec's OffloadingWorker; records each finished transfer's throughput by direction."""

    def __init__(self, inner: OffloadingWorker, count_bytes_and_seconds: bool = False):
        self.inner = inner
        self._count_bytes_and_seconds = count_bytes_and_seconds
        self._direction: dict[int, str] = {}  # job id -> direction, until the job finishes
        self._stats = OffloadingConnectorStats()

    # The device side is a GPULoadStoreSpec up to vLLM 0.33 and DevicePointers from 0.34: passed on as is.
    def submit_store(self, job_id: int, src: Any, dst_spec: LoadStoreSpec) -> bool:
        self._direction[job_id] = names.DIRECTION_STORE
        return self.inner.submit_store(job_id, src, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst: Any, **kwargs: Any) -> bool:
        self._direction[job_id] = names.DIRECTION_LOAD
        return self.inner.submit_load(job_id, src_spec, dst, **kwargs)

    def get_finished(self) -> list[TransferResult]:
        results = self.inner.get_finished()
        for result in results:
            direction = self._direction.pop(result.job_id, None)
            if direction is not None and result.transfer_size is not None and result.transfer_time is not None:
                self.record(direction, result.transfer_size, result.transfer_time)
        return results

    def wait(self, job_ids: set[int]) -> None:
        self.inner.wait(job_ids)

    def shutdown(self) -> None:
        self._direction.clear()
        self.inner.shutdown()

    def record(self, direction: str, num_bytes: int, seconds: float) -> None:
        labels = (direction,)
        gbps = throughput_gbps(num_bytes, seconds)
        if gbps is not None:
            self._stats.observe_histogram(names.TRANSFER_THROUGHPUT, gbps, labels)
        if self._count_bytes_and_seconds:
            self._stats.increase_counter(names.TRANSFER_BYTES, num_bytes, labels)
            self._stats.increase_counter(names.TRANSFER_SECONDS, seconds, labels)

    def take_stats(self) -> OffloadingConnectorStats | None:
        """The observations since the last call, or None when there are none."""
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, OffloadingConnectorStats()
        return stats


class PoolProbe:
    """Wraps the scheduler's OffloadingManager; counts resident and evicted chunks.

    Resident = chunks allocated by prepare_store (in flight or stored) less those evicted
    to make room, zeroed by reset_cache. Every other attribute reaches the manager as is
    (`inner` is fixed at construction: its methods are cached on first use).
    """

    def __init__(self, inner: Any, capacity_chunks: int | None, prepare_load: Any = None, complete_load: Any = None):
        """`prepare_load`/`complete_load`: what the manager's own methods do, faster (batched_pin.py,
        batched_release.py), or None to call the manager's."""
        self.inner = inner
        if prepare_load is not None:
            self.prepare_load = prepare_load
        if complete_load is not None:
            self.complete_load = complete_load
        self.capacity_chunks = capacity_chunks
        self.resident_chunks = 0
        self._evicted_chunks = 0
        self._reported: tuple[int | None, int] | None = None  # gauges last put on a payload

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. during copy): no recursion
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if callable(value):  # a bound method of the manager: keep it, later calls skip this lookup
            self.__dict__[name] = value
        return value

    def prepare_store(self, keys: Any, *args: Any, **kwargs: Any) -> Any:
        output = self.inner.prepare_store(keys, *args, **kwargs)
        if output is not None:
            evicted = len(output.evicted_keys)
            self.resident_chunks += len(output.keys_to_store) - evicted
            self._evicted_chunks += evicted
        return output

    def reset_cache(self, *args: Any, **kwargs: Any) -> Any:
        self.resident_chunks = 0
        return self.inner.reset_cache(*args, **kwargs)

    def take_stats(self) -> OffloadingConnectorStats | None:
        """The evictions since the last call and, when they changed, the gauges; None when neither."""
        gauges = (self.capacity_chunks, self.resident_chunks)
        if gauges == self._reported and not self._evicted_chunks:
            return None
        stats = OffloadingConnectorStats()
        if gauges != self._reported:
            if self.capacity_chunks is not None:
                stats.set_gauge(names.POOL_CAPACITY_CHUNKS, self.capacity_chunks)
            stats.set_gauge(names.POOL_RESIDENT_CHUNKS, self.resident_chunks)
            self._reported = gauges
        if self._evicted_chunks:
            stats.increase_counter(names.POOL_EVICTED_CHUNKS, self._evicted_chunks)
            self._evicted_chunks = 0
        return stats
