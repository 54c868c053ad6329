"""`spillway route` as its own process over stand-in workers (stdlib HTTP servers that record what reaches them):
prompts of one prefix reach one worker and new prefixes spread; a streamed answer passes through whole; a
worker that is gone is a 502, not a hung client; the worker set follows a file without a restart (the index of
the others kept); /health says whether there is a worker; and bad settings are refused with a message."""
from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from spillway.commands.route import Router, SettledWorkersFile, read_workers_file
from spillway.core import affinity, routing
from support.vllm_server import free_port

BLOCK = 16


class _Worker(http.server.ThreadingHTTPServer):
    def __init__(self):
        self.seen: list[tuple[str, str | None, bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((self.path, self.headers.get("Authorization"), body))
                if b'"stream": true' in body:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(3):
                        data = f"data: {json.dumps({'i': i})}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        time.sleep(0.05)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                answer = json.dumps({"worker": outer.url, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Router:
    def __init__(self, workers_file: Path, *extra: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(workers_file), "--block-size",
             str(BLOCK), "--host", "127.0.0.1", "--port", str(self.port), "--metrics-port", str(self.metrics_port),
             "--poll-seconds", "0.2", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def health(self) -> int:
        try:
            with urllib.request.urlopen(self.url(routing.ROUTER_HEALTH_PATH), timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def wait(self, status: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[0]
            try:
                if self.health() == status:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"/health never answered {status}")

    def post(self, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url("/v1/completions"), data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}{routing.ROUTER_METRICS_PATH}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def stop(self) -> str:
        self.proc.terminate()
        return self.proc.communicate(timeout=20)[0]


@pytest.fixture
def workers():
    started = [_Worker() for _ in range(3)]
    yield started
    for w in started:
        w.shutdown()
        w.server_close()


def _prompt(prefix: int, suffix: int) -> dict:
    return {"model": "m", "max_tokens": 1, "prompt": [prefix] * (4 * BLOCK) + [suffix] * 5}


def _samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, its labels) -> value, as Prometheus reads the router's /metrics."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition) for sample in family.samples}


def _sample(exposition: str, name: str, **labels: str) -> float | None:
    return _samples(exposition).get((name, frozenset(labels.items())))


def _served(workers) -> list[int]:
    return [sum(1 for path, _, _ in w.seen if path == "/v1/completions") for w in workers]


def _owners(urls: list[str], prefixes) -> dict[int, str]:
    """Where the policy places each prefix over these workers (core/affinity.py, as the router runs it)."""
    index = affinity.AffinityIndex(affinity.AffinitySettings(block_tokens=BLOCK, index_blocks=64))
    index.sync(urls)
    return {p: index.choose(affinity.prompt_blocks(_prompt(p, 0), BLOCK), {}).replica for p in prefixes}


def test_prefixes_stick_spread_and_follow_pod_changes(workers, tmp_path):
    listed = tmp_path / "workers"
    listed.write_text(f"{workers[0].url}\n# a comment\n{workers[1].url}\n")
    router = _Router(listed)
    prefixes = range(24)
    try:
        router.wait(200)
        where = {}
        for suffix in range(2):
            for prefix in prefixes:
                status, body = router.post(_prompt(prefix, suffix))
                assert status == 200
                where.setdefault(prefix, set()).add(json.loads(body)["worker"])
        assert all(len(w) == 1 for w in where.values()), where  # each prefix on one worker
        two = {p: next(iter(w)) for p, w in where.items()}
        assert two == _owners([workers[0].url, workers[1].url], prefixes)  # the ring's owners
        assert _served(workers)[2] == 0 and min(_served(workers)[:2]) > 0
        listed.write_text("\n".join(w.url for w in workers) + "\n")  # a third pod became ready
        time.sleep(1.0)
        three = {p: json.loads(router.post(_prompt(p, 9))[1])["worker"] for p in prefixes}
        assert three == _owners([w.url for w in workers], prefixes)
        moved = [p for p in prefixes if three[p] != two[p]]
        assert moved and all(three[p] == workers[2].url for p in moved)  # the new pod takes its arcs at once
        metrics = router.metrics()
        assert _sample(metrics, routing.ROUTER_METRIC_REQUESTS, worker=workers[2].url, decision="new") == len(moved)
        assert _sample(metrics, routing.ROUTER_METRIC_WORKERS) == 3
        assert _sample(metrics, routing.ROUTER_METRIC_PROMPT_BLOCKS, worker=workers[0].url) == 4 * _served(workers)[0]
        assert _sample(metrics, routing.ROUTER_METRIC_IN_FLIGHT, worker=workers[0].url) == 0
        assert not any(name.endswith("_created") for name, _ in _samples(metrics))
        listed.write_text("")  # no ready pod: not ready, nothing crashes
        router.wait(503)
        status, body = router.post(_prompt(1, 1))
        assert status == 503 and b"no ready vLLM pod" in body
        # The pods that left take their series with them; the count of workers stays, at 0.
        assert _samples(router.metrics()) == {(routing.ROUTER_METRIC_WORKERS, frozenset()): 0}
    finally:
        log = router.stop()
    assert "the others keep their arcs of the ring" in log


def test_a_workers_file_caught_half_rewritten_moves_no_pod(tmp_path):
    """CI caught the router reading the file of the test above while it was rewritten in place: the pods it
    missed left the ring for a poll and came back with their counters from 0."""
    listed = tmp_path / "workers"
    a, b, c = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"
    listed.write_text(f"{a}\n{b}\n")
    settled = SettledWorkersFile(listed)
    assert settled() == [a, b]  # the first read is taken at once
    listed.write_text(f"{a}\n")  # the moment of a rewrite in place: cut short
    assert read_workers_file(listed) == [a]  # what one read alone would have taken
    assert settled() == [a, b]
    listed.write_text(f"{a}\n{b}\n{c}\n")  # the rewrite done
    assert settled() == [a, b]  # not yet: it differs from the read before
    assert settled() == [a, b, c]  # two reads agree
    listed.write_text("")
    assert settled() == [a, b, c] and settled() == []  # an emptied file is a change like any other


def test_streams_pass_through_and_tokens_are_the_clients(workers, tmp_path):
    listed = tmp_path / "workers"
    listed.write_text(workers[0].url)
    router = _Router(listed)
    try:
        router.wait(200)
        status, body = router.post({**_prompt(1, 1), "stream": True}, {"Authorization": "Bearer client-key"})
        assert status == 200 and body.count(b"data: ") == 3, body
        assert router.post(_prompt(1, 2))[0] == 200
        # The client's own token reaches the pod (which checks it, spec.apiKeySecretRef); the router adds none.
        assert [auth for path, auth, _ in workers[0].seen if path == "/v1/completions"] == ["Bearer client-key", None]
        with urllib.request.urlopen(router.url("/v1/models"), timeout=5) as response:  # an OpenAI route
            assert json.loads(response.read())["path"] == "/v1/models"
    finally:
        router.stop()


def test_a_gone_worker_is_a_502(tmp_path):
    listed = tmp_path / "workers"
    listed.write_text(f"http://127.0.0.1:{free_port()}\n")  # nothing listens there
    router = _Router(listed)
    try:
        router.wait(200)
        status, body = router.post(_prompt(1, 1))
        assert status == 502 and b"answered" in body and b"127.0.0.1" not in body
        worker = listed.read_text().strip()
        assert _sample(router.metrics(), routing.ROUTER_METRIC_UPSTREAM_ERRORS, worker=worker) == 1
        assert _sample(router.metrics(), routing.ROUTER_METRIC_RETRIES, worker=worker) == 1
    finally:
        router.stop()


@pytest.mark.parametrize("args, message", [
    (["--block-size", "0"], "block_tokens must be"),
    (["--load-factor", "0.5"], "load_factor must be"),
    (["--load-factor", "nan"], "load_factor must be"),
    (["--poll-seconds", "NaN"], "--poll-seconds must be"),
    (["--poll-seconds", "inf"], "--poll-seconds must be"),
    (["--read-timeout", "-1"], "--read-timeout must be"),
    (["--port", "70000"], "--port must be"),
    (["--replicas", "not a name!"], "is not a DNS name"),
])
def test_bad_settings_are_refused_with_a_message(args, message, tmp_path):
    listed = tmp_path / "workers"
    listed.write_text("")
    base = ["--block-size", "16"] if "--block-size" not in args else []
    source = [] if "--replicas" in args else ["--workers-file", str(listed)]
    done = subprocess.run([sys.executable, "-m", "spillway.cli", "route", *source, *base, *args],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_routers_in_one_process_keep_their_own_series():
    """Each Router has a registry of its own: two in one process neither collide nor see each other's series;
    a worker's series start at 0 when it joins (every decision) and go when it leaves."""
    settings = affinity.AffinitySettings(block_tokens=BLOCK, index_blocks=64)
    first, second = Router(settings, log=lambda _: None), Router(settings, log=lambda _: None)
    first.set_workers(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    second.set_workers(["http://10.0.0.3:8000"])
    first.router_metrics.worker("http://10.0.0.1:8000").requests[affinity.DECISION_PREFIX].inc()
    one, two = first.exposition().decode(), second.exposition().decode()
    assert _sample(one, routing.ROUTER_METRIC_REQUESTS, worker="http://10.0.0.1:8000", decision="prefix") == 1
    assert _sample(one, routing.ROUTER_METRIC_REQUESTS, worker="http://10.0.0.2:8000", decision="overloaded") == 0
    assert _sample(one, routing.ROUTER_METRIC_WORKERS) == 2 and _sample(two, routing.ROUTER_METRIC_WORKERS) == 1
    assert {dict(labels).get("worker") for _, labels in _samples(two)} == {None, "http://10.0.0.3:8000"}
    first.set_workers(["http://10.0.0.2:8000"])
    gone = [key for key in _samples(first.exposition().decode()) if ("worker", "http://10.0.0.1:8000") in key[1]]
    assert not gone
