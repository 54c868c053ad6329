"""An emulated Kubernetes API (kmock) on a real HTTP port with a kubeconfig, for `spillway loadtest job`.

kmock stores objects and serves get/list/create; it runs no controllers, so a test plays the Job
controller and kubelet: it stores the Job's pod and serves that pod's log. Label selectors are not
applied by kmock (lists return every object of the kind).
"""
from __future__ import annotations

from pathlib import Path

import kubernetes
from spillway.core import k8s_names as names
from support.kube_api import EmulatedApi

RESOURCES = {
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": {"log"}},
    "batch/v1/jobs": {"kind": "Job", "namespaced": True},
    f"{names.API_VERSION}/{names.PLURAL}": {"kind": names.KIND, "namespaced": True},
}


class KubeEmulator(EmulatedApi):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, RESOURCES, namespace="ns")

    def serve_log(self, namespace: str, pod: str, text: str) -> None:
        """Answer GET .../pods/<pod>/log with text (what the kubelet would stream)."""
        self.call(lambda: self.emulator[f"get /api/v1/namespaces/{namespace}/pods/{pod}/log"] << text.encode())


    def create(self, obj: dict) -> None:
        api = self.client()
        namespace = obj["metadata"]["namespace"]
        if obj["kind"] == "Pod":
            kubernetes.client.CoreV1Api(api).create_namespaced_pod(namespace, obj)
        elif obj["kind"] == "Job":
            kubernetes.client.BatchV1Api(api).create_namespaced_job(namespace, obj)
        else:
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, obj)

    def jobs(self, namespace: str) -> list:
        return kubernetes.client.BatchV1Api(self.client()).list_namespaced_job(namespace).items


def job_pod(job: str, namespace: str, phase: str = "Succeeded") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-x1", "namespace": namespace, "labels": {"job-name": job}},
            "spec": {"containers": [{"name": "loadtest", "image": "i"}]},
            "status": {"phase": phase}}


def modelserver(name: str, namespace: str) -> dict:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": "m"}}
