"""An emulated Kubernetes API (kmock) on a real HTTP port, and the operator as a real `kopf run` process.

kmock keeps objects and serves list/watch/get/create/patch/delete; it has no uid, resourceVersion,
defaulting, validation or garbage collection, so the tests set uids themselves and check owner
references rather than collection. Known gaps worked around here: /api/v1/namespaces answers 500
unless namespaces are declared; List responses lack kind; /version/ is 404 (kopf asks /version).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import attrs
import kmock
import kubernetes
from spillway import k8s_names as names

REPO = Path(__file__).resolve().parents[2]
KOPF = Path(sys.executable).with_name("kopf")

CORE = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/nodes": {"kind": "Node", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/services": {"kind": "Service", "namespaced": True},
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True, "subresources": {"status", "scale"}},
    f"{names.API_VERSION}/{names.PLURAL}": {"kind": names.KIND, "namespaced": True, "singular": "modelserver",
                                            "shortnames": {names.SHORT_NAME}, "subresources": {"status", "scale"}},
}
POD_MONITORS = {f"{names.PODMONITOR_GROUP}/{names.PODMONITOR_VERSION}/{names.PODMONITOR_PLURAL}":
                {"kind": names.PODMONITOR_KIND, "namespaced": True}}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


@attrs.define(kw_only=True)
class Apiserver(kmock.KubernetesEmulator):
    """kmock's emulator plus what the API server itself stamps on objects: uid, generateName, generation
    (bumped by spec changes), resourceVersion and creationTimestamp. kopf relies on resourceVersion to
    tell its own patches from others'."""

    _version: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

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
        return await super()._handle(request)


class EmulatedCluster:
    """kmock's KubernetesEmulator served on 127.0.0.1 from a background thread with its own event loop."""

    def __init__(self, tmp: Path, pod_monitors: bool = False):
        self.kubeconfig = tmp / "kubeconfig"
        self._declare = dict(CORE, **(POD_MONITORS if pod_monitors else {}))
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.emulator: kmock.KubernetesEmulator | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("kmock did not start")
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        }))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with Apiserver() as emulator, kmock.Server(emulator) as server:
            for key, info in self._declare.items():
                emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn() on the emulator's event loop (kmock is not thread-safe) and return its result."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def requests(self, method: str, path_part: str) -> int:
        """How many requests with this method whose path contains path_part the emulator has served."""
        return self.call(lambda: sum(1 for r in self.emulator if r.method == method and path_part in str(r.url.path)))

    def client(self) -> kubernetes.client.ApiClient:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=config)
        return kubernetes.client.ApiClient(config)


class Operator:
    """`kopf run` of spillway.handlers against a kubeconfig, in its own process group."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None):
        self.kubeconfig, self.log, self.env = kubeconfig, log, env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> Self:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("HF_TOKEN", None)
        self.process = subprocess.Popen(
            [str(KOPF), "run", "--standalone", "--all-namespaces", "--verbose", "-m", "spillway.handlers"],
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


def eventually(check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll check() until it returns a truthy value; fail with the last value or exception."""
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
