"""An OpenAI-compatible completions client for load tests (stdlib + aiohttp only).

Prompts are token-id lists where the server takes them (`/v1/completions` with a list of ids), so that
tokenization does not blur the figures; plain text otherwise. TTFT is the time from sending the request
to the first streamed chunk that carries a choice. Completions go through `http1.Http1Pool` (pre-encoded
requests on connections opened before a timed phase); discovery and /metrics through aiohttp.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from ..core.errors import SpillwayError
from ..core.vllm_api import COMPLETIONS_PATH, HEALTH_PATH, METRICS_PATH, MODELS_PATH, RESET_PREFIX_CACHE_PATH
from .http1 import DEFAULT_REQUEST_TIMEOUT_S, Http1Pool, Reply
from .progress import Progress

VERSION_PATH = "/version"  # vLLM's own: {"version": "..."}
ERROR_TEXT_LIMIT = 300
KEEPALIVE_S = 1.0
# Discovery (/v1/models, /version, /health), /metrics and the cache reset answer at once on a live server;
# the request timeout (long prompts, minutes) must not let a server that accepts and never answers
# hold the run. One attempt each: a timed-out GET is not retried.
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=10)


class EndpointError(SpillwayError):
    """The endpoint is unreachable, lacks the model, or answers requests with errors."""

    reason = "EndpointError"


@dataclass
class Completion:
    """One request's outcome, timed on the client."""

    ok: bool
    latency_s: float
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


class OpenAIClient:
    """Async client of one endpoint. Use as `async with OpenAIClient(url) as client:`."""

    def __init__(self, base_url: str, *, api_key: str | None = None, concurrency: int = 256,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.model: str | None = None
        self.prompt_format = "ids"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._concurrency = concurrency
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=30)
        self._request_timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None

    async def __aenter__(self):  # -> OpenAIClient
        # Idle connections are dropped well before the server drops them (vLLM/uvicorn: 5 s); reusing one the
        # server has closed fails the request with "Server disconnected" (aiohttp's default keeps them 15 s).
        connector = aiohttp.TCPConnector(limit=self._concurrency, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, headers=self._headers)
        try:
            self._pool = Http1Pool(self.base_url, limit=self._concurrency, headers=self._headers,
                                   idle_s=KEEPALIVE_S, timeout_s=self._request_timeout_s)
        except ValueError as exc:
            await self._session.close()
            raise EndpointError(str(exc)) from None
        return self

    async def __aexit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path: str) -> str:
        return self.base_url + path

    # -- discovery --------------------------------------------------------------------------------
    async def _get(self, path: str, attempts: int = 3) -> tuple[int, str]:
        """GET (idempotent: retried on connection errors, which a dropped idle connection also causes)."""
        for attempt in range(attempts):
            try:
                async with self._session.get(self.url(path), timeout=CONTROL_TIMEOUT) as response:
                    return response.status, await response.text()
            except TimeoutError:
                raise EndpointError(f"{self.url(path)} did not answer within {CONTROL_TIMEOUT.total:g} s") from None
            except (aiohttp.ClientError, OSError) as exc:
                if attempt == attempts - 1 or isinstance(exc, aiohttp.ClientConnectorError):
                    raise EndpointError(f"cannot reach {self.url(path)}: {_describe(exc)}") from None
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def models(self) -> list[dict]:
        status, body = await self._get(MODELS_PATH)
        if status != 200:
            raise EndpointError(f"{self.url(MODELS_PATH)} answered HTTP {status}: {_clip(body)}")
        try:
            return list(json.loads(body)["data"])
        except (ValueError, KeyError, TypeError):
            raise EndpointError(f"{self.url(MODELS_PATH)} is not an OpenAI model list: {_clip(body)}") from None

    async def resolve_model(self, requested: str | None) -> dict:
        """The served model entry: the requested id, or the only one served."""
        models = await self.models()
        ids = [m.get("id") for m in models]
        if requested is not None:
            for entry in models:
                if entry.get("id") == requested:
                    self.model = requested
                    return entry
            raise EndpointError(f"model {requested!r} is not served by {self.base_url} (served: {', '.join(ids) or 'none'})")
        if len(models) != 1:
            raise EndpointError(f"{self.base_url} serves {len(models)} models ({', '.join(ids) or 'none'}): "
                                "name one with --model")
        self.model = ids[0]
        return models[0]

    async def version(self) -> str | None:
        status, body = await self._get(VERSION_PATH)
        if status != 200:
            return None
        try:
            return str(json.loads(body).get("version"))
        except (ValueError, AttributeError):
            return None

    async def healthy(self) -> bool:
        status, _ = await self._get(HEALTH_PATH)
        return status == 200

    async def reset_prefix_cache(self) -> bool | None:
        """Empty the engine's GPU prefix cache, keeping the CPU pool. None: the server does not offer it
        (vLLM serves it with VLLM_SERVER_DEV_MODE=1); False: refused for now (blocks still held)."""
        url = self.url(RESET_PREFIX_CACHE_PATH)
        try:
            async with self._session.post(url) as response:
                if response.status in (404, 405):
                    return None
                body = await response.text()
                if response.status != 200:
                    raise EndpointError(f"{url} answered HTTP {response.status}: {_clip(_message(body))}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise EndpointError(f"cannot reach {url}: {_describe(exc)}") from None
        try:
            return bool(json.loads(body).get("success", True))
        except (ValueError, AttributeError):
            return True

    async def metrics_text(self) -> str | None:
        """The server's /metrics, None where it has none."""
        status, body = await self._get(METRICS_PATH)
        return body if status == 200 else None

    # -- requests ---------------------------------------------------------------------------------
    def payload(self, prompt: list[int] | str, max_tokens: int, stream: bool) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def body(self, prompt: list[int] | str, max_tokens: int = 1, stream: bool = False) -> bytes:
        """A request body, encoded ahead of a timed phase so that encoding stays out of the timing."""
        return json.dumps(self.payload(prompt, max_tokens, stream), separators=(",", ":")).encode()

    def wire(self, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        """The whole completion request as sent (head and body), built ahead of a timed phase."""
        return self._pool.request(COMPLETIONS_PATH, body, headers)

    async def warm(self, connections: int) -> None:
        """Open the connections a phase will use before its clock starts."""
        try:
            await self._pool.warm(connections)
        except (TimeoutError, OSError) as exc:
            raise EndpointError(f"cannot reach {self.base_url}: {_describe(exc)}") from None

    async def complete(self, prompt: list[int] | str, max_tokens: int = 1, stream: bool = False) -> Completion:
        return await self.post(self.body(prompt, max_tokens, stream), stream)

    async def post(self, body: bytes, stream: bool = False) -> Completion:
        return await self.send(self.wire(body), stream)

    async def exchange(self, body: bytes) -> Reply:
        """One completion request, its whole reply (status and body) for a caller that reads the answer itself."""
        return await self._pool.send(self.wire(body), False)

    async def send(self, request: bytes, stream: bool = False) -> Completion:
        """Send one wire-encoded completion request; errors come back in the Completion, never raised."""
        start = time.perf_counter()
        try:
            reply = await self._pool.send(request, stream)
        except (TimeoutError, OSError) as exc:
            return Completion(False, time.perf_counter() - start, error=_describe(exc))
        return _completion(reply, stream)

    async def send_phase(self, bodies: list[bytes], concurrency: int, progress: Progress,
                         stream: bool = False, headers: list[dict[str, str] | None] | None = None,
                         ) -> tuple[list[Completion], float]:
        """Send bodies over `concurrency` connections; (results in order, seconds from first send to last reply).

        The clock covers sending and replies only: requests are wire-encoded and the phase's connections
        opened before it starts, and a worker's loop does nothing else per request."""
        requests = [self.wire(body, h) for body, h in zip(bodies, headers or [None] * len(bodies))]
        workers_n = min(concurrency, len(requests))
        await self.warm(workers_n)
        results: list[Completion] = [None] * len(requests)  # type: ignore[list-item]
        indices = iter(range(len(requests)))
        send, update = self.send, progress.update

        async def worker() -> None:
            for index in indices:  # a shared iterator: each index is taken by exactly one worker
                results[index] = result = await send(requests[index], stream)
                update(result.ok)

        start = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(workers_n)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            progress.close()
        return results, time.perf_counter() - start

    async def probe_prompt_format(self, token_ids: list[int], requested: str = "auto") -> str:
        """Check that the model answers a prompt; pick token ids where the server takes them.

        Raises EndpointError with the server's own message when it answers neither."""
        formats = ["ids", "text"] if requested == "auto" else [requested]
        errors = []
        for fmt in formats:
            prompt = token_ids if fmt == "ids" else " ".join(f"w{t}" for t in token_ids)
            result = await self.complete(prompt, max_tokens=1)
            if result.ok:
                self.prompt_format = fmt
                return fmt
            errors.append(f"{fmt} prompt: {result.error}")
        raise EndpointError(f"{self.url(COMPLETIONS_PATH)} refused a {len(token_ids)}-token completion for model "
                            f"{self.model!r}: " + "; ".join(errors))


def _completion(reply: Reply, stream: bool) -> Completion:
    if reply.status != 200:
        return Completion(False, reply.seconds,
                          error=f"HTTP {reply.status}: {_clip(_message(reply.body.decode(errors='replace')))}")
    if stream:
        return _stream_completion(reply)
    try:
        usage = json.loads(reply.body).get("usage") or {}
    except (ValueError, AttributeError):
        return Completion(False, reply.seconds, error=f"not a completion: {_clip(reply.body.decode(errors='replace'))}")
    return Completion(True, reply.seconds, None, usage.get("prompt_tokens"), usage.get("completion_tokens"))


def _stream_completion(reply: Reply) -> Completion:
    """An event stream's outcome: its first choice (TTFT, timed as the bytes arrived), usage and errors."""
    usage: dict = {}
    error = None
    for line in reply.body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if "error" in event:
            error = _clip(json.dumps(event["error"]))
        if event.get("usage"):
            usage = event["usage"]
    ttft = reply.first_event_s
    if error is not None or ttft is None:
        return Completion(False, reply.seconds, ttft, error=error or "stream ended without a token")
    return Completion(True, reply.seconds, ttft, usage.get("prompt_tokens"), usage.get("completion_tokens"))


def _message(text: str) -> str:
    try:
        body = json.loads(text)
        error = body.get("error", body)
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        return text


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ERROR_TEXT_LIMIT else text[:ERROR_TEXT_LIMIT] + "..."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
