"""The `helm test` pod's check (charts/spillway/scripts/helm_test.py), run as the pod runs it (`python -c`),
against local HTTP servers standing in for the operator's health endpoint and a model's vLLM server."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from spillway.core import vllm_api
from support.chart_render import CHART

SCRIPT = (CHART / "scripts" / "helm_test.py").read_text()


@contextmanager
def serve(routes: dict[str, tuple[int, str]], ready_after: float = 0.0):
    """An HTTP server answering GET path -> (status, body); 503 for everything until ready_after seconds."""
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = routes.get(self.path, (404, "not found"))
            if time.monotonic() - started < ready_after:
                status, body = 503, "loading"
            payload = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def vllm_routes(served: list[str], metrics: str | None = None) -> dict[str, tuple[int, str]]:
    if metrics is None:
        metrics = (f"# TYPE {vllm_api.Metric.REQUESTS_RUNNING} gauge\n"
                   f'{vllm_api.Metric.REQUESTS_RUNNING}{{engine="0"}} 0.0\n')
    models = {"object": "list", "data": [{"id": name, "object": "model"} for name in served]}
    return {vllm_api.MODELS_PATH: (200, json.dumps(models)), vllm_api.METRICS_PATH: (200, metrics)}


HEALTHY_OPERATOR = {"/healthz": (200, "{}")}


def run_check(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], check=False, capture_output=True, text=True, timeout=timeout + 60)


def test_healthy_install_passes():
    with serve(HEALTHY_OPERATOR) as operator, serve(vllm_routes(["Qwen/Qwen2.5-7B-Instruct"])) as model:
        proc = run_check(f"--operator={operator}/healthz", f"--model=qwen={model}", "--timeout=5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   operator: healthy" in proc.stdout
    assert "ok   model qwen: serves Qwen/Qwen2.5-7B-Instruct; metrics ok" in proc.stdout


def test_operator_only_install_passes():
    with serve(HEALTHY_OPERATOR) as operator:
        proc = run_check(f"--operator={operator}/healthz", "--timeout=5")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_model_still_loading_is_waited_for():
    with serve(HEALTHY_OPERATOR) as operator, serve(vllm_routes(["m"]), ready_after=3) as model:
        proc = run_check(f"--operator={operator}/healthz", f"--model=m={model}", "--timeout=30")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("routes, reason", [
    (vllm_routes(["m"], metrics="# no samples\n"), f"no {vllm_api.Metric.REQUESTS_RUNNING} sample"),
    (vllm_routes([]), "serves no model"),
    ({vllm_api.MODELS_PATH: (200, "<html>"), vllm_api.METRICS_PATH: (200, "")}, "not an OpenAI model list"),
    ({}, "404"),
])
def test_a_broken_model_fails_and_says_why(routes, reason):
    with serve(HEALTHY_OPERATOR) as operator, serve(routes) as model:
        proc = run_check(f"--operator={operator}/healthz", f"--model=m={model}", "--timeout=0")
    assert proc.returncode == 1
    assert "ok   operator" in proc.stdout
    assert "FAIL model m:" in proc.stdout and reason in proc.stdout


def test_an_unreachable_operator_fails():
    with serve({}) as gone:
        pass  # the port is closed again
    proc = run_check(f"--operator={gone}/healthz", "--timeout=0")
    assert proc.returncode == 1 and "FAIL operator" in proc.stdout
