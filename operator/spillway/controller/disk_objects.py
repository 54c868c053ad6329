"""The disk tier's part of the vLLM pod: its volume and mount, and the ephemeral storage the pod requests."""
from __future__ import annotations

from typing import Any

from ..core import disk_tier as dt
from ..core.planner import Plan
from ..core.quantity import to_quantity
from .spec import ModelServerSpec

EPHEMERAL_STORAGE = "ephemeral-storage"


def ephemeral_storage(result: Plan) -> dict[str, str]:
    """{"ephemeral-storage": share} for the container's requests and limits (request = limit: the kubelet evicts a
    pod over its limit, or first under disk pressure when over its request; neither happens for the tier, which
    the evictor keeps under its sizeLimit inside the share). Empty without an emptyDir tier."""
    disk = dt.active(result.disk)
    if disk is None or disk.ephemeral_request_bytes is None:
        return {}
    return {EPHEMERAL_STORAGE: to_quantity(disk.ephemeral_request_bytes, "Mi")}


def volumes(spec: ModelServerSpec, result: Plan) -> list[dict[str, Any]]:
    disk = dt.active(result.disk)
    return [dt.volume(spec.request.offload.disk, disk)] if disk is not None else []


def mounts(result: Plan) -> list[dict[str, Any]]:
    return [dt.mount()] if dt.active(result.disk) is not None else []
