"""The threat model is written down for every chart value, and the hub fetch keeps its token to itself:
never across a redirect to another origin, and Secret reads only where the chart lets the operator
read them (the watched namespaces)."""
from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from harness import REPO, names, spillway

SECURITY = REPO / "docs" / "security.md"
TOKEN = "hf_secret_token"


def _chart_values() -> list[str]:
    table = (REPO / "docs" / "chart.md").read_text().split("<!-- values table: start -->")[1].split(
        "<!-- values table: end -->")[0]
    return re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)


def test_security_doc_states_the_threat_model():
    text = SECURITY.read_text()
    for claim in ("pod-create", "any image", "Secret", "hubFetch", "watchNamespaces", "NetworkPolicy",
                  "automountServiceAccountToken", "apiKeySecretRef", "restricted"):
        assert claim in text, claim


def test_security_doc_says_what_each_chart_value_grants():
    text = SECURITY.read_text()
    values = _chart_values()
    assert len(values) > 20
    missing = [v for v in values if f"`{v}`" not in text]
    assert not missing, f"chart values docs/security.md does not cover: {missing}"


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []
    redirect_to = ""

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to + self.path)
            self.end_headers()
            return
        body = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_hub_token_does_not_follow_a_redirect_to_another_origin():
    cdn_handler = type("Cdn", (_Recorder,), {"seen": [], "redirect_to": ""})
    cdn = _serve(cdn_handler)
    hub_handler = type("Hub", (_Recorder,), {"seen": [], "redirect_to": f"http://localhost:{cdn.server_port}"})
    hub = _serve(hub_handler)
    try:
        env = dict(os.environ, HF_TOKEN=TOKEN, HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}")
        done = spillway("plan", "--model", "acme/private-8b", "--allow-hub", "--node-memory", "2Ti",
                        "--gpus-per-node", "8", "-o", "json", env=env)
    finally:
        hub.shutdown()
        cdn.shutdown()
    assert hub_handler.seen == [("/acme/private-8b/resolve/main/config.json", f"Bearer {TOKEN}")]
    assert cdn_handler.seen and all(auth is None for _, auth in cdn_handler.seen), cdn_handler.seen
    assert done.returncode == 0, done.stderr


def _rbac(values: dict) -> list[tuple[str, str, str]]:
    from support.chart_render import render, require_binary

    require_binary("helm")
    docs = render("helm", values)
    return [(d["kind"], (d.get("metadata") or {}).get("namespace", ""), verb)
            for d in docs if d["kind"] in ("ClusterRole", "Role")
            for rule in d.get("rules") or [] if "secrets" in rule["resources"] for verb in rule["verbs"]]


@pytest.mark.parametrize("namespaces", [[], ["team-a", "team-b"]])
def test_the_chart_grants_secret_reads_in_watched_namespaces_only(namespaces):
    grants = _rbac({"operator": {"hubFetch": {"enabled": True}, "watchNamespaces": namespaces}})
    assert all(kind == "Role" for kind, _, _ in grants), grants
    assert sorted(ns for _, ns, _ in grants) == sorted(namespaces)
    assert {verb for _, _, verb in grants} <= {"get"}


def test_a_secret_the_operator_may_not_read_gets_a_status(tmp_path):
    import kmock
    from harness import Api, EmulatedCluster, Operator

    with EmulatedCluster(tmp_path) as cluster:
        api = Api(cluster)
        api.node("a")
        secret = f"/api/v1/namespaces/{api.namespace}/secrets/hf"
        # The chart grants no Secret reads to an operator serving every namespace: the API server answers 403.
        cluster.call(lambda: cluster.emulator["get", kmock.path(secret)] << 403)
        operator = Operator(cluster.kubeconfig, tmp_path / "kopf.log", {
            names.ENV_RETRY_SECONDS: "1", names.ENV_ALLOW_HUB_FETCH: "true", "HF_ENDPOINT": "http://127.0.0.1:9"}).start()
        try:
            api.modelserver(model="acme/private-8b", hfTokenSecretRef={"name": "hf"})
            planned = api.planned(status="False", reason="ModelGeometryUnknown")
            assert "may not read Secret hf" in planned["message"], planned
        finally:
            operator.kill()
