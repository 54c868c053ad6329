"""An emulated API server that enforces the chart's RBAC on the operator's token, and the operator run against it.

kmock (support.ms_cluster) answers 403 to every request of the operator's token that the chart's (Cluster)Roles
and bindings do not grant, and records every request, so a test can compare what was asked with what was granted.
Used by tests/chart/test_operator_rbac.py and by the operator image's test.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import aiohttp.web
import attrs
import kmock
import kubernetes
from spillway.adapters.model_config import catalog_config
from spillway.core import k8s_names

from support.chart_render import NAMESPACE, REPO, of_kind, operator_container
from support.ms_cluster import AUTOSCALERS, Apiserver, EmulatedCluster, eventually
from support.ms_examples import LLAMA_8B, gpu_node, modelserver

OPERATOR_TOKEN = "spillway-operator-token"
KOPF = Path(sys.executable).with_name("kopf")


class Policy:
    """What the chart's Roles grant to the operator's ServiceAccount, evaluated like the RBAC authorizer."""

    def __init__(self, docs: list[dict]):
        deployment, = of_kind(docs, "Deployment")
        subject = {"kind": "ServiceAccount", "namespace": NAMESPACE,
                   "name": deployment["spec"]["template"]["spec"]["serviceAccountName"]}
        roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d["rules"]
                 for d in of_kind(docs, "ClusterRole") + of_kind(docs, "Role")}
        self.cluster: list[dict] = []
        self.namespaced: dict[str, list[dict]] = defaultdict(list)
        for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
            if subject not in binding["subjects"]:
                continue
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace")
            rules = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
            if binding["kind"] == "ClusterRoleBinding":
                self.cluster += rules
            else:
                self.namespaced[namespace] += rules

    def allows(self, group: str, resource: str, verb: str, namespace: str | None) -> bool:
        rules = self.cluster + (self.namespaced.get(namespace, []) if namespace else [])
        return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
                   for rule in rules)

    def grants(self) -> set[tuple[str, str, str]]:
        rules = self.cluster + [rule for rules in self.namespaced.values() for rule in rules]
        return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def verb(request: kmock.Request) -> str:
    action = request.action
    if action == kmock.action.UPDATE:
        return "patch" if str(request.method).upper().endswith("PATCH") else "update"
    if action == kmock.action.DELETE:
        return "delete" if request.name else "deletecollection"
    return {kmock.action.LIST: "list", kmock.action.WATCH: "watch", kmock.action.FETCH: "get",
            kmock.action.CREATE: "create"}[action]


def forbidden(group: str, resource: str, verb: str, namespace: str | None) -> aiohttp.web.Response:
    message = f"{verb} {group or 'core'}/{resource} in {namespace or 'the cluster'} is not granted"
    return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                                      "code": 403, "message": message}, status=403)


@attrs.define(kw_only=True)
class AuthorizingApiserver(Apiserver):
    """The emulated API server, refusing the operator's requests that the chart's RBAC does not grant."""

    policy: Policy
    seen: list = attrs.field(factory=list)  # (group, resource, verb, namespace, allowed) of the operator's requests

    async def __call__(self, raw_request: aiohttp.web.BaseRequest):
        # kmock cannot parse the cluster-wide /api/v1/namespaces; decide on it before kmock tries.
        if raw_request.path == "/api/v1/namespaces" and self._operator(raw_request.headers):
            wanted = ("", "namespaces", "watch" if raw_request.query.get("watch") else "list", None)
            if not self.policy.allows(*wanted):
                self.seen.append((*wanted, False))
                return forbidden(*wanted)
        return await super().__call__(raw_request)

    @staticmethod
    def _operator(headers) -> bool:
        token = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        return token == f"Bearer {OPERATOR_TOKEN}"

    async def _handle(self, request: kmock.Request):
        # Discovery (/api, /apis/...: no plural) is open to every authenticated user (system:discovery).
        if request.resource is not None and request.resource.plural and self._operator(request.headers):
            resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            group = request.resource.group or ""
            wanted = (group, resource, verb(request), request.namespace)
            allowed = self.policy.allows(*wanted)
            self.seen.append((*wanted, allowed))
            if not allowed:
                return forbidden(*wanted)
        return await super()._handle(request)


class AuthorizingCluster(EmulatedCluster):
    def __init__(self, tmp: Path, policy: Policy):
        super().__init__(tmp, autoscalers=AUTOSCALERS)  # KEDA served: its ScaledObject is written too
        self.policy = policy
        self.operator_kubeconfig = tmp / "operator-kubeconfig"

    def __enter__(self):
        super().__enter__()
        config = json.loads(self.kubeconfig.read_text())
        config["users"][0]["user"]["token"] = OPERATOR_TOKEN
        self.operator_kubeconfig.write_text(json.dumps(config))
        return self

    def new_emulator(self) -> kmock.KubernetesEmulator:
        return AuthorizingApiserver(policy=self.policy)

    def operator_requests(self) -> list[tuple]:
        return self.call(lambda: list(self.emulator.seen))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_operator(docs: list[dict], kubeconfig: Path, log: Path, health_port: int) -> subprocess.Popen:
    """The operator exactly as the chart's Deployment runs it; only the liveness address is made local."""
    container = operator_container(docs)
    command = [str(KOPF) if arg == "kopf" else arg for arg in container["command"]]
    liveness = [i for i, arg in enumerate(command) if arg.startswith("--liveness=")]
    assert len(liveness) == 1
    command[liveness[0]] = f"--liveness=http://127.0.0.1:{health_port}/healthz"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["POD_NAMESPACE"] = NAMESPACE
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_") and k != "HF_TOKEN"}
    return subprocess.Popen(command, cwd=REPO, env={**environment, **env, "KUBECONFIG": str(kubeconfig)},
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def condition(custom, namespace: str, name: str, kind: str) -> dict | None:
    body = custom.get_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL, name)
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def _exists(read) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def exercise(cluster: AuthorizingCluster, namespace: str, ignored_namespace: str | None) -> None:
    """What an operator does in its first minutes: plan, deploy, follow readiness, read a ConfigMap, prune what a
    routing mode switched off added."""
    client = cluster.client()
    core, apps = kubernetes.client.CoreV1Api(client), kubernetes.client.AppsV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    core.create_node(gpu_node("gpu-1", "2Ti", 8))

    def create(body: dict) -> None:
        custom.create_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, body["metadata"]["namespace"],
                                               k8s_names.PLURAL, body)

    create(modelserver("llama", namespace))
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "private-model", "namespace": namespace},
              "data": {"config.json": json.dumps(catalog_config(LLAMA_8B))}}
    core.create_namespaced_config_map(namespace, config)
    create(modelserver("private", namespace, model="acme/private-llama",
                       modelConfig={"configMapRef": {"name": "private-model"}}))
    if ignored_namespace:
        create(modelserver("elsewhere", ignored_namespace))
    # spec.routing: kv-aware adds a router Deployment and Services, llm-d an InferencePool and a ConfigMap.
    create(modelserver("routed", namespace, replicas=2, routing={"mode": "kv-aware"}))
    create(modelserver("pooled", namespace, replicas=2, routing={"mode": "llm-d"}))
    # A disk tier on a claim: the operator reads the claim before it applies anything.
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "kv-tier"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "4Ti"}}}})
    create(modelserver("tiered", namespace, offload={"disk": {"enabled": True, "volume": {
        "persistentVolumeClaim": {"claimName": "kv-tier", "capacity": "4Ti"}}}}))

    for name in ("llama", "private", "routed", "pooled", "tiered"):
        planned = eventually(lambda name=name: condition(custom, namespace, name, "Planned"), timeout=60,
                             what=f"{name} planned")
        assert planned["status"] == "True", planned
    eventually(lambda: core.read_namespaced_service("llama", namespace), what="the Service")
    eventually(lambda: apps.read_namespaced_deployment("routed-router", namespace), what="the router")
    eventually(lambda: custom.get_namespaced_custom_object(k8s_names.INFERENCEPOOL_GROUP, k8s_names.INFERENCEPOOL_VERSION,
                                                           namespace, k8s_names.INFERENCEPOOL_PLURAL, "pooled"),
               what="the InferencePool")
    apps.patch_namespaced_deployment_status("llama", namespace, {"status": {"replicas": 1, "readyReplicas": 1,
                                                                           "availableReplicas": 1}})
    eventually(lambda: (condition(custom, namespace, "llama", "Ready") or {}).get("status") == "True",
               timeout=60, what="llama ready")
    # routing.mode back to none: the operator prunes the router's and the InferencePool's objects (delete).
    for name in ("routed", "pooled"):
        custom.patch_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL, name,
                                              {"spec": {"routing": {"mode": "none"}}},
                                              _content_type="application/merge-patch+json")
    eventually(lambda: not _exists(lambda: apps.read_namespaced_deployment("routed-router", namespace))
               and not _exists(lambda: core.read_namespaced_service("routed-replicas", namespace)),
               timeout=60, what="the router pruned")
    eventually(lambda: not _exists(lambda: custom.get_namespaced_custom_object(
        k8s_names.INFERENCEPOOL_GROUP, k8s_names.INFERENCEPOOL_VERSION, namespace, k8s_names.INFERENCEPOOL_PLURAL,
        "pooled")) and not _exists(lambda: core.read_namespaced_config_map("pooled-epp", namespace)),
        timeout=60, what="the InferencePool and its ConfigMap pruned")
    # spec.autoscaling: an HPA or a KEDA ScaledObject, changed (patch), then removed (pruned: delete).
    create(modelserver("scaled", namespace, replicas=2, autoscaling={"maxReplicas": 2}))
    create(modelserver("keda", namespace, replicas=2, autoscaling={
        "provider": "keda", "maxReplicas": 2, "prometheusAddress": "http://prometheus.monitoring.svc:9090"}))
    autoscalers = (("scaled", "autoscaling", "v2", "horizontalpodautoscalers"),
                   ("keda", "keda.sh", "v1alpha1", "scaledobjects"))

    def autoscaler(name: str, group: str, version: str, plural: str) -> dict:
        return custom.get_namespaced_custom_object(group, version, namespace, plural, name)

    for name, *kind in autoscalers:
        eventually(lambda name=name, kind=kind: _exists(lambda: autoscaler(name, *kind)), timeout=60,
                   what=f"{name}'s autoscaler")
        custom.patch_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL, name,
                                              {"spec": {"autoscaling": {"maxReplicas": 1}}},
                                              _content_type="application/merge-patch+json")
    for name, *kind in autoscalers:
        field = "maxReplicaCount" if kind[0] == "keda.sh" else "maxReplicas"
        eventually(lambda name=name, kind=kind, field=field: autoscaler(name, *kind)["spec"][field] == 1,
                   timeout=60, what=f"{name}'s autoscaler patched")
        custom.patch_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, namespace, k8s_names.PLURAL, name,
                                              {"spec": {"autoscaling": None}},
                                              _content_type="application/merge-patch+json")
    for name, *kind in autoscalers:
        eventually(lambda name=name, kind=kind: not _exists(lambda: autoscaler(name, *kind)), timeout=60,
                   what=f"{name}'s autoscaler pruned")
    if ignored_namespace:
        body = custom.get_namespaced_custom_object(k8s_names.GROUP, k8s_names.VERSION, ignored_namespace,
                                                   k8s_names.PLURAL, "elsewhere")
        assert not body.get("status"), "the operator served a namespace it does not watch"
