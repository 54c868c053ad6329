"""What `helm template` renders for each scenario, with Helm 4 and Helm 3."""
from __future__ import annotations

import pytest
from spillway.core import k8s_names, routing, vllm_api
from support.chart_render import (
    CHART,
    MONITORING_API,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    of_kind,
    one,
    operator_container,
    operator_deployment,
    render,
    render_failure,
    render_scenario,
    test_pod,
)

MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}
DASHBOARD_FILES = sorted((CHART / "files" / "dashboards").glob("*.json"))
RULE_FILES = sorted((CHART / "files" / "rules").glob("*.yaml"))


def kinds(docs: list[dict]) -> set[str]:
    return {doc["kind"] for doc in docs}


def dashboards(docs: list[dict]) -> list[dict]:
    return [d for d in of_kind(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm3_and_helm4_render_the_same_objects(scenario):
    from support.chart_render import require_binary
    assert render_scenario(require_binary("helm"), scenario) == render_scenario(require_binary("helm3"), scenario)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_namespaced_object_names_its_namespace(helm, scenario):
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for doc in render_scenario(helm, scenario):
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace"), f"{doc['kind']} {doc['metadata']['name']} has no namespace"


def test_defaults_install_the_operator_without_monitoring_crs(helm):
    docs = render_scenario(helm, "defaults")
    assert not kinds(docs) & MONITORING_KINDS, "no Prometheus Operator API: no monitoring custom resources"
    assert not of_kind(docs, k8s_names.KIND)
    assert {"Deployment", "ServiceAccount", "Service", "ClusterRole", "ClusterRoleBinding"} <= kinds(docs)
    assert len(dashboards(docs)) == len(DASHBOARD_FILES), "dashboards are plain ConfigMaps: no API needed"


def test_prometheus_operator_api_turns_on_monitors_and_rules(helm):
    docs = render_scenario(helm, "prometheus-operator")
    monitors = {m["metadata"]["name"].rsplit("-", 1)[-1]: m for m in of_kind(docs, "PodMonitor")}
    assert sorted(monitors) == ["operator", "router", "vllm"]
    pod_monitor = monitors["vllm"]
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        k8s_names.LABEL_COMPONENT: k8s_names.COMPONENT_VLLM, k8s_names.LABEL_MANAGED_BY: k8s_names.MANAGED_BY}
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoint, = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == k8s_names.PORT_NAME_HTTP
    assert endpoint["path"] == vllm_api.METRICS_PATH
    # The kv-aware router pods' metrics port (`spillway route`), selected as the operator labels them
    router = monitors["router"]
    assert router["spec"]["selector"]["matchLabels"] == {
        k8s_names.LABEL_COMPONENT: k8s_names.COMPONENT_ROUTER, k8s_names.LABEL_MANAGED_BY: k8s_names.MANAGED_BY}
    assert router["spec"]["podMetricsEndpoints"][0]["port"] == k8s_names.PORT_NAME_METRICS
    assert router["spec"]["podMetricsEndpoints"][0]["path"] == routing.ROUTER_METRICS_PATH
    # One PodMonitor for all vLLM pods: the operator is told to write none of its own.
    env = {e["name"]: e.get("value") for e in operator_container(docs)["env"]}
    assert env[k8s_names.ENV_POD_MONITORS] == "false"
    # The operator's own metrics (each node's qualified DMA figure) are scraped from its metrics port.
    operator_endpoint, = monitors["operator"]["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in operator_container(docs)["ports"]}
    assert operator_endpoint["port"] == "metrics" and str(ports["metrics"]) == env[k8s_names.ENV_METRICS_PORT]
    assert len(of_kind(docs, "PrometheusRule")) == len(RULE_FILES)


def test_prometheus_rules_carry_the_rule_files_groups(helm):
    import yaml

    docs = render_scenario(helm, "prometheus-operator")
    rendered = sorted((r["spec"]["groups"] for r in of_kind(docs, "PrometheusRule")), key=str)
    files = sorted((yaml.safe_load(path.read_text())["groups"] for path in RULE_FILES), key=str)
    assert rendered == files


def test_dashboards_carry_the_dashboard_files_with_the_sidecar_label(helm):
    import json

    docs = render_scenario(helm, "defaults")
    rendered = {}
    for config_map in dashboards(docs):
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key, text), = config_map["data"].items()
        rendered[key] = json.loads(text)
    assert rendered == {path.name: json.loads(path.read_text()) for path in DASHBOARD_FILES}


def test_monitoring_off_renders_no_monitoring_objects(helm):
    docs = render_scenario(helm, "monitoring-off")
    assert not kinds(docs) & MONITORING_KINDS
    assert not dashboards(docs)


@pytest.mark.parametrize("switch", ["podMonitor", "rules", "dashboards"])
def test_each_monitoring_object_can_be_switched_off(helm, switch):
    docs = render(helm, {"monitoring": {switch: {"enabled": False}}}, (MONITORING_API,))
    found = {"podMonitor": of_kind(docs, "PodMonitor"), "rules": of_kind(docs, "PrometheusRule"),
             "dashboards": dashboards(docs)}
    assert not found[switch]


def test_monitoring_labels_reach_monitors_and_rules_and_dashboards_go_to_their_namespace(helm):
    docs = render_scenario(helm, "namespaced")
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for config_map in dashboards(docs):
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "Spillway"}
    assert one(docs, "PodMonitor", f"{RELEASE}-vllm")["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_models_become_modelservers(helm):
    docs = render_scenario(helm, "models")
    servers = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in of_kind(docs, k8s_names.KIND)}
    assert set(servers) == {(NAMESPACE, "llama-8b"), ("serving", "llama-8b-tp2")}
    for server in servers.values():
        assert server["apiVersion"] == k8s_names.API_VERSION
    values, _ = SCENARIOS["models"]
    assert servers[(NAMESPACE, "llama-8b")]["spec"] == values["models"][0]["spec"]


def test_helm_test_checks_the_operator_and_every_model_service(helm):
    docs = render_scenario(helm, "models")
    pod = test_pod(docs)
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "-c"]
    assert command[2] == (CHART / "scripts" / "helm_test.py").read_text()
    service = one(docs, "Service")
    port = service["spec"]["ports"][0]["port"]
    assert f"--operator=http://{service['metadata']['name']}.{NAMESPACE}.svc:{port}/healthz" in command
    port = vllm_api.SERVER_PORT
    assert f"--model=llama-8b=http://llama-8b.{NAMESPACE}.svc:{port}" in command
    assert f"--model=llama-8b-tp2=http://llama-8b-tp2.serving.svc:{port}" in command
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_cluster_wide_operator(helm):
    docs = render_scenario(helm, "defaults")
    command = operator_container(docs)["command"]
    assert command[:3] == ["kopf", "run", "--standalone"]
    assert "--all-namespaces" in command
    assert not [arg for arg in command if arg.startswith("--namespace")]
    assert not of_kind(docs, "Role")


def test_namespace_scoped_operator_gets_a_role_per_namespace(helm):
    docs = render_scenario(helm, "namespaced")
    command = operator_container(docs)["command"]
    assert "--all-namespaces" not in command
    assert [arg for arg in command if arg.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert sorted(r["metadata"]["namespace"] for r in of_kind(docs, "Role")) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in of_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    cluster_role, = of_kind(docs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]


def test_operator_runs_the_handlers_module_that_exists():
    from support.chart_render import require_binary

    command = operator_container(render(require_binary("helm")))["command"]
    module = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--module="))
    path = CHART.parents[1] / "operator" / (module.replace(".", "/") + ".py")
    assert path.is_file(), f"the chart runs kopf -m {module}, but {path} does not exist"


def test_operator_pod_is_locked_down(helm):
    for scenario in SCENARIOS:
        docs = render_scenario(helm, scenario)
        deployment = operator_deployment(docs)
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = operator_container(docs)
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]
        health = next(p for p in container["ports"] if p["name"] == "health")["containerPort"]
        assert f"--liveness=http://0.0.0.0:{health}/healthz" in container["command"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_customized_values_reach_the_operator(helm):
    docs = render_scenario(helm, "customized")
    deployment = operator_deployment(docs)
    assert deployment["metadata"]["name"] == "llm-operator"
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert container["image"] == "registry.example.com/spillway-operator@sha256:" + "ab" * 32
    assert container["imagePullPolicy"] == "Always"
    assert test_pod(docs)["spec"]["containers"][0]["image"] == container["image"]
    assert {"--log-format=json", "--verbose", "--liveness=http://0.0.0.0:9090/healthz"} <= set(container["command"])
    assert {"name": "SPILLWAY_EXAMPLE", "value": "1"} in container["env"]
    assert pod["serviceAccountName"] == "spillway-op" == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["priorityClassName"] == "spillway-critical"
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["affinity"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 9090


def test_default_operator_image_is_the_one_the_project_names(helm):
    container = operator_container(render(helm))
    assert container["image"] == k8s_names.DEFAULT_OPERATOR_IMAGE


def test_existing_service_account_is_used_without_creating_one(helm):
    docs = render(helm, {"serviceAccount": {"create": False, "name": "byo"}})
    assert not of_kind(docs, "ServiceAccount")
    assert operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "byo"
    for binding in of_kind(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "byo", "namespace": NAMESPACE}]
    assert "serviceAccount.name is required" in render_failure(helm, {"serviceAccount": {"create": False}})


def test_rbac_and_network_policy_can_be_left_to_the_cluster_admin(helm):
    docs = render(helm, {"rbac": {"create": False}, "networkPolicy": {"enabled": False}})
    assert not kinds(docs) & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "NetworkPolicy"}


def test_network_policies_admit_only_the_health_and_metrics_ports(helm):
    docs = render(helm)
    operator_policy = one(docs, "NetworkPolicy", f"{RELEASE}-operator")
    assert operator_policy["spec"]["ingress"] == [
        {"ports": [{"port": "health", "protocol": "TCP"}, {"port": "metrics", "protocol": "TCP"}]}]
    test_policy = one(docs, "NetworkPolicy", f"{RELEASE}-test")
    assert test_policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in test_policy["spec"]
    pod_labels = test_pod(docs)["metadata"]["labels"]
    assert test_policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def test_chart_refuses_kubernetes_older_than_supported(helm):
    assert "1.29" in render_failure(helm, kube_version="1.29.0")
    render(helm, kube_version="1.30.0")


def test_notes_tell_what_to_do_next():
    import subprocess

    from support.chart_render import helm_command, require_binary

    values, _ = SCENARIOS["models"]
    # `helm install --dry-run=client` prints NOTES.txt (`helm template` does not); Helm 3's wants a cluster.
    command = helm_command(require_binary("helm"), values)
    command[1] = "install"
    command.remove("--include-crds")
    proc = subprocess.run(command + ["--dry-run=client"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n spillway-system get ms llama-8b -w" in notes
    assert "kubectl -n serving get ms llama-8b-tp2 -w" in notes
    assert f"helm test {RELEASE}" in notes
    assert f"spillway loadtest job --modelserver NAME -n NAMESPACE --image {k8s_names.DEFAULT_OPERATOR_IMAGE}" in notes
    assert "grafana_dashboard=1" in notes or not DASHBOARD_FILES


def rbac_rules(docs: list[dict]) -> list[tuple[str, str, str, str]]:
    """(kind of role, api group, resource, verb) for every grant."""
    grants = []
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames/nonResourceURLs expected"
            grants += [(role["kind"], group, resource, verb)
                       for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]]
    return grants


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rbac_is_least_privilege(helm, scenario):
    values, _ = SCENARIOS[scenario]
    grants = rbac_rules(render_scenario(helm, scenario))
    assert grants
    for _, group, resource, verb in grants:
        assert "*" not in (group, resource, verb)
        assert verb not in {"deletecollection", "update", "escalate", "bind", "impersonate"}
        assert resource not in {"customresourcedefinitions", "namespaces", "pods/exec", "clusterroles", "roles"}
        if resource == "secrets":
            assert verb == "get" and values.get("operator", {}).get("hubFetch", {}).get("enabled")
    namespaced_mode = bool(values.get("operator", {}).get("watchNamespaces"))
    cluster_wide = {(group, resource) for kind, group, resource, _ in grants if kind == "ClusterRole"}
    if namespaced_mode:
        assert cluster_wide == {("", "nodes")}
    writes = {(group, resource) for _, group, resource, verb in grants if verb in {"create", "patch"}}
    assert writes == {(k8s_names.GROUP, "modelservers"), (k8s_names.GROUP, "modelservers/status"),
                      ("apps", "deployments"), ("", "services"), ("", "events"), ("networking.k8s.io", "networkpolicies"),
                      # spec.routing.mode llm-d: the InferencePool and the endpoint picker's ConfigMap
                      (k8s_names.INFERENCEPOOL_GROUP, k8s_names.INFERENCEPOOL_PLURAL), ("", "configmaps"),
                      # spec.autoscaling: the HPA or KEDA's ScaledObject
                      ("autoscaling", "horizontalpodautoscalers"), ("keda.sh", "scaledobjects")}
    # Deletes: only what a routed mode adds and the operator prunes when routing.mode no longer wants it (the router
    # Deployment and its NetworkPolicy, the headless Service, the InferencePool and the endpoint picker's ConfigMap),
    # in a namespace.
    deletes = {(kind, group, resource) for kind, group, resource, verb in grants if verb == "delete"}
    role = "Role" if namespaced_mode else "ClusterRole"
    assert deletes == {(role, "apps", "deployments"), (role, "", "services"), (role, "", "configmaps"),
                       (role, "networking.k8s.io", "networkpolicies"),
                       (role, k8s_names.INFERENCEPOOL_GROUP, k8s_names.INFERENCEPOOL_PLURAL),
                       (role, "autoscaling", "horizontalpodautoscalers"), (role, "keda.sh", "scaledobjects")}


def test_operator_settings_use_the_operators_names(helm):
    docs = render_scenario(helm, "customized")
    env = {e["name"]: e.get("value") for e in operator_container(docs)["env"]}
    assert env[k8s_names.ENV_ALLOW_HUB_FETCH] == "true"
    assert env["HF_ENDPOINT"] == "https://hub.example.com"  # the Hugging Face hub's own variable (spillway.adapters.hub)
    assert env[k8s_names.ENV_POD_MONITORS] == "false"
    default_env = {e["name"] for e in operator_container(render(helm))["env"]}
    assert k8s_names.ENV_ALLOW_HUB_FETCH not in default_env


def test_pod_monitor_and_helm_test_reach_what_the_operator_deploys(helm):
    """The operator's own manifests for a `models:` entry: the PodMonitor selects its pods' port, and
    `helm test` calls its Service by name and port."""
    from spillway.controller.facts import summarize_node, synthetic_node
    from spillway.controller.manifests import desired

    docs = render_scenario(helm, "models")
    server = one(docs, k8s_names.KIND, "llama-8b")
    objects = desired(server, [summarize_node(synthetic_node("2Ti", 8))]).objects
    deployment, = [o for o in objects if o["kind"] == "Deployment"]
    service, = [o for o in objects if o["kind"] == "Service"]
    pod = deployment["spec"]["template"]
    pod_monitor = one(docs, "PodMonitor", f"{RELEASE}-vllm")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    endpoint, = pod_monitor["spec"]["podMetricsEndpoints"]
    container_ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert endpoint["port"] in container_ports
    port, = service["spec"]["ports"]
    url = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"
    assert f"--model=llama-8b={url}" in test_pod(docs)["spec"]["containers"][0]["command"]
