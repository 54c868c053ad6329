"""The Node patch goes out as a JSON merge patch with the pod's token, and errors come back as one line."""
from __future__ import annotations

import json
import threading
import typing
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from spillway.qualify.node import ApiServer, NodePatchFailed, patch_node


class Recorder(BaseHTTPRequestHandler):
    seen: typing.ClassVar[list[dict]] = []
    status = 200

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append({"path": self.path, "type": self.headers["Content-Type"],
                              "auth": self.headers.get("Authorization"), "body": json.loads(body)})
        reply = json.dumps({"kind": "Node", "metadata": {"name": "n"}} if self.status == 200
                           else {"kind": "Status", "message": "nodes is forbidden"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    Recorder.seen, Recorder.status = [], 200
    httpd = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


def test_patch_sends_a_merge_patch_with_the_token(server):
    api = ApiServer(f"http://127.0.0.1:{server.server_port}", token="sa-token")
    body = {"metadata": {"annotations": {"spillway.dev/qualified-dma-gbps": "51.3"}}}
    assert patch_node("gpu-node-1", body, api)["kind"] == "Node"
    assert Recorder.seen == [{"path": "/api/v1/nodes/gpu-node-1", "type": "application/merge-patch+json",
                              "auth": "Bearer sa-token", "body": body}]


def test_a_refused_patch_is_one_clear_error(server):
    Recorder.status = 403
    api = ApiServer(f"http://127.0.0.1:{server.server_port}", token="t")
    with pytest.raises(NodePatchFailed, match="HTTP 403.*forbidden"):
        patch_node("gpu-node-1", {"metadata": {}}, api)


def test_outside_a_pod_there_is_no_api_server(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(NodePatchFailed, match="not running in a pod"):
        ApiServer.in_cluster()


def test_in_cluster_reads_the_service_account(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("abc\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    api = ApiServer.in_cluster(str(tmp_path))
    assert api == ApiServer("https://10.0.0.1:6443", "abc", str(tmp_path / "ca.crt"))
