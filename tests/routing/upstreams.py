"""Small real HTTP upstreams for `spillway route`'s mechanics (no engine): stdlib servers that answer as a vLLM
pod would, or hang, or cut an answer, or restart, and record what reached them; and the router as its own
process over them."""
from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from spillway.core import routing
from spillway.core import vllm_api as api
from support.vllm_server import free_port

BLOCK = 16


class Upstream(http.server.ThreadingHTTPServer):
    """A stand-in pod. `mode`: "ok" (a JSON answer naming the pod), "hang" (reads the request, never answers),
    "cut" (announces 1,000 bytes, sends 10, closes), "cut-stream" (two chunks, then closes without the last),
    "stall-stream" (one chunk, then nothing), "big-stream" (`big_bytes` of events, as fast as they are taken).
    Its /metrics shows `start_time` as the process start."""

    daemon_threads = True
    request_queue_size = 1024  # a listen backlog for the router's bursts (the stdlib's 5 drops SYNs)

    def __init__(self, mode: str = "ok", port: int = 0) -> None:
        self.mode = mode
        self.start_time = 1_000.0
        self.seen: list[tuple[str, str, dict[str, str], int]] = []  # (method, path, headers, body bytes)
        self.answer_headers: dict[str, str] = {}
        self.big_bytes = 8 << 20
        self.cut_off = 0  # big-stream answers whose reader went away before the end
        self.release = threading.Event()
        outer = self

        self.connections: set[socket.socket] = set()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                outer.connections.add(self.connection)

            def _answer(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == api.METRICS_PATH:
                    text = (f"# TYPE {api.Metric.PROCESS_START_TIME} gauge\n"
                            f"{api.Metric.PROCESS_START_TIME} {outer.start_time}\n").encode()
                    return self._send(200, text, "text/plain")
                outer.seen.append((self.command, self.path, dict(self.headers.items()), len(body)))
                mode = outer.mode
                if mode == "hang":
                    outer.release.wait(60)
                    return
                if mode == "cut":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if mode == "big-stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    data = b"data: " + b"x" * 16_370 + b"\n\n"
                    try:
                        for _ in range(outer.big_bytes // len(data)):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        outer.cut_off += 1
                    self.close_connection = True
                    return
                if mode in ("cut-stream", "stall-stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(2 if mode == "cut-stream" else 1):
                        data = f"data: {i}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    if mode == "stall-stream":
                        outer.release.wait(60)
                    self.close_connection = True
                    return
                self._send(200, json.dumps({"worker": outer.url, "path": self.path}).encode(), "application/json")

            def _send(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for key, value in outer.answer_headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def requests(self, path: str = api.COMPLETIONS_PATH) -> list[tuple[str, str, dict[str, str], int]]:
        return [s for s in self.seen if s[1] == path]

    def stop(self) -> None:
        """Gone as a killed pod is: no new connection, and the open ones (a client's pooled ones) closed."""
        self.release.set()
        self.shutdown()
        self.server_close()
        for sock in list(self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class RouterProcess:
    """`spillway route` over a workers file, as its own process."""

    def __init__(self, workers_file: Path, *extra: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(workers_file), "--block-size",
             str(BLOCK), "--host", "127.0.0.1", "--port", str(self.port), "--metrics-port", str(self.metrics_port),
             "--poll-seconds", "0.2", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._wait_ready()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def health(self) -> int:
        try:
            with urllib.request.urlopen(self.url(routing.ROUTER_HEALTH_PATH), timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[0]
            try:
                if self.health() == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("the router never became ready")

    def request(self, method: str, target: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        """One request with exactly this target (no client-side normalisation); the body read whole."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                conn.putheader(key, value)
            conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def post(self, body: dict, target: str = api.COMPLETIONS_PATH, **kwargs) -> tuple[int, dict[str, str], bytes]:
        return self.request("POST", target, json.dumps(body).encode(), **kwargs)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{routing.ROUTER_METRICS_PATH}",
                                    timeout=5) as response:
            return response.read().decode()

    def peak_rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def stop(self) -> str:
        self.proc.terminate()
        return self.proc.communicate(timeout=20)[0]


def workers_file(path: Path, *upstreams: Upstream | str) -> Path:
    path.write_text("".join(f"{u if isinstance(u, str) else u.url}\n" for u in upstreams))
    return path


def prompt(prefix: int, suffix: int, blocks: int = 4) -> dict:
    return {"model": "m", "max_tokens": 1, "prompt": [prefix] * (blocks * BLOCK) + [suffix] * 5}


def socket_buffer_bytes(pid: int) -> int:
    """What the kernel holds in the process's TCP sockets' buffers (receive, send, queued), from `ss -tmp`."""
    lines = subprocess.run(["ss", "-tmnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    total = 0
    for line, nxt in zip(lines, lines[1:]):  # noqa: RUF007 (pairs, as itertools.pairwise)
        if f"pid={pid}," in line:
            found = re.search(r"skmem:\(r(\d+),rb\d+,t(\d+),tb\d+,f\d+,w(\d+)", nxt)
            if found:
                total += sum(int(g) for g in found.groups())
    return total


def tcp_state(sock: socket.socket) -> int:
    """The socket's TCP state (tcp_info.tcpi_state: 1 established), without reading what it holds."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def half_open(port: int, count: int) -> list[socket.socket]:
    """Connections that send the start of a request's headers and never the rest."""
    out = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        out.append(sock)
    return out


def closed(sock: socket.socket, wait_s: float) -> bool:
    """Whether the peer closed the connection within wait_s."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
