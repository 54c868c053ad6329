"""A PersistentVolumeClaim the pods would mount, against the claim as the API server has it.

A pod whose claim is missing, lost, read-only or one pod's waits Pending or ContainerCreating, and the scheduler's
event on the pod is all anyone hears of it; the planner cannot see claims, so the operator reads each one the plan
mounts before it applies anything, and these checks say on the ModelServer what would go wrong.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import k8s_names as names
from .errors import InvalidSpec, SpillwayError


class ClaimNotFound(SpillwayError):
    """The claim is not there (or lost its volume): the pods would wait for it with no word on the resource. The
    operator looks again after its retry delay, so a claim created later is found. Each claim's own subclass
    carries the reason, which names what the claim is for."""


def check_mountable(claim: Mapping[str, Any] | None, *, field: str, name: str, namespace: str, replicas: int,
                    writes: str, not_found: type[ClaimNotFound]) -> None:
    """`field` names the spec field that names the claim; `writes` says what the pods write there."""
    if claim is None:
        raise not_found(f"{field} {name}: there is no PersistentVolumeClaim {name} in namespace {namespace}, so the "
                        "pods would stay Pending; create it (the operator looks again) or name another")
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    if status.get("phase") == names.CLAIM_PHASE_LOST:
        raise not_found(f"{field} {name}: the claim lost its PersistentVolume (phase {names.CLAIM_PHASE_LOST}), "
                        "so the pods cannot mount it")
    modes = set(spec.get("accessModes") or [])
    if modes and modes <= {names.ACCESS_READ_ONLY_MANY}:
        raise InvalidSpec(f"{field} {name} is {names.ACCESS_READ_ONLY_MANY}: {writes}")
    if modes == {names.ACCESS_READ_WRITE_ONCE_POD} and replicas > 1:
        raise InvalidSpec(f"{field} {name} is {names.ACCESS_READ_WRITE_ONCE_POD}: one pod may mount it, but all "
                          f"{replicas} replicas share the claim")
