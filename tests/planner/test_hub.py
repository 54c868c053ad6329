"""The optional hub fetch, against a local HTTP server standing in for the hub (HF_ENDPOINT)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from spillway.adapters.hub import fetch_config
from spillway.adapters.model_config import catalog_config
from spillway.core.errors import ModelGeometryUnknown

CONFIG = catalog_config("meta-llama/Llama-3.1-8B-Instruct")


@pytest.fixture()
def hub():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "Bearer secret":
                self.send_response(401)
                self.end_headers()
                return
            if self.path == "/acme/private-8b/resolve/v2/config.json":
                body = json.dumps(CONFIG).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()


def test_fetch_sends_token_and_revision(hub):
    endpoint, seen = hub
    assert fetch_config("acme/private-8b", "v2", token="secret", endpoint=endpoint) == CONFIG
    assert seen == [("/acme/private-8b/resolve/v2/config.json", "Bearer secret")]


def test_fetch_errors_are_clear(hub, monkeypatch):
    endpoint, _ = hub
    with pytest.raises(ModelGeometryUnknown, match="HTTP 401"):
        fetch_config("acme/private-8b", "v2", token="wrong", endpoint=endpoint)
    with pytest.raises(ModelGeometryUnknown, match="HTTP 404"):
        fetch_config("acme/other", token="secret", endpoint=endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ModelGeometryUnknown, match="no HF_TOKEN"):
        fetch_config("acme/private-8b", endpoint=endpoint)


def test_plan_cli_uses_the_hub_only_when_allowed(hub):
    endpoint, seen = hub
    env = {"HF_ENDPOINT": endpoint, "HF_TOKEN": "secret", "PATH": "/usr/bin:/bin"}
    base = [sys.executable, "-m", "spillway.cli", "plan", "--model", "acme/private-8b", "-o", "json"]
    refused = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert refused.returncode == 2 and "not in Spillway's catalog" in refused.stderr and not seen
    allowed = subprocess.run(base + ["--allow-hub", "--revision", "v2"], capture_output=True, text=True, env=env, check=False,
                             timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["geometry"]["block_bytes"] == 8 * 2**20  # 64-token blocks
