"""The chart's RBAC is enough for the real operator, and no more than it uses.

The operator runs as a real `kopf run` process with the chart's own command line and environment,
against an emulated API server (support.rbac_cluster) that answers 403 to every request of the
operator's token that the chart's (Cluster)Roles and bindings do not grant. The operator then has to
plan and deploy ModelServers, follow their Deployments' readiness and read a config ConfigMap; its
health endpoint must satisfy the chart's `helm test` check.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import kubernetes
import pytest
from spillway.controller.routing_status import REASON_PRUNE_FORBIDDEN, ROUTED
from spillway.core import k8s_names
from support.chart_render import CHART, SCENARIOS, render, require_binary
from support.ms_cluster import eventually
from support.ms_examples import gpu_node, modelserver
from support.rbac_cluster import AuthorizingCluster, Policy, condition, exercise, free_port, start_operator, stop


@pytest.mark.parametrize("scenario", ["defaults", "namespaced"])
def test_operator_works_with_exactly_the_charts_rbac(scenario, tmp_path):
    values, api_versions = SCENARIOS[scenario]
    docs = render(require_binary("helm"), values, api_versions)
    policy = Policy(docs)
    watched = values.get("operator", {}).get("watchNamespaces")
    namespace = watched[0] if watched else "team-a"
    health_port = free_port()
    with AuthorizingCluster(tmp_path, policy) as cluster:
        log = tmp_path / "operator.log"
        process = start_operator(docs, cluster.operator_kubeconfig, log, health_port)
        try:
            # The chart's `helm test` check of the operator, against the real health endpoint.
            check = subprocess.run([sys.executable, "-c", (CHART / "scripts" / "helm_test.py").read_text(),
                                    f"--operator=http://127.0.0.1:{health_port}/healthz", "--timeout=60"],
                                   check=False, capture_output=True, text=True, timeout=120)
            assert check.returncode == 0, check.stdout + log.read_text(errors="replace")[-3000:]
            exercise(cluster, namespace, "team-c" if watched else None)
            assert process.poll() is None, "the operator exited"
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- operator log ---\n{log.read_text(errors='replace')[-5000:]}") from exc
        finally:
            stop(process)
        requests = cluster.operator_requests()

    # Nothing refused, kopf's Namespace and CRD observers included (the operator disables scanning).
    refused = {(g, r, v, ns) for g, r, v, ns, allowed in requests if not allowed}
    assert not refused, f"the chart does not grant what the operator asks for: {refused}"
    used = {(g, r, v) for g, r, v, _, allowed in requests if allowed}
    assert policy.grants() <= used, f"granted but never used by the operator: {policy.grants() - used}"


def without_delete(docs: list[dict]) -> list[dict]:
    """The chart's objects with every `delete` taken out of its (Cluster)Roles: a cluster that grants less."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        if doc.get("kind") in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != "delete"]
    return docs


def test_a_prune_the_rbac_refuses_is_a_condition(tmp_path):
    """Routing switched off where the operator may not delete: the router stays, Routed says why, the operator
    runs on."""
    values, api_versions = SCENARIOS["defaults"]
    docs = without_delete(render(require_binary("helm"), values, api_versions))
    namespace = "team-a"
    with AuthorizingCluster(tmp_path, Policy(docs)) as cluster:
        log = tmp_path / "operator.log"
        process = start_operator(docs, cluster.operator_kubeconfig, log, free_port())
        try:
            client = cluster.client()
            apps, custom = kubernetes.client.AppsV1Api(client), kubernetes.client.CustomObjectsApi(client)
            kubernetes.client.CoreV1Api(client).create_node(gpu_node("gpu-1", "2Ti", 8))
            custom.create_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL,
                                                   modelserver("routed", namespace, replicas=2,
                                                               routing={"mode": "kv-aware"}))
            eventually(lambda: condition(custom, namespace, "routed", "Planned"), timeout=60, what="routed planned")
            apps.read_namespaced_deployment("routed-router", namespace)  # applied before the status says Planned
            custom.patch_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL,
                                                  "routed", {"spec": {"routing": {"mode": "none"}}},
                                                  _content_type="application/merge-patch+json")

            def refused():
                found = condition(custom, namespace, "routed", ROUTED) or {}
                return found if found.get("reason") == REASON_PRUNE_FORBIDDEN else None
            routed = eventually(refused, timeout=60, what="Routed PruneForbidden")
            assert routed["status"] == "False" and "Deployment routed-router" in routed["message"]
            assert "Service routed-replicas" in routed["message"]
            assert (condition(custom, namespace, "routed", "Planned") or {}).get("status") == "True"
            apps.read_namespaced_deployment("routed-router", namespace)  # still there: nothing else to do
            assert process.poll() is None, "the operator exited"
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- operator log ---\n{log.read_text(errors='replace')[-5000:]}") from exc
        finally:
            stop(process)
        denied = {(g, r, v) for g, r, v, _, allowed in cluster.operator_requests() if not allowed}
    assert denied == {("apps", "deployments", "delete"), ("", "services", "delete"),
                      ("networking.k8s.io", "networkpolicies", "delete")}, denied
