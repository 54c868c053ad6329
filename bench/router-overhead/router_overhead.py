"""What `spillway route` (kv-aware mode's router, a Python proxy) adds to a request, and how many it passes,
against the vLLM project's own router (vllm-router, Rust) on the same requests in the same run.

Three stand-in workers (aiohttp, in their own process, answering a completion at once) behind `spillway route`,
behind vllm-router (`round_robin`, and `cache_aware`, its prefix-tree policy) and behind a bare aiohttp proxy to
one worker (the floor of the stack `spillway route` is built on), each its own process; the
same client sends the same requests to a worker directly and through each router, in turn within every round
(so the machine's load falls on all alike), closed loop at 1 and at 32 in flight, with prompts of 512 and of
32,768 token ids (spillway parses each body and hashes its blocks: 64-token blocks, as the plan's default). It
prints requests/s and the median and p90 latency of each, and each router's added latency per request (medians
over the rounds).

    .venv/bin/python bench/router-overhead/router_overhead.py [--requests 400] [--rounds 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from spillway.core import router_api as R
from support.tools import require_binary
from support.vllm_router import VllmRouter
from support.vllm_server import free_port

BLOCK = 64
WORKERS = 3
ANSWER = json.dumps({"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "a"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


def _serve_workers(ports: list[int]) -> None:
    async def completion(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def main() -> None:
        for port in ports:
            await _start_completions_app(port, completion)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _health(request: web.Request) -> web.Response:  # vllm-router waits for every worker's /health
    return web.Response(text="ok")


async def _start_completions_app(port: int, completion) -> None:
    """An aiohttp server on 127.0.0.1:port answering /v1/completions with `completion` and /health."""
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/completions", completion)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()


def _serve_bare_proxy(port: int, worker: str) -> None:
    """The floor under `spillway route`: an aiohttp server that sends each body to one worker through an
    aiohttp client and returns the answer, with no routing, limits, timeouts or metrics (uvloop, as the
    router runs)."""
    import uvloop

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

        async def completion(request: web.Request) -> web.Response:
            body = await request.read()
            async with session.post(f"{worker}/v1/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as answer:
                return web.Response(body=await answer.read(), status=answer.status, content_type="application/json")

        await _start_completions_app(port, completion)
        await asyncio.Event().wait()

    uvloop.run(main())


async def _closed_loop(url: str, bodies: list[bytes], in_flight: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            while queue:
                body = queue.pop()
                start = time.perf_counter()
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    assert r.status == 200, r.status
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(in_flight)))
        return time.perf_counter() - start, latencies


def _bodies(count: int, tokens: int) -> list[bytes]:
    # 8 shared prefixes of half the prompt, each prompt its own second half: the router finds and records blocks
    return [json.dumps({"model": "m", "max_tokens": 1, "prompt": [i % 8 + 1] * (tokens // 2) +
                        [(i * 7919 + t) % 50000 for t in range(tokens - tokens // 2)]}).encode()
            for i in range(count)]


def _wait(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


VLLM_ROUTER_POLICIES = (R.POLICY_ROUND_ROBIN, R.POLICY_CACHE_AWARE)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, help="the figures as JSON")
    p.add_argument("--baseline", type=Path, metavar="TREE", help="another checkout's root (git archive of a commit "
                   "will do): its `spillway route` runs beside this tree's, as the path \"spillway (baseline)\"")
    args = p.parse_args()
    ports = [free_port() for _ in range(WORKERS)]
    workers = multiprocessing.Process(target=_serve_workers, args=(ports,), daemon=True)
    workers.start()
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    listed = Path(tempfile.mkdtemp(prefix="router-bench-")) / "workers"
    listed.write_text("".join(f"{url}\n" for url in urls))
    port, metrics_port = free_port(), free_port()
    def route(port: int, metrics_port: int, tree: Path | None = None) -> subprocess.Popen:
        # Another tree's package first on the path: the editable install's finder comes after PYTHONPATH.
        env = {**os.environ, "PYTHONPATH": str(tree / "operator")} if tree else None
        return subprocess.Popen([sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(listed),
                                 "--block-size", str(BLOCK), "--host", "127.0.0.1", "--port", str(port),
                                 "--metrics-port", str(metrics_port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)

    router = route(port, metrics_port)
    base_port = free_port()
    baseline = route(base_port, free_port(), args.baseline) if args.baseline else None
    bare_port = free_port()
    bare = multiprocessing.Process(target=_serve_bare_proxy, args=(bare_port, urls[0]), daemon=True)
    bare.start()
    others = [VllmRouter(urls, policy=policy, binary=require_binary(R.ROUTER_COMMAND)) for policy in
              VLLM_ROUTER_POLICIES]
    try:
        _wait(urls[0] + "/health")
        for other in others:
            other.start()
        _wait(f"http://127.0.0.1:{port}/health")
        _wait(f"http://127.0.0.1:{bare_port}/health")
        if baseline:
            _wait(f"http://127.0.0.1:{base_port}/health")
        paths = {"direct": f"{urls[0]}/v1/completions", "spillway": f"http://127.0.0.1:{port}/v1/completions",
                 **({"spillway (baseline)": f"http://127.0.0.1:{base_port}/v1/completions"} if baseline else {}),
                 "aiohttp proxy, no routing": f"http://127.0.0.1:{bare_port}/v1/completions",
                 **{f"vllm-router {o.policy}": o.url("/v1/completions") for o in others}}
        print(f"{'prompt':>8} {'in flight':>9} {'path':>26} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'added':>8}   "
              f"(medians of {args.rounds} rounds of {args.requests} requests)")
        rows = []
        for tokens, count in ((512, args.requests), (32_768, max(40, args.requests // 10))):
            bodies = _bodies(count, tokens)
            for in_flight in (1, 32):
                figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
                for _ in range(args.rounds):
                    for name, url in paths.items():  # side by side, same bodies, in turn
                        elapsed, latencies = asyncio.run(_closed_loop(url, bodies, in_flight))
                        q = statistics.quantiles(latencies, n=10)
                        figures[name].append((count / elapsed, statistics.median(latencies) * 1e3, q[8] * 1e3))
                med = {name: [statistics.median(x[i] for x in rounds) for i in range(3)]
                       for name, rounds in figures.items()}
                for name, (rate, p50, p90) in med.items():
                    added = "" if name == "direct" else f"{p50 - med['direct'][1]:>8.2f}"
                    print(f"{tokens:>8} {in_flight:>9} {name:>26} {rate:>8.0f} {p50:>8.2f} {p90:>8.2f} {added}",
                          flush=True)
                rows.append({"prompt_tokens": tokens, "in_flight": in_flight, **{
                    f"{name}_{k}": round(v, 3) for name, vals in med.items()
                    for k, v in zip(("rps", "p50_ms", "p90_ms"), vals)},
                    **{f"{name}_added_p50_ms": round(vals[1] - med["direct"][1], 3)
                       for name, vals in med.items() if name != "direct"}})
        print(json.dumps(rows))
        if args.out:
            settings = vars(args) | {"out": None, "baseline": args.baseline and str(args.baseline)}
            args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    finally:
        for process in (router, baseline):
            if process is not None:
                process.terminate()
                process.wait(20)
        for other in others:
            other.close()
        bare.terminate()
        workers.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
