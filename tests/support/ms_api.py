"""The official Kubernetes client scoped to one test: its own namespace and node pool (nodes carry a `pool`
label, ModelServers select it), so the tests of a module share one emulated cluster without seeing each other."""
from __future__ import annotations

import json
import uuid
from typing import Any

import kubernetes
from spillway.core import k8s_names as names

from support.ms_cluster import EmulatedCluster, eventually
from support.ms_examples import gpu_node, modelserver


class Api:
    def __init__(self, cluster: EmulatedCluster):
        client = cluster.client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.namespace = f"t-{uuid.uuid4().hex[:8]}"
        self.pool = self.namespace  # kmock serves any namespace without a Namespace object (it cannot POST one)

    def node(self, name: str, memory: str = "2Ti", gpus: int = 8, **kw) -> dict:
        body = gpu_node(f"{self.pool}-{name}", memory, gpus, labels={"pool": self.pool}, **kw)
        self.core.create_node(body)
        return body

    def resize_node(self, name: str, memory: str) -> None:
        self.core.patch_node(name, {"status": {"capacity": {"memory": memory}, "allocatable": {"memory": memory}}})

    def modelserver(self, name: str = "llama", **spec: Any) -> dict:
        body = modelserver(name, self.namespace, **{"nodeSelector": {"pool": self.pool}, **spec})
        self.custom.create_namespaced_custom_object(names.GROUP, names.VERSION, self.namespace, names.PLURAL, body)
        return self.get(name)

    def get(self, name: str = "llama") -> dict:
        return self.custom.get_namespaced_custom_object(names.GROUP, names.VERSION, self.namespace, names.PLURAL, name)

    def patch(self, patch: dict, name: str = "llama") -> dict:
        return self.custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, self.namespace, names.PLURAL,
                                                         name, patch, _content_type="application/merge-patch+json")

    def condition(self, type_: str, name: str = "llama") -> dict | None:
        conditions = (self.get(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    def planned(self, name: str = "llama", status: str | None = None, reason: str | None = None,
                timeout: float = 60) -> dict:  # eventually's bound (support/ms_cluster.py says why)
        def check():
            found = self.condition("Planned", name)
            if found and (status is None or found["status"] == status) and (reason is None or found["reason"] == reason):
                return found
            return None
        return eventually(check, timeout=timeout, what=f"{name} Planned={status} {reason}")

    def _read(self, call, *args) -> dict | None:
        try:
            return json.loads(call(*args, _preload_content=False).data)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def deployment(self, name: str = "llama") -> dict | None:
        return self._read(self.apps.read_namespaced_deployment, name, self.namespace)

    def service(self, name: str = "llama") -> dict | None:
        return self._read(self.core.read_namespaced_service, name, self.namespace)

    def deployments(self) -> list[dict]:
        return json.loads(self.apps.list_namespaced_deployment(self.namespace, _preload_content=False).data)["items"]

    def services(self) -> list[dict]:
        return json.loads(self.core.list_namespaced_service(self.namespace, _preload_content=False).data)["items"]

    def events(self) -> list[tuple[str, str, str]]:
        listed = json.loads(self.core.list_namespaced_event(self.namespace, _preload_content=False).data)["items"]
        return [(e.get("type"), e.get("reason"), e.get("message")) for e in listed]
