"""spec.autoscaling -> a KEDA ScaledObject or an autoscaling/v2 HorizontalPodAutoscaler over the vLLM Deployment.

Both scale on what the pods export: the engine's queue (vllm:num_requests_waiting, per replica) and its KV
cache use (vllm:kv_cache_usage_perc); a replica past either target calls for another. The highest replica
count is the smaller of spec.autoscaling.maxReplicas and what the eligible nodes can host (each node
replicas-per-node pods, GPUs / tensor parallel size unless spec says fewer): replicas beyond it would only be
Pending.

- provider hpa: the HPA reads the two series as Pods metrics through prometheus-adapter, which must expose
  them under ADAPTER_METRICS' names (docs/routing.md gives the adapter rules).
- provider keda: a ScaledObject with two prometheus triggers querying spec.autoscaling.prometheusAddress;
  KEDA creates and owns the HPA itself.

With autoscaling on, the Deployment is rendered without spec.replicas, so the autoscaler owns the count and
the operator's apply never resets it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core import vllm_api as api
from ..core.errors import InvalidSpec
from .objects import metadata
from .spec_checks import known_fields

PROVIDER_HPA = "hpa"
PROVIDER_KEDA = "keda"
PROVIDERS = (PROVIDER_HPA, PROVIDER_KEDA)
FIELDS = frozenset({"provider", "minReplicas", "maxReplicas", "queueDepthPerReplica", "kvCacheUsage",
                    "prometheusAddress"})
MAX_REPLICAS = 1000
DEFAULT_QUEUE_DEPTH = 4  # waiting requests per replica: a few queued behind a full batch
DEFAULT_KV_USAGE = 0.9  # past 90% of the GPU's KV blocks the engine starts preempting
HPA_API = ("autoscaling/v2", "HorizontalPodAutoscaler")
KEDA_API = ("keda.sh/v1alpha1", "ScaledObject")
AUTOSCALER_KINDS = (HPA_API[1], KEDA_API[1])
# prometheus-adapter's names for the two series (a custom-metrics name may not hold ':').
ADAPTER_METRICS = {api.Metric.REQUESTS_WAITING: "vllm_num_requests_waiting",
                   api.Metric.GPU_CACHE_USAGE: "vllm_kv_cache_usage_perc"}


@dataclass(frozen=True)
class AutoscalingSpec:
    provider: str
    min_replicas: int
    max_replicas: int
    queue_depth: float
    kv_usage: float
    prometheus_address: str | None


def _number(value: Any, where: str, least: float, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not least <= value <= most:
        raise InvalidSpec(f"{where} must be a number in [{least:g}, {most:g}], got {value!r}")
    return float(value)


def _whole(value: Any, where: str, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidSpec(f"{where} must be a whole number in {least}..{most}, got {value!r}")
    return value


def parse_autoscaling(spec: Mapping[str, Any]) -> AutoscalingSpec | None:
    where = "spec.autoscaling"
    value = spec.get("autoscaling")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {value!r}"[:300])
    known_fields(value, FIELDS, where)
    provider = value.get("provider", PROVIDER_HPA)
    if provider not in PROVIDERS:
        raise InvalidSpec(f"{where}.provider must be one of {', '.join(PROVIDERS)}; got {provider!r}"[:300])
    least = _whole(value.get("minReplicas", 1), f"{where}.minReplicas", 1, MAX_REPLICAS)
    most = _whole(value.get("maxReplicas"), f"{where}.maxReplicas", 1, MAX_REPLICAS) \
        if "maxReplicas" in value else None
    if most is None:
        raise InvalidSpec(f"{where}.maxReplicas is required")
    if most < least:
        raise InvalidSpec(f"{where}.maxReplicas ({most}) is below minReplicas ({least})")
    address = value.get("prometheusAddress")
    if provider == PROVIDER_KEDA:
        if not isinstance(address, str) or not address.startswith(("http://", "https://")) or len(address) > 512 \
                or any(c.isspace() or c in "\"'`$\\" for c in address):
            raise InvalidSpec(f"{where}.prometheusAddress must be an http(s) URL of Prometheus for provider keda, "
                              f"got {address!r}"[:300])
    elif address is not None:
        raise InvalidSpec(f"{where}.prometheusAddress is KEDA's (provider keda); the HPA reads prometheus-adapter")
    return AutoscalingSpec(provider, least, most,
                           _number(value.get("queueDepthPerReplica", DEFAULT_QUEUE_DEPTH),
                                   f"{where}.queueDepthPerReplica", 0.1, 10_000),
                           _number(value.get("kvCacheUsage", DEFAULT_KV_USAGE), f"{where}.kvCacheUsage", 0.05, 1.0),
                           address)


def hostable_replicas(node_gpus: Iterable[int], tensor_parallel_size: int, replicas_per_node: int | None) -> int:
    """Replicas the eligible nodes can run at once: per node its GPUs over the tensor parallel size, or the
    spec's replicas per node where it says fewer."""
    total = 0
    for gpus in node_gpus:
        fit = gpus // max(1, tensor_parallel_size)
        total += min(fit, replicas_per_node) if replicas_per_node is not None else fit
    return total


def replica_bounds(scaling: AutoscalingSpec, hostable: int) -> tuple[int, int]:
    """(min, max) replicas: the spec's, the max no higher than the nodes host; InvalidSpec when even the
    minimum does not fit."""
    if scaling.min_replicas > hostable:
        raise InvalidSpec(f"spec.autoscaling.minReplicas {scaling.min_replicas} is more than the eligible nodes "
                          f"can host ({hostable} replicas)")
    return scaling.min_replicas, min(scaling.max_replicas, hostable)


def _quantity(value: float) -> str:
    """A Kubernetes quantity for a target: whole numbers as they are, fractions in thousandths."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def queries(namespace: str, name: str) -> dict[str, str]:
    """PromQL per signal over this ModelServer's pods: the sum over its replicas (KEDA divides by the
    threshold, the replicas it wants)."""
    pods = f'namespace="{namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
    return {"queue": f"sum({api.Metric.REQUESTS_WAITING}{{{pods}}})",
            "kv": f"sum({api.Metric.GPU_CACHE_USAGE}{{{pods}}})"}


def autoscaler(body: Mapping[str, Any], scaling: AutoscalingSpec, bounds: tuple[int, int]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    namespace = body["metadata"].get("namespace") or "default"
    least, most = bounds
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    if scaling.provider == PROVIDER_KEDA:
        found = queries(namespace, name)
        triggers = [
            {"type": "prometheus", "name": "queue", "metadata": {
                "serverAddress": scaling.prometheus_address, "query": found["queue"],
                "threshold": _quantity(scaling.queue_depth)}},
            {"type": "prometheus", "name": "kv-cache", "metadata": {
                "serverAddress": scaling.prometheus_address, "query": found["kv"],
                "threshold": _quantity(scaling.kv_usage)}},
        ]
        return {"apiVersion": KEDA_API[0], "kind": KEDA_API[1], "metadata": metadata(body),
                "spec": {"scaleTargetRef": target, "minReplicaCount": least, "maxReplicaCount": most,
                         "triggers": triggers}}
    metrics = [
        {"type": "Pods", "pods": {"metric": {"name": ADAPTER_METRICS[api.Metric.REQUESTS_WAITING]},
                                  "target": {"type": "AverageValue", "averageValue": _quantity(scaling.queue_depth)}}},
        {"type": "Pods", "pods": {"metric": {"name": ADAPTER_METRICS[api.Metric.GPU_CACHE_USAGE]},
                                  "target": {"type": "AverageValue", "averageValue": _quantity(scaling.kv_usage)}}},
    ]
    return {"apiVersion": HPA_API[0], "kind": HPA_API[1], "metadata": metadata(body),
            "spec": {"scaleTargetRef": target, "minReplicas": least, "maxReplicas": most, "metrics": metrics}}


def autoscaled(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The vLLM Deployment without spec.replicas: the autoscaler owns the count."""
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
            obj["spec"].pop("replicas", None)
    return objects


def autoscaler_keys(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of what autoscaling adds (pruned when spec.autoscaling goes)."""
    return [(*HPA_API, name), (*KEDA_API, name)]
