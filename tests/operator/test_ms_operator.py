"""The real operator (`kopf run -m spillway.controller.handlers`) against an emulated Kubernetes API over HTTP.

Each test works in its own namespace with its own node pool (nodes carry a `pool` label the test's
ModelServers select), so one operator process serves the whole module.
"""
from __future__ import annotations

import json
import urllib.request

import kubernetes
import pytest
from spillway.adapters.model_config import catalog_config, resolve_geometry
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.core import k8s_names as names
from spillway.core.geometry import kv_layout
from spillway.core.model_source import ModelSource
from spillway.core.planner import plan
from spillway.core.qualification import Row
from spillway.core.qualification import summary as qualification_summary
from spillway.core.quantity import parse_bytes
from support.ms_api import Api
from support.ms_cluster import eventually
from support.ms_examples import LLAMA_8B


def memory_limit(deployment: dict) -> int:
    container, = deployment["spec"]["template"]["spec"]["containers"]
    return parse_bytes(container["resources"]["limits"]["memory"])


def planned_limit(ms: dict, *nodes: dict) -> int:
    """The planner's own pod limit for the smallest of these nodes (computed here, not by the operator)."""
    spec = desired(ms, [summarize_node(n) for n in nodes]).spec
    limits = [plan(resolve_geometry(LLAMA_8B), spec.request, summarize_node(n).facts()).pod
              .memory_limit_bytes for n in nodes]
    return min(limits)


def wait_planned(api: Api, name: str = "llama", generation: int | None = None) -> dict:
    def planned():
        ms = api.get(name)
        status = ms.get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "Planned"), None)
        if cond and (generation is None or status.get("observedGeneration") == generation):
            return ms
        return None
    return eventually(planned, what=f"{name} planned (generation {generation})")


def test_create_applies_the_planned_deployment_and_service(api):
    small = api.node("small", "768Gi", 8, dma="51.2")
    big = api.node("big", "2Ti", 8)
    created = api.modelserver(replicas=2)
    ms = wait_planned(api, generation=1)
    status = ms["status"]
    planned = next(c for c in status["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "True" and planned["reason"] == "Planned"
    assert "smallest of 2 eligible nodes" in planned["message"]
    assert status["plan"]["plannedNode"] == small["metadata"]["name"]
    assert status["plan"]["qualifiedDmaGBps"] == 51.2
    deployment = eventually(api.deployment)
    assert memory_limit(deployment) == planned_limit(created, small, big) == parse_bytes(status["plan"]["memoryLimit"])
    assert deployment["spec"]["replicas"] == 2
    owner, = deployment["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        names.KIND, "llama", created["metadata"]["uid"], True)
    service, = api.services()
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond["Ready"]["status"] == "False" and cond["Degraded"]["status"] == "False"
    assert status["ready"] == "0/2" and status["plan"]["cachedTokens"] > 0
    # Events are posted as the reconcile goes (Planned before the writes, Created after each): wait for both.
    eventually(lambda: {"Planned", "Created"} <= {reason for _, reason, _ in api.events()}, what="the events")


def test_spec_change_rolls_out(api):
    node = api.node("a")
    ms = api.modelserver()
    wait_planned(api, generation=1)
    before = eventually(api.deployment)
    api.patch({"spec": {"offload": {"size": "50Gi"}, "replicas": 3}})
    after_ms = wait_planned(api, generation=2)
    after = eventually(lambda: (d := api.deployment()) and d["spec"]["replicas"] == 3 and d)
    changed = {**ms, "spec": {**ms["spec"], "offload": {"size": "50Gi"}}}
    assert memory_limit(after) == planned_limit(changed, node) < memory_limit(before)
    assert after_ms["status"]["plan"]["offloadBytes"] <= 50 * 2**30
    assert len(api.deployments()) == 1 and len(api.services()) == 1
    assert any(reason == "Updated" for _, reason, _ in eventually(api.events))


def test_node_pool_change_replans(api, cluster):
    big = api.node("big", "2Ti", 8)
    ms = api.modelserver()
    wait_planned(api)
    first = memory_limit(eventually(api.deployment))
    assert first == planned_limit(ms, big)
    small = api.node("small", "512Gi", 8)
    eventually(lambda: memory_limit(api.deployment()) == planned_limit(ms, big, small), what="re-plan for small")
    eventually(lambda: api.get()["status"]["plan"]["plannedNode"] == small["metadata"]["name"], what="status")
    # A label the spec does not select on changes nothing the plan reads: no re-plan, no write.
    patches = cluster.requests("PATCH", f"/namespaces/{api.namespace}/deployments/llama")
    api.core.patch_node(small["metadata"]["name"], {"metadata": {"labels": {"rack": "7"}}})
    api.core.delete_node(small["metadata"]["name"])
    eventually(lambda: memory_limit(api.deployment()) == first, what="re-plan without the small node")
    assert cluster.requests("PATCH", f"/namespaces/{api.namespace}/deployments/llama") == patches + 1


def test_ready_follows_the_deployment(api):
    api.node("a")
    api.modelserver()
    wait_planned(api)
    eventually(api.deployment)
    api.apps.patch_namespaced_deployment_status("llama", api.namespace, {"status": {"replicas": 1, "readyReplicas": 1}})
    ready = eventually(lambda: (c := api.condition("Ready")) and c["status"] == "True" and c)
    assert ready["reason"] == "ReplicasReady"
    assert api.get()["status"]["ready"] == "1/1"
    api.apps.patch_namespaced_deployment_status("llama", api.namespace, {"status": {"readyReplicas": 0, "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": "ReplicaSet has timed out progressing."}]}})
    degraded = eventually(lambda: (c := api.condition("Degraded")) and c["status"] == "True" and c)
    assert degraded["reason"] == "RolloutFailed" and "timed out" in degraded["message"]


def test_a_deleted_deployment_is_applied_again(api):
    api.node("a")
    api.modelserver()
    wait_planned(api)
    uid = eventually(api.deployment)["metadata"]["uid"]
    api.apps.delete_namespaced_deployment("llama", api.namespace)
    again = eventually(lambda: (d := api.deployment()) and d["metadata"]["uid"] != uid and d)
    assert len(api.deployments()) == 1 and again["metadata"]["ownerReferences"][0]["name"] == "llama"


def test_delete_leaves_collection_to_owner_references(api, operator):
    api.node("a")
    created = api.modelserver()
    wait_planned(api)
    deployment = eventually(api.deployment)
    api.custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, api.namespace, names.PLURAL, "llama")
    # No finalizer: the ModelServer is gone at once; the garbage collector follows the controller references.
    with pytest.raises(kubernetes.client.ApiException):
        api.get()
    for obj in (deployment, *api.services()):
        owner, = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] and owner["blockOwnerDeletion"]
    assert operator.alive()


BAD = {
    # reason: (spec, words the condition's message must contain)
    "InvalidSpec": ({"tensorParallelSize": "two"}, ["tensorParallelSize", "'two'"]),
    "ModelGeometryUnknown": ({"model": "acme/unknown-70b"}, ["acme/unknown-70b", "modelConfig"]),
    "PoolDoesNotFit": ({"offload": {"size": "4Ti"}}, ["4Ti", "largest pool that fits is"]),
    "NoEligibleNodes": ({"tensorParallelSize": 16}, ["tensorParallelSize 16 needs 16 GPUs", "at most 8"]),
}


@pytest.mark.parametrize("reason", BAD)
def test_bad_input_gets_a_condition_and_deploys_nothing(api, operator, reason):
    api.node("a", "1Ti", 8)
    spec, words = BAD[reason]
    api.modelserver(**spec)
    ms = wait_planned(api)
    cond = {c["type"]: c for c in ms["status"]["conditions"]}
    assert (cond["Planned"]["status"], cond["Planned"]["reason"]) == ("False", reason)
    for word in words:
        assert word in cond["Planned"]["message"]
    assert (cond["Degraded"]["status"], cond["Degraded"]["reason"]) == ("True", reason)
    assert "nothing is deployed" in cond["Degraded"]["message"]
    assert cond["Ready"]["reason"] == "NotDeployed"
    assert api.deployments() == [] and api.services() == []
    assert ("Warning", reason) in {(t, r) for t, r, _ in eventually(api.events)}
    assert operator.alive()


def test_no_gpu_nodes_at_all_then_one_arrives(api):
    api.modelserver()
    ms = wait_planned(api)
    assert api.condition("Planned")["reason"] == "NoEligibleNodes"
    assert ms["status"]["nodesFingerprint"]
    api.node("late")
    eventually(lambda: api.condition("Planned")["status"] == "True", what="planned once a node arrives")
    assert eventually(api.deployment)


def test_an_unsatisfiable_update_keeps_the_last_good_deployment(api):
    api.node("a", "1Ti", 8)
    api.modelserver()
    wait_planned(api, generation=1)
    good = eventually(api.deployment)
    api.patch({"spec": {"offload": {"size": "900Gi"}}})
    ms = wait_planned(api, generation=2)
    cond = {c["type"]: c for c in ms["status"]["conditions"]}
    assert (cond["Planned"]["status"], cond["Planned"]["reason"]) == ("False", "PoolDoesNotFit")
    assert "the last applied plan keeps running" in cond["Degraded"]["message"]
    assert api.deployment()["metadata"]["annotations"] == good["metadata"]["annotations"]
    assert ms["status"]["plan"]["memoryLimit"] == good["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["memory"]


def test_model_geometry_from_a_configmap_that_appears_later(api):
    node = api.node("a")
    config = {**catalog_config(LLAMA_8B), "num_hidden_layers": 16}
    api.modelserver(model="acme/llama-16-layers", modelConfig={"configMapRef": {"name": "geometry"}})
    ms = wait_planned(api)
    assert api.condition("Planned")["reason"] == "ModelGeometryUnknown"
    assert "ConfigMap geometry" in api.condition("Planned")["message"]
    api.core.create_namespaced_config_map(api.namespace, {"metadata": {"name": "geometry"},
                                                          "data": {"config.json": json.dumps(config)}})
    eventually(lambda: api.condition("Planned")["status"] == "True", what="planned from the ConfigMap")
    status = api.get()["status"]["plan"]
    geometry = resolve_geometry(ModelSource("acme/llama-16-layers", inline=config))
    expected = plan(geometry, desired(ms, [summarize_node(node)], lambda n, k: json.dumps(config)).spec
                    .request, summarize_node(node).facts())
    assert status["blockBytes"] == expected.layout.block_bytes
    assert status["blockBytes"] * 2 == kv_layout(resolve_geometry(LLAMA_8B)).block_bytes  # 16 of Llama's 32 layers
    assert status["offloadBytes"] == expected.pool.bytes


def _qualified_dma_samples(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith(names.METRIC_NODE_QUALIFIED_DMA_GBPS + "{"):
            labels, value = line.rsplit(" ", 1)
            samples[labels.split('node="', 1)[1].split('"', 1)[0]] = float(value)
    return samples


def test_operator_exports_the_qualified_dma_figure_of_each_node(api, operator):
    api.node("qualified", dma="51.3")
    api.node("unqualified")
    qualified, unqualified = f"{api.pool}-qualified", f"{api.pool}-unqualified"
    eventually(lambda: _qualified_dma_samples(operator.metrics_port).get(qualified) == 51.3, what="the qualified node's gauge")
    assert unqualified not in _qualified_dma_samples(operator.metrics_port)
    api.core.delete_node(qualified)
    eventually(lambda: qualified not in _qualified_dma_samples(operator.metrics_port), what="the deleted node's gauge to go")


def test_requalifying_a_node_replans_from_its_new_table(api):
    node = api.node("a", dma="51.3")
    api.modelserver()
    wait_planned(api)
    assert not [w for w in api.get()["status"]["plan"]["warnings"] if "qualified at" in w]
    # The new table says 5 GB/s CPU->GPU at every size; the single annotated figure stays as it was.
    rows = [Row("dma", "c2g", size, 1000, "alloc", [5.0]) for size in (2**16, 2**20, 2**21, 2**24)]
    annotation = json.dumps(qualification_summary(rows, {}), separators=(",", ":"), sort_keys=True)
    api.core.patch_node(node["metadata"]["name"], {"metadata": {"annotations": {
        names.ANNOTATION_QUALIFICATION: annotation}}})
    eventually(lambda: any("qualified at 5.0 GB/s" in w for w in api.get()["status"]["plan"]["warnings"]),
               what="a re-plan that reads the new qualification table")


def test_model_config_null_with_an_unknown_model_is_a_condition(api, operator):
    api.node("a")
    api.modelserver(model="acme/unknown-70b", modelConfig=None)
    wait_planned(api)
    planned = api.condition("Planned")
    assert (planned["status"], planned["reason"]) == ("False", "ModelGeometryUnknown")
    assert "acme/unknown-70b" in planned["message"]
    assert operator.alive() and "AttributeError" not in operator.output()
