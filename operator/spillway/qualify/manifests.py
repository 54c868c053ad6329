"""Kubernetes objects that run `spillway qualify` on GPU nodes and let it patch its own Node.

DaemonSet: schedules on every GPU node that lacks the `qualified` label. The pod measures, patches its
Node (annotations + label) and waits; the new label takes the node out of the DaemonSet's affinity, so
the controller removes the pod and its GPU is free again. Deleting the label re-qualifies the node.
Job: one run on a named node (after a driver update, say), whatever its label says.
"""
from __future__ import annotations

from typing import Any

from ..core import k8s_names as names
from ..core.quantity import GiB, MiB, to_quantity
from .measure import MiB as _MiB
from .measure import pool_bytes

COMPONENT = "qualify"
NAME = "spillway-qualify"
DEFAULT_NAMESPACE = "spillway-system"
DEFAULT_GPU_NODE_LABEL = "nvidia.com/gpu.present=true"  # set by NVIDIA GPU feature discovery
# Up to the annotated copy size (PLAN_BLOCK_BYTES, 8 MiB): 8000 MiB of pinned memory at most.
RENDER_BLOCK_SIZES = (64 * 1024, 256 * 1024, 1 * _MiB, 2 * _MiB, 4 * _MiB, 8 * _MiB)
PROCESS_MEMORY = 6 * GiB  # torch, the CUDA context, vLLM's import
SHM_SLACK = 64 * MiB


def _labels() -> dict[str, str]:
    return {names.LABEL_NAME: names.APP_NAME, names.LABEL_COMPONENT: COMPONENT}


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**_labels(), names.LABEL_MANAGED_BY: "spillway-qualify"}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def rbac(namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount + ClusterRole (get/patch nodes) + binding."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, namespace)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(NAME),
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(NAME),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
    ]


def qualify_args(block_sizes: list[int], host_memory: str, repeats: int, hold: bool) -> list[str]:
    args = ["python3", "-m", "spillway.qualify",
            "--block-sizes", ",".join(to_quantity(b, "Ki") for b in block_sizes),
            "--host-memory", host_memory, "--repeats", str(repeats),
            "--annotate-node", "$(NODE_NAME)", "--json", "/tmp/qualification.json"]
    return args + (["--hold"] if hold else [])


def pod_spec(image: str, block_sizes: list[int], host_memory: str, repeats: int, hold: bool) -> dict[str, Any]:
    host = pool_bytes(block_sizes)
    shm = host + SHM_SLACK if host_memory == "shm" else SHM_SLACK
    memory = to_quantity(host + (shm if host_memory == "shm" else 0) + PROCESS_MEMORY, "Mi")
    container = {
        "name": COMPONENT,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": qualify_args(block_sizes, host_memory, repeats, hold),
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "HOME", "value": "/tmp"},
            {"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": {
            "requests": {"cpu": "2", "memory": memory, names.GPU_RESOURCE: "1"},
            "limits": {"memory": memory, names.GPU_RESOURCE: "1"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    return {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": True,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "tolerations": [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": to_quantity(shm, "Mi")}},
        ],
    }


def _split_label(label: str) -> tuple[str, str]:
    key, sep, value = label.partition("=")
    if not sep or not key:
        from ..core.errors import InvalidSpec

        raise InvalidSpec(f"--gpu-node-label must be KEY=VALUE, got {label!r}")
    return key, value


def daemonset(namespace: str, image: str, block_sizes: list[int], host_memory: str, repeats: int,
              gpu_node_label: str = DEFAULT_GPU_NODE_LABEL) -> list[dict[str, Any]]:
    key, value = _split_label(gpu_node_label)
    spec = pod_spec(image, block_sizes, host_memory, repeats, hold=True)
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]},
            {"key": names.LABEL_QUALIFIED, "operator": "DoesNotExist"},
        ]}
    ]}}}
    ds = {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(NAME, namespace),
        "spec": {
            "selector": {"matchLabels": _labels()},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": _labels()}, "spec": spec},
        },
    }
    return rbac(namespace) + [ds]


def job(namespace: str, image: str, node: str, block_sizes: list[int], host_memory: str,
        repeats: int) -> list[dict[str, Any]]:
    spec = pod_spec(image, block_sizes, host_memory, repeats, hold=False)
    spec["restartPolicy"] = "Never"
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    name = f"{NAME}-{node}"[:63].rstrip("-.")
    jb = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace),
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": 1800,
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": _labels()}, "spec": spec},
        },
    }
    return rbac(namespace) + [jb]
