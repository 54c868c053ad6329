"""The disk tier's named volume as the API server has it.

A pod whose PersistentVolumeClaim does not exist waits, Pending, and the scheduler's event on the pod is all anyone
hears of it; the planner cannot see the claim, so the reconcile reads it before anything is applied. hostPath and
emptyDir tiers have nothing to read (the kubelet creates their directories); a generic ephemeral volume's claim is
made per pod by the kubelet. A hostPath tier is refused outside the directories the administrator allows (the
operator's setting; `spillway render`, which has no administrator, renders it).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..adapters.kube import ApiError, Kube, path
from ..core import disk_tier as dt
from ..core import k8s_names as names
from .manifests import Desired


def check_disk_volume(result: Desired, namespace: str, kube: Kube, host_path_prefixes: Sequence[str] = ()) -> None:
    """Raises DiskVolumeNotFound (retried), DiskTierDoesNotFit or InvalidSpec when the rendered tier's claim
    cannot carry it, DiskHostPathNotAllowed for a hostPath outside `host_path_prefixes` (the operator's
    setting: none by default); nothing when the plan renders no PVC tier."""
    request = result.spec.request.offload.disk
    if request.enabled:
        dt.check_host_path_allowed(request.volume, host_path_prefixes)
    if dt.active(result.plan.disk) is None or request.volume.kind != dt.PVC:
        return
    name = request.volume.claim_name
    try:
        claim = kube.get(path("v1", names.PVC_PLURAL, namespace, name))
    except ApiError as exc:
        if exc.status != 403:
            raise  # the API server's trouble: retried
        raise dt.DiskVolumeNotFound(
            f"the operator may not read PersistentVolumeClaim {name} in namespace {namespace} ({exc}): it needs get "
            "on persistentvolumeclaims there (the chart grants it) to see that the disk tier's claim exists") from exc
    dt.check_claim(request, claim, namespace)
