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
- provider auto (the default): keda where the API server serves KEDA's ScaledObjects (discovery, asked by the
  operator) and a ScaledObject can be made (a prometheusAddress, a name KEDA accepts), else hpa; choose() says
  which and why, for the Autoscaled condition.

With autoscaling on, the Deployment is rendered without spec.replicas, so the autoscaler owns the count and
the operator's apply never resets it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core import vllm_api as api
from ..core.errors import InvalidSpec
from . import conditions as cond
from .objects import metadata
from .spec_checks import known_fields

PROVIDER_AUTO = "auto"
PROVIDER_HPA = "hpa"
PROVIDER_KEDA = "keda"
PROVIDERS = (PROVIDER_AUTO, PROVIDER_HPA, PROVIDER_KEDA)
FIELDS = frozenset({"provider", "minReplicas", "maxReplicas", "queueDepthPerReplica", "kvCacheUsage",
                    "prometheusAddress"})
MAX_REPLICAS = 1000
DEFAULT_QUEUE_DEPTH = 4  # waiting requests per replica: a few queued behind a full batch
DEFAULT_KV_USAGE = 0.9  # past 90% of the GPU's KV blocks the engine starts preempting
HPA_API = ("autoscaling/v2", "HorizontalPodAutoscaler")
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
KEDA_API = (f"{KEDA_GROUP}/{KEDA_VERSION}", "ScaledObject")
# KEDA names the HPA it makes keda-hpa-<ScaledObject> and its admission webhook refuses a ScaledObject whose
# HPA name passes a label value's 63 characters (apis/keda/v1alpha1/scaledobject_webhook.go, verifyName).
KEDA_HPA_PREFIX = "keda-hpa-"
KEDA_MAX_NAME = 63 - len(KEDA_HPA_PREFIX)
AUTOSCALER_KINDS = (HPA_API[1], KEDA_API[1])
# prometheus-adapter's names for the two series (a custom-metrics name may not hold ':').
ADAPTER_METRICS = {api.Metric.REQUESTS_WAITING: "vllm_num_requests_waiting",
                   api.Metric.GPU_CACHE_USAGE: "vllm_kv_cache_usage_perc"}


AUTOSCALED = "Autoscaled"  # the condition: which autoscaler was rendered, and why
REASON_HPA_CHOSEN = "HPAChosen"  # provider hpa
REASON_KEDA_CHOSEN = "KEDAChosen"  # provider keda, KEDA served
REASON_KEDA_MISSING = "KEDAMissing"  # provider keda, KEDA not served: nothing rendered
REASON_KEDA_SERVED = "KEDAServed"  # auto: KEDA served
REASON_KEDA_NOT_SERVED = "KEDANotServed"  # auto: KEDA not served, an HPA
REASON_NO_PROMETHEUS_ADDRESS = "NoPrometheusAddress"  # auto: KEDA served, no address for its triggers, an HPA
REASON_NAME_TOO_LONG_FOR_KEDA = "NameTooLongForKEDA"  # auto: KEDA served, would refuse the name, an HPA
REASON_NOT_AUTOSCALED = "NotAutoscaled"  # spec.autoscaling removed (the condition stays, saying so)


@dataclass(frozen=True)
class Choice:
    """The autoscaler rendered (provider None: none) and the Autoscaled condition's status, reason and why."""

    provider: str | None
    ok: bool
    reason: str
    message: str


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
    provider = value.get("provider", PROVIDER_AUTO)
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
    if provider == PROVIDER_HPA and address is not None:
        raise InvalidSpec(f"{where}.prometheusAddress is KEDA's (provider keda or auto); the HPA reads "
                          "prometheus-adapter")
    if (provider == PROVIDER_KEDA or address is not None) and (
            not isinstance(address, str) or not address.startswith(("http://", "https://")) or len(address) > 512
            or any(c.isspace() or c in "\"'`$\\" for c in address)):
        raise InvalidSpec(f"{where}.prometheusAddress must be an http(s) URL of Prometheus for provider keda, "
                          f"got {address!r}"[:300])
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


def choose(scaling: AutoscalingSpec, name: str, keda_served: Callable[[], bool] | None) -> Choice:
    """Which autoscaler spec.autoscaling gets: the provider it names, else (auto) KEDA's ScaledObject where
    the API server serves them and one can be made, else an HPA. keda_served asks the API server's discovery
    (None: there is none to ask, as in `spillway render`; KEDA counts as not served)."""
    hpa = f"HorizontalPodAutoscaler {name} through prometheus-adapter"
    keda = f"ScaledObject {name} querying {scaling.prometheus_address}"
    missing = f"the API server serves no {KEDA_GROUP}/{KEDA_VERSION} {KEDA_PLURAL}"
    if scaling.provider == PROVIDER_HPA:
        return Choice(PROVIDER_HPA, True, REASON_HPA_CHOSEN, f"spec.autoscaling.provider is hpa: {hpa}")
    too_long = len(name) > KEDA_MAX_NAME
    if scaling.provider == PROVIDER_KEDA and too_long:
        raise InvalidSpec(f"spec.autoscaling.provider keda: KEDA refuses a ScaledObject named {name!r} "
                          f"({len(name)} characters): its HPA {KEDA_HPA_PREFIX}{name} would pass 63; use a "
                          f"name of at most {KEDA_MAX_NAME} characters, or provider hpa")
    served = keda_served() if keda_served is not None else False
    if scaling.provider == PROVIDER_KEDA:
        if not served:
            return Choice(None, False, REASON_KEDA_MISSING,
                          f"spec.autoscaling.provider is keda, but {missing}: nothing scales the replicas "
                          "(install KEDA, or set provider auto or hpa)")
        return Choice(PROVIDER_KEDA, True, REASON_KEDA_CHOSEN, f"spec.autoscaling.provider is keda: {keda}")
    if not served:
        return Choice(PROVIDER_HPA, True, REASON_KEDA_NOT_SERVED, f"{missing} (KEDA is not installed): {hpa}")
    if scaling.prometheus_address is None:
        return Choice(PROVIDER_HPA, True, REASON_NO_PROMETHEUS_ADDRESS,
                      "KEDA is served, but spec.autoscaling.prometheusAddress (the Prometheus its triggers query) "
                      f"is not set: {hpa}")
    if too_long:
        return Choice(PROVIDER_HPA, True, REASON_NAME_TOO_LONG_FOR_KEDA,
                      f"KEDA is served, but refuses a ScaledObject named {name!r}: its HPA {KEDA_HPA_PREFIX}{name} "
                      f"would pass 63 characters: {hpa}")
    return Choice(PROVIDER_KEDA, True, REASON_KEDA_SERVED, f"the API server serves KEDA's ScaledObjects: {keda}")


def condition(choice: Choice | None, autoscaled_before: bool, generation: int | None) -> dict[str, Any] | None:
    """The Autoscaled condition: the choice; once spec.autoscaling goes, NotAutoscaled (None: never autoscaled)."""
    if choice is not None:
        return cond.condition(AUTOSCALED, choice.ok, choice.reason, choice.message, generation)
    if autoscaled_before:
        return cond.condition(AUTOSCALED, False, REASON_NOT_AUTOSCALED, "spec.autoscaling is not set: the "
                              "Deployment's spec.replicas is the count", generation)
    return None


def _quantity(value: float) -> str:
    """A Kubernetes quantity for a target: whole numbers as they are, fractions in thousandths."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _decimal(value: float) -> str:
    """A KEDA threshold: a plain decimal, as its typed config decodes a float64 (json.Unmarshal, so no
    quantity suffix: "850m" is refused)."""
    return str(int(value)) if value == int(value) else repr(round(value, 6))


def queries(namespace: str, name: str) -> dict[str, str]:
    """PromQL per signal over this ModelServer's pods: the sum over its replicas (KEDA divides by the
    threshold, the replicas it wants)."""
    pods = f'namespace="{namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
    return {"queue": f"sum({api.Metric.REQUESTS_WAITING}{{{pods}}})",
            "kv": f"sum({api.Metric.GPU_CACHE_USAGE}{{{pods}}})"}


def autoscaler(body: Mapping[str, Any], scaling: AutoscalingSpec, bounds: tuple[int, int],
               provider: str) -> dict[str, Any]:
    """The autoscaler of `provider` (hpa or keda: choose()'s)."""
    name = body["metadata"]["name"]
    namespace = body["metadata"].get("namespace") or "default"
    least, most = bounds
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    if provider == PROVIDER_KEDA:
        found = queries(namespace, name)
        triggers = [
            {"type": "prometheus", "name": "queue", "metadata": {
                "serverAddress": scaling.prometheus_address, "query": found["queue"],
                "threshold": _decimal(scaling.queue_depth)}},
            {"type": "prometheus", "name": "kv-cache", "metadata": {
                "serverAddress": scaling.prometheus_address, "query": found["kv"],
                "threshold": _decimal(scaling.kv_usage)}},
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


def displaced(objects: Iterable[Mapping[str, Any]], name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the operator's own HPA when a ScaledObject is wanted: it goes before the
    ScaledObject is applied, as KEDA's admission webhook refuses a ScaledObject on a Deployment another HPA
    already scales (verifyHpas), and the prune would only come after the apply."""
    wanted = any(o["kind"] == KEDA_API[1] and o["metadata"]["name"] == name for o in objects)
    return [(*HPA_API, name)] if wanted else []


def autoscaler_keys(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of what autoscaling adds (pruned when spec.autoscaling goes)."""
    return [(*HPA_API, name), (*KEDA_API, name)]
