"""An emulated Kubernetes API (kmock) on a real HTTP port with a kubeconfig, for `spillway loadtest job`.

kmock stores objects and serves get/list/create; it runs no controllers, so a test plays the Job
controller and kubelet: it stores the Job's pod and serves that pod's log. Label selectors are not
applied by kmock (lists return every object of the kind).
"""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import kmock
import kubernetes
from spillway import k8s_names as names

RESOURCES = {
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": {"log"}},
    "batch/v1/jobs": {"kind": "Job", "namespaced": True},
    f"{names.API_VERSION}/{names.PLURAL}": {"kind": names.KIND, "namespaced": True},
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


class KubeEmulator:
    def __init__(self, tmp: Path) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.emulator: kmock.KubernetesEmulator | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):  # -> KubeEmulator
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("kmock did not start")
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": "ns"}}],
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
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for key, info in RESOURCES.items():
                emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def serve_log(self, namespace: str, pod: str, text: str) -> None:
        """Answer GET .../pods/<pod>/log with text (what the kubelet would stream)."""
        self.call(lambda: self.emulator[f"get /api/v1/namespaces/{namespace}/pods/{pod}/log"] << text.encode())

    def api(self) -> kubernetes.client.ApiClient:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=config)
        return kubernetes.client.ApiClient(config)

    def create(self, obj: dict) -> None:
        api = self.api()
        namespace = obj["metadata"]["namespace"]
        if obj["kind"] == "Pod":
            kubernetes.client.CoreV1Api(api).create_namespaced_pod(namespace, obj)
        elif obj["kind"] == "Job":
            kubernetes.client.BatchV1Api(api).create_namespaced_job(namespace, obj)
        else:
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, obj)

    def jobs(self, namespace: str) -> list:
        return kubernetes.client.BatchV1Api(self.api()).list_namespaced_job(namespace).items


def job_pod(job: str, namespace: str, phase: str = "Succeeded") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-x1", "namespace": namespace, "labels": {"job-name": job}},
            "spec": {"containers": [{"name": "loadtest", "image": "i"}]},
            "status": {"phase": phase}}


def modelserver(name: str, namespace: str) -> dict:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": "m"}}
