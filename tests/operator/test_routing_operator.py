"""spec.routing through the real operator (`kopf run`) against the emulated Kubernetes API: the router objects
are applied, the router's readiness becomes the Routed condition (never the replicas' Ready), a router that is
down or a replica that is gone is a condition, and one replica is a warning."""
from __future__ import annotations

import pytest
from spillway.controller.routing_status import (
    REASON_POOL_APPLIED,
    REASON_ROUTER_NOT_READY,
    REASON_ROUTER_READY,
    REASON_SINGLE_REPLICA,
    ROUTED,
)
from spillway.core import k8s_names as names
from support.ms_cluster import EmulatedCluster, Operator, eventually
from test_ms_operator import Api, wait_planned


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("kmock")) as emulated:
        yield emulated


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    running = Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "kopf.log",
                       {names.ENV_RETRY_SECONDS: "1"}).start()
    yield running
    alive = running.alive()
    running.kill()
    assert alive, "the operator died during the tests:\n" + running.output()[-5000:]


@pytest.fixture()
def api(cluster, operator):
    return Api(cluster)


def routed(api: Api, status: str, reason: str) -> dict:
    def check():
        found = api.condition(ROUTED)
        return found if found and found["status"] == status and found["reason"] == reason else None
    return eventually(check, what=f"Routed {status} {reason}")


def test_kv_aware_router_readiness_is_the_routed_condition(api):
    api.node("a", dma="50")
    api.modelserver(replicas=3, routing={"mode": "kv-aware"})
    wait_planned(api)
    router = eventually(lambda: api.deployment("llama-router"))
    service, = [s for s in api.services() if s["metadata"]["name"] == "llama"]
    assert service["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    down = routed(api, "False", REASON_ROUTER_NOT_READY)  # nothing runs in the emulated cluster
    assert "llama-router" in down["message"]
    status = api.get()["status"]["routing"]
    assert status["mode"] == "kv-aware" and status["routerReady"] == "0/1" and 0 < status["hostTierCredit"] < 1

    api.apps.patch_namespaced_deployment_status("llama-router", api.namespace,
                                                {"status": {"replicas": 1, "readyReplicas": 1}})
    routed(api, "True", REASON_ROUTER_READY)
    assert api.get()["status"]["routing"]["routerReady"] == "1/1"
    # The router's readiness is not the replicas': Ready still waits for the vLLM pods.
    assert api.condition("Ready")["status"] == "False"

    api.apps.patch_namespaced_deployment_status("llama", api.namespace, {"status": {"replicas": 3, "readyReplicas": 3}})
    eventually(lambda: api.condition("Ready")["status"] == "True", what="Ready")
    api.apps.patch_namespaced_deployment_status("llama-router", api.namespace, {"status": {"readyReplicas": 0}})
    routed(api, "False", REASON_ROUTER_NOT_READY)  # the router went down: a condition, the operator runs on
    assert api.condition("Ready")["status"] == "True"


def test_one_replica_is_a_warning(api):
    api.node("a")
    api.modelserver(replicas=1, routing={"mode": "kv-aware"})
    wait_planned(api)
    eventually(lambda: api.deployment("llama-router"))
    api.apps.patch_namespaced_deployment_status("llama-router", api.namespace,
                                                {"status": {"replicas": 1, "readyReplicas": 1}})
    single = routed(api, "False", REASON_SINGLE_REPLICA)
    assert "no other replica" in single["message"]


def test_llm_d_applies_an_inference_pool(api):
    api.node("a")
    api.modelserver(replicas=2, routing={"mode": "llm-d"})
    wait_planned(api)
    pool = eventually(lambda: api.custom.get_namespaced_custom_object(
        names.INFERENCEPOOL_GROUP, names.INFERENCEPOOL_VERSION, api.namespace, names.INFERENCEPOOL_PLURAL, "llama"))
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    routed(api, "True", REASON_POOL_APPLIED)
    assert api.deployment("llama-router") is None
