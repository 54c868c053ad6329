"""`spillway route` as a public endpoint, as its own process over small real HTTP upstreams (no engine): only the
OpenAI routes pass, whatever the path's spelling; a body's leading bytes only are parsed; headers, bodies and
the pods' answers have timeouts and connections a cap; a cut answer is cut for the client; malformed input is a
4xx with one log line; hop-by-hop headers stop at the router; errors name no internal address; a failed
connection is retried on the next pod, a failing pod's circuit opens, and a pod's restart is noticed."""
from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest
from routing.upstreams import BLOCK, RouterProcess, Upstream, closed, half_open, prompt, workers_file
from spillway.commands import route as R
from spillway.core import routing
from spillway.core import vllm_api as api
from support.vllm_server import free_port


@pytest.fixture
def upstream():
    server = Upstream()
    yield server
    server.stop()


def _log_lines(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


# -- what passes -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, target, status", [
    ("POST", "/invocations", 404),
    ("POST", "/tokenize", 404),
    ("POST", "/v1/%2e%2e/invocations", 404),
    ("POST", "/v1/%2E%2E/tokenize", 404),
    ("POST", "/v1/completions/../../pooling", 404),
    ("POST", "/v1/../score", 404),
    ("POST", "/%2e%2e/v1/../v1/../tokenize", 404),
    ("POST", "/v1%2fcompletions%2f..%2f..%2ftokenize", 404),
    ("POST", "/v1/completions%00", 404),
    ("POST", "/v1\\completions", 404),
    ("GET", "/metrics", 404),
    ("DELETE", "/v1/completions", 405),
    ("GET", "/v1/completions", 405),
    ("POST", "/v1/models", 405),
])
def test_only_the_openai_routes_pass(upstream, tmp_path, method, target, status):
    router = RouterProcess(workers_file(tmp_path / "w", upstream))
    try:
        got, _, body = router.request(method, target, json.dumps(prompt(1, 1)).encode())
        assert got == status, body
        assert [s for s in upstream.seen if not s[1].startswith("/metrics")] == []  # nothing reached the pod
    finally:
        log = router.stop()
    assert len(_log_lines(log, "refused")) == 1 and "Traceback" not in log


@pytest.mark.parametrize("target, forwarded", [
    ("/v1/completions", "/v1/completions"),
    ("/v1/./completions", "/v1/completions"),
    ("/v1/x/../completions", "/v1/completions"),
    ("/v1/%63ompletions", "/v1/completions"),
    ("/v1/chat/completions?stream=1", "/v1/chat/completions?stream=1"),
])
def test_the_pod_gets_the_normalised_path(upstream, tmp_path, target, forwarded):
    router = RouterProcess(workers_file(tmp_path / "w", upstream))
    try:
        assert router.post(prompt(1, 1), target)[0] == 200
        assert [s[1] for s in upstream.seen if not s[1].startswith("/metrics")] == [forwarded]
    finally:
        router.stop()


# -- bodies ---------------------------------------------------------------------------------------------------------

def test_a_huge_body_is_parsed_only_as_far_as_routing_needs(upstream, tmp_path):
    """A 60 MB body of token ids (the router once went from 150 MB to 832 MiB on it, and blocked its loop for
    seconds): it reaches the pod whole, /health keeps answering meanwhile, and RSS stays far below what
    parsing it would take."""
    router = RouterProcess(workers_file(tmp_path / "w", upstream), "--max-body-bytes", str(80 << 20))
    try:
        body = orjson.dumps({"model": "m", "prompt": list(range(100_000, 100_000 + 8_000_000))})
        assert len(body) > 55 << 20
        health: list[float] = []
        done = threading.Event()

        def probe():
            while not done.is_set():
                start = time.monotonic()
                router.health()
                health.append(time.monotonic() - start)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            status, _, _ = router.request("POST", "/v1/completions", body, timeout=60)
        finally:
            done.set()
            prober.join()
        assert status == 200
        assert upstream.requests()[-1][3] == len(body)
        assert max(health) < 1.0, max(health)
        assert router.peak_rss_bytes() < 400 << 20, router.peak_rss_bytes()
    finally:
        router.stop()


def test_routing_reads_the_prompt_of_a_body_cut_to_its_head():
    ids = list(range(50_000))
    for body in ({"model": "m", "prompt": ids, "max_tokens": 3},
                 {"model": "m", "prompt": "t" * 2_000_000},
                 {"model": "m", "messages": [{"role": "system", "content": "s" * 300}] * 5000}):
        raw = orjson.dumps(body)
        head = R.parse_body(raw, cap=64 << 10)
        assert head, body.keys()
        assert R.affinity.prompt_blocks(head, BLOCK) == R.affinity.prompt_blocks(body, BLOCK)


@pytest.mark.parametrize("body", [
    b"{not json",
    b"[]",
    b"",
    b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 1000 + b"]" * 1000 + b"}]}",
    b'{"model": "m", "messages": ' + b'[{"content": ' * 1000 + b'"x"' + b"}]" * 1000 + b"}",
])
def test_malformed_input_is_a_4xx_with_one_log_line(upstream, tmp_path, body):
    router = RouterProcess(workers_file(tmp_path / "w", upstream))
    try:
        status, _, answer = router.request("POST", "/v1/chat/completions", body)
        assert status == 400, answer
        assert upstream.requests("/v1/chat/completions") == []
    finally:
        log = router.stop()
    assert "Traceback" not in log and len(_log_lines(log, "refused")) == 1, log


def test_a_body_above_the_cap_is_refused(upstream, tmp_path):
    router = RouterProcess(workers_file(tmp_path / "w", upstream), "--max-body-bytes", "4096")
    try:
        status, _, _ = router.request("POST", "/v1/completions", b'{"prompt": "' + b"a" * 8000 + b'"}')
        assert status == 413
    finally:
        router.stop()


# -- headers ------------------------------------------------------------------------------------------------------

def test_hop_by_hop_headers_stop_at_the_router(upstream, tmp_path):
    upstream.answer_headers = {"Connection": "X-Internal", "X-Internal": "pod-secret", "Keep-Alive": "timeout=5",
                               "X-End": "kept"}
    router = RouterProcess(workers_file(tmp_path / "w", upstream))
    try:
        status, headers, _ = router.post(prompt(1, 1), headers={
            "Connection": "keep-alive, X-Client-Hop", "X-Client-Hop": "1", "TE": "trailers",
            "Proxy-Authorization": "Basic eA==", "Keep-Alive": "timeout=9", "Authorization": "Bearer k"})
        assert status == 200
        seen = {k.lower(): v for k, v in upstream.requests()[-1][2].items()}
        assert {"x-client-hop", "te", "proxy-authorization", "keep-alive"}.isdisjoint(seen), seen
        assert seen["authorization"] == "Bearer k"
        assert "x-internal" not in headers and headers["x-end"] == "kept"
    finally:
        router.stop()


def test_a_pods_cookie_goes_to_its_client_only(upstream, tmp_path):
    """A pod's Set-Cookie reaches the client it answered; the router keeps none, so no other client's request
    carries it (aiohttp's client keeps a named host's cookies: workers named in a workers file)."""
    upstream.answer_headers = {"Set-Cookie": "session=alice; Path=/"}
    router = RouterProcess(workers_file(tmp_path / "w", upstream.url.replace("127.0.0.1", "localhost")))
    try:
        status, headers, _ = router.post(prompt(1, 0))
        assert status == 200 and headers["set-cookie"] == "session=alice; Path=/"
        assert router.post(prompt(2, 0))[0] == 200
        assert [s[2].get("Cookie") for s in upstream.requests()] == [None, None]
    finally:
        router.stop()


def test_half_sent_headers_are_closed_and_connections_capped(upstream, tmp_path):
    router = RouterProcess(workers_file(tmp_path / "w", upstream), "--header-timeout", "1",
                           "--max-connections", "40")
    try:
        slow = half_open(router.port, 60)
        try:
            assert sum(closed(s, 0.2) for s in slow[40:]) == 20  # beyond the cap: closed as they open
            assert all(closed(s, 5) for s in slow[:40])  # the headers never came: closed
        finally:
            for sock in slow:
                sock.close()
        assert router.health() == 200
        assert router.post(prompt(1, 1))[0] == 200
    finally:
        router.stop()


def test_a_body_that_never_arrives_is_a_408(upstream, tmp_path):
    router = RouterProcess(workers_file(tmp_path / "w", upstream), "--body-timeout", "1")
    try:
        sock = socket.create_connection(("127.0.0.1", router.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        answer = sock.recv(4096)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
    finally:
        router.stop()


# -- answers --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["cut", "cut-stream"])
def test_an_answer_the_pod_cuts_is_cut_for_the_client(tmp_path, mode):
    pod = Upstream(mode)
    router = RouterProcess(workers_file(tmp_path / "w", pod))
    try:
        with pytest.raises((http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError)):
            router.post(prompt(1, 1))
    finally:
        log = router.stop()
        pod.stop()
    assert len(_log_lines(log, "was cut")) == 1


def test_a_pod_that_never_answers_is_a_504_naming_no_address(tmp_path):
    pod = Upstream("hang")
    router = RouterProcess(workers_file(tmp_path / "w", pod), "--first-byte-timeout", "1")
    try:
        status, _, body = router.post(prompt(1, 1))
        assert status == 504 and b"127.0.0.1" not in body and str(pod.server_address[1]).encode() not in body
    finally:
        router.stop()
        pod.stop()


def test_a_stream_that_stalls_is_cut_after_the_read_timeout(tmp_path):
    pod = Upstream("stall-stream")
    router = RouterProcess(workers_file(tmp_path / "w", pod), "--read-timeout", "1")
    try:
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            router.post({**prompt(1, 1), "stream": True})
    finally:
        router.stop()
        pod.stop()


# -- failures and restarts -----------------------------------------------------------------------------------------

def test_a_dead_pod_costs_no_client_error_and_its_circuit_opens(tmp_path):
    live = Upstream()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = RouterProcess(workers_file(tmp_path / "w", live, dead))
    try:
        statuses = [router.post(prompt(p, 0))[0] for p in range(40)]
        assert statuses == [200] * 40  # the dead pod's prefixes were retried on the live one
        metrics = router.metrics()
        retries = [line for line in metrics.splitlines() if line.startswith(routing.ROUTER_METRIC_RETRIES)]
        assert sorted(retries) == sorted([f'{routing.ROUTER_METRIC_RETRIES}{{worker="{dead}"}} 3.0',  # then open
                                          f'{routing.ROUTER_METRIC_RETRIES}{{worker="{live.url}"}} 0.0']), retries
    finally:
        log = router.stop()
        live.stop()
    assert len(_log_lines(log, "its circuit is open")) == 1


def test_a_pod_that_dies_between_requests_costs_no_client_error(tmp_path):
    pods = [Upstream(), Upstream()]
    router = RouterProcess(workers_file(tmp_path / "w", *pods))
    try:
        assert all(router.post(prompt(p, 0))[0] == 200 for p in range(20))
        pods[0].stop()  # its pooled connections are gone too
        assert [router.post(prompt(p, 1))[0] for p in range(20)] == [200] * 20
    finally:
        router.stop()
        pods[1].stop()


def test_a_restarted_pod_is_noticed_and_its_record_forgotten(upstream, tmp_path):
    router = RouterProcess(workers_file(tmp_path / "w", upstream))
    try:
        assert router.post(prompt(1, 0))[0] == 200
        assert router.post(prompt(1, 1))[0] == 200
        upstream.start_time = 2_000.0  # the process started again
        deadline = time.monotonic() + 20
        while routing.ROUTER_METRIC_RESTARTS + f'{{worker="{upstream.url}"}} 1.0' not in router.metrics():
            assert time.monotonic() < deadline, router.metrics()
            time.sleep(0.1)
        assert router.post(prompt(1, 2))[0] == 200
        metrics = router.metrics()
        line = f'{routing.ROUTER_METRIC_REQUESTS}{{decision="new",worker="{upstream.url}"}} 2.0'
        assert line in metrics, metrics  # its first prompt, and the first after the restart
    finally:
        log = router.stop()
    assert len(_log_lines(log, "restarted")) == 1


class _BusyPod:
    """A stand-in vLLM pod whose /metrics shows `running` and `waiting` requests in its engine (what other router
    pods, or clients past the router, have sent it), and records each read of its /metrics; a completion is
    answered at once with the pod's URL."""

    def __init__(self) -> None:
        import http.server

        self.running = self.waiting = 0
        self.reads: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith(api.METRICS_PATH):
                    outer.reads.append(self.path)
                    data = (f'{api.Metric.PROCESS_START_TIME} 1000.0\n'
                            f'{api.Metric.REQUESTS_RUNNING}{{engine="0",model_name="m"}} {outer.running}.0\n'
                            f'{api.Metric.REQUESTS_WAITING}{{engine="0",model_name="m"}} {outer.waiting}.0\n').encode()
                else:
                    data = json.dumps({"worker": outer.url}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def read_again(self) -> None:
        """Until the router has taken a read made after now: a pod's next read starts only when its last one
        is done, so the second read from now means the first was."""
        seen, deadline = len(self.reads), time.monotonic() + 30
        while len(self.reads) < seen + 2:
            assert time.monotonic() < deadline, self.reads[-3:]
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("pods", [3])
def test_a_pods_own_queue_moves_a_prefix_on_until_it_drains(tmp_path, pods):
    """A prefix's pod shows 2 running and 1 waiting that this router pod did not send (another router pod's,
    which it cannot count): its next prompt goes on to the next pod along the ring, as an overloaded decision;
    once the pod's queue drains, the prefix comes back. (A lone router pod uses no report: affinity.py.)"""
    busy = [_BusyPod(), _BusyPod()]
    router = RouterProcess(workers_file(tmp_path / "w", *(b.url for b in busy)), "--load-poll-seconds", "0.05",
                           "--router-pods", str(pods))
    try:
        status, _, body = router.post(prompt(1, 0))
        assert status == 200
        owner = next(b for b in busy if b.url == json.loads(body)["worker"])
        other = next(b for b in busy if b is not owner)
        owner.running, owner.waiting = 2, 1
        owner.read_again()
        status, _, body = router.post(prompt(1, 1))
        assert (status, json.loads(body)["worker"]) == (200, other.url)
        overloaded = f'{routing.ROUTER_METRIC_REQUESTS}{{decision="overloaded",worker="{other.url}"}} 1.0'
        assert overloaded in router.metrics()
        owner.running = owner.waiting = 0
        owner.read_again()
        status, _, body = router.post(prompt(1, 2))
        assert (status, json.loads(body)["worker"]) == (200, owner.url)
    finally:
        router.stop()
        for b in busy:
            b.stop()


@pytest.mark.parametrize("pods", [1, 3])
def test_a_lone_router_pod_reads_the_pods_only_at_their_resolve_pace(tmp_path, pods):
    """Three router pods read each pod's /metrics every --load-poll-seconds for the load report; a lone one uses
    no report, so it reads a pod at --poll-seconds, for its restart marks only."""
    pod = _BusyPod()
    router = RouterProcess(workers_file(tmp_path / "w", pod.url), "--load-poll-seconds", "0.05",
                           "--router-pods", str(pods))  # RouterProcess resolves every 0.2 s
    try:
        assert router.post(prompt(1, 0))[0] == 200
        seen = len(pod.reads)
        time.sleep(2.0)
        reads = len(pod.reads) - seen
    finally:
        router.stop()
        pod.stop()
    if pods == 1:
        assert 3 <= reads <= 14, reads  # about 10 at 0.2 s
    else:
        assert reads >= 20, reads  # about 40 at 0.05 s


def test_a_lone_router_pod_takes_a_restarted_pod_back_before_its_cooldown(tmp_path):
    """A lone router pod reads every pod at --poll-seconds (here 30 s), but a pod whose circuit is open every
    --load-poll-seconds: a pod that failed while it restarted is routed to again as soon as its new process is
    read, not after the circuit's 10 s cooldown or the next read of every pod."""
    pods = [Upstream(), Upstream()]
    port = int(pods[0].url.rsplit(":", 1)[1])
    router = RouterProcess(workers_file(tmp_path / "w", *pods), "--router-pods", "1", "--poll-seconds", "30",
                           "--load-poll-seconds", "0.05")
    back = None
    try:
        owned = [p for p in range(40) if json.loads(router.post(prompt(p, 0))[2])["worker"] == pods[0].url]
        pods[0].stop()
        for p in owned[:3]:  # three refused connections open its circuit; each request is served by the other
            assert router.post(prompt(p, 1))[0] == 200
        back = Upstream(port=port)
        back.start_time = 2_000.0  # a new process
        deadline = time.monotonic() + 5
        while routing.ROUTER_METRIC_RESTARTS + f'{{worker="{pods[0].url}"}} 1.0' not in router.metrics():
            assert time.monotonic() < deadline, "the restart was not read within 5 s"
            time.sleep(0.05)
        status, _, body = router.post(prompt(owned[0], 2))
        assert (status, json.loads(body)["worker"]) == (200, pods[0].url)
    finally:
        log = router.stop()
        pods[1].stop()
        if back is not None:
            back.stop()
    assert len(_log_lines(log, "its circuit is open")) == 1


def test_a_read_does_not_count_this_pods_own_answered_requests_as_anothers():
    """A replica's count is taken while its /metrics is read; requests this pod sends and sees answered in that
    time are in it, though in flight neither when the read began nor when it ended. They are this pod's own,
    not another pod's: a lone router pod that read them as others' passed replicas over on a loaded node."""
    import asyncio

    from aiohttp import web

    async def main() -> tuple[int, int]:
        router = R.Router(R.affinity.AffinitySettings(block_tokens=BLOCK, index_blocks=100), log=lambda _: None)

        async def metrics(request: web.Request) -> web.Response:
            router.sent[worker] += 2  # two of this pod's requests sent to the pod and answered during the read
            running = f'{api.Metric.REQUESTS_RUNNING}{{engine="0"}} 3.0\n'  # with one of another pod's
            return web.Response(text=f"{api.Metric.PROCESS_START_TIME} 1.0\n{running}")

        app = web.Application()
        app.router.add_get(api.METRICS_PATH, metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        worker = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        router.set_workers([worker])
        await router.start()
        try:
            await R.probe(router, worker)
            return router.reports[worker].others, router.in_flight[worker]
        finally:
            await router.close()
            await runner.cleanup()

    assert asyncio.run(main()) == (1, 0)


def test_load_report_sums_every_engine():
    text = (f'{api.Metric.REQUESTS_RUNNING}{{engine="0"}} 2.0\n{api.Metric.REQUESTS_RUNNING}{{engine="1"}} 1.0\n'
            f'{api.Metric.REQUESTS_WAITING}{{engine="0"}} 4.0\n{api.Metric.REQUESTS_WAITING}_other 9.0\n').encode()
    assert R.load_report(text) == 7.0
    assert R.load_report(b"process_start_time_seconds 1.0\n") is None
    assert R.load_report(f"{api.Metric.REQUESTS_RUNNING} NaN\n".encode()) is None


# -- the command line -------------------------------------------------------------------------------------------------

def _route(tmp_path, *args: str) -> subprocess.CompletedProcess:
    listed = workers_file(tmp_path / "w")
    return subprocess.run([sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(listed),
                           "--block-size", "16", "--metrics-port", str(free_port()), *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _route(tmp_path, "--host", "127.0.0.1", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "cannot listen" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1", "::ffff:300.1.1.1", "a" * 300])
def test_a_host_that_cannot_be_listened_on_is_one_line_and_exit_2(tmp_path, host):
    done = _route(tmp_path, "--host", host, "--port", str(free_port()))
    assert done.returncode == 2 and "cannot listen" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
