"""What the operator writes into ModelServer.status: the plan's figures and one-line error messages."""
from __future__ import annotations

from typing import Any

from ..core.disk_tier import DiskTierPlan
from ..core.errors import SpillwayError
from ..core.quantity import GiB, to_quantity
from .manifests import Desired


def status_plan(result: Desired) -> dict[str, Any]:
    """The plan as ModelServer.status.plan (what `kubectl get ms` shows)."""
    p, pool, pod = result.plan, result.plan.pool, result.plan.pod
    assert pod is not None and p.node is not None
    out: dict[str, Any] = {
        "offloadBytes": pool.bytes if pool else 0,
        "offloadGiB": round(pool.gib, 2) if pool else 0,
        "blockBytes": p.layout.block_bytes,
        "cpuBlocks": pool.blocks if pool else 0,
        "cachedTokens": pool.tokens if pool else 0,
        "memoryLimit": to_quantity(pod.memory_limit_bytes, "Mi"),
        "shmSize": to_quantity(pod.shm_bytes, "Mi"),
        "plannedNode": result.node.name,
        "eligibleNodes": len(result.eligible),
        "replicasPerNode": p.node.replicas_per_node,
        "warnings": list(p.warnings),
        # None removes a stale line from the merged status when the plan has no pool
        "poolPages": p.pages.why if p.pages is not None else None,
    }
    if result.node.dma_gbps is not None:
        out["qualifiedDmaGBps"] = result.node.dma_gbps
    if p.disk is not None:
        out["disk"] = disk_plan(p.disk)
    return out


def disk_plan(disk: DiskTierPlan) -> dict[str, Any]:
    """status.plan.disk: the tier's size and volume, whether it is rendered, and the figures that decided it.

    Every key is always written (None where a figure is unknown): the status is one merge patch, which keeps a
    nested key it does not name, so a figure the new plan lacks must be named to be removed."""
    return {
        "volume": disk.volume,
        "requested": disk.requested,
        "tierBytes": disk.tier_bytes,
        "tierGiB": round(disk.tier_bytes / GiB, 2),
        "boundBytes": disk.bound_bytes,
        "chunks": disk.chunks,
        "cachedTokens": disk.tokens,
        "shareBytes": disk.share_bytes,
        "ephemeralStorage": (to_quantity(disk.ephemeral_request_bytes, "Mi")
                             if disk.ephemeral_request_bytes is not None else None),
        "rendered": disk.active,
        # "Unknown": the node's disk read rate (or the model's prefill rate) is not known; the tier runs as asked
        "pays": {True: "True", False: "False", None: "Unknown"}[disk.pays],
        "qualifiedDiskReadGBps": disk.read_gbps,
        "breakEvenGBps": round(disk.break_even_gbps, 3) if disk.break_even_gbps is not None else None,
        "sizing": disk.why,
        "verdict": disk.verdict,
        # the pool-to-GPU rate the break-even counts: the node's qualified rate, else DEFAULT_RELOAD_GBPS
        "reloadGBps": disk.reload_gbps,
        # the eligible node classes (ephemeral storage, disk rate, ...) and which of them sized and decided the tier
        "nodeClasses": disk.node_classes,
        "sizedFor": disk.sized_for or None,
        "decidedBy": disk.decided_by or None,
    }


def error_line(exc: SpillwayError) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
