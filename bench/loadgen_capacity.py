"""How many requests/s the load generator issues on one core, so it is never the bottleneck it measures.

A canned OpenAI completions server (aiohttp, its own process, on another core where there is one) answers
instantly; the load test's own request path (pre-encoded 512-token bodies, the plan's concurrency, the
same client and worker pool as the throughput experiment) runs pinned to one core. Compare the figure with
the requests/s of a real server: an H100 prefilling Llama-3.1-8B at ~20k tokens/s serves ~40 requests/s of
512 tokens, at 100% hit rate some hundreds.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import socket
import time

from spillway.loadtest.client import OpenAIClient
from spillway.loadtest.plan import Plan
from spillway.loadtest.prompts import PromptSource
from spillway.loadtest.target import Target

PROMPT_TOKENS = 512
REQUESTS = 20_000
CONCURRENCY = (64, 256)


def _canned_server(port: int, ready, cpu: int | None) -> None:
    from aiohttp import web

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    reply = json.dumps({"id": "c", "object": "text_completion", "model": "canned",
                        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1,
                                  "total_tokens": PROMPT_TOKENS + 1}}).encode()
    stream = (b'data: {"choices":[{"index":0,"text":""}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":512,"completion_tokens":1}}\n\ndata: [DONE]\n\n')

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' in body:
            return web.Response(body=stream, content_type="text/event-stream")
        return web.Response(body=reply, content_type="application/json")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "canned", "max_model_len": 1 << 20}]})

    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


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
        await target.send_all("warm", (target.prompts.token_ids(PROMPT_TOKENS, "w", i) for i in range(500)))
        bodies = [client.body(target.prompts.token_ids(PROMPT_TOKENS, "b", i)) for i in range(REQUESTS)]
        cpu_before = time.process_time()
        results, elapsed = await target.send_encoded("bench", bodies)
        cpu = time.process_time() - cpu_before
        assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
        return REQUESTS / elapsed, elapsed, cpu / REQUESTS


def main() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = cpus[0], (cpus[1] if len(cpus) > 1 else None)
    port = _free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_canned_server, args=(port, ready, server_cpu), daemon=True)
    server.start()
    try:
        ready.wait(30)
        time.sleep(0.5)
        os.sched_setaffinity(0, {client_cpu})
        print(f"load generator capacity (one core, canned server{' on another core' if server_cpu is not None else ''}; "
              f"{REQUESTS} requests of {PROMPT_TOKENS} token ids)")
        for concurrency in CONCURRENCY:
            rate, elapsed, cpu = asyncio.run(_measure(f"http://127.0.0.1:{port}", concurrency))
            print(f"  concurrency {concurrency:4d}: {rate:6.0f} requests/s issued ({elapsed:.1f} s wall, bounded by the "
                  f"canned server too); load generator CPU {cpu * 1e6:.0f} us/request = capacity "
                  f"{1 / cpu:.0f} requests/s ({PROMPT_TOKENS / cpu / 1e6:.2f} M prompt tokens/s) per core")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
