"""The plugin's metrics reach Prometheus through vLLM's own connector-metrics path, beside vLLM's."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from support import require_vllm

require_vllm(allow_module_level=True)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from spillway.core import vllm_api as V
from spillway_connector import names
from spillway_connector.compat import OffloadingConnectorStats
from spillway_connector.connector import SpillwayOffloadingConnector
from spillway_connector.host_backend import kv_transfer_config
from support.promtext import total
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

LABELNAMES = ["model_name", "engine"]
ENGINES = {0: ["tiny", "0"], 1: ["tiny", "1"]}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def prom(registry) -> KVConnectorProm:
    """vLLM's KVConnectorProm, registering into a private registry; it finds the connector class itself."""

    class IsolatedProm(KVConnectorProm):
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    # The metrics path reads only kv_transfer_config from the VllmConfig (a whole one needs a device).
    config = SimpleNamespace(kv_transfer_config=KVTransferConfig(**kv_transfer_config(1 << 20)))
    return IsolatedProm(config, LABELNAMES, ENGINES)


def payload(reloads: int, store_gbps: list[float]) -> dict:
    stats = OffloadingConnectorStats()
    stats.increase_counter(names.PREEMPTED_RELOAD_REQUESTS, reloads)
    stats.increase_counter(names.PREEMPTED_RELOAD_TOKENS, 32 * reloads)
    for gbps in store_gbps:
        stats.observe_histogram(names.TRANSFER_THROUGHPUT, gbps, (names.DIRECTION_STORE,))
    stats.set_gauge(names.POOL_RESIDENT_CHUNKS, 7)
    stats.increase_counter(V.Metric.OFFLOAD_STORE_BYTES, 4096)  # vLLM's own, in the same payload
    return stats.data


def test_metrics_are_exported_per_engine_with_vllms_labels(prom, registry):
    prom.observe(payload(2, [1.5, 3.0]), engine_idx=0)
    prom.observe(payload(1, [30.0]), engine_idx=0)
    prom.observe(payload(5, []), engine_idx=1)
    text = generate_latest(registry).decode()
    reloads = names.exported(names.PREEMPTED_RELOAD_REQUESTS)
    assert total(text, reloads, model_name="tiny", engine="0") == 3
    assert total(text, reloads, model_name="tiny", engine="1") == 5
    assert total(text, names.exported(names.PREEMPTED_RELOAD_TOKENS), engine="0") == 96
    store = {"engine": "0", names.LABEL_DIRECTION: names.DIRECTION_STORE}
    assert total(text, names.TRANSFER_THROUGHPUT + "_count", **store) == 3
    assert total(text, names.TRANSFER_THROUGHPUT + "_sum", **store) == pytest.approx(34.5)
    assert total(text, names.TRANSFER_THROUGHPUT + "_bucket", le="2.0", **store) == 1
    assert total(text, names.POOL_RESIDENT_CHUNKS, engine="1") == 7
    assert total(text, V.Metric.OFFLOAD_STORE_BYTES + "_total", engine="0") == 2 * 4096  # vLLM's part still counts


def test_every_name_has_a_help_text_and_the_declared_type(prom, registry):
    prom.observe(payload(1, [1.0]), engine_idx=0)
    text = generate_latest(registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in names.ALL:
        family = families[name]
        assert family.documentation, name
        expected = "counter" if name in names.COUNTERS else "gauge" if name in names.GAUGES else "histogram"
        assert family.type == expected, name


def test_connector_logging_summarises_the_plugins_stats():
    stats = SpillwayOffloadingConnector.build_kv_connector_stats(payload(2, [1.0]))
    stats = stats.aggregate(SpillwayOffloadingConnector.build_kv_connector_stats(payload(1, [3.0])))
    summary = stats.reduce()
    assert summary[names.PREEMPTED_RELOAD_REQUESTS] == 3
