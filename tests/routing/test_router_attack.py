"""`spillway route` against clients that attack it, as its own process over small real HTTP upstreams: a client
that stops reading a streamed answer is cut after the write timeout and holds bounded memory meanwhile (in
the process and in the kernel's socket buffers); connections beyond the cap and clients that leave mid-body cost no traceback; the readiness probe's /health
answers while the API port is full; and a hostile set of HTTP shapes (odd methods, absurd headers, chunked
tricks, Expect, HTTP/1.0, pipelining, invalid UTF-8, many tiny requests) is answered or closed, never a
traceback or a hang. bench/router-attack/attack.py runs the attacks at once for a minute, with waves of 2,000
concurrent streams."""
from __future__ import annotations

import socket
import struct
import time
import urllib.request

import pytest
from routing.upstreams import (
    RouterProcess,
    Upstream,
    closed,
    half_open,
    prompt,
    socket_buffer_bytes,
    tcp_state,
    workers_file,
)
from spillway.core import routing

ESTABLISHED = 1
STREAM = b'{"model": "m", "prompt": [1, 2, 3], "stream": true}'


def _request(body: bytes, target: str = "/v1/completions") -> bytes:
    return (f"POST {target} HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _stopped_reader(port: int) -> socket.socket:
    """A client that asks for a streamed answer and never reads a byte of it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(_request(STREAM))
    return sock


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.fixture
def big():
    pod = Upstream("big-stream")
    yield pod
    pod.stop()


# -- slow readers -------------------------------------------------------------------------------------------------

def test_a_client_that_stops_reading_is_reset_after_the_write_timeout(big, tmp_path):
    """The answer would take minutes to pass a client that reads nothing; the read timeout (the pod's) is
    never reached, since the pod sends as fast as it may: only a write timeout frees the connection, and the
    pod's. The client sees a reset, not a connection the kernel keeps open to send what was queued."""
    router = RouterProcess(workers_file(tmp_path / "w", big), "--write-timeout", "1", "--read-timeout", "120")
    try:
        sock = _stopped_reader(router.port)
        assert _wait(lambda: big.requests(), 10)
        assert _wait(lambda: tcp_state(sock) != ESTABLISHED, 15), "the stopped reader was never cut"
        with pytest.raises(ConnectionResetError):
            while sock.recv(1 << 16):
                pass
        sock.close()
        assert _wait(lambda: big.cut_off == 1, 10)  # the pod's answer was given up too
        assert router.health() == 200
    finally:
        log = router.stop()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "took nothing" in line]
    assert len(lines) == 1 and "was cut" not in log, log  # the client's doing, not the pod's


def test_stopped_readers_hold_bounded_memory(big, tmp_path):
    """100 clients that stop reading their streams: each held ~1.5 MB of the router's RSS and ~5 MB of
    kernel socket buffers (the kernel grows them for a fast sender) before both were fixed per connection."""
    router = RouterProcess(workers_file(tmp_path / "w", big), "--read-timeout", "120")
    readers = []
    try:
        before = router.peak_rss_bytes()
        readers = [_stopped_reader(router.port) for _ in range(100)]
        assert _wait(lambda: len(big.requests()) == 100, 30)
        time.sleep(2)  # every stream as far as its buffers let it go
        held = socket_buffer_bytes(router.proc.pid)
        grown = router.peak_rss_bytes() - before
        assert held < 40 << 20, held
        assert grown < 60 << 20, grown
        assert router.health() == 200
    finally:
        for sock in readers:
            sock.close()
        router.stop()


# -- many connections -----------------------------------------------------------------------------------------------

def test_connections_beyond_the_cap_cost_no_traceback(tmp_path):
    pod = Upstream()
    router = RouterProcess(workers_file(tmp_path / "w", pod), "--max-connections", "10")
    try:
        socks = half_open(router.port, 60)
        assert sum(closed(s, 0.5) for s in socks[10:]) == 50
        for sock in socks:
            sock.close()
    finally:
        log = router.stop()
        pod.stop()
    assert "Traceback" not in log, log[:2000]


def test_the_readiness_probe_answers_while_the_api_port_is_full(tmp_path):
    pod = Upstream()
    router = RouterProcess(workers_file(tmp_path / "w", pod), "--max-connections", "20", "--header-timeout", "60")
    try:
        socks = half_open(router.port, 20)
        time.sleep(0.5)
        with pytest.raises(OSError):  # the API port takes no more
            router.health()
        url = f"http://127.0.0.1:{router.metrics_port}{routing.ROUTER_HEALTH_PATH}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
        for sock in socks:
            sock.close()
    finally:
        router.stop()
        pod.stop()


def test_a_client_that_leaves_mid_body_is_one_log_line_at_most(tmp_path):
    """Headers and part of a body, then a reset at once: the connection is lost before the body is read."""
    pod = Upstream()
    router = RouterProcess(workers_file(tmp_path / "w", pod))
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", router.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
            sock.close()
        assert router.post(prompt(1, 1))[0] == 200
    finally:
        log = router.stop()
        pod.stop()
    assert "Traceback" not in log, log[:2000]
