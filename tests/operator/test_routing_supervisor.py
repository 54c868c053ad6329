"""`spillway route` against the real vllm-router (PyPI wheel) with stand-in workers (stdlib HTTP servers that
answer /health and record what reaches them): the workers' API key travels over a pipe and is on no command
line nor in the router's environment, and clients' own tokens pass through to the workers; a change of the ready pods goes through the router's worker API with the same
process (its index kept), and the router is started again only when it exits or its API fails."""
from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from spillway.commands.route import RouterWorkers, Supervisor, launch_router, read_api_key
from spillway.core import router_api as R
from support.tools import require_binary
from support.vllm_server import free_port


class _Worker(http.server.ThreadingHTTPServer):
    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}
                                  if "models" in self.path else {"choices": [{"text": "x", "index": 0}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def workers():
    require_binary(R.ROUTER_COMMAND)
    started = [_Worker() for _ in range(3)]
    yield started
    for w in started:
        w.shutdown()
        w.server_close()


def _wait_healthy(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the router exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{R.ROUTER_HEALTH_PATH}", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("vllm-router did not become healthy")


def _listed(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{R.ROUTER_LIST_WORKERS_PATH}", timeout=5) as response:
        return sorted(json.loads(response.read())["urls"])


def _start(urls: list[str], port: int, key: str | None) -> subprocess.Popen:
    """The router as `spillway route` launches it; round_robin, since the stand-ins publish no KV events."""
    args = [R.FLAG_HOST, "127.0.0.1", R.FLAG_PORT, str(port), R.FLAG_POLICY, R.POLICY_ROUND_ROBIN,
            R.FLAG_WORKER_URLS, *urls, R.FLAG_PROMETHEUS_HOST, "127.0.0.1", R.FLAG_PROMETHEUS_PORT, str(free_port()),
            R.FLAG_WORKER_STARTUP_CHECK_INTERVAL, "1"]
    return launch_router(args, key)


def test_the_api_key_reaches_the_workers_and_no_command_line(workers):
    port = free_port()
    proc = _start([workers[0].url], port, "s3cret-key")
    try:
        _wait_healthy(port, proc)
        for visible in ("cmdline", "environ"):  # what `ps e` shows of the process
            assert b"s3cret-key" not in Path(f"/proc/{proc.pid}/{visible}").read_bytes()
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
        for auth in ({}, {"Authorization": "Bearer client-key"}):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json", **auth})
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        # vllm-router 0.1.17 forwards the client's own bearer token and adds none of its own to completions:
        # with spec.apiKeySecretRef, clients send the key to the router as they would to vLLM.
        completions = [auth for path, auth in workers[0].seen if path == "/v1/completions"]
        assert completions == [None, "Bearer client-key"]
    finally:
        proc.terminate()
        proc.wait(20)


def test_pod_changes_go_through_the_worker_api_of_the_same_router(workers):
    port = free_port()
    ips = {w.url: w.url for w in workers}
    answers = [[workers[0].url, workers[1].url], [workers[0].url, workers[1].url, workers[2].url], [workers[2].url]]
    log: list[str] = []
    supervisor = Supervisor(lambda: answers.pop(0), lambda found: _start(found, port, None),
                            workers=RouterWorkers(port), log=log.append, url=lambda ip: ips[ip])
    try:
        supervisor.step()
        first = supervisor.proc
        _wait_healthy(port, first)
        supervisor.step()  # a third pod became ready: added in place
        assert supervisor.proc is first and first.poll() is None and "kept its index" in log[-1]
        assert _listed(port) == sorted(w.url for w in workers)
        supervisor.step()  # two went away: removed in place
        assert supervisor.proc is first and _listed(port) == [workers[2].url]
        first.terminate()
        first.wait(20)
        answers.append([workers[0].url])
        supervisor.step()  # the router exited: started again over the pods there are now
        assert supervisor.proc is not first and "exited" in log[-2]
    finally:
        supervisor.stop_router()


def test_a_failing_worker_api_restarts_the_router():
    class Refusing:
        def add(self, url):
            raise ConnectionRefusedError("router API down")

        def remove(self, url):
            raise ConnectionRefusedError("router API down")

    answers = [["10.0.0.1"], ["10.0.0.1", "10.0.0.2"], OSError("resolver down"), []]

    def discover():
        item = answers.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def launch(found):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *found])

    log: list[str] = []
    supervisor = Supervisor(discover, launch, workers=Refusing(), log=log.append)
    try:
        supervisor.step()
        first = supervisor.proc
        supervisor.step()  # the API refuses: restarted with both
        assert first.poll() is not None and supervisor.proc.args[-2:] == ["10.0.0.1", "10.0.0.2"]
        assert any("worker API failed" in m for m in log)
        second = supervisor.proc
        supervisor.step()  # the resolver fails: the router keeps running
        assert supervisor.proc is second and second.poll() is None and "cannot resolve" in log[-1]
        supervisor.step()  # no ready pod: no router
        assert supervisor.proc is None and second.poll() is not None and "no ready vLLM pod" in log[-1]
    finally:
        supervisor.stop_router()


def test_the_api_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert read_api_key(None) == "from-env"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert read_api_key(key) == "from-file"
    with pytest.raises(SystemExit, match="cannot read --api-key-file"):
        read_api_key(tmp_path / "missing")
    monkeypatch.delenv("VLLM_API_KEY")
    assert read_api_key(None) is None
