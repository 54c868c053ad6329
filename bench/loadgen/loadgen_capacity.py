"""How many requests/s the load generator issues, so it is never the bottleneck it measures.

A stub OpenAI completions server (raw asyncio, its own process, on another core where there is one; it
answers each request with a canned reply as soon as the request's bytes are in) is driven by the load test's
own timed request path (pre-encoded 512-token bodies, connections opened before the clock, the same client and
worker pool as the throughput experiment), pinned to one core. The figure is requests issued per wall second;
the load generator's CPU per request is printed beside it. Compare with a real server: one H200 serving
Llama-3.1-8B at 100% CPU hits takes some hundreds of 512-token requests/s (bench/headline).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time

from spillway.loadtest.client import OpenAIClient
from spillway.loadtest.plan import Plan
from spillway.loadtest.prompts import PromptSource
from spillway.loadtest.target import Target

PROMPT_TOKENS = 512
REQUESTS = 20_000
CONCURRENCY = (64, 256, 800)
GOAL_RPS = 5000  # what the H200 runs need with room to spare (issue: >= 5,000 requests/s of 512 tokens)


def _stub_server(port: int, ready, cpu: int | None) -> None:
    """HTTP/1.1 keep-alive server: POST /v1/completions -> canned completion (streamed when asked)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    reply = json.dumps({"id": "c", "object": "text_completion", "model": "canned",
                        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1,
                                  "total_tokens": PROMPT_TOKENS + 1}}).encode()
    events = (b'data: {"choices":[{"index":0,"text":""}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":512,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply)
    stream = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
              + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))
    models = json.dumps({"object": "list", "data": [{"id": "canned", "max_model_len": 1 << 20}]}).encode()
    models_reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(models), models)
    missing = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"

    class Stub(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.buf = transport, bytearray()

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end]).lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.buf) < end + 4 + length:
                    return
                body = bytes(self.buf[end + 4:end + 4 + length])
                del self.buf[:end + 4 + length]
                if head.startswith(b"post /v1/completions"):
                    self.transport.write(stream if b'"stream":true' in body else plain)
                elif head.startswith(b"get /v1/models"):
                    self.transport.write(models_reply)
                else:
                    self.transport.write(missing)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Stub, "127.0.0.1", port, backlog=4096)
        ready.set()
        await server.serve_forever()

    asyncio.run(serve())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _measure(url: str, concurrency: int) -> tuple[float, float, float]:
    """(requests/s, wall seconds, load-generator CPU seconds per request) of the timed request path."""
    plan = Plan(concurrency=concurrency, seed=1)
    async with OpenAIClient(url, concurrency=concurrency) as client:
        await client.resolve_model(None)
        target = Target(client, plan, PromptSource(1), progress_mode="none")
        await target.send_all("warm", (target.prompts.token_ids(PROMPT_TOKENS, "w", i) for i in range(2000)))
        bodies = [client.body(target.prompts.token_ids(PROMPT_TOKENS, "b", i)) for i in range(REQUESTS)]
        cpu_before = time.process_time()
        results, elapsed = await target.send_encoded("bench", bodies)
        cpu = time.process_time() - cpu_before
        assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
        return REQUESTS / elapsed, elapsed, cpu / REQUESTS


def main() -> int:
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = cpus[0], (cpus[1] if len(cpus) > 1 else None)
    port = _free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_stub_server, args=(port, ready, server_cpu), daemon=True)
    server.start()
    best = 0.0
    try:
        ready.wait(30)
        os.sched_setaffinity(0, {client_cpu})
        print(f"load generator capacity (one core, stub server{' on another core' if server_cpu is not None else ''}; "
              f"{REQUESTS} requests of {PROMPT_TOKENS} token ids; goal >= {GOAL_RPS} requests/s)")
        for concurrency in CONCURRENCY:
            rate, elapsed, cpu = asyncio.run(_measure(f"http://127.0.0.1:{port}", concurrency))
            best = max(best, rate)
            print(f"  concurrency {concurrency:4d}: {rate:6.0f} requests/s issued = {rate * PROMPT_TOKENS / 1e6:.2f} M "
                  f"prompt tokens/s ({elapsed:.2f} s wall); load generator CPU {cpu * 1e6:.0f} us/request")
    finally:
        server.terminate()
        server.join(5)
    verdict = "meets" if best >= GOAL_RPS else "MISSES"
    print(f"  best {best:.0f} requests/s: {verdict} the {GOAL_RPS} requests/s goal (a loaded machine lowers it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
