"""The disk tier's named volume as the API server has it.

A pod whose PersistentVolumeClaim does not exist waits, Pending, and the scheduler's event on the pod is all anyone
hears of it; the planner cannot see the claim, so the reconcile reads it before anything is applied. hostPath and
emptyDir tiers have nothing to read (the kubelet creates their directories); a generic ephemeral volume's claim is
made per pod by the kubelet. A hostPath tier is refused outside the directories the administrator allows (the
operator's setting; `spillway render`, which has no administrator, renders it).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..adapters.kube import Kube
from ..core import disk_tier as dt
from .claims import read_claim
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
    claim = read_claim(kube, namespace, name, "the disk tier's claim exists", dt.DiskVolumeNotFound)
    dt.check_claim(request, claim, namespace)
