"""`spillway route` as a fleet's front door, on stand-in pods: hit share, per-pod share and queueing with 1 and 3
router pods on a Zipf workload, on scale-up, on a pod's restart and under a hot prefix; and the router's
overhead per request.

The pods are small aiohttp servers in this process, each with an LRU prefix cache of `--pod-blocks` blocks
(what a pool would hold) and a fixed service time with `--slots` requests served at once (vLLM's batch); a
request's hit share is the leading blocks its pod held, the way a CPU-pool hit is counted. The routers are
real `spillway route` processes over them; with 3 routers each request goes to one at random (a Service). So
placement, balance, spills and restarts are the router's own; the hit figures are what an LRU of that size
would give, not an engine's.

    .venv/bin/python bench/routing/fleet.py [--requests 2000] [--out bench/routing/results/fleet.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
BLOCK = 16
PREFIX_BLOCKS = 8
SUFFIX = 5


class Pod:
    def __init__(self, blocks: int, service_s: float, slots: int) -> None:
        self.cache: OrderedDict[tuple, None] = OrderedDict()
        self.blocks, self.service_s = blocks, service_s
        self.slots = asyncio.Semaphore(slots)
        self.start_time = time.time()
        self.served = 0
        self.hit_blocks = self.prompt_blocks = 0
        self.waited = 0.0
        self.runner: web.AppRunner | None = None
        self.port = 0

    def restart(self) -> None:
        self.cache.clear()
        self.start_time = time.time()

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/metrics":
            return web.Response(text=f"process_start_time_seconds {self.start_time}\n")
        body = await request.json()
        ids = body["prompt"]
        keys = [tuple(ids[: (i + 1) * BLOCK]) for i in range(len(ids) // BLOCK)]
        hit = 0
        for key in keys:
            if key not in self.cache:
                break
            hit += 1
        arrived = time.monotonic()
        async with self.slots:
            self.waited += time.monotonic() - arrived
            await asyncio.sleep(self.service_s)
        for key in keys:
            self.cache[key] = None
            self.cache.move_to_end(key)
        while len(self.cache) > self.blocks:
            self.cache.popitem(last=False)
        self.served += 1
        self.hit_blocks += hit
        self.prompt_blocks += len(keys)
        return web.json_response({"ok": True})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset_counts(self) -> None:
        self.served = self.hit_blocks = self.prompt_blocks = 0
        self.waited = 0.0


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Routers:
    def __init__(self, count: int, workers: Path) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(workers), "--block-size",
             str(BLOCK), "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port()),
             "--poll-seconds", "0.5", "--router-pods", str(count)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in self.ports]

    async def ready(self, session: aiohttp.ClientSession) -> None:
        for port in self.ports:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(20)


def zipf_prefixes(count: int, s: float, n: int, rng: random.Random) -> list[int]:
    weights = [1 / (k ** s) for k in range(1, count + 1)]
    return rng.choices(range(count), weights=weights, k=n)


def body(prefix: int, i: int) -> dict:
    return {"model": "m", "max_tokens": 1, "prompt": [prefix + 1] * (PREFIX_BLOCKS * BLOCK) + [10_000 + i] * SUFFIX}


async def drive(session, urls: list[str], prefixes: list[int], concurrency: int, rng: random.Random,
                errors: Counter) -> None:
    queue = list(enumerate(prefixes))

    async def worker():
        while queue:
            i, prefix = queue.pop(0)
            url = rng.choice(urls)
            try:
                async with session.post(f"{url}/v1/completions", json=body(prefix, i)) as r:
                    await r.read()
                    if r.status != 200:
                        errors[r.status] += 1
            except aiohttp.ClientError as exc:
                errors[type(exc).__name__] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def summary(pods: list[Pod], errors: Counter) -> dict:
    served = [p.served for p in pods]
    total = sum(served) or 1
    hit = sum(p.hit_blocks for p in pods) / max(1, sum(p.prompt_blocks for p in pods))
    return {"hit_share": round(hit, 4), "served": served,
            "busiest_over_even": round(max(served) / (total / len(pods)), 2),
            "mean_wait_ms": [round(1000 * p.waited / max(1, p.served), 1) for p in pods],
            "client_errors": dict(errors)}


async def scenario(name: str, args, routers: int, *, pods_n: int = 4, hot: float = 0.0, scale_from: int = 0,
                   restart: bool = False) -> dict:
    rng = random.Random(args.seed)
    pods = [Pod(args.pod_blocks, args.service_ms / 1000, args.slots) for _ in range(pods_n)]
    for pod in pods:
        await pod.start()
    with tempfile.TemporaryDirectory() as tmp:
        workers = Path(tmp) / "workers"
        listed = pods[:scale_from] if scale_from else pods
        workers.write_text("".join(f"{p.url}\n" for p in listed))
        fleet = Routers(routers, workers)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                await fleet.ready(session)
                urls = [f"http://127.0.0.1:{p}" for p in fleet.ports]
                errors: Counter = Counter()
                prefixes = zipf_prefixes(args.prefixes, args.zipf, args.requests, rng)
                if hot:
                    prefixes = [0 if rng.random() < hot else p for p in prefixes]
                half = len(prefixes) // 2
                await drive(session, urls, prefixes[:half], args.concurrency, rng, errors)
                out: dict = {"name": name, "routers": routers, "first_half": summary(pods, errors)}
                if scale_from:
                    workers.write_text("".join(f"{p.url}\n" for p in pods))
                    await asyncio.sleep(1.5)
                if restart:
                    pods[0].restart()
                    await asyncio.sleep(1.5)
                for p in pods:
                    p.reset_counts()
                errors = Counter()
                await drive(session, urls, prefixes[half:], args.concurrency, rng, errors)
                out["second_half"] = summary(pods, errors)
                return out
        finally:
            fleet.stop()
            for pod in pods:
                await pod.runner.cleanup()


async def overhead(args) -> dict:
    """Latency of one request at a time to a pod directly and through one router (the pod answers at once),
    and requests/s through the router at 32 in flight."""
    pod = Pod(10**6, 0.0, 10**6)
    await pod.start()
    with tempfile.TemporaryDirectory() as tmp:
        workers = Path(tmp) / "workers"
        workers.write_text(f"{pod.url}\n")
        fleet = Routers(1, workers)
        try:
            async with aiohttp.ClientSession() as session:
                await fleet.ready(session)
                routed = f"http://127.0.0.1:{fleet.ports[0]}"
                out = {}
                times: dict[str, list[float]] = {"direct": [], "routed": []}
                for i in range(args.overhead_requests):  # alternated: load on the machine hits both alike
                    for name, url in (("direct", pod.url), ("routed", routed)):
                        start = time.perf_counter()
                        async with session.post(f"{url}/v1/completions", json=body(i % 40, i)) as r:
                            await r.read()
                        times[name].append(time.perf_counter() - start)
                for name, seen in times.items():
                    seen.sort()
                    out[f"{name}_median_ms"] = round(1000 * seen[len(seen) // 2], 3)
                out["overhead_median_ms"] = round(out["routed_median_ms"] - out["direct_median_ms"], 3)
                start, n = time.perf_counter(), 2000
                await drive(session, [routed], [i % 40 for i in range(n)], 32, random.Random(0), Counter())
                out["routed_req_per_s_at_32"] = round(n / (time.perf_counter() - start))
                return out
        finally:
            fleet.stop()
            await pod.runner.cleanup()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--prefixes", type=int, default=40)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--pod-blocks", type=int, default=120, help="blocks each pod's cache holds")
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--overhead-requests", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out"}, "scenarios": []}
    for name, routers, kwargs in (("zipf", 1, {}), ("zipf", 3, {}), ("scale-up 2->4", 1, {"scale_from": 2}),
                                  ("scale-up 2->4", 3, {"scale_from": 2}), ("restart", 3, {"restart": True}),
                                  ("hot prefix 60%", 1, {"hot": 0.6}), ("hot prefix 60%", 3, {"hot": 0.6})):
        result = await scenario(name, args, routers, **kwargs)
        print(json.dumps(result), flush=True)
        results["scenarios"].append(result)
    results["overhead"] = await overhead(args)
    print(json.dumps(results["overhead"]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
