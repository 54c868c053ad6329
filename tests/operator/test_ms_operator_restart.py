"""The operator killed mid-reconcile, restarted after nodes changed, with the Prometheus Operator API
present (PodMonitor) and with the hub fetch allowed (a local server stands in for the hub)."""
from __future__ import annotations

import asyncio
import base64
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kmock
import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core import k8s_names as names
from support.ms_api import Api
from support.ms_cluster import EmulatedCluster, Operator, eventually
from support.ms_examples import LLAMA_8B
from test_ms_operator import memory_limit, planned_limit, wait_planned

HUB_TOKEN = "hub-secret"


@pytest.fixture(scope="module")
def hub():
    """A hub that serves acme/private-8b's config.json to the right token only."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = (self.headers.get("Authorization") == f"Bearer {HUB_TOKEN}"
                  and self.path == "/acme/private-8b/resolve/main/config.json")
            body = json.dumps(catalog_config(LLAMA_8B)).encode() if ok else b"{}"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("kmock"), pod_monitors=True) as emulated:
        yield emulated


@pytest.fixture()
def operator(cluster, hub, tmp_path):
    env = {names.ENV_RETRY_SECONDS: "1", names.ENV_ALLOW_HUB_FETCH: "true", "HF_ENDPOINT": hub}
    running = Operator(cluster.kubeconfig, tmp_path / "kopf.log", env).start()
    yield running
    running.kill()


def test_killed_mid_reconcile_then_restarted_converges_without_duplicates(cluster, operator):
    api = Api(cluster)
    api.node("a")
    services = f"/api/v1/namespaces/{api.namespace}/services"
    # The emulator stores the Service, then holds the answer for a minute: the operator is killed waiting.
    cluster.call(lambda: cluster.emulator["post", kmock.path(services)] << (lambda: asyncio.sleep(60)))
    api.modelserver()
    eventually(lambda: cluster.requests("POST", services) == 1, what="the Service create in flight")
    operator.kill(signal.SIGKILL)
    assert api.deployment() is not None and not (api.get().get("status") or {}).get("conditions")
    operator.start()
    ms = wait_planned(api)
    assert api.condition("Planned")["status"] == "True"
    assert [d["metadata"]["name"] for d in api.deployments()] == ["llama"]
    assert [s["metadata"]["name"] for s in api.services()] == ["llama"]
    monitors = api.custom.list_namespaced_custom_object(names.PODMONITOR_GROUP, names.PODMONITOR_VERSION,
                                                        api.namespace, names.PODMONITOR_PLURAL)["items"]
    assert [m["metadata"]["name"] for m in monitors] == ["llama"]
    assert cluster.requests("POST", services) == 1, "the restarted operator found the Service and kept it"
    assert memory_limit(api.deployment()) == planned_limit(ms, *api_nodes(api))


def api_nodes(api):
    listed = json.loads(api.core.list_node(label_selector=f"pool={api.pool}", _preload_content=False).data)["items"]
    return listed or pytest.fail("no nodes")


def test_nodes_changed_while_the_operator_was_down(cluster, operator):
    api = Api(cluster)
    api.node("big", "2Ti", 8)
    ms = api.modelserver()
    wait_planned(api)
    before = memory_limit(eventually(api.deployment))
    operator.kill()
    api.node("small", "512Gi", 8)
    operator.start()
    eventually(lambda: memory_limit(api.deployment()) < before, what="re-plan on resume")
    assert memory_limit(api.deployment()) == planned_limit(ms, *api_nodes(api))


def test_hub_fetch_with_the_token_from_the_secret(cluster, operator):
    api = Api(cluster)
    api.node("a")
    api.core.create_namespaced_secret(api.namespace, {"metadata": {"name": "hf"}, "data": {
        "token": base64.b64encode(HUB_TOKEN.encode()).decode()}})
    api.modelserver(model="acme/private-8b", hfTokenSecretRef={"name": "hf"})
    wait_planned(api)
    assert api.condition("Planned")["status"] == "True", api.condition("Planned")
    container, = api.deployment()["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "acme/private-8b"
    api.modelserver(name="nokey", model="acme/private-8b")
    eventually(lambda: (c := api.condition("Planned", "nokey")) and c["reason"] == "ModelGeometryUnknown")
