"""`spillway route` as a public endpoint under a sustained mixed attack: does it stay within the memory limit the
operator renders for it, keep `/health` answering, and give every client an answer or an error in time?

Two stand-in pods (aiohttp, in a process of their own) behind `spillway route` as its own process, with the
record's budget the operator renders at its least (`--index-bytes` 16 MiB) and so the smallest memory limit it
renders (controller/routing_objects.py router_memory_bytes). For `--seconds`, at once:

- huge bodies: 15 MiB of token ids each (the cap is 16 MiB), as many in flight as the router may hold and one more;
- deep JSON: chat bodies nesting 1,000 deep (a 400);
- long prompts: 32K-token prompts, each of another prefix, filling the record;
- slowloris: connections sending a request's headers a byte a second (closed at the header timeout);
- slow readers: streamed answers of 32 MB that the client never reads (cut at the write timeout);
- many connections: waves of 2,000 concurrent streams of 10 s each (beyond the connection cap: closed);
- plain clients: small completions, which must keep being answered.

A separate process reads `/health` every 100 ms (5 s timeout) and the router's RSS (every 100 ms) and its
sockets' kernel buffers (`ss -tm`, every 2 s). Each client has a deadline: the router's timeout for what it
does, plus 10 s; a client that got neither an answer nor an error (a close or reset) by then is counted.

    nice -n 10 .venv/bin/python bench/router-attack/attack.py [--seconds 60] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import platform
import queue
import random
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from spillway.controller.routing_objects import router_memory_bytes
from spillway.core import routing
from support.vllm_server import free_port

BLOCK = 16
INDEX_BYTES = routing.ROUTER_MIN_INDEX_BYTES
SLACK_S = 10.0
TCP_ESTABLISHED = 1  # struct tcp_info: tcpi_state, its first byte
TCPI_LAST_DATA_RECV = 52  # its tcpi_last_data_recv (ms since data last arrived)
ANSWER = b'{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a"}]}'


# -- the stand-in pods ----------------------------------------------------------------------------------------

def _serve_pods(ports: list[int]) -> None:
    from aiohttp import web

    async def completion(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind = request.headers.get("X-Bench-Answer", "small")
        if kind == "small":
            return web.Response(body=ANSWER, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            if kind == "tokens":  # a generation: an event every 0.5 s for 10 s
                for i in range(20):
                    await response.write(b'data: {"choices":[{"text":"t%d"}]}\n\n' % i)
                    await asyncio.sleep(0.5)
            else:  # "big": 32 MB as fast as the router takes it
                chunk = b"data: " + b"x" * 16_370 + b"\n\n"
                for _ in range(2048):
                    await response.write(chunk)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            pass  # the router cut the client's answer, and so this one
        return response

    async def empty(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def main() -> None:
        for port in ports:
            app = web.Application(client_max_size=64 << 20)
            app.router.add_post("/v1/completions", completion)
            app.router.add_post("/v1/chat/completions", completion)
            app.router.add_get("/metrics", empty)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()

    import logging

    import uvloop
    logging.disable(logging.CRITICAL)
    uvloop.run(main())


# -- the observer ----------------------------------------------------------------------------------------------

def _socket_bytes(pid: int) -> int:
    """The kernel buffers (receive, send, queued) of the process's TCP sockets, from `ss -tmp`."""
    out = subprocess.run(["ss", "-tmnpH"], capture_output=True, text=True, check=False).stdout.splitlines()
    total = 0
    for line, nxt in itertools.pairwise(out):
        if f"pid={pid}," in line:
            m = re.search(r"skmem:\(r(\d+),rb\d+,t(\d+),tb\d+,f\d+,w(\d+)", nxt)
            if m:
                total += sum(int(g) for g in m.groups())
    return total


def _observe(pid: int, ports: dict[str, int], seconds: float, out) -> None:
    import http.client
    rss_peak = sock_peak = sum_peak = 0
    last_sock = 0
    health: dict[str, list[float]] = {name: [] for name in ports}
    failures: dict[str, Counter] = {name: Counter() for name in ports}
    gone = False
    end = time.monotonic() + seconds
    next_ss = 0.0
    while time.monotonic() < end:
        try:
            found = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
        except OSError:
            found = None
        if found is None:  # gone, or a zombie: the router died
            gone = True
            break
        rss = int(found.group(1)) * 1024
        rss_peak = max(rss_peak, rss)
        if time.monotonic() >= next_ss:
            last_sock = _socket_bytes(pid)
            sock_peak = max(sock_peak, last_sock)
            next_ss = time.monotonic() + 2.0
        sum_peak = max(sum_peak, rss + last_sock)
        start = time.monotonic()
        for name, port in ports.items():
            began = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", routing.ROUTER_HEALTH_PATH)
                answer = conn.getresponse()
                answer.read()
                conn.close()
                if answer.status != 200:
                    failures[name][f"status {answer.status}"] += 1
            except OSError as exc:
                failures[name][exc.__class__.__name__] += 1
            health[name].append(time.monotonic() - began)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - start)))
    try:
        hwm = re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        hwm = None
    out.put({"rss_peak": rss_peak, "vm_hwm": int(hwm.group(1)) * 1024 if hwm else None, "socket_peak": sock_peak,
             "rss_plus_sockets_peak": sum_peak, "health": health, "router_gone": gone,
             "health_failures": {name: dict(f) for name, f in failures.items()}})


# -- the attackers -------------------------------------------------------------------------------------------------

def _request(body: bytes, answer: str = "small", path: str = "/v1/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
            f"X-Bench-Answer: {answer}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


class Tally:
    def __init__(self) -> None:
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.late: dict[str, int] = Counter()
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def add(self, kind: str, outcome: str, took: float) -> None:
        self.outcomes[kind][outcome] += 1
        self.seconds[kind].append(took)
        if outcome == "nothing":
            self.late[kind] += 1


async def _exchange(port: int, kind: str, data: bytes, deadline_s: float, tally: Tally, *,
                    read: bool = True, trickle: float | None = None, small_buffer: bool = False) -> None:
    """One client: send `data` (a byte every `trickle` s, when given), then read the status line and (with
    `read`) the whole answer. Its outcome: "answer <status>", "error" (the router closed or reset it), or
    "nothing" when neither came within deadline_s."""
    start = time.monotonic()
    writer = None
    outcome = "nothing"
    try:
        async with asyncio.timeout(deadline_s):
            try:
                sock = socket.socket()
                if small_buffer:  # a client that takes nothing: its own window closes at once
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                reader, writer = await asyncio.open_connection(sock=sock)
                if trickle is None:
                    writer.write(data)
                    await writer.drain()
                else:
                    for i in range(len(data)):
                        if writer.transport.is_closing():
                            raise ConnectionResetError
                        writer.write(data[i:i + 1])
                        await writer.drain()
                        await asyncio.sleep(trickle)
                if not read:
                    # Never read: the router must cut the connection (a reset: the socket leaves ESTABLISHED)
                    # within its write timeout of the last data it could send; past that (+ slack), nothing.
                    while True:
                        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                        if info[0] != TCP_ESTABLISHED:
                            outcome = "error"
                            return
                        got_data = reader._buffer  # what the stream took before it paused
                        idle_s = struct.unpack_from("I", info, TCPI_LAST_DATA_RECV)[0] / 1e3
                        if got_data and idle_s > routing.ROUTER_WRITE_TIMEOUT_S + SLACK_S:
                            return  # nothing
                        await asyncio.sleep(0.5)
                line = await reader.readline()
                if not line:
                    outcome = "error"
                    return
                status = line.split()[1].decode() if len(line.split()) > 1 else "?"
                while await reader.read(1 << 16):
                    pass
                outcome = f"answer {status}"
            except (ConnectionError, OSError, RuntimeError, asyncio.IncompleteReadError):  # RuntimeError: closed
                outcome = "error"
    except TimeoutError:
        outcome = "nothing"
    finally:
        tally.add(kind, outcome, time.monotonic() - start)
        if writer is not None:
            writer.transport.abort()


async def _attack(port: int, seconds: float, tally: Tally) -> None:
    rng = random.Random(7)
    end = time.monotonic() + seconds
    huge = _request(json.dumps({"model": "m", "prompt": list(range(100_000, 100_000 + 1_900_000))}).encode())
    assert len(huge) < routing.ROUTER_MAX_BODY_BYTES
    deep = _request(b'{"model":"m","messages":[{"role":"user","content":' + b"[" * 1000 + b"]" * 1000 + b"}]}",
                    path="/v1/chat/completions")
    first_byte = routing.ROUTER_FIRST_BYTE_TIMEOUT_S
    bodies_deadline = routing.ROUTER_BODY_TIMEOUT_S + SLACK_S

    async def loop(kind: str, make, deadline: float, pause: float = 0.0, **kw) -> None:
        while time.monotonic() < end:
            await _exchange(port, kind, make(), deadline, tally, **kw)
            await asyncio.sleep(pause)

    def long_prompt() -> bytes:
        base = rng.randrange(1 << 30)
        return _request(json.dumps({"model": "m", "prompt": [base + i for i in range(32_768)]}).encode())

    def plain() -> bytes:
        return _request(json.dumps({"model": "m", "prompt": [rng.randrange(50)] * 64 + [1, 2, 3]}).encode())

    def stream() -> bytes:
        return _request(json.dumps({"model": "m", "prompt": [rng.randrange(50)] * 64, "stream": True}).encode(),
                        "tokens")

    async def waves() -> None:  # 2,000 concurrent streams, again and again
        while time.monotonic() < end:
            await asyncio.gather(*(_exchange(port, "many connections", stream(), 10 + bodies_deadline, tally)
                                   for _ in range(2000)))
            await asyncio.sleep(2)

    # As many as the router may hold at once (routing.ROUTER_BODY_BUDGET_BYTES), and one more.
    tasks = [loop("huge body", lambda: huge, bodies_deadline)
             for _ in range(routing.ROUTER_BODY_BUDGET_BYTES // len(huge) + 1)]
    tasks += [loop("deep JSON", lambda: deep, bodies_deadline, 0.05) for _ in range(2)]
    tasks += [loop("long prompt", long_prompt, bodies_deadline) for _ in range(4)]
    tasks += [loop("slowloris", lambda: _request(b"{}"), routing.ROUTER_HEADER_TIMEOUT_S + SLACK_S, trickle=1.0)
              for _ in range(200)]
    tasks += [loop("slow reader", lambda: _request(b'{"model":"m","prompt":[1,2,3],"stream":true}', "big"),
                   first_byte + routing.ROUTER_WRITE_TIMEOUT_S + SLACK_S, read=False, small_buffer=True)
              for _ in range(200)]
    tasks += [loop("plain", plain, min(first_byte, 30.0), 0.02) for _ in range(4)]
    tasks.append(waves())
    await asyncio.gather(*tasks)


def _attackers(port: int, seconds: float, out) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (20_000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    tally = Tally()
    import uvloop
    uvloop.run(_attack(port, seconds, tally))
    out.put({"outcomes": {k: dict(v) for k, v in tally.outcomes.items()}, "nothing_in_time": dict(tally.late),
             "max_seconds": {k: max(v) for k, v in tally.seconds.items()}})


# -- the run ---------------------------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--log", type=Path, help="write the router's log here")
    args = parser.parse_args()

    pod_ports = [free_port(), free_port()]
    pods = multiprocessing.Process(target=_serve_pods, args=(pod_ports,), daemon=True)
    pods.start()
    port, metrics_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        workers = Path(tmp) / "workers"
        workers.write_text("".join(f"http://127.0.0.1:{p}\n" for p in pod_ports))
        log = open(Path(tmp) / "router.log", "w+")  # noqa: SIM115 (read back after the router has gone)
        router = subprocess.Popen(
            [sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(workers), "--block-size",
             str(BLOCK), "--index-blocks", str(1 << 30), "--index-bytes", str(INDEX_BYTES), "--host", "127.0.0.1",
             "--port", str(port), "--metrics-port", str(metrics_port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or router.poll() is not None:
                    raise SystemExit("the router never became ready")
                time.sleep(0.2)
            idle_rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{router.pid}/status").read_text()).group(1))
            results: multiprocessing.Queue = multiprocessing.Queue()
            # The observer outlasts the attack by the longest deadline, so every client is seen to its end.
            tail = routing.ROUTER_BODY_TIMEOUT_S + 2 * SLACK_S
            probed = {"metrics port (readiness probe)": metrics_port, "API port": port}
            observer = multiprocessing.Process(target=_observe, args=(router.pid, probed, args.seconds + tail, results))
            attackers = multiprocessing.Process(target=_attackers, args=(port, args.seconds, results))
            observer.start()
            attackers.start()
            got = []
            while len(got) < 2:
                try:
                    got.append(results.get(timeout=5))
                except queue.Empty:
                    codes = (observer.exitcode, attackers.exitcode)
                    if any(code not in (None, 0) for code in codes) or None not in codes:
                        raise SystemExit(f"the observer or the attackers failed (exit {codes})") from None
            observer.join()
            attackers.join()
            alive = router.poll() is None
        finally:
            router.terminate()
            router.wait(timeout=20)
            pods.terminate()
            log.seek(0)
            router_log = log.read()
            if args.log:
                args.log.write_text(router_log)
    seen = {k: v for part in got for k, v in part.items()}
    health = seen.pop("health")
    limit = router_memory_bytes(INDEX_BYTES)
    report = {
        "seconds": args.seconds,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), load {os.getloadavg()[0]:.1f}",
        "rendered_memory_limit_bytes": limit,
        "idle_rss_bytes": idle_rss * 1024,
        "peak_rss_bytes": seen["rss_peak"],
        "vm_hwm_bytes": seen["vm_hwm"],
        "peak_socket_buffer_bytes": seen["socket_peak"],
        "peak_rss_plus_sockets_bytes": seen["rss_plus_sockets_peak"],
        "rss_within_limit": seen["rss_peak"] <= limit and (seen["vm_hwm"] or 0) <= limit,
        "health": {name: {"probes": len(times), "p50_s": _pct(times, 50), "p99_s": _pct(times, 99),
                          "max_s": max(times), "over_1s": sum(t > 1.0 for t in times),
                          "failures": seen["health_failures"][name]} for name, times in health.items()},
        "router_died": seen["router_gone"],
        "clients": seen["outcomes"],
        "clients_without_answer_or_error_in_time": sum(seen["nothing_in_time"].values()),
        "without_answer_by_kind": seen["nothing_in_time"],
        "client_max_seconds": seen["max_seconds"],
        "router_alive_after": alive,
        "router_tracebacks": router_log.count("Traceback"),
        "router_log_lines": len(router_log.splitlines()),
        "router_log_tail": router_log.splitlines()[-5:],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    mib = 1 << 20
    print(f"\npeak RSS {seen['rss_peak'] / mib:.0f} MiB (+ {seen['socket_peak'] / mib:.0f} MiB socket buffers) vs "
          f"rendered limit {limit / mib:.0f} MiB")
    for name, h in report["health"].items():
        print(f"/health on the {name}: p50 {h['p50_s'] * 1e3:.1f} ms, p99 {h['p99_s'] * 1e3:.1f} ms, "
              f"max {h['max_s'] * 1e3:.1f} ms, failed {sum(h['failures'].values())} of {h['probes']}")
    print(f"clients without an answer or error in time: {report['clients_without_answer_or_error_in_time']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
