"""status.routing and the Routed condition: is the endpoint routing, over how many replicas.

A router that is down or a replica that is gone is a condition, never an error the operator retries: the
router pod's own readiness says whether requests get through, and `spillway route` follows the ready pods.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import routing
from . import conditions as cond
from .routing_objects import router_name, routing_warnings
from .spec import ModelServerSpec

ROUTED = "Routed"
REASON_ROUTER_READY = "RouterReady"
REASON_ROUTER_NOT_READY = "RouterNotReady"
REASON_SINGLE_REPLICA = "SingleReplica"
REASON_POOL_APPLIED = "InferencePoolApplied"
REASON_NOT_ROUTED = "NotRouted"
REASON_PRUNE_FORBIDDEN = "PruneForbidden"


def _ready(deployment: Mapping[str, Any] | None) -> tuple[int, int]:
    """(ready, wanted) pods of a Deployment; (0, 0) when there is none."""
    if deployment is None:
        return 0, 0
    wanted = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    return int((deployment.get("status") or {}).get("readyReplicas") or 0), wanted


def routing_status(name: str, namespace: str, spec: ModelServerSpec, vllm: Mapping[str, Any] | None,
                   router: Mapping[str, Any] | None, generation: int | None,
                   credit: float | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(status.routing, the Routed condition or None for an unrouted ModelServer)."""
    mode = spec.routing.mode
    status: dict[str, Any] = {"mode": mode, "endpoint": f"{name}.{namespace}.svc"}
    if mode == routing.MODE_NONE:
        return status, None
    replicas_ready, replicas = _ready(vllm)
    status["replicasPublishing"] = replicas_ready
    warnings = routing_warnings(spec)
    if replicas_ready < replicas:
        warnings.append(f"{replicas_ready} of {replicas} replicas ready: requests go to the ready ones")
    status["warnings"] = warnings
    if mode == routing.MODE_KV_AWARE:
        ready, wanted = _ready(router)
        status["routerReady"] = f"{ready}/{wanted}"
        if router is None or ready < wanted or wanted == 0:
            return status, cond.condition(
                ROUTED, False, REASON_ROUTER_NOT_READY,
                f"{ready} of {wanted} router pods of Deployment {router_name(name)} ready: requests to Service "
                f"{name} wait for one (it needs a ready vLLM replica; `kubectl logs deploy/{router_name(name)}`)",
                generation)
    else:
        status["endpoint"] = f"InferencePool {name} (llm-d-router: ConfigMap {name}-epp)"
        if credit is not None:
            status["hostTierCredit"] = credit  # the weight of llm-d's CPU tier
    if spec.replicas <= 1:
        return status, cond.condition(ROUTED, False, REASON_SINGLE_REPLICA, warnings[0], generation)
    reason = REASON_ROUTER_READY if mode == routing.MODE_KV_AWARE else REASON_POOL_APPLIED
    return status, cond.condition(ROUTED, True, reason,
                                  f"{mode} routing over {replicas_ready} of {replicas} ready replicas", generation)
