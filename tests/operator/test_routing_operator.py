"""spec.routing through the real operator (`kopf run`) against the emulated Kubernetes API: the router objects
are applied, the router's readiness becomes the Routed condition (never the replicas' Ready), a router that is
down or a replica that is gone is a condition, one replica is a warning, and a mode switched off prunes what it
added: only the objects the ModelServer controls."""
from __future__ import annotations

import kubernetes
from spillway.controller.routing_status import (
    REASON_NOT_ROUTED,
    REASON_POOL_APPLIED,
    REASON_ROUTER_NOT_READY,
    REASON_ROUTER_READY,
    REASON_SINGLE_REPLICA,
    ROUTED,
)
from spillway.core import k8s_names as names
from support.ms_api import Api
from support.ms_cluster import eventually
from test_ms_operator import wait_planned


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
    assert status["mode"] == "kv-aware" and status["routerReady"] == "0/1" and "hostTierCredit" not in status

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
    api.node("a", dma="50")
    api.modelserver(replicas=2, routing={"mode": "llm-d"})
    wait_planned(api)
    pool = eventually(lambda: api.custom.get_namespaced_custom_object(
        names.INFERENCEPOOL_GROUP, names.INFERENCEPOOL_VERSION, api.namespace, names.INFERENCEPOOL_PLURAL, "llama"))
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    routed(api, "True", REASON_POOL_APPLIED)
    assert api.deployment("llama-router") is None
    assert 0 < api.get()["status"]["routing"]["hostTierCredit"] < 1  # the weight of llm-d's CPU tier


def service(api: Api, name: str) -> dict | None:
    return next((s for s in api.services() if s["metadata"]["name"] == name), None)


def config_map(api: Api, name: str) -> dict | None:
    try:
        return api.core.read_namespaced_config_map(name, api.namespace).to_dict()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def inference_pool(api: Api, name: str = "llama") -> dict | None:
    try:
        return api.custom.get_namespaced_custom_object(names.INFERENCEPOOL_GROUP, names.INFERENCEPOOL_VERSION,
                                                       api.namespace, names.INFERENCEPOOL_PLURAL, name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_routing_off_prunes_the_router_and_keeps_the_replicas(api):
    api.node("a")
    # Same-named objects the ModelServer does not control: a user's, and another owner's (its controller).
    other = {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": "other", "uid": "0000-other",
             "controller": True}
    api.core.create_namespaced_config_map(api.namespace, {
        "metadata": {"name": "llama-epp", "namespace": api.namespace, "ownerReferences": [other]},
        "data": {"config.yaml": "mine"}})
    api.modelserver(replicas=2, routing={"mode": "kv-aware"})
    wait_planned(api)
    eventually(lambda: api.deployment("llama-router") and service(api, "llama-replicas"), what="the router objects")

    generation = api.patch({"spec": {"routing": {"mode": "none"}}})["metadata"]["generation"]
    wait_planned(api, generation=generation)
    eventually(lambda: api.deployment("llama-router") is None and service(api, "llama-replicas") is None,
               what="the router Deployment and headless Service pruned")
    vllm, endpoint = api.deployment("llama"), service(api, "llama")
    assert vllm is not None and endpoint is not None
    assert endpoint["spec"]["selector"] == vllm["spec"]["selector"]["matchLabels"]  # back on the vLLM pods
    assert "--kv-events-config" not in vllm["spec"]["template"]["spec"]["containers"][0]["args"]
    assert config_map(api, "llama-epp")["data"] == {"config.yaml": "mine"}  # another owner's: untouched
    not_routed = routed(api, "False", REASON_NOT_ROUTED)
    assert "routing.mode none" in not_routed["message"]
    routing = api.get()["status"]["routing"]
    assert routing["mode"] == "none" and "routerReady" not in routing
    pruned = {message for _, reason, message in api.events() if reason == "Pruned"}
    assert any("Deployment llama-router" in m for m in pruned) and any("Service llama-replicas" in m for m in pruned)
    assert any("NetworkPolicy llama-router" in m for m in pruned)


def test_a_users_same_named_objects_survive(api):
    api.node("a")
    api.core.create_namespaced_service(api.namespace, {
        "metadata": {"name": "llama-replicas", "namespace": api.namespace},
        "spec": {"selector": {"app": "mine"}, "ports": [{"port": 80}]}})
    api.apps.create_namespaced_deployment(api.namespace, {
        "metadata": {"name": "llama-router", "namespace": api.namespace},
        "spec": {"selector": {"matchLabels": {"app": "mine"}}, "template": {
            "metadata": {"labels": {"app": "mine"}}, "spec": {"containers": [{"name": "c", "image": "mine"}]}}}})
    api.modelserver(replicas=2)
    wait_planned(api)
    generation = api.patch({"spec": {"replicas": 3}})["metadata"]["generation"]  # a second reconcile, too
    wait_planned(api, generation=generation)
    eventually(lambda: (api.deployment() or {}).get("spec", {}).get("replicas") == 3, what="the new plan applied")
    assert api.deployment("llama-router")["spec"]["template"]["spec"]["containers"][0]["image"] == "mine"
    assert service(api, "llama-replicas")["spec"]["selector"] == {"app": "mine"}
    assert not [reason for _, reason, _ in api.events() if reason == "Pruned"]


def test_llm_d_off_prunes_the_inference_pool_and_its_config(api):
    api.node("a")
    api.modelserver(replicas=2, routing={"mode": "llm-d"})
    wait_planned(api)
    eventually(lambda: inference_pool(api) and config_map(api, "llama-epp"), what="the llm-d objects")
    generation = api.patch({"spec": {"routing": {"mode": "none"}}})["metadata"]["generation"]
    wait_planned(api, generation=generation)
    eventually(lambda: inference_pool(api) is None and config_map(api, "llama-epp") is None,
               what="the InferencePool and the endpoint picker's ConfigMap pruned")
    assert api.deployment("llama") is not None and service(api, "llama") is not None
    routed(api, "False", REASON_NOT_ROUTED)


def test_kv_aware_to_llm_d_swaps_the_router_for_the_pool(api):
    api.node("a")
    api.modelserver(replicas=2, routing={"mode": "kv-aware"})
    wait_planned(api)
    eventually(lambda: api.deployment("llama-router") and service(api, "llama-replicas"), what="the router objects")
    generation = api.patch({"spec": {"routing": {"mode": "llm-d"}}})["metadata"]["generation"]
    wait_planned(api, generation=generation)
    eventually(lambda: inference_pool(api) and config_map(api, "llama-epp"), what="the llm-d objects")
    eventually(lambda: api.deployment("llama-router") is None and service(api, "llama-replicas") is None,
               what="the router pruned")
    endpoint, vllm = service(api, "llama"), api.deployment("llama")
    assert endpoint["spec"]["selector"] == vllm["spec"]["selector"]["matchLabels"]
    routed(api, "True", REASON_POOL_APPLIED)
