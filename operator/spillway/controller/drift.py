"""The fields of a vLLM Deployment the operator owns outright, and the patch that takes them back.

Server-side apply sets the fields the operator writes, but a field another manager added stays (a
`privileged: true` or a `capabilities.add` beside ours, a `hostNetwork: true` the operator never wrote), so
`holds()` alone would call such a Deployment current. These subtrees are compared whole: the vLLM container's
resources and security context, the pod's security context, the host namespaces and the /dev/shm volume.
A Deployment event whose owned fields differ from the last ones applied is a hand edit: a reconcile follows
(handlers.deployment_changed), without waiting for any other trigger.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..adapters.kube import holds
from ..core import k8s_names as names

HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


def _pod(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}


def _vllm(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((c for c in pod.get("containers") or [] if c.get("name") == names.CONTAINER_VLLM), {})


def _shm(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((v for v in pod.get("volumes") or [] if v.get("name") == names.VOLUME_SHM), {})


def owned(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The owned subtrees of a Deployment (absent ones as None; host namespaces default to false)."""
    pod = _pod(deployment)
    container = _vllm(pod)
    return {
        "resources": container.get("resources"),
        "containerSecurityContext": container.get("securityContext"),
        "podSecurityContext": pod.get("securityContext"),
        "shm": _shm(pod) or None,
        **{key: bool(pod.get(key, False)) for key in HOST_NAMESPACES},
    }


def same(live: Any, wanted: Any) -> bool:
    """Equal, quantities by value (the API server canonicalises them): each holds the other."""
    return holds(live, wanted) and holds(wanted, live)


def drifted(live: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """The owned fields in which the live Deployment differs from `want` (owned() of what was applied)."""
    have = owned(live)
    return [key for key in want if not same(have.get(key), want[key])]


def restore_patch(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch that makes the owned fields of `live` exactly `wanted`'s, or None when they are.
    A merge patch replaces lists whole, so the containers and volumes go as the live ones with ours
    replaced (a sidecar another controller injected stays)."""
    if not drifted(live, owned(wanted)):
        return None
    live_pod, want_pod = _pod(live), _pod(wanted)
    want_container, want_shm = _vllm(want_pod), _shm(want_pod)
    containers = [
        {**c, "resources": want_container.get("resources"), "securityContext": want_container.get("securityContext")}
        if c.get("name") == names.CONTAINER_VLLM else c for c in live_pod.get("containers") or []]
    volumes = [dict(want_shm) if v.get("name") == names.VOLUME_SHM else v for v in live_pod.get("volumes") or []]
    pod_context = dict(want_pod.get("securityContext") or {})
    extra = {k: None for k in (live_pod.get("securityContext") or {}) if k not in pod_context}
    pod_patch: dict[str, Any] = {"containers": containers, "volumes": volumes,
                                 "securityContext": {**extra, **pod_context},
                                 **{key: bool(want_pod.get(key, False)) for key in HOST_NAMESPACES}}
    return {"spec": {"template": {"spec": pod_patch}}}
