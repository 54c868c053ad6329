"""The disk tier's part of the vLLM pod: its volume and mount, the ephemeral storage the pod requests, and the share
of replicas whose slots its engine reads."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import disk_tier as dt
from ..core import vllm_api as api
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


def share_env(body: Mapping[str, Any], result: Plan) -> list[dict[str, Any]]:
    """The engine's share (<namespace>/<name>): a replica reads the chunks its ModelServer's other replicas wrote on
    a volume they share (a claim, a node's hostPath), so one that joins or restarts starts warm; a volume another
    ModelServer also names holds its chunks under another namespace, never read across. Empty without a tier."""
    if dt.active(result.disk) is None:
        return []
    meta = body["metadata"]
    return [{"name": api.ENV_DISK_TIER_SHARE, "value": f"{meta.get('namespace') or 'default'}/{meta['name']}"}]
