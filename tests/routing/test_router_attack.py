"""`spillway route` against clients that attack it, as its own process over small real HTTP upstreams: a client
that stops reading a streamed answer is cut after the write timeout and holds bounded memory meanwhile (in
the process and in the kernel's socket buffers); connections beyond the cap and clients that leave mid-body cost no traceback; the readiness probe's /health
answers while the API port is full; and a hostile set of HTTP shapes (odd methods, absurd headers, chunked
tricks, Expect, HTTP/1.0, pipelining, invalid UTF-8, many tiny requests) is answered or closed, never a
traceback or a hang. bench/router-attack/attack.py runs the attacks at once for a minute, with waves of 2,000
concurrent streams."""
from __future__ import annotations

import contextlib
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


# -- HTTP shapes no other test sends -------------------------------------------------------------------------------

def _raw(method: bytes = b"POST", target: bytes = b"/v1/completions", headers: list[bytes] | None = None,
         body: bytes = STREAM, version: bytes = b"HTTP/1.1") -> bytes:
    if headers is None:
        headers = [b"Host: r", b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"%s %s %s\r\n" % (method, target, version) + b"\r\n".join(headers) + b"\r\n\r\n" + body


def _length(body: bytes) -> bytes:
    return b"Content-Length: %d" % len(body)


HOSTILE_SHAPES = {
    "odd method": _raw(method=b"BREW"),
    "CONNECT": b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n",
    "absolute target": _raw(target=b"http://10.0.0.1/v1/completions"),
    "HTTP/1.0": _raw(version=b"HTTP/1.0"),
    "HTTP/0.9": b"GET /health\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "5,000 headers": _raw(headers=[b"Host: r", _length(STREAM)] + [b"X-%d: a" % i for i in range(5000)]),
    "a 200 KB header": _raw(headers=[b"Host: r", _length(STREAM), b"X-Big: " + b"a" * 200_000]),
    "chunked": _raw(headers=[b"Host: r", b"Transfer-Encoding: chunked"],
                    body=b"%x\r\n%s\r\n0\r\n\r\n" % (len(STREAM), STREAM)),
    "a chunk size not hex": _raw(headers=[b"Host: r", b"Transfer-Encoding: chunked"], body=b"zz\r\nab\r\n0\r\n\r\n"),
    "a chunk that never comes": _raw(headers=[b"Host: r", b"Transfer-Encoding: chunked"],
                                     body=b"ffffffffffffffff\r\nab\r\n"),
    "chunked and a length": _raw(headers=[b"Host: r", b"Transfer-Encoding: chunked", b"Content-Length: 5"],
                                 body=b"0\r\n\r\n"),
    "two lengths": _raw(headers=[b"Host: r", b"Content-Length: 3", _length(STREAM)]),
    "a length of 10^20": _raw(headers=[b"Host: r", b"Content-Length: 99999999999999999999"], body=b""),
    "Expect: 100-continue": _raw(headers=[b"Host: r", b"Expect: 100-continue", _length(STREAM)]),
    "Expect: something else": _raw(headers=[b"Host: r", b"Expect: 999-never", _length(STREAM)]),
    "50 pipelined": _raw() * 50,
    "invalid UTF-8 in the body": _raw(body=b'{"prompt": "\xff\xfe\xc3"}'),
    "invalid UTF-8 in the path": _raw(target=b"/v1/\xff\xfecompletions"),
    "invalid UTF-8 in a header": _raw(headers=[b"Host: r", b"X-A: \xff\xfe", _length(STREAM)]),
    "NUL in the path": _raw(target=b"/v1/completions\x00/x"),
    "bare LF": _raw().replace(b"\r\n", b"\n"),
    "a folded header": _raw(headers=[b"Host: r", b"X-A: a", b" folded", _length(STREAM)]),
    "binary garbage": bytes(range(256)) * 100,
    "a 100 KB path": _raw(target=b"/v1/" + b"a" * 100_000),
    "1e400 in the JSON": _raw(body=b'{"prompt": [1e308], "max_tokens": 1e400}'),
    "a 5,000-digit token id": _raw(body=b'{"prompt": [' + b"9" * 5000 + b"]}"),
    "content parts of every type": _raw(target=b"/v1/chat/completions",
                                        body=b'{"messages": [{"role": "user", "content": [{"type": "text", '
                                             b'"text": 5}, null, 7]}]}'),
}


def _answer_or_close(port: int, data: bytes, wait_s: float) -> bytes:
    """What the router sends back until it closes the connection (or `wait_s` passes: the caller fails it)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(wait_s)
    got = b""
    try:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # nothing more comes: an answer or a close is due within the timeouts
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        got += b"<no close>"
    except OSError:
        pass  # reset: closed
    finally:
        sock.close()
    return got


def test_hostile_http_shapes_are_answered_or_closed_with_one_line_each(tmp_path):
    """Each shape gets an HTTP answer or a closed connection within the header and body timeouts; a request
    the parser refuses is a 400 and one log line (aiohttp logs its parser's traceback otherwise); the router
    serves on afterwards."""
    pod = Upstream()
    router = RouterProcess(workers_file(tmp_path / "w", pod), "--header-timeout", "2", "--body-timeout", "2")
    try:
        for name, data in HOSTILE_SHAPES.items():
            got = _answer_or_close(router.port, data, wait_s=15)
            assert not got.endswith(b"<no close>"), (name, got[:200])
            assert not got or got.startswith(b"HTTP/1."), (name, got[:200])
        assert router.health() == 200 and router.post(prompt(1, 1))[0] == 200
    finally:
        log = router.stop()
        pod.stop()
    assert "Traceback" not in log, log[:3000]
    assert log.count("malformed request, answered 400") >= 10, log[:3000]
