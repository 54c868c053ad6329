"""Status conditions following the Kubernetes API conventions (type, status, reason, message,
observedGeneration, lastTransitionTime), kept in a fixed order."""
from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from ..core import k8s_names as names
from ..core.errors import PoolDoesNotFit

PLANNED, READY, DEGRADED = "Planned", "Ready", "Degraded"
ORDER = (PLANNED, READY, DEGRADED)

# Reasons written by the operator besides SpillwayError.reason (InvalidSpec, ModelGeometryUnknown, ...).
REASON_PLANNED = "Planned"
REASON_REPLICAS_READY = "ReplicasReady"
REASON_REPLICAS_NOT_READY = "ReplicasNotReady"
REASON_NOT_DEPLOYED = "NotDeployed"
REASON_AS_EXPECTED = "AsExpected"
REASON_ROLLOUT_FAILED = "RolloutFailed"
REASON_SCALED_TO_ZERO = "ScaledToZero"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge(existing: Iterable[Mapping[str, Any]] | None, updates: Iterable[Mapping[str, Any]],
          timestamp: str | None = None) -> list[dict[str, Any]]:
    """Existing conditions with `updates` applied; lastTransitionTime moves only when status changes."""
    timestamp = timestamp or now()
    by_type = {c.get("type"): dict(c) for c in (existing or []) if isinstance(c, Mapping)}
    for update in updates:
        old = by_type.get(update["type"])
        new = dict(update)
        if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
            new["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            new["lastTransitionTime"] = timestamp
        by_type[new["type"]] = new
    ordered = [by_type.pop(t) for t in ORDER if t in by_type]
    return ordered + [by_type[t] for t in sorted(by_type, key=str)]


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == type_), None)


def ready_condition(deployment: Mapping[str, Any] | None, generation: int | None) -> dict[str, Any]:
    """Ready from the Deployment's status: every wanted replica passes its readiness probe."""
    if deployment is None:
        return condition(READY, False, REASON_NOT_DEPLOYED, "no Deployment has been applied", generation)
    wanted = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    if wanted == 0:
        return condition(READY, False, REASON_SCALED_TO_ZERO, "replicas is 0", generation)
    reason = REASON_REPLICAS_READY if ready >= wanted else REASON_REPLICAS_NOT_READY
    return condition(READY, ready >= wanted, reason, f"{ready} of {wanted} replicas ready", generation)


def _scaled_to_zero(planned: Mapping[str, Any], deployment: Mapping[str, Any] | None, generation: int | None) -> bool:
    """The operator scaled this generation's own Deployment to 0: its plan stopped fitting the nodes."""
    meta = (deployment or {}).get("metadata") or {}
    applied = (meta.get("annotations") or {}).get(names.ANNOTATION_PLANNED_GENERATION)
    replicas = ((deployment or {}).get("spec") or {}).get("replicas")
    return (planned.get("reason") == PoolDoesNotFit.reason and replicas == 0 and generation is not None
            and applied == str(generation))


def rollout_failure(deployment: Mapping[str, Any] | None) -> str | None:
    for c in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if ((c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded")
                or (c.get("type") == "ReplicaFailure" and c.get("status") == "True")):
            return f"Deployment {c.get('type')}: {c.get('message') or c.get('reason')}"
    return None


def degraded_condition(planned: Mapping[str, Any] | None, deployment: Mapping[str, Any] | None,
                       generation: int | None) -> dict[str, Any]:
    """Degraded: the last plan failed (its reason), or the Deployment cannot roll out."""
    if planned is not None and planned.get("status") == "False":
        running = ("the last applied plan keeps running" if deployment is not None else "nothing is deployed")
        if _scaled_to_zero(planned, deployment, generation):
            running = "the nodes no longer fit the applied plan: its Deployment is scaled to 0 until they do"
        return condition(DEGRADED, True, str(planned.get("reason")), f"{planned.get('message')} ({running})",
                         generation)
    failure = rollout_failure(deployment)
    if failure is not None:
        return condition(DEGRADED, True, REASON_ROLLOUT_FAILED, failure, generation)
    return condition(DEGRADED, False, REASON_AS_EXPECTED, "planned and applied", generation)


def ready_counts(deployment: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.replicas (pods that exist, for the scale subresource), readyReplicas and "ready/wanted"."""
    if deployment is None:
        return {"replicas": 0, "readyReplicas": 0, "ready": "0/0"}
    wanted = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    status = deployment.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    return {"replicas": int(status.get("replicas") or 0), "readyReplicas": ready, "ready": f"{ready}/{wanted}"}
