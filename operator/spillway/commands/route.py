"""`spillway route`: Spillway's prefix-affinity router over a ModelServer's ready vLLM pods.

An OpenAI endpoint that sends each request to one pod by the policy in core/affinity.py: the owner of the
prompt's leading blocks on a consistent-hash ring of the ready pods, unless it would hold more than its share
of the requests in flight (then the next pod along the ring). Placement depends on the prompt and the pod set
only, so several router pods agree without talking, and a pod that joins takes its share at once.

Pods are found without Kubernetes API access: the ModelServer's headless Service <name>-replicas answers DNS
with the IPs of its ready pods, resolved every few seconds. Each pod's /metrics is read four times a second: a
pod whose process started again (or whose prompt-token counter went back) has its record forgotten, and the requests running and waiting in its engine tell every router pod
what the others have sent it, so that a hot prefix leaves its pod before the pod queues. Without
a ready pod /health answers 503, so the router pod is not ready (the truth) and nothing crash-loops.

As a public endpoint: only the OpenAI routes pass (paths normalised first); a body's leading bytes only are
parsed, off the event loop when large; headers, bodies and the pods' first byte and every later read have
timeouts; connections are capped; a connection that failed before any byte came back is retried on the next
pod and counts against that pod's circuit; an answer the pod cuts is cut for the client too; 502s and 504s
name no address.

The router holds no secret: a client's Authorization header passes through to the pod, which checks it as it
would without the router (spec.apiKeySecretRef), and the router itself asks nothing of the pods.

    spillway route --replicas llama-replicas.team-a.svc --block-size 64 [--index-blocks N] [--index-bytes B]
    spillway route --workers-file workers.txt --block-size 64     # outside Kubernetes: one URL per line
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import posixpath
import re
import signal
import socket
import struct
import sys
import time
from bisect import bisect_right
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import orjson
import uvloop
from aiohttp import ClientConnectionError, ClientError, ClientSession, ClientTimeout, DummyCookieJar, TCPConnector, web
from aiohttp.client_exceptions import ClientConnectorError, ConnectionTimeoutError, ServerDisconnectedError
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from ..core import affinity, routing
from ..core import vllm_api as api
from ..core.errors import InvalidSpec

POLL_SECONDS = 5.0
LISTEN_BACKLOG = 128  # aiohttp's default
PROBE_TIMEOUT_S = 2.0
# Headers that belong to one connection (RFC 9110 7.6.1), plus those aiohttp sets for the body it sends; the
# headers a Connection header names are dropped too.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
# orjson parses in C under the GIL: a body above this is parsed in a worker thread so that the loop's other
# connections are not held behind it (256 KiB parse in under a millisecond; the thread hop costs ~50 us).
PARSE_IN_THREAD_BYTES = 64 << 10
MAX_DEPTH = 64  # deeper bodies are not an OpenAI request
FORWARDED = {path: method for method, path in routing.ROUTER_FORWARDED}


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


# -- what a request is -----------------------------------------------------------------------------------------

class BadRequest(Exception):
    """Input the router refuses itself: (status, one line for the client and the log)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def forwarded_path(raw_path: str, method: str) -> tuple[str, str]:
    """(the OpenAI path to forward, the raw query) for a request target, after percent-decoding and resolving
    dot segments as the pod's server would; BadRequest for any other path (404) or method (405)."""
    path, _, query = raw_path.partition("?")
    decoded = unquote(path, errors="strict")
    if not decoded.startswith("/") or "\\" in decoded or "\x00" in decoded or "%" in decoded:
        raise BadRequest(404, "not found: the router serves the OpenAI routes only")
    normal = posixpath.normpath(decoded)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    wanted = FORWARDED.get(normal)
    if wanted is None:
        raise BadRequest(404, "not found: the router serves the OpenAI routes only")
    if method != wanted and not (wanted == "GET" and method == "HEAD"):
        raise BadRequest(405, f"method {method[:16]} not allowed here")
    return normal, query


# A string (complete, or open at the end of the bytes read) or a bracket.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\Z)|[\[\]{}]', re.DOTALL)
_CUT_TRIES = 8


def _scan(head: bytes) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]], int | None]:
    """(after each bracket, the closers of those then open; the complete strings' spans; where a string
    left open at the end starts). BadRequest when the brackets nest deeper than MAX_DEPTH."""
    stack: list[bytes] = []
    events: list[tuple[int, bytes]] = [(0, b"")]
    spans: list[tuple[int, int]] = []
    open_string = None
    for match in _TOKENS.finditer(head):
        token = match.group()
        if token[:1] == b'"':
            if len(token) > 1 and token.endswith(b'"') and not _escaped_end(token):
                spans.append(match.span())
            else:
                open_string = match.start()
            continue
        if token in (b"{", b"["):
            stack.append(b"}" if token == b"{" else b"]")
            if len(stack) > MAX_DEPTH:
                raise BadRequest(400, f"the body nests deeper than {MAX_DEPTH} levels")
        elif stack:
            stack.pop()
        events.append((match.end(), b"".join(reversed(stack))))
    return events, spans, open_string


def _head_json(head: bytes) -> Any:
    """The leading bytes of a JSON body made whole: cut after the last complete member or element (or inside
    an open string value) and the open brackets closed, so a prompt's first tokens parse without the rest.
    None when nothing usable comes of it."""
    events, spans, open_string = _scan(head)
    closers_at = lambda offset: events[bisect_right([e for e, _ in events], offset) - 1][1]
    if open_string is not None:  # a long text value cut short: close it where it was cut
        for trim in range(8):
            text = head[:len(head) - trim]
            try:
                return orjson.loads(text + b'"' + closers_at(open_string))
            except orjson.JSONDecodeError:
                continue
    starts = [s for s, _ in spans]
    cut = len(head)
    for _ in range(_CUT_TRIES):
        cut = head.rfind(b",", 0, cut)
        if cut <= 0:
            return None
        i = bisect_right(starts, cut) - 1
        if i >= 0 and spans[i][1] > cut:  # inside a string
            cut = spans[i][0]
            continue
        try:
            return orjson.loads(head[:cut] + closers_at(cut))
        except orjson.JSONDecodeError:
            continue
    return None


def _escaped_end(token: bytes) -> bool:
    """Whether a token's last quote is escaped (an odd run of backslashes before it): the string is open."""
    run = len(token) - 1 - len(token[:-1].rstrip(b"\\"))
    return run % 2 == 1


def parse_body(body: bytes, cap: int = routing.ROUTER_PARSE_BYTES) -> dict[str, Any]:
    """The request body as far as routing reads it: the whole JSON object when it is at most `cap` bytes (a
    malformed one is a BadRequest, as vLLM would answer), else its first `cap` bytes made whole (what vLLM
    makes of the rest is its own answer)."""
    if not body:
        raise BadRequest(400, "the body is empty: an OpenAI request is a JSON object")
    if len(body) <= cap:
        if body.count(b"[") + body.count(b"{") > MAX_DEPTH:
            _scan(body)  # brackets enough to nest too deep: the scan refuses a body that does
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(400, f"the body is not JSON ({str(exc)[:120]})") from None
        if not isinstance(parsed, dict):
            raise BadRequest(400, "the body is not a JSON object")
        return parsed
    parsed = _head_json(body[:cap])
    return parsed if isinstance(parsed, dict) else {}


def end_to_end(headers) -> dict[str, str]:
    """The headers to pass on: none of one connection's, nor any a Connection header names."""
    named = {token.strip().lower() for value in headers.getall("Connection", ()) for token in value.split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named}


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = routing.ROUTER_MAX_BODY_BYTES
    body_budget_bytes: int = routing.ROUTER_BODY_BUDGET_BYTES
    parse_bytes: int = routing.ROUTER_PARSE_BYTES
    max_connections: int = routing.ROUTER_MAX_CONNECTIONS
    header_timeout_s: float = routing.ROUTER_HEADER_TIMEOUT_S
    body_timeout_s: float = routing.ROUTER_BODY_TIMEOUT_S
    connect_timeout_s: float = routing.ROUTER_CONNECT_TIMEOUT_S
    first_byte_timeout_s: float = routing.ROUTER_FIRST_BYTE_TIMEOUT_S
    read_timeout_s: float = routing.ROUTER_READ_TIMEOUT_S
    write_timeout_s: float = routing.ROUTER_WRITE_TIMEOUT_S
    stream_buffer_bytes: int = routing.ROUTER_STREAM_BUFFER_BYTES
    attempts: int = routing.ROUTER_ATTEMPTS
    breaker_failures: int = 3
    breaker_cooldown_s: float = 10.0


ROUTER_SAMPLES = (routing.ROUTER_METRIC_REQUESTS, routing.ROUTER_METRIC_MATCHED_BLOCKS,
                  routing.ROUTER_METRIC_PROMPT_BLOCKS, routing.ROUTER_METRIC_UPSTREAM_ERRORS,
                  routing.ROUTER_METRIC_IN_FLIGHT, routing.ROUTER_METRIC_WORKERS, routing.ROUTER_METRIC_RETRIES,
                  routing.ROUTER_METRIC_RESTARTS)


class _WorkerSeries:
    """One worker's children of the router's metrics, looked up once when it joins: a labelled child costs
    microseconds to find (prometheus_client hashes the label values under a lock), an attribute nanoseconds."""

    __slots__ = ("in_flight", "matched_blocks", "prompt_blocks", "requests", "restarts", "retries",
                 "upstream_errors")

    def __init__(self, metrics: RouterMetrics, worker: str) -> None:
        self.requests = {reason: metrics.requests.labels(worker, reason) for reason in affinity.DECISIONS}
        self.matched_blocks = metrics.matched_blocks.labels(worker)
        self.prompt_blocks = metrics.prompt_blocks.labels(worker)
        self.upstream_errors = metrics.upstream_errors.labels(worker)
        self.in_flight = metrics.in_flight.labels(worker)
        self.retries = metrics.retries.labels(worker)
        self.restarts = metrics.restarts.labels(worker)


class RouterMetrics:
    """The router's series on a registry of its own (several routers in one process do not share them): per
    worker and decision, requests; per worker, prompt blocks, those matched where they were sent before,
    upstream errors, failed connections retried elsewhere, restarts seen and requests in flight; the workers
    routed over. A worker's series start at 0 when it joins (a first increment is a rate, not a new series)
    and are removed when it leaves: a gone pod's IP is not a series forever, and the record forgets it too."""

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
                                       "answer in time (a 502 or 504) or whose answer was cut", [worker], registry=r)
        self.retries = Counter(routing.ROUTER_METRIC_RETRIES, "Attempts whose connection to the worker failed "
                               "before any byte came back, sent on to the next worker", [worker], registry=r)
        self.restarts = Counter(routing.ROUTER_METRIC_RESTARTS, "Restarts of the worker seen on its /metrics "
                                "(its record forgotten)", [worker], registry=r)
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
        for metric in (self.matched_blocks, self.prompt_blocks, self.upstream_errors, self.in_flight,
                       self.retries, self.restarts):
            metric.remove(worker)

    def exposition(self) -> bytes:
        return generate_latest(self._exposed)


_START = re.compile(rb"^" + re.escape(api.Metric.PROCESS_START_TIME.encode()) + rb" (\S+)$", re.MULTILINE)
_PROMPT_TOKENS = re.compile(rb"^" + re.escape(f"{api.Metric.PROMPT_TOKENS}_total".encode()) + rb"(?:\{[^}]*\})? (\S+)$",
                            re.MULTILINE)


def restart_marks(exposition: bytes) -> tuple[float | None, float | None]:
    """(the server process's start time, its prompt tokens so far) from a vLLM pod's /metrics; None where absent."""
    start = _START.search(exposition)
    tokens = [float(m.group(1)) for m in _PROMPT_TOKENS.finditer(exposition)]
    return (float(start.group(1)) if start else None), (sum(tokens) if tokens else None)


_LOAD = re.compile(rb"^(?:" + re.escape(api.Metric.REQUESTS_RUNNING.encode()) + rb"|"
                   + re.escape(api.Metric.REQUESTS_WAITING.encode()) + rb")(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


def load_report(exposition: bytes) -> float | None:
    """The requests running and waiting in a vLLM pod's engine (all its engines), from its /metrics; None when
    it shows neither."""
    values = [float(m.group(1)) for m in _LOAD.finditer(exposition)]
    return sum(values) if values and all(math.isfinite(v) and v >= 0 for v in values) else None


def restarted(before: tuple[float | None, float | None], now: tuple[float | None, float | None]) -> bool:
    """A new process (another start time), or a counter that went back (a process with no start time shown)."""
    if before[0] is not None and now[0] is not None and before[0] != now[0]:
        return True
    return before[1] is not None and now[1] is not None and now[1] < before[1]


class Router:
    """The proxy: one AffinityIndex, the requests in flight per worker, a circuit per worker and the router's
    metrics."""

    def __init__(self, settings: affinity.AffinitySettings, log=print, limits: Limits | None = None) -> None:
        self.index = affinity.AffinityIndex(settings)
        self.limits = limits or Limits()
        self.breaker = affinity.Breaker(self.limits.breaker_failures, self.limits.breaker_cooldown_s)
        self.log = log
        self.in_flight: Tally[str] = Tally()  # what the bound balances on; the gauge shows it
        self.sent: Tally[str] = Tally()  # attempts sent per worker, ever: those sent while its /metrics is read
        self.router_metrics = RouterMetrics(lambda: len(self.index.replicas))
        self.session: ClientSession | None = None
        self.body_bytes = 0  # request bodies held now
        self.marks: dict[str, tuple[float | None, float | None]] = {}
        self.reports: dict[str, affinity.Report] = {}  # the pods' own counts, as last read
        self._probing: set[str] = set()

    def set_workers(self, urls: list[str]) -> None:
        added, removed = self.index.sync(urls)
        for worker in removed:
            self.router_metrics.forget(worker)
            self.breaker.forget(worker)
            self.marks.pop(worker, None)
            self.reports.pop(worker, None)
        for worker in added:
            self.router_metrics.worker(worker).in_flight.set(self.in_flight[worker])  # 0 unless it came back
        if added or removed:
            self.log(f"spillway route: routing over {len(urls)} ready pods (added {added}, removed {removed}; "
                     f"the others keep their arcs of the ring)")

    def saw_marks(self, worker: str, marks: tuple[float | None, float | None]) -> None:
        before = self.marks.get(worker)
        self.marks[worker] = marks
        if before is not None and restarted(before, marks) and worker in self.index.replicas:
            self.index.forget(worker)
            self.breaker.forget(worker)
            self.router_metrics.worker(worker).restarts.inc()
            self.log(f"spillway route: {worker} restarted (its /metrics says so); its record is forgotten")

    async def start(self) -> None:
        # No total timeout: a long generation streams for minutes; the first byte and every later read have
        # their own. auto_decompress off: bodies pass through byte for byte with their Content-Encoding.
        # read_bufsize and the socket's fixed receive buffer: an answer whose client stops reading holds a few
        # buffers' worth here (the pod is told to wait by TCP), not the megabytes the kernel would grow to.
        # No cookie jar: aiohttp's keeps a named host's Set-Cookie and sends it with every later request to it,
        # so one client's session cookie from a pod would go out with other clients' requests (workers named in
        # a --workers-file; Kubernetes pods are IPs, whose cookies aiohttp's jar refuses anyway).
        buffer = self.limits.stream_buffer_bytes
        self.session = ClientSession(
            timeout=ClientTimeout(total=None, sock_connect=self.limits.connect_timeout_s),
            auto_decompress=False, read_bufsize=buffer, cookie_jar=DummyCookieJar(),
            connector=TCPConnector(limit=0, ttl_dns_cache=None, socket_factory=lambda info: _pod_socket(info, buffer)))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        # The body is read by forward() itself, against the router's budget; aiohttp's own cap stays above it.
        app = web.Application(client_max_size=self.limits.max_body_bytes + 1)
        app.router.add_get(routing.ROUTER_HEALTH_PATH, self.health)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    def metrics_app(self) -> web.Application:
        # /health here too, for the readiness probe: this port's connections are capped apart from the API
        # port's, so a flood of clients at the API port's cap does not make the router pod unready.
        app = web.Application()
        app.router.add_get(routing.ROUTER_METRICS_PATH, self.metrics)
        app.router.add_get(routing.ROUTER_HEALTH_PATH, self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if not self.index.replicas:
            return web.Response(status=503, text="no ready vLLM pod\n")
        return web.Response(text="ok\n")

    async def _read_body(self, request: web.Request) -> list[bytes]:
        """The body as the chunks it came in, never joined: a joined copy would hold it twice, and the router
        holds as many bodies at once as its budget allows."""
        limits = self.limits
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            raise BadRequest(413, f"the body is larger than {limits.max_body_bytes} bytes")
        reserved = length if length is not None else 0
        if self.body_bytes + reserved > limits.body_budget_bytes:
            raise BadRequest(503, "the router holds as many request bodies as it may; try again")
        self.body_bytes += reserved
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                parts, size = [], 0
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limits.max_body_bytes:
                        raise BadRequest(413, f"the body is larger than {limits.max_body_bytes} bytes")
                    if size > reserved:
                        if self.body_bytes + size - reserved > limits.body_budget_bytes:
                            raise BadRequest(503, "the router holds as many request bodies as it may; try again")
                        self.body_bytes += size - reserved
                        reserved = size
                    parts.append(chunk)
        except TimeoutError:
            self.body_bytes -= reserved
            raise BadRequest(408, f"the body did not arrive within {limits.body_timeout_s:g} s") from None
        except (RuntimeError, ConnectionError) as exc:
            # The client left before or while its body came: aiohttp's payload raises the reset, or says
            # "Connection closed." (a RuntimeError) when the connection was gone before the read began.
            self.body_bytes -= reserved
            if isinstance(exc, RuntimeError) and request.protocol is not None and request.protocol.connected:
                raise
            raise BadRequest(400, "the client closed its connection before its body arrived") from None
        except BaseException:
            self.body_bytes -= reserved
            raise
        request["reserved"] = reserved
        return parts

    async def _blocks(self, body: bytes) -> list[int]:
        cap = self.limits.parse_bytes
        settings = self.index.settings
        if min(len(body), cap) > PARSE_IN_THREAD_BYTES:
            parsed = await asyncio.get_running_loop().run_in_executor(None, parse_body, body, cap)
        else:
            parsed = parse_body(body, cap)
        return affinity.prompt_blocks(parsed, settings.block_tokens, settings.max_blocks)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            path, query = forwarded_path(request.raw_path, request.method)
            parts = await self._read_body(request) if request.method == "POST" else []
        except BadRequest as exc:
            self.log(f"spillway route: refused {request.method[:16]} {request.raw_path[:120]!r}: {exc.status} {exc}")
            return _error(exc.status, str(exc))
        try:
            try:
                blocks = await self._blocks(_head(parts, self.limits.parse_bytes)) if request.method == "POST" else []
            except BadRequest as exc:
                self.log(f"spillway route: refused a body for {path}: {exc.status} {exc}")
                return _error(exc.status, str(exc))
            return await self._proxy(request, path + (f"?{query}" if query else ""), parts, blocks)
        finally:
            self.body_bytes -= request.get("reserved", 0)

    async def _proxy(self, request: web.Request, target: str, parts: list[bytes],
                     blocks: list[int]) -> web.StreamResponse:
        assert self.session is not None
        headers = end_to_end(request.headers)
        if request.method == "POST":
            headers["Content-Length"] = str(sum(map(len, parts)))
        limits = self.limits
        tried: list[str] = []
        for attempt in range(limits.attempts):
            now = time.monotonic()
            exclude = [*tried, *self.breaker.open(now)]
            try:
                decision = self.index.choose(blocks, self.in_flight, exclude, self.reports, now)
            except LookupError:
                return _error(503, "no ready vLLM pod to route to")
            worker = decision.replica
            if worker in tried:
                break  # every pod was tried
            if attempt == 0:
                self.index.record(worker, blocks)
            series = self.router_metrics.worker(worker)
            self.in_flight[worker] += 1
            self.sent[worker] += 1
            series.in_flight.set(self.in_flight[worker])
            try:
                try:
                    async with asyncio.timeout(limits.first_byte_timeout_s):
                        upstream = await self.session.request(request.method, f"{worker}{target}", data=_sent(parts),
                                                              headers=headers, allow_redirects=False)
                except (ClientConnectorError, ConnectionTimeoutError, ServerDisconnectedError) as exc:
                    # Nothing came back: the request is sent on to the next pod along the ring.
                    tried.append(worker)
                    series.retries.inc()
                    if self.breaker.failed(worker, time.monotonic()):
                        self.log(f"spillway route: {worker} failed {limits.breaker_failures} times in a row; "
                                 f"its circuit is open for {limits.breaker_cooldown_s:g} s")
                    self.log(f"spillway route: no answer from {worker} ({exc.__class__.__name__}); "
                             f"{'trying the next pod' if attempt + 1 < limits.attempts else 'giving up'}")
                    continue
                except TimeoutError:
                    series.upstream_errors.inc()
                    self.breaker.failed(worker, time.monotonic())
                    self.log(f"spillway route: {worker} sent no byte within {limits.first_byte_timeout_s:g} s")
                    return _error(504, f"the vLLM pod did not answer within {limits.first_byte_timeout_s:g} s")
                except (ClientError, OSError) as exc:
                    series.upstream_errors.inc()
                    self.breaker.failed(worker, time.monotonic())
                    self.log(f"spillway route: {worker} failed: {exc.__class__.__name__}: {str(exc)[:200]}")
                    return _error(502, "the vLLM pod did not answer")
                self.breaker.succeeded(worker)
                if attempt == 0:
                    series.requests[decision.reason].inc()
                    series.matched_blocks.inc(decision.matched_blocks)
                else:
                    series.requests[affinity.DECISION_OVERLOADED].inc()
                    self.index.record(worker, blocks)
                series.prompt_blocks.inc(decision.prompt_blocks)
                return await self._relay(request, upstream, worker, series)
            finally:
                self.in_flight[worker] -= 1
                self.router_metrics.set_in_flight(worker, self.in_flight[worker])
        if tried and tried[-1] in self.index.replicas:
            self.router_metrics.worker(tried[-1]).upstream_errors.inc()
        return _error(502, "no vLLM pod answered")

    async def _relay(self, request: web.Request, upstream, worker: str, series: _WorkerSeries) -> web.StreamResponse:
        """The pod's answer passed on as it comes; an answer the pod cuts (or that stalls past the read
        timeout) is cut for the client too, so a client never takes a truncated answer for a whole one."""
        read, write = self.limits.read_timeout_s, self.limits.write_timeout_s
        length = upstream.content_length
        if length is not None and length <= self.limits.stream_buffer_bytes and request.method != "HEAD" \
                and upstream.status not in (204, 304):
            # A whole answer of known, small length (every non-streamed completion): read it, then send headers
            # and body in one write. Streamed, it cost a write for the headers, one per chunk and one for the
            # chunked encoding's end, each waking the client (bench/router-overhead/README.md).
            try:
                async with asyncio.timeout(read):
                    body = await upstream.read()
            except (TimeoutError, ClientError, OSError) as exc:
                series.upstream_errors.inc()
                self.log(f"spillway route: the answer from {worker} was cut ({exc.__class__.__name__}); cutting "
                         f"the client's too")
                _reset(request.transport)
                return web.StreamResponse()  # never sent: the connection is gone
            finally:
                upstream.release()
            answer = web.Response(status=upstream.status, reason=upstream.reason, body=body)
            for key, value in end_to_end(upstream.headers).items():
                answer.headers.add(key, value)
            return answer  # a client that stopped reading: the connection's write buffer is fixed (_cap_connections)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        try:
            for key, value in end_to_end(upstream.headers).items():
                response.headers.add(key, value)
            await response.prepare(request)
            while True:
                async with asyncio.timeout(read):
                    chunk = await upstream.content.readany()
                try:
                    # A write waits only when the client's buffers are full: a client that takes nothing for
                    # write_timeout is cut, so a stopped reader holds its connection and the pod's no longer.
                    async with asyncio.timeout(write):
                        if not chunk:
                            await response.write_eof()
                            return response
                        await response.write(chunk)
                except TimeoutError:
                    self.log(f"spillway route: a client took nothing of the answer from {worker} for {write:g} s; "
                             f"closing its connection")
                    _reset(request.transport)
                    return response
                except (ClientConnectionError, ConnectionError):
                    return response  # the client left: nothing to tell it
        except (TimeoutError, ClientError, OSError) as exc:
            series.upstream_errors.inc()
            self.log(f"spillway route: the answer from {worker} was cut ({exc.__class__.__name__}); cutting the "
                     f"client's too")
            _reset(request.transport)
            return response
        finally:
            upstream.release()

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), content_type="text/plain", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    def exposition(self) -> bytes:
        """Prometheus text format (prometheus_client's, of the router's own registry)."""
        return self.router_metrics.exposition()


def _head(parts: list[bytes], cap: int) -> bytes:
    """The whole body when it is at most `cap` bytes, else its leading chunks up to just past `cap` (all that
    parse_body reads of it)."""
    taken, size = [], 0
    for part in parts:
        taken.append(part)
        size += len(part)
        if size > cap:
            break
    return taken[0] if len(taken) == 1 else b"".join(taken)


def _sent(parts: list[bytes]):
    """A body for aiohttp to send as it is (its Content-Length set by the caller): one chunk as bytes, more as
    an iterator over them, made anew for each attempt."""
    if len(parts) <= 1:
        return parts[0] if parts else b""

    async def chunks():
        for part in parts:
            yield part

    return chunks()


_LINGER_RESET = struct.pack("ii", 1, 0)


def _reset(transport) -> None:
    """Cut a client's connection with a reset, now: without SO_LINGER 0 the kernel would keep the socket to
    send what is queued, so a client that stopped reading would see no error and its buffers stay held."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass  # already gone
    transport.abort()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "spillway_router_error", "code": status}},
                             status=status)


async def probe(router: Router, worker: str) -> None:
    """Read a worker's /metrics for the marks of a restart and its engine's load; a worker that does not
    answer is left as it is (its last report ages out). vLLM's /metrics is read whole: its instrumentator's
    route serves it before prometheus_client's app, which alone would serve series by name (`name[]`)."""
    assert router.session is not None
    own, sent = router.in_flight[worker], router.sent[worker]
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            async with router.session.get(f"{worker}{api.METRICS_PATH}") as response:
                if response.status != 200:
                    return
                text = await response.read()
    except (TimeoutError, ClientError, OSError):
        return
    router.saw_marks(worker, restart_marks(text))
    load = load_report(text)
    if load is not None and worker in router.index.replicas:
        # The requests of this pod's that the count may hold: those in flight when the read began and those
        # sent while it was under way, answered or not by its end. Counting only those in flight at either end
        # read one sent and answered in between as another pod's (a read takes a few ms, hundreds on a loaded
        # node), and a lone router pod then passed a replica over for requests nobody else had sent.
        router.reports[worker] = affinity.Report.read(load, own + router.sent[worker] - sent, time.monotonic())


def _start_probes(router: Router, tasks: set[asyncio.Task], workers) -> None:
    """A read of each worker's /metrics, but of none whose last read is still under way (a slow pod, up to
    PROBE_TIMEOUT_S): it delays no other worker's read."""
    async def read(worker: str) -> None:
        try:
            await probe(router, worker)
        finally:
            router._probing.discard(worker)

    for worker in workers:
        if worker not in router._probing:
            router._probing.add(worker)
            task = asyncio.ensure_future(read(worker))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


def loads_poll_s(settings: affinity.AffinitySettings, poll_s: float, load_poll_s: float) -> float:
    """How often every pod's /metrics is read. A lone router pod counts every request in flight itself and uses no
    report (affinity.loads), so it reads the pods for their restart marks, at the pace it resolves them: at
    load_poll_s it fetched each vLLM pod's whole /metrics (79 KB) four times a second for nothing. Pods whose
    circuit is open are still read every load_poll_s (follow_loads): their restart closes the circuit."""
    return load_poll_s if settings.peers > 1 else max(poll_s, load_poll_s)


async def follow_loads(router: Router, poll_s: float, stopped: asyncio.Event, tasks: set[asyncio.Task],
                       all_every_s: float | None = None) -> None:
    """Read every worker's /metrics every `all_every_s` (poll_s unless given), and those whose circuit is open
    every poll_s: a pod that failed while restarting is taken back the moment its new process is read (its
    restart forgets the circuit), not after the cooldown or the next read of every pod."""
    every = poll_s if all_every_s is None else all_every_s
    last_all = -math.inf
    while not stopped.is_set():
        if router.session is not None:
            now = time.monotonic()
            if now - last_all >= every:
                last_all = now
                _start_probes(router, tasks, router.index.replicas)
            else:
                _start_probes(router, tasks, router.breaker.open(now))
        try:
            await asyncio.wait_for(stopped.wait(), poll_s)
        except TimeoutError:
            pass


async def follow_workers(router: Router, discover: Callable[[], list[str]], poll_s: float,
                         stopped: asyncio.Event, tasks: set[asyncio.Task]) -> None:
    """Resolve the ready pods every poll_s and hand them to the router (the resolver's trouble keeps the set);
    a new pod's /metrics is read at once, so that its restart marks are known before its first request."""
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
            if router.session is not None:
                _start_probes(router, tasks, [w for w in router.index.replicas if w not in router.marks])
        try:
            await asyncio.wait_for(stopped.wait(), poll_s)
        except TimeoutError:
            pass


def _pod_socket(info, buffer: int) -> socket.socket:
    """A socket to a pod whose kernel receive buffer is fixed at `buffer` (set before connecting, so the window
    the pod is offered is that small from the start): an answer whose client stopped reading holds that much
    here. The send buffer is the kernel's own: the body sent is held in the process anyway (within the body
    budget), and a fixed 16 KiB one cost a write and a wake-up per 16 KiB of body: with it and the other cuts
    of that round, a 32K-token prompt's overhead went from 6.8 to 2.4 ms (bench/router-overhead/README.md)."""
    family, kind, proto, _, _ = info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return sock


def _cap_connections(runner: web.AppRunner, cap: int, buffer: int) -> None:
    """Connections beyond `cap` are closed as they open: a flood of idle or half-sent requests takes no more.
    Each connection's send buffers, in the kernel and above it, are fixed at `buffer`: a client that stops
    reading holds that much, where the kernel would grow its buffer to megabytes."""
    server = runner.server
    assert server is not None
    accept = server.connection_made

    def connection_made(handler, transport) -> None:
        accept(handler, transport)
        if len(server.connections) > cap:
            # After the handler's task has started (scheduled next): aborted here, the connection would be
            # lost before the task ran, and aiohttp would log a traceback for each one.
            asyncio.get_running_loop().call_soon(transport.abort)
            return
        sock = transport.get_extra_info("socket")
        try:
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, routing.ROUTER_RECEIVE_BUFFER_BYTES)
            transport.set_write_buffer_limits(high=buffer)
        except OSError:
            pass  # a connection already reset: nothing to bound

    server.connection_made = connection_made  # type: ignore[method-assign]


class ListenError(InvalidSpec):
    """The router cannot listen where it was told to."""


class _OneLineForMalformed(logging.Handler):
    """aiohttp answers a request it cannot parse (a bad method, header, chunk size or URL) with a 400 and logs
    the parser's exception with its traceback (and so a write to a client that left, such as aiohttp's own
    `100 Continue`): on a public endpoint that is a log flood any client can cause. Those are one line here; any
    other exception keeps its traceback (it is the router's bug)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._log = log
        self.setFormatter(logging.Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = (exc.message or exc.__class__.__name__).splitlines()[0][:200]
            self._log(f"{record.getMessage()[:200]}: malformed request, answered {exc.code}: {reason}")
        elif isinstance(exc, ConnectionResetError):  # e.g. its `100 Continue` to a client already gone
            self._log(f"{record.getMessage()[:200]}: the client's connection closed before the answer")
        else:
            self._log(self.format(record))


def _http_logger(log: Callable[[str], None]) -> logging.Logger:
    logger = logging.getLogger("spillway.route.http")
    logger.propagate = False
    logger.handlers = [_OneLineForMalformed(log)]
    return logger


async def serve(router: Router, discover: Callable[[], list[str]], *, host: str = "0.0.0.0",
                port: int = routing.ROUTER_PORT, metrics_port: int = routing.ROUTER_METRICS_PORT,
                poll_s: float = POLL_SECONDS, load_poll_s: float = routing.ROUTER_LOAD_POLL_S,
                stopped: asyncio.Event | None = None) -> None:
    stopped = stopped or asyncio.Event()
    await router.start()
    # keepalive_timeout: aiohttp closes a connection that has not sent a whole request's headers this long
    # after it opened or after its last answer, which is the header timeout (slow or half-sent headers).
    logger = _http_logger(router.log)
    runners = [web.AppRunner(app, access_log=None, keepalive_timeout=router.limits.header_timeout_s, logger=logger)
               for app in (router.app(), router.metrics_app())]
    try:
        for runner, bind in zip(runners, (port, metrics_port)):
            await runner.setup()
            _cap_connections(runner, router.limits.max_connections, router.limits.stream_buffer_bytes)
            try:
                # A backlog as deep as the cap (aiohttp's 128 at least): a burst of connections waits to be
                # accepted (or closed at the cap) rather than for SYN retransmits of a full queue, seconds each.
                backlog = max(LISTEN_BACKLOG, router.limits.max_connections)
                await web.TCPSite(runner, host, bind, backlog=backlog).start()
            except (OSError, UnicodeError, ValueError) as exc:  # UnicodeError: a name IDNA cannot encode
                reason = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
                raise ListenError(f"spillway route: cannot listen on {host[:80]}:{bind}: {reason}") from None
        probes: set[asyncio.Task] = set()
        loads = asyncio.ensure_future(follow_loads(router, load_poll_s, stopped, probes,
                                                   loads_poll_s(router.index.settings, poll_s, load_poll_s)))
        try:
            await follow_workers(router, discover, poll_s, stopped, probes)
        finally:
            stopped.set()
            await loads
            for task in list(probes):
                task.cancel()
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
                        help="a file of worker URLs, one per line, read again every --poll-seconds; a change is taken when "
                             "two reads agree (elsewhere)")
    p.add_argument("--block-size", type=int, required=True, help="the pods' --block-size")
    p.add_argument("--index-blocks", type=int, default=routing.DEFAULT_INDEX_BLOCKS,
                   help="blocks recorded per pod: its GPU and CPU caches' blocks (the operator passes the plan's)")
    p.add_argument("--index-bytes", type=int, default=affinity.AffinitySettings.index_bytes,
                   help="memory for the record of all pods together (the operator renders the memory limit "
                        "from it)")
    p.add_argument("--key-blocks", type=int, default=affinity.DEFAULT_KEY_BLOCKS,
                   help="leading blocks that name a prompt's prefix on the hash ring")
    p.add_argument("--load-factor", type=float, default=affinity.DEFAULT_LOAD_FACTOR,
                   help="a pod takes no more than this times the mean requests in flight (>= 1)")
    p.add_argument("--router-pods", type=int, default=1,
                   help="router pods sharing the traffic (each bounds loads as its own x this; the operator "
                        "passes routing.router.replicas)")
    p.add_argument("--port", type=int, default=routing.ROUTER_PORT)
    p.add_argument("--metrics-port", type=int, default=routing.ROUTER_METRICS_PORT)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--poll-seconds", type=float, default=POLL_SECONDS, help="how often the pods are resolved")
    p.add_argument("--load-poll-seconds", type=float, default=routing.ROUTER_LOAD_POLL_S,
                   help="how often each pod's /metrics is read (its restarts; the requests in its engine, which "
                        "the load bound counts for the router pods it cannot see); with --router-pods 1 the "
                        "pods are read at --poll-seconds, for their restarts only")
    p.add_argument("--max-connections", type=int, default=routing.ROUTER_MAX_CONNECTIONS)
    p.add_argument("--max-body-bytes", type=int, default=routing.ROUTER_MAX_BODY_BYTES)
    p.add_argument("--header-timeout", type=float, default=routing.ROUTER_HEADER_TIMEOUT_S, metavar="SECONDS")
    p.add_argument("--body-timeout", type=float, default=routing.ROUTER_BODY_TIMEOUT_S, metavar="SECONDS")
    p.add_argument("--first-byte-timeout", type=float, default=routing.ROUTER_FIRST_BYTE_TIMEOUT_S,
                   metavar="SECONDS", help="for a pod's first byte of an answer (then 504)")
    p.add_argument("--read-timeout", type=float, default=routing.ROUTER_READ_TIMEOUT_S, metavar="SECONDS",
                   help="between two chunks of a pod's answer (then the answer is cut)")
    p.add_argument("--write-timeout", type=float, default=routing.ROUTER_WRITE_TIMEOUT_S, metavar="SECONDS",
                   help="for a client to take the next piece of an answer (then its connection is closed)")
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


class SettledWorkersFile:
    """A workers file's URLs, a changed list taken only once two reads in a row agree. A file rewritten in
    place (`echo ... > FILE`, an editor's save) is empty or cut short for a moment; a read in that moment took
    the pods it missed out of the ring and dropped their series, and they came back with counters from 0 and
    their arcs' prefixes recomputed. A change now costs one more --poll-seconds; the first read is taken as it
    is, so that a router starts serving at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.taken: list[str] | None = None
        self.last_read: list[str] | None = None

    def __call__(self) -> list[str]:
        urls = read_workers_file(self.path)
        if self.taken is None or urls == self.last_read:
            self.taken = urls
        self.last_read = urls
        return self.taken


def settings_from(args: argparse.Namespace) -> affinity.AffinitySettings:
    try:
        return affinity.AffinitySettings(block_tokens=args.block_size, index_blocks=args.index_blocks,
                                         index_bytes=args.index_bytes, key_blocks=args.key_blocks,
                                         load_factor=args.load_factor, peers=args.router_pods,
                                         # A few reads' worth: one slow or lost read keeps the last report
                                         report_ttl_s=max(affinity.DEFAULT_REPORT_TTL_S, 4 * args.load_poll_seconds))
    except ValueError as exc:
        raise InvalidSpec(f"spillway route: {exc}") from None


def _seconds(value: float, flag: str, most: float = 86_400.0) -> float:
    if not math.isfinite(value) or not 0 < value <= most:
        raise InvalidSpec(f"spillway route: {flag} must be a number of seconds in (0, {most:g}]; got {value!r}")
    return value


def _count(value: int, flag: str, least: int = 1, most: int = 1 << 40) -> int:
    if not least <= value <= most:
        raise InvalidSpec(f"spillway route: {flag} must be a whole number in {least}..{most}; got {value!r}")
    return value


def limits_from(args: argparse.Namespace) -> Limits:
    for flag in ("port", "metrics_port"):
        _count(getattr(args, flag), f"--{flag.replace('_', '-')}", 1, 65535)
    _seconds(args.poll_seconds, "--poll-seconds", 3600.0)
    _seconds(args.load_poll_seconds, "--load-poll-seconds", 3600.0)
    return Limits(max_body_bytes=_count(args.max_body_bytes, "--max-body-bytes", 1024, 1 << 30),
                  max_connections=_count(args.max_connections, "--max-connections", 1, 1 << 20),
                  header_timeout_s=_seconds(args.header_timeout, "--header-timeout"),
                  body_timeout_s=_seconds(args.body_timeout, "--body-timeout"),
                  first_byte_timeout_s=_seconds(args.first_byte_timeout, "--first-byte-timeout"),
                  read_timeout_s=_seconds(args.read_timeout, "--read-timeout"),
                  write_timeout_s=_seconds(args.write_timeout, "--write-timeout"))


def cmd_route(args: argparse.Namespace) -> int:
    if args.replicas is not None:
        check_dns_name(args.replicas, "--replicas")
        discover = lambda: [worker_url(ip) for ip in resolve_ips(args.replicas)]
    else:
        discover = SettledWorkersFile(args.workers_file)
    limits, settings = limits_from(args), settings_from(args)
    router = Router(settings, log=lambda m: print(m, file=sys.stderr, flush=True), limits=limits)

    async def main() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await serve(router, discover, host=args.host,
                    port=args.port, metrics_port=args.metrics_port, poll_s=args.poll_seconds,
                    load_poll_s=args.load_poll_seconds, stopped=stopped)

    uvloop.run(main())  # the proxy's event loop is its cost per request (bench/router-overhead/router_overhead.py)
    return 0
