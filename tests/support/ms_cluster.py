"""An emulated Kubernetes API (kmock) on a real HTTP port, and the operator as a real `kopf run` process.

kmock keeps objects and serves list/watch/get/create/patch/delete; it has no uid, resourceVersion,
defaulting, validation or garbage collection, so the tests set uids themselves and check owner
references rather than collection. Known gaps worked around here: /api/v1/namespaces answers 500
unless namespaces are declared; List responses lack kind; /version/ is 404 (kopf asks /version).
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import attrs
import kmock
from spillway.controller import autoscaling
from spillway.core import k8s_names as names

from support.kube_api import EmulatedApi

REPO = Path(__file__).resolve().parents[2]
KOPF = Path(sys.executable).with_name("kopf")

CORE = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/nodes": {"kind": "Node", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/persistentvolumeclaims": {"kind": "PersistentVolumeClaim", "namespaced": True},  # spec.offload.disk
    "v1/services": {"kind": "Service", "namespaced": True},
    "networking.k8s.io/v1/networkpolicies": {"kind": "NetworkPolicy", "namespaced": True},
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True, "subresources": {"status", "scale"}},
    # spec.routing: the kv-aware router's account and binding, llm-d's InferencePool
    "v1/serviceaccounts": {"kind": "ServiceAccount", "namespaced": True},
    "rbac.authorization.k8s.io/v1/rolebindings": {"kind": "RoleBinding", "namespaced": True},
    "inference.networking.k8s.io/v1/inferencepools": {"kind": "InferencePool", "namespaced": True},
    f"{names.API_VERSION}/{names.PLURAL}": {"kind": names.KIND, "namespaced": True, "singular": "modelserver",
                                            "shortnames": {names.SHORT_NAME}, "subresources": {"status", "scale"}},
}
POD_MONITORS = {f"{names.PODMONITOR_GROUP}/{names.PODMONITOR_VERSION}/{names.PODMONITOR_PLURAL}":
                {"kind": names.PODMONITOR_KIND, "namespaced": True}}
# spec.autoscaling: the HPA, and KEDA's ScaledObject, whose discovery makes provider auto choose KEDA
AUTOSCALERS = {f"{autoscaling.HPA_API[0]}/horizontalpodautoscalers": {"kind": autoscaling.HPA_API[1], "namespaced": True},
               f"{autoscaling.KEDA_API[0]}/{autoscaling.KEDA_PLURAL}": {"kind": autoscaling.KEDA_API[1],
                                                                       "namespaced": True}}


@attrs.define(kw_only=True)
class Apiserver(kmock.KubernetesEmulator):
    """kmock's emulator plus what the API server itself stamps on objects: uid, generateName, generation
    (bumped by spec changes), resourceVersion and creationTimestamp. kopf relies on resourceVersion to
    tell its own patches from others'."""

    _version: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    # kmock matches each request against its reactions by scanning every request it has recorded, so a long
    # busy run slows quadratically; a cluster that never counts old requests may keep only the latest.
    keep_requests: int | None = None

    async def _handle(self, request: kmock.Request):
        data = request.data if isinstance(request.data, dict) else None
        if request.resource is not None and data is not None:
            meta = data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                meta["generation"] = 1
                meta["resourceVersion"] = str(next(self._version))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                meta["resourceVersion"] = str(next(self._version))
                if request.subresource is None and "spec" in data:
                    key = (request.resource, request.namespace, request.name)
                    current = self._objects[key] if key in self._objects and not self._objects[key].deleted else {}
                    if current and data["spec"] != current.get("spec"):
                        meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1
        if self.keep_requests is not None and len(self._requests) > 2 * self.keep_requests:
            del self._requests[:-self.keep_requests]
        return await super()._handle(request)


class EmulatedCluster(EmulatedApi):
    """The Kubernetes API the operator talks to: core resources, ModelServers and optionally PodMonitors."""

    def __init__(self, tmp: Path, pod_monitors: bool = False, keep_requests: int | None = None,
                 autoscalers: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__(tmp, dict(CORE, **(POD_MONITORS if pod_monitors else {}), **(autoscalers or {})))
        self._keep_requests = keep_requests

    def new_emulator(self) -> kmock.KubernetesEmulator:
        return Apiserver(keep_requests=self._keep_requests)

    def requests(self, method: str, path_part: str) -> int:
        """How many requests with this method whose path contains path_part the emulator has served."""
        return self.call(lambda: sum(1 for r in self.emulator if r.method == method and path_part in str(r.url.path)))


class Operator:
    """`kopf run` of spillway.controller.handlers against a kubeconfig, in its own process group."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None):
        self.kubeconfig, self.log, self.env = kubeconfig, log, env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> Self:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("HF_TOKEN", None)
        self.process = subprocess.Popen(
            [str(KOPF), "run", "--standalone", "--all-namespaces", "--verbose", "-m", "spillway.controller.handlers"],
            cwd=REPO, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def eventually(check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll check() until it returns a truthy value; fail with the last value or exception.

    The timeout bounds a wait, it measures nothing: a passing check returns as soon as it holds. 60 s, since
    the suite runs on four workers on two cores (the Makefile), where an operator's reconcile can take ten
    times what it takes alone."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except AssertionError as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last {last!r}")


def new_uid() -> str:
    return str(uuid.uuid4())
