"""Hand edits of the fields the operator plans or hardens, on a running Deployment, through the real operator:
each is taken back by the Deployment's own event (no other trigger), a field another manager added included."""
from __future__ import annotations

import copy

import pytest
from spillway.controller import drift
from spillway.core import k8s_names as names
from support.ms_api import Api
from support.ms_cluster import eventually


def _vllm(deployment: dict) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == names.CONTAINER_VLLM)


def _limit_memory(pod):
    _vllm({"spec": {"template": {"spec": pod}}})["resources"]["limits"]["memory"] = "1900Gi"


def _gpus(pod):
    resources = _vllm({"spec": {"template": {"spec": pod}}})["resources"]
    resources["limits"][names.GPU_RESOURCE] = resources["requests"][names.GPU_RESOURCE] = "8"


def _shm(pod):
    next(v for v in pod["volumes"] if v["name"] == names.VOLUME_SHM)["emptyDir"]["sizeLimit"] = "1Gi"


def _privileged(pod):
    _vllm({"spec": {"template": {"spec": pod}}})["securityContext"]["privileged"] = True


def _capability(pod):
    _vllm({"spec": {"template": {"spec": pod}}})["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def _run_as_root(pod):
    pod["securityContext"]["runAsUser"] = 0


EDITS = {
    "memory-limit": _limit_memory, "gpus": _gpus, "shm": _shm, "privileged": _privileged,
    "capability-added": _capability, "pod-run-as-root": _run_as_root,
    "host-network": lambda pod: pod.update(hostNetwork=True), "host-pid": lambda pod: pod.update(hostPID=True),
    "host-ipc": lambda pod: pod.update(hostIPC=True),
}


@pytest.fixture(scope="module")
def running(cluster, operator):
    api = Api(cluster)
    api.node("a")
    api.modelserver()
    api.planned(status="True")
    return api, drift.owned(eventually(api.deployment))


@pytest.mark.parametrize("edit", EDITS)
def test_a_hand_edit_of_an_owned_field_is_taken_back(running, edit):
    api, planned = running
    live = api.deployment()
    pod = copy.deepcopy(live["spec"]["template"]["spec"])
    EDITS[edit](pod)
    api.apps.patch_namespaced_deployment(
        "llama", api.namespace, {"spec": {"template": {"spec": pod}}}, _content_type="application/merge-patch+json")
    assert drift.drifted(api.deployment(), planned), "the edit did not land"
    eventually(lambda: not drift.drifted(api.deployment(), planned), timeout=20,
               what=f"the operator took back {edit}")
