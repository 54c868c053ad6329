"""The operator's own Prometheus metrics (served when SPILLWAY_METRICS_PORT is set).

`spillway_node_qualified_dma_gbps{node}`: the GPU<->pinned-CPU copy rate `spillway qualify` wrote
on each GPU node, so alerts can compare a pod's reload throughput with its node's measured figure.
`spillway_modelserver_planned{modelserver_namespace,modelserver}`: whether each ModelServer's last plan succeeded.
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from ..core import k8s_names as names
from .facts import NodeSummary

REGISTRY = CollectorRegistry()
QUALIFIED_DMA = Gauge(
    names.METRIC_NODE_QUALIFIED_DMA_GBPS,
    "GPU<->pinned-CPU copy rate measured by spillway qualify on the node (GB/s, 1e9 B/s, one direction)",
    ["node"],
    registry=REGISTRY,
)


PLANNED = Gauge(
    names.METRIC_MODELSERVER_PLANNED,
    "1 while the ModelServer's last plan succeeded, 0 while it fails (see its Planned condition)",
    # Not "namespace": Prometheus would rename it, as the scrape target (the operator's pod) has one.
    ["modelserver_namespace", "modelserver"],
    registry=REGISTRY,
)


def serve(port: int) -> None:
    start_http_server(port, registry=REGISTRY)


def publish_planned(namespace: str, name: str, planned: bool | None) -> None:
    """The ModelServer's planned gauge; None removes it (the ModelServer is gone)."""
    if planned is None:
        try:
            PLANNED.remove(namespace, name)
        except KeyError:
            pass
        return
    PLANNED.labels(modelserver_namespace=namespace, modelserver=name).set(1 if planned else 0)


def publish_nodes(nodes: Iterable[NodeSummary]) -> None:
    """Make the gauge show exactly the qualified GPU nodes now known."""
    QUALIFIED_DMA.clear()
    for node in nodes:
        if node.dma_gbps is not None:
            QUALIFIED_DMA.labels(node=node.name).set(node.dma_gbps)
