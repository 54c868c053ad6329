"""`spillway route`: Spillway's prefix-affinity router over a ModelServer's ready vLLM pods.

An OpenAI endpoint that sends each request to one pod by the policy in core/affinity.py: the pod that was sent
the longest run of the prompt's leading blocks, unless it is too far above the least loaded one; a new prefix to
the pod holding the fewest. The router records its own placements as it routes, so it needs no KV events, keeps
what it knows when pods come and go, and knows a prefix from its first prompt on (why not vllm-router's
kv_aware: docs/routing.md).

Pods are found without Kubernetes API access: the ModelServer's headless Service <name>-replicas answers DNS
with the IPs of its ready pods, resolved every few seconds; a new pod joins the index empty, a gone one is
forgotten, the others keep their entries. Without a ready pod /health answers 503, so the router pod is not
ready (the truth) and nothing crash-loops.

The router holds no secret: a client's Authorization header passes through to the pod, which checks it as it
would without the router (spec.apiKeySecretRef), and the router itself asks nothing of the pods.

    spillway route --replicas llama-replicas.team-a.svc --block-size 64 [--index-blocks N] [--max-imbalance K]
    spillway route --workers-file workers.txt --block-size 64     # outside Kubernetes: one URL per line
"""
from __future__ import annotations

import argparse
import asyncio
import re
import signal
import socket
import sys
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path

import orjson
import uvloop
from aiohttp import ClientError, ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from ..core import affinity, routing
from ..core import vllm_api as api
from ..core.errors import InvalidSpec

POLL_SECONDS = 5.0
CONNECT_TIMEOUT_S = 10.0
# A 128K-token prompt as JSON token ids is about 0.8 MB; text and chat bodies with images are larger still.
MAX_BODY_BYTES = 64 << 20
# Headers that belong to one connection (RFC 9110 7.6.1), plus those aiohttp sets for the body it sends.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})


def resolve_ips(host: str) -> list[str]:
    """The addresses DNS gives for `host`, sorted; [] when the name has none (a headless Service without a
    ready pod). Other resolver failures raise OSError."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise
    return sorted({info[4][0] for info in infos})


def worker_url(ip: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{api.SERVER_PORT}"


ROUTER_SAMPLES = (routing.ROUTER_METRIC_REQUESTS, routing.ROUTER_METRIC_MATCHED_BLOCKS,
                  routing.ROUTER_METRIC_PROMPT_BLOCKS, routing.ROUTER_METRIC_UPSTREAM_ERRORS,
                  routing.ROUTER_METRIC_IN_FLIGHT, routing.ROUTER_METRIC_WORKERS)


class _WorkerSeries:
    """One worker's children of the router's metrics, looked up once when it joins: a labelled child costs
    microseconds to find (prometheus_client hashes the label values under a lock), an attribute nanoseconds."""

    __slots__ = ("in_flight", "matched_blocks", "prompt_blocks", "requests", "upstream_errors")

    def __init__(self, metrics: RouterMetrics, worker: str) -> None:
        self.requests = {reason: metrics.requests.labels(worker, reason) for reason in affinity.DECISIONS}
        self.matched_blocks = metrics.matched_blocks.labels(worker)
        self.prompt_blocks = metrics.prompt_blocks.labels(worker)
        self.upstream_errors = metrics.upstream_errors.labels(worker)
        self.in_flight = metrics.in_flight.labels(worker)


class RouterMetrics:
    """The router's series on a registry of its own (several routers in one process do not share them): per
    worker and decision, requests; per worker, prompt blocks, those matched where they were sent before,
    upstream errors and requests in flight; the workers routed over. A worker's series start at 0 when it
    joins (a first increment is a rate, not a new series) and are removed when it leaves: a gone pod's IP is
    not a series forever, and the index forgets it too."""

    def __init__(self, workers: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        worker, decision = routing.ROUTER_LABEL_WORKER, routing.ROUTER_LABEL_DECISION
        r = self.registry
        self.requests = Counter(routing.ROUTER_METRIC_REQUESTS, "Requests routed, per worker and decision "
                                "(prefix, new, overloaded)", [worker, decision], registry=r)
        self.matched_blocks = Counter(routing.ROUTER_METRIC_MATCHED_BLOCKS, "Prompt blocks sent to the worker "
                                      "that was sent them before", [worker], registry=r)
        self.prompt_blocks = Counter(routing.ROUTER_METRIC_PROMPT_BLOCKS, "Prompt blocks routed", [worker],
                                     registry=r)
        self.upstream_errors = Counter(routing.ROUTER_METRIC_UPSTREAM_ERRORS, "Requests the worker did not "
                                       "answer (a 502) or whose answer was cut", [worker], registry=r)
        self.in_flight = Gauge(routing.ROUTER_METRIC_IN_FLIGHT, "Requests in flight to the worker", [worker],
                               registry=r)
        self.workers = Gauge(routing.ROUTER_METRIC_WORKERS, "Ready workers routed over", registry=r)
        self.workers.set_function(workers)
        # The samples served: the counters' <name>_created left out (a second series per counter, which the
        # router's /metrics never had and nothing reads).
        self._exposed = r.restricted_registry(ROUTER_SAMPLES)
        self._series: dict[str, _WorkerSeries] = {}

    def worker(self, worker: str) -> _WorkerSeries:
        series = self._series.get(worker)
        if series is None:
            series = self._series[worker] = _WorkerSeries(self, worker)
        return series

    def set_in_flight(self, worker: str, requests: int) -> None:
        """The worker's gauge, when the worker is routed over (a request that outlived its worker's leaving
        and return sets the new series, not the removed one)."""
        series = self._series.get(worker)
        if series is not None:
            series.in_flight.set(requests)

    def forget(self, worker: str) -> None:
        if self._series.pop(worker, None) is None:
            return
        for reason in affinity.DECISIONS:
            self.requests.remove(worker, reason)
        for metric in (self.matched_blocks, self.prompt_blocks, self.upstream_errors, self.in_flight):
            metric.remove(worker)

    def exposition(self) -> bytes:
        return generate_latest(self._exposed)


class Router:
    """The proxy: one AffinityIndex, the requests in flight per worker, and the router's metrics."""

    def __init__(self, settings: affinity.AffinitySettings, log=print) -> None:
        self.index = affinity.AffinityIndex(settings)
        self.log = log
        self.in_flight: Tally[str] = Tally()  # what the index balances on; the gauge shows it
        self.router_metrics = RouterMetrics(lambda: len(self.index.replicas))
        self.session: ClientSession | None = None

    def set_workers(self, urls: list[str]) -> None:
        added, removed = self.index.sync(urls)
        for worker in removed:
            self.router_metrics.forget(worker)
        for worker in added:
            self.router_metrics.worker(worker).in_flight.set(self.in_flight[worker])  # 0 unless it came back
        if added or removed:
            self.log(f"spillway route: routing over {len(urls)} ready pods (added {added}, removed {removed}; "
                     f"the index of the others is kept)")

    async def start(self) -> None:
        # No total timeout: a long generation streams for minutes. auto_decompress off: bodies pass through
        # byte for byte with their Content-Encoding.
        self.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                                     auto_decompress=False)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get(routing.ROUTER_HEALTH_PATH, self.health)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(routing.ROUTER_METRICS_PATH, self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if not self.index.replicas:
            return web.Response(status=503, text="no ready vLLM pod\n")
        return web.Response(text="ok\n")

    def _choose(self, body: bytes, method: str) -> affinity.Decision:
        parsed = None
        if method == "POST" and body:
            try:
                parsed = orjson.loads(body)  # a 32K-token prompt's ids: 4x faster than json (bench/router-overhead/router_overhead.py)
            except ValueError:
                parsed = None  # not JSON: the worker answers it; routed as a prompt-less request
        return self.index.route(parsed if isinstance(parsed, dict) else {}, self.in_flight)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            decision = self._choose(body, request.method)
        except LookupError:
            return _error(503, "no ready vLLM pod to route to")
        worker = decision.replica
        series = self.router_metrics.worker(worker)
        series.requests[decision.reason].inc()
        series.matched_blocks.inc(decision.matched_blocks)
        series.prompt_blocks.inc(decision.prompt_blocks)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        assert self.session is not None
        response: web.StreamResponse | None = None
        self.in_flight[worker] += 1
        series.in_flight.set(self.in_flight[worker])
        try:
            async with self.session.request(request.method, f"{worker}{request.rel_url}", data=body,
                                            headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        response.headers.add(key, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (TimeoutError, ClientError, OSError) as exc:
            series.upstream_errors.inc()
            if response is not None and response.prepared:
                # The answer had begun (a stream cut by the pod or the client): nothing more can be sent.
                self.log(f"spillway route: a response from {worker} was cut: {exc.__class__.__name__}: {exc}")
                return response
            return _error(502, f"vLLM pod {worker} did not answer: {exc.__class__.__name__}: {exc}")
        finally:
            self.in_flight[worker] -= 1
            self.router_metrics.set_in_flight(worker, self.in_flight[worker])

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), content_type="text/plain", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    def exposition(self) -> bytes:
        """Prometheus text format (prometheus_client's, of the router's own registry)."""
        return self.router_metrics.exposition()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "spillway_router_error", "code": status}},
                             status=status)


async def follow_workers(router: Router, discover: Callable[[], list[str]], poll_s: float,
                         stopped: asyncio.Event) -> None:
    """Resolve the ready pods every poll_s and hand them to the router (the resolver's trouble keeps the set)."""
    loop = asyncio.get_running_loop()
    while not stopped.is_set():
        try:
            urls = await loop.run_in_executor(None, discover)
        except OSError as exc:
            router.log(f"spillway route: cannot resolve the replicas ({exc}); keeping the current pods")
        else:
            if not urls and router.index.replicas:
                router.log("spillway route: no ready vLLM pod; answering 503 until one is ready")
            router.set_workers(urls)
        try:
            await asyncio.wait_for(stopped.wait(), poll_s)
        except TimeoutError:
            pass


async def serve(router: Router, discover: Callable[[], list[str]], *, host: str = "0.0.0.0",
                port: int = routing.ROUTER_PORT, metrics_port: int = routing.ROUTER_METRICS_PORT,
                poll_s: float = POLL_SECONDS, stopped: asyncio.Event | None = None) -> None:
    stopped = stopped or asyncio.Event()
    await router.start()
    runners = [web.AppRunner(router.app(), access_log=None), web.AppRunner(router.metrics_app(), access_log=None)]
    try:
        for runner, bind in zip(runners, (port, metrics_port)):
            await runner.setup()
            await web.TCPSite(runner, host, bind).start()
        await follow_workers(router, discover, poll_s, stopped)
    finally:
        for runner in runners:
            await runner.cleanup()
        await router.close()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("route", help="route a ModelServer's requests to its ready vLLM pods by prefix "
                                            "affinity (the kv-aware router pod's entry point)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--replicas", help="DNS name of the replicas' headless Service (in Kubernetes)")
    source.add_argument("--workers-file", type=Path,
                        help="a file of worker URLs, one per line, read again every --poll-seconds (elsewhere)")
    p.add_argument("--block-size", type=int, required=True, help="the pods' --block-size")
    p.add_argument("--index-blocks", type=int, default=routing.DEFAULT_INDEX_BLOCKS,
                   help="blocks remembered per pod: its GPU and CPU caches' blocks (the operator passes the plan's)")
    p.add_argument("--max-imbalance", type=int, default=routing.DEFAULT_MAX_IMBALANCE,
                   help="requests in flight beyond the least loaded pod at which a prefix's holder is passed over")
    p.add_argument("--port", type=int, default=routing.ROUTER_PORT)
    p.add_argument("--metrics-port", type=int, default=routing.ROUTER_METRICS_PORT)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--poll-seconds", type=float, default=POLL_SECONDS)
    p.set_defaults(func=cmd_route)


DNS_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
MAX_DNS_NAME = 253


def check_dns_name(value: str, flag: str) -> str:
    """A name the resolver can look up (RFC 1123: labels of 1 to 63 characters, 253 in all), else InvalidSpec."""
    name = value.rstrip(".")
    if not name or len(name) > MAX_DNS_NAME or not all(DNS_LABEL.match(label) for label in name.split(".")):
        raise InvalidSpec(f"{flag} {value[:80]!r}{'...' if len(value) > 80 else ''} is not a DNS name (labels of "
                          f"letters, digits and '-' up to 63 characters, {MAX_DNS_NAME} in all)")
    return value


def read_workers_file(path: Path) -> list[str]:
    """The URLs a workers file lists (blank lines and #-comments skipped); OSError when it cannot be read."""
    urls = []
    for line in path.read_text().splitlines():
        url = line.split("#", 1)[0].strip()
        if url:
            if not url.startswith(("http://", "https://")):
                raise OSError(f"{path}: {url[:80]!r} is not an http(s) URL")
            urls.append(url.rstrip("/"))
    return urls


def settings_from(args: argparse.Namespace) -> affinity.AffinitySettings:
    try:
        return affinity.AffinitySettings(block_tokens=args.block_size, index_blocks=args.index_blocks,
                                         max_imbalance=args.max_imbalance)
    except ValueError as exc:
        raise InvalidSpec(f"spillway route: {exc}") from None


def cmd_route(args: argparse.Namespace) -> int:
    if args.replicas is not None:
        check_dns_name(args.replicas, "--replicas")
        discover = lambda: [worker_url(ip) for ip in resolve_ips(args.replicas)]
    else:
        discover = lambda: read_workers_file(args.workers_file)
    settings = settings_from(args)
    router = Router(settings, log=lambda m: print(m, file=sys.stderr, flush=True))

    async def main() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await serve(router, discover, host=args.host,
                    port=args.port, metrics_port=args.metrics_port, poll_s=args.poll_seconds, stopped=stopped)

    uvloop.run(main())  # the proxy's event loop is its cost per request (bench/router-overhead/router_overhead.py)
    return 0
