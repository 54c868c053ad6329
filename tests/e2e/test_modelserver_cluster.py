"""ModelServer on a real cluster (kind or any kube-context): the API server's own schema and CEL
validation, the operator planning for a GPU node, and garbage collection through owner references.

Skips when no cluster is reachable; SPILLWAY_E2E_REQUIRED=1 (the e2e workflow) turns that into a failure.
The cluster needs no GPU: the test adds a Node object that advertises GPUs and memory (no kubelet
runs it, so the vLLM pods stay Pending; the operator's work is what is checked).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from spillway.core import k8s_names as names

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "charts" / "spillway" / "crds" / "modelservers.spillway.dev.yaml"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _unreachable(reason: str):
    if os.environ.get("SPILLWAY_E2E_REQUIRED"):
        pytest.fail(f"no Kubernetes cluster: {reason}")
    pytest.skip(f"no Kubernetes cluster reachable: {reason}")


@pytest.fixture(scope="module")
def kube():
    kubernetes = pytest.importorskip("kubernetes")
    try:
        kubernetes.config.load_kube_config()
    except Exception as exc:  # noqa: BLE001 - any failure to load a kubeconfig means no cluster
        _unreachable(str(exc).splitlines()[0])
    client = kubernetes.client.ApiClient()
    client.configuration.retries = 0
    try:
        kubernetes.client.VersionApi(client).get_code(_request_timeout=5)
    except Exception as exc:  # noqa: BLE001 - any failure to reach it means no cluster
        _unreachable(str(exc).splitlines()[0][:200])
    return kubernetes, client


def _wait(check, timeout=60.0, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # noqa: BLE001 - not there yet: poll again
            found = None
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def crd(kube):
    kubernetes, client = kube
    ext = kubernetes.client.ApiextensionsV1Api(client)
    body = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
            body["metadata"]["name"]).metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    _wait(lambda: any(c.type == "Established" and c.status == "True" for c in
                      ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []),
          what="the CRD established")
    return body


@pytest.fixture(scope="module")
def namespace(kube, crd):
    kubernetes, client = kube
    core = kubernetes.client.CoreV1Api(client)
    name = f"spillway-e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def gpu_node(kube):
    kubernetes, client = kube
    core = kubernetes.client.CoreV1Api(client)
    name = f"spillway-e2e-gpu-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": name, "labels": {"spillway.dev/e2e": name}}})
    resources = {"memory": "1Ti", names.GPU_RESOURCE: "8", "cpu": "64", "pods": "110"}
    core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources}})
    yield name
    core.delete_node(name)


@pytest.fixture(scope="module")
def operator(kube, crd, tmp_path_factory):
    log = tmp_path_factory.mktemp("operator") / "kopf.log"
    kopf = Path(sys.executable).with_name("kopf")
    process = subprocess.Popen([str(kopf), "run", "--standalone", "--all-namespaces", "-m", "spillway.controller.handlers"],
                               cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    yield process
    alive = process.poll() is None
    if alive:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    assert alive, log.read_text()[-5000:]


def _modelserver(name, **spec):
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name},
            "spec": {"model": LLAMA_8B, **spec}}


@pytest.mark.parametrize("spec, message", [
    ({"offload": {"size": "1.5"}}, "fractional offload size"),
    ({"resources": {"limits": {"memory": "1Ti"}}}, "planned by Spillway"),
    ({"blockSize": 16, "offload": {"blockSize": 24}}, "multiple of blockSize"),
    ({"tensorParallelSize": 0}, "spec.tensorParallelSize"),
])
def test_api_server_rejects_bad_resources(kube, namespace, spec, message):
    kubernetes, client = kube
    custom = kubernetes.client.CustomObjectsApi(client)
    with pytest.raises(kubernetes.client.ApiException) as raised:
        custom.create_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL,
                                               _modelserver("bad", **spec))
    assert raised.value.status == 422 and message in raised.value.body


def test_operator_plans_applies_and_garbage_collects(kube, namespace, gpu_node, operator):
    kubernetes, client = kube
    custom = kubernetes.client.CustomObjectsApi(client)
    apps = kubernetes.client.AppsV1Api(client)
    core = kubernetes.client.CoreV1Api(client)
    created = custom.create_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL,
                                                     _modelserver("llama", nodeSelector={"spillway.dev/e2e": gpu_node}))
    assert created["spec"]["offload"]["size"] == "auto", "the schema's defaults applied"

    def planned():
        ms = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL, "llama")
        cond = {c["type"]: c for c in (ms.get("status") or {}).get("conditions") or []}
        return ms if cond.get("Planned", {}).get("status") == "True" else None
    ms = _wait(planned, what="Planned=True")
    assert ms["status"]["plan"]["plannedNode"] == gpu_node and ms["status"]["observedGeneration"] == 1
    deployment = _wait(lambda: apps.read_namespaced_deployment("llama", namespace), what="the Deployment")
    owner, = deployment.metadata.owner_references
    assert owner.uid == created["metadata"]["uid"] and owner.controller
    assert deployment.spec.template.spec.containers[0].resources.limits["memory"] == ms["status"]["plan"]["memoryLimit"]
    assert core.read_namespaced_service("llama", namespace).spec.selector == deployment.spec.selector.match_labels

    custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL, "llama")

    def collected():
        try:
            apps.read_namespaced_deployment("llama", namespace)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False
    _wait(collected, timeout=120, what="the Deployment garbage-collected")
