"""What keeps a vLLM pod to itself: its security contexts, the writable volumes a read-only root needs,
and the NetworkPolicy that admits only its clients.

Spillway's own image runs as a known non-root user (images/vllm/Dockerfile), so its pods meet the
Pod Security Standards' "restricted" profile. Another image's user is unknown: its pods get every
control that does not depend on it (no privilege escalation, no capabilities, RuntimeDefault seccomp).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import k8s_names as names
from ..core import vllm_api as api
from .spec import ModelServerSpec, ours

VOLUME_TMP = "tmp"
VOLUME_HOME = "home"  # caches: Hugging Face downloads, vLLM, torch compile, triton
PROMETHEUS_NAME = "prometheus"  # app.kubernetes.io/name of Prometheus pods (Prometheus Operator, kube-prometheus)


def pod_security_context() -> dict[str, Any]:
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def volume_group(hugepages_bytes: int, spec: ModelServerSpec) -> dict[str, Any]:
    """The pool's hugetlbfs volume is mounted by the kubelet as root's, mode 0755 (pagesize only, no mode), and a
    compile-cache claim is as its provisioner made it: fsGroup makes each the pod's group's and adds that group to
    every container's processes, so vLLM, whatever its user, can create the pool's file and the cache's entries there.
    OnRootMismatch: a volume already the group's (a disk tier's claim, a cache another replica wrote) is not walked."""
    if not hugepages_bytes and spec.compile_cache is None:
        return {}
    return {"fsGroup": names.VLLM_IMAGE_UID, "fsGroupChangePolicy": "OnRootMismatch"}


def host_namespaces() -> dict[str, bool]:
    """Written out, so that the operator owns them and a hand-set true is taken back (drift.py)."""
    return {"hostNetwork": False, "hostPID": False, "hostIPC": False}


def container_security_context(spec: ModelServerSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if ours(spec.image):
        out.update(runAsNonRoot=True, runAsUser=names.VLLM_IMAGE_UID, runAsGroup=names.VLLM_IMAGE_UID,
                   readOnlyRootFilesystem=True)
    return out


def writable_volumes(spec: ModelServerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) a read-only root filesystem needs: /tmp and the image user's home."""
    if not ours(spec.image):
        return [], []
    volumes = [{"name": VOLUME_TMP, "emptyDir": {}}, {"name": VOLUME_HOME, "emptyDir": {}}]
    mounts = [{"name": VOLUME_TMP, "mountPath": "/tmp"}, {"name": VOLUME_HOME, "mountPath": names.VLLM_IMAGE_HOME}]
    return volumes, mounts


def api_key_env(spec: ModelServerSpec) -> list[dict[str, Any]]:
    ref = spec.api_key_secret
    if ref is None:
        return []
    return [{"name": api.ENV_API_KEY, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def network_policy_spec(name: str, spec: ModelServerSpec, pod_selector: Mapping[str, str]) -> dict[str, Any]:
    """Ingress to the server's port from: the namespace's router and this ModelServer's load-test Jobs,
    Prometheus (any namespace), and the namespaces the spec names."""
    peers: list[dict[str, Any]] = [
        {"podSelector": {"matchLabels": {names.LABEL_ROLE: names.ROLE_ROUTER}}},
        {"podSelector": {"matchLabels": {names.LABEL_COMPONENT: names.COMPONENT_LOADTEST,
                                         names.LABEL_MODELSERVER: name}}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {names.LABEL_NAME: PROMETHEUS_NAME}}},
    ]
    if spec.client_namespaces is not None:
        peers.append({"namespaceSelector": dict(spec.client_namespaces)})
    return {
        "podSelector": {"matchLabels": dict(pod_selector)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": peers, "ports": [{"port": api.SERVER_PORT, "protocol": "TCP"}]}],
    }
