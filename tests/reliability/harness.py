"""What the reliability tests share: the `spillway` CLI as a subprocess, and the real operator over the
emulated Kubernetes API (the operator suites' harness) with a small client for one test's namespace."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
from spillway.core import k8s_names as names
from support.ms_cluster import EmulatedCluster, Operator, eventually

__all__ = [
    "LLAMA_8B",
    "Api",
    "EmulatedCluster",
    "Operator",
    "eventually",
    "gpu_node",
    "modelserver",
    "names",
    "one_error_line",
    "render",
    "spillway",
]

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def spillway(*args: str, stdin: str | None = None, timeout: float = 120, env: dict | None = None,
             preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, check=False, env=env, preexec_fn=preexec_fn)


def one_error_line(done: subprocess.CompletedProcess, *words: str) -> str:
    """The CLI refused the input the way the project promises: exit 2 and one line on stderr."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("spillway: error: "), done.stderr[-3000:]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def modelserver(name: str = "llama", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": LLAMA_8B, **spec}}


def gpu_node(name: str, memory: str = "2Ti", gpus: int = 8, labels: dict | None = None) -> dict[str, Any]:
    allocatable = {"memory": memory, names.GPU_RESOURCE: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


def render(tmp: Path, body: dict[str, Any], *extra: str, memory: str = "2Ti", gpus: int = 8
           ) -> subprocess.CompletedProcess:
    path = tmp / f"ms-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(body))
    return spillway("render", "-f", str(path), "--node-memory", memory, "--gpus-per-node", str(gpus),
                    "-o", "json", *extra)


def rendered(done: subprocess.CompletedProcess) -> dict[str, dict[str, Any]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return {item["kind"]: item for item in json.loads(done.stdout)["items"]}


class Api:
    """The official client, one test's namespace and node pool (nodes carry a `pool` label)."""

    def __init__(self, cluster: EmulatedCluster):
        client = cluster.client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.namespace = f"r-{uuid.uuid4().hex[:8]}"
        self.pool = self.namespace

    def node(self, name: str, memory: str = "2Ti", gpus: int = 8) -> str:
        full = f"{self.pool}-{name}"
        self.core.create_node(gpu_node(full, memory, gpus, labels={"pool": self.pool}))
        return full

    def resize_node(self, name: str, memory: str) -> None:
        self.core.patch_node(name, {"status": {"capacity": {"memory": memory}, "allocatable": {"memory": memory}}})

    def modelserver(self, name: str = "llama", **spec: Any) -> dict:
        body = modelserver(name, self.namespace, **{"nodeSelector": {"pool": self.pool}, **spec})
        self.custom.create_namespaced_custom_object(names.GROUP, names.VERSION, self.namespace, names.PLURAL, body)
        return self.get(name)

    def get(self, name: str = "llama") -> dict:
        return self.custom.get_namespaced_custom_object(names.GROUP, names.VERSION, self.namespace, names.PLURAL, name)

    def condition(self, type_: str, name: str = "llama") -> dict | None:
        conditions = (self.get(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    def planned(self, name: str = "llama", status: str | None = None, reason: str | None = None,
                timeout: float = 30) -> dict:
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

    def events(self) -> list[tuple[str, str, str]]:
        listed = json.loads(self.core.list_namespaced_event(self.namespace, _preload_content=False).data)["items"]
        return [(e.get("type"), e.get("reason"), e.get("message")) for e in listed]


def memory_limit(deployment: dict) -> str:
    container, = deployment["spec"]["template"]["spec"]["containers"]
    return container["resources"]["limits"]["memory"]
