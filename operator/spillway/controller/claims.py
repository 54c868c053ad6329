"""Reading a claim the plan mounts, before anything is applied (core/claims.py says why)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..adapters.kube import ApiError, Kube, path
from ..core import k8s_names as names
from ..core.claims import ClaimNotFound, check_mountable
from .spec import ModelServerSpec


def read_claim(kube: Kube, namespace: str, name: str, purpose: str,
               not_found: type[ClaimNotFound]) -> Mapping[str, Any] | None:
    """The claim, or None when there is none; `purpose` says what the operator reads it for."""
    try:
        return kube.get(path("v1", names.PVC_PLURAL, namespace, name))
    except ApiError as exc:
        if exc.status != 403:
            raise  # the API server's trouble: retried
        raise not_found(
            f"the operator may not read PersistentVolumeClaim {name} in namespace {namespace} ({exc}): it needs get "
            f"on persistentvolumeclaims there (the chart grants it) to see that {purpose}") from exc


class CompileCacheClaimNotFound(ClaimNotFound):
    """spec.compileCache's claim is not there (or lost its volume)."""

    reason = "CompileCacheClaimNotFound"


def check_compile_cache_claim(spec: ModelServerSpec, namespace: str, kube: Kube) -> None:
    """spec.compileCache's claim, mountable by every replica and writable (each publishes its snapshots there)."""
    if spec.compile_cache is None:
        return
    name = spec.compile_cache.claim_name
    claim = read_claim(kube, namespace, name, "the compile cache's claim exists", CompileCacheClaimNotFound)
    check_mountable(claim, field="spec.compileCache.claimName", name=name, namespace=namespace,
                    replicas=spec.replicas, writes="each replica publishes snapshots of its compile cache there",
                    not_found=CompileCacheClaimNotFound)
