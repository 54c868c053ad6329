"""The real operator over the emulated API: objects it does not own, hand edits, huge sizes, and GPU nodes
that shrink or disappear under a running ModelServer."""
from __future__ import annotations

import urllib.request

import pytest
from harness import eventually, memory_limit, names

# -- ownership ---------------------------------------------------------------------------------------

def test_a_users_service_of_the_same_name_is_left_alone(api):
    api.node("a")
    users = {"metadata": {"name": "llama", "labels": {"app": "web"}},
             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    api.core.create_namespaced_service(api.namespace, users)
    api.modelserver()
    planned = api.planned(status="False")
    assert planned["reason"] == "NameConflict" and "Service llama" in planned["message"], planned
    service = api.service()
    assert service["spec"]["selector"] == {"app": "web"}
    assert not service["metadata"].get("ownerReferences"), service["metadata"]
    assert api.deployments() == [], "nothing is applied while a name is taken"
    assert ("Warning", "NameConflict") in {(t, r) for t, r, _ in eventually(api.events)}


def test_an_object_another_modelserver_controls_is_left_alone(api):
    api.node("a")
    foreign = {"metadata": {"name": "llama", "ownerReferences": [{
        "apiVersion": names.API_VERSION, "kind": names.KIND, "name": "llama", "uid": "someone-else",
        "controller": True}]}, "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}}
    api.core.create_namespaced_service(api.namespace, foreign)
    api.modelserver()
    assert api.planned(status="False")["reason"] == "NameConflict"
    assert api.service()["metadata"]["ownerReferences"][0]["uid"] == "someone-else"


# -- drift -------------------------------------------------------------------------------------------

def test_a_hand_edited_memory_limit_is_reverted_after_a_restart(api, operator):
    api.node("a")
    api.modelserver()
    api.planned(status="True")
    planned = memory_limit(eventually(api.deployment))
    edited = api.deployment()
    edited["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "1900Gi"
    api.apps.patch_namespaced_deployment("llama", api.namespace, {"spec": {"template": {"spec": {
        "containers": edited["spec"]["template"]["spec"]["containers"]}}}})
    assert memory_limit(api.deployment()) == "1900Gi"
    operator.kill()
    operator.start()
    eventually(lambda: memory_limit(api.deployment()) == planned, timeout=60, what="the planned limit back")


# -- huge sizes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["1e400", "1e309"])
def test_a_huge_offload_size_gets_a_status(api, operator, size):
    api.node("a")
    api.modelserver(offload={"size": size})
    planned = api.planned(status="False")
    assert planned["reason"] == "InvalidSpec" and size in planned["message"], planned
    assert api.deployments() == []
    assert operator.alive()


# -- nodes that shrink or go -------------------------------------------------------------------------

def _planned_gauge(port: int, namespace: str, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if (line.startswith(names.METRIC_MODELSERVER_PLANNED + "{") and f'modelserver_namespace="{namespace}"' in line
                and f'modelserver="{name}"' in line):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_explicit_pool_that_no_longer_fits_scales_to_zero_and_back(api, operator):
    node = api.node("a", "2Ti")
    api.modelserver(offload={"size": "200Gi"}, replicasPerNode=1)
    api.planned(status="True")
    eventually(api.deployment)
    api.resize_node(node["metadata"]["name"], "200Gi")
    planned = api.planned(status="False", reason="PoolDoesNotFit")
    assert "200Gi" in planned["message"]
    eventually(lambda: api.deployment()["spec"]["replicas"] == 0, what="the Deployment scaled to 0")
    degraded = eventually(lambda: (c := api.condition("Degraded")) and "scaled to 0" in c["message"] and c,
                          what="Degraded saying why")
    assert degraded["status"] == "True" and degraded["reason"] == "PoolDoesNotFit"
    assert eventually(lambda: _planned_gauge(operator.metrics_port, api.namespace, "llama") == 0.0, what="the planned gauge at 0")
    api.resize_node(node["metadata"]["name"], "2Ti")
    api.planned(status="True")
    eventually(lambda: api.deployment()["spec"]["replicas"] == 1, what="the replicas back")
    assert eventually(lambda: _planned_gauge(operator.metrics_port, api.namespace, "llama") == 1.0)


def test_an_auto_pool_is_replanned_smaller_on_a_shrunken_node(api):
    node = api.node("a", "2Ti")
    api.modelserver()
    api.planned(status="True")
    before = memory_limit(eventually(api.deployment))
    api.resize_node(node["metadata"]["name"], "512Gi")
    eventually(lambda: memory_limit(api.deployment()) != before, what="a smaller plan")
    assert api.condition("Planned")["status"] == "True"
    assert api.deployment()["spec"]["replicas"] == 1


def test_a_node_that_disappears_keeps_the_deployment_until_one_returns(api):
    node = api.node("a", "2Ti")
    api.modelserver()
    api.planned(status="True")
    applied = eventually(api.deployment)
    api.core.delete_node(node["metadata"]["name"])
    api.planned(status="False", reason="NoEligibleNodes")
    kept = api.deployment()
    assert kept["spec"]["replicas"] == 1 and memory_limit(kept) == memory_limit(applied)
    assert "keeps running" in api.condition("Degraded")["message"]
    api.node("a", "2Ti")
    api.planned(status="True")


def test_the_not_planned_alert_watches_the_operators_gauge():
    from spillway.observability.alerts import alerts

    found = {a.name: a for a in alerts()}
    alert = found["SpillwayModelServerNotPlanned"]
    assert names.METRIC_MODELSERVER_PLANNED in alert.expr


def test_an_object_the_api_server_refuses_gets_a_status_not_endless_retries(api, cluster):
    import kmock

    api.node("a")
    deployments = f"/apis/apps/v1/namespaces/{api.namespace}/deployments"
    # What a real API server answers to a pod spec the CRD's schema let through (preserve-unknown fields);
    # the emulator creates what its apply does not find, so its create answers it.
    cluster.call(lambda: cluster.emulator["post", kmock.path(deployments)] << 422)
    api.modelserver()
    planned = api.planned(status="False", reason="InvalidSpec")
    assert "the API server refused Deployment llama" in planned["message"], planned
    assert ("Warning", "InvalidSpec") in {(t, r) for t, r, _ in eventually(api.events)}


@pytest.mark.parametrize("rate", ["nan", "inf", "-5"])
def test_a_qualified_rate_that_is_no_rate_is_ignored(api, rate):
    from harness import gpu_node

    node = gpu_node(f"{api.pool}-odd", labels={"pool": api.pool})
    node["metadata"]["annotations"] = {names.ANNOTATION_QUALIFIED_DMA_GBPS: rate}
    api.core.create_node(node)
    api.modelserver()
    api.planned(status="True")
    assert "qualifiedDmaGBps" not in api.get()["status"]["plan"]
