"""What the operator writes into ModelServer.status: the plan's figures and one-line error messages."""
from __future__ import annotations

from typing import Any

from ..core.errors import SpillwayError
from ..core.quantity import to_quantity
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
    }
    if result.node.dma_gbps is not None:
        out["qualifiedDmaGBps"] = result.node.dma_gbps
    return out


def error_line(exc: SpillwayError) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
