"""The chart's RBAC is enough for the real operator, and no more than it uses.

The operator runs as a real `kopf run` process with the chart's own command line and environment,
against an emulated API server (support.rbac_cluster) that answers 403 to every request of the
operator's token that the chart's (Cluster)Roles and bindings do not grant. The operator then has to
plan and deploy ModelServers, follow their Deployments' readiness and read a config ConfigMap; its
health endpoint must satisfy the chart's `helm test` check.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from support.chart_render import CHART, SCENARIOS, render, require_binary
from support.rbac_cluster import AuthorizingCluster, Policy, exercise, free_port, start_operator, stop


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
