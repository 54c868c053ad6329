"""A lean HTTP/1.1 client for the timed request path (stdlib asyncio only).

Each request of a timed phase costs the load generator one write of pre-encoded bytes and the parsing of one
small reply on a connection opened before the clock started; a general-purpose client (aiohttp) spends
several times that per request in its request/response objects, and opens its connections inside the
timed window. Replies are read as vLLM sends them: Content-Length bodies, or chunked event streams whose
first event carrying a choice marks the first token.
"""
from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

# What a load test waits for one completion by default: ten times its longest request (1,024 tokens decoded at
# 256 concurrent sequences, or a cold 128K-token prefill, each well under a minute on the GPUs it targets), so a
# server that accepts and never answers fails the request in minutes, not an hour.
DEFAULT_REQUEST_TIMEOUT_S = 600.0

FIRST_CHOICE = b'"choices":[{'  # an event that carries a choice (vLLM writes compact JSON)
MAX_HEAD = 1 << 16


class ConnectionDropped(ConnectionError):
    """The connection closed before a byte of the reply arrived (the request may be resent)."""


@dataclass
class Reply:
    status: int
    body: bytes
    seconds: float
    first_event_s: float | None = None  # streams: seconds to the first event carrying a choice


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._reply: asyncio.Future | None = None
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._status = 0
        self._length: int | None = None  # Content-Length, or None while the head is incomplete
        self._chunked = False
        self._close_after = False
        self._body = bytearray()
        self._stream = False
        self._start = 0.0
        self._first: float | None = None
        self._received = False

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._received = True
        self._buf += data
        try:
            self._parse()
        except ValueError as exc:
            self._fail(ConnectionError(f"malformed HTTP reply: {exc}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._reply is not None and not self._reply.done():
            if not self._received:
                self._fail(ConnectionDropped("connection closed by the server before a reply"))
            elif self._length is not None and not self._chunked and self._length < 0:
                self._finish()  # a body delimited by the connection's end
            else:
                self._fail(ConnectionError("connection closed in the middle of a reply"))

    # requests
    def send(self, request: bytes, stream: bool) -> asyncio.Future:
        self._reset()
        self._stream = stream
        self._start = time.perf_counter()
        self._reply = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._reply

    def _fail(self, exc: BaseException) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(exc)

    def _finish(self) -> None:
        reply = Reply(self._status, bytes(self._body), time.perf_counter() - self._start, self._first)
        if self._close_after:
            self.transport.close()
            self.closed = True
        self.idle_since = time.monotonic()
        future, self._reply = self._reply, None
        if future is not None and not future.done():
            future.set_result(reply)

    def _parse(self) -> None:
        if self._length is None and not self._chunked:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ValueError("header too long")
                return
            self._head(bytes(self._buf[:end]))
            del self._buf[:end + 4]
            if self._status in (100, 103):  # interim replies: the real head follows
                self._length = None
                self._chunked = False
                return self._parse()
        if self._chunked:
            self._dechunk()
        else:
            if self._length < 0:  # until the server closes
                self._take(bytes(self._buf))
                self._buf.clear()
                return
            need = self._length - len(self._body)
            if len(self._buf) >= need:
                self._take(bytes(self._buf[:need]))
                del self._buf[:need]
                self._finish()
            else:
                self._take(bytes(self._buf))
                self._buf.clear()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        self._status = int(parts[1])
        length = -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
            elif name == b"connection" and value.strip().lower() == b"close":
                self._close_after = True
        if parts[0] == b"HTTP/1.0":
            self._close_after = True
        if self._status in (204, 304):
            length = 0
        self._length = 0 if self._chunked else length

    def _dechunk(self) -> None:
        buf = self._buf
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return
            size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
            if size == 0:  # the last chunk, then optional trailers and an empty line
                end = buf.find(b"\r\n\r\n", eol)
                if end < 0:
                    return
                del buf[:]
                return self._finish()
            if len(buf) < eol + 2 + size + 2:
                return
            self._take(bytes(buf[eol + 2:eol + 2 + size]))
            del buf[:eol + 2 + size + 2]

    def _take(self, data: bytes) -> None:
        if self._stream and self._first is None and FIRST_CHOICE in (self._body[-len(FIRST_CHOICE):] + data):
            self._first = time.perf_counter() - self._start
        self._body += data


class Http1Pool:
    """Keep-alive connections to one origin, at most `limit` open; `warm(n)` opens them ahead of a phase.

    A connection idle for longer than `idle_s` is closed instead of reused: servers drop idle ones (vLLM's
    uvicorn after 5 s), and a request written to a connection the server is closing fails."""

    def __init__(self, base_url: str, *, limit: int, headers: dict[str, str] | None = None, idle_s: float = 1.0,
                 timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, connect_timeout_s: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base_url!r}")
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {host_header}\r\nContent-Type: application/json\r\n{extra}Content-Length: "
        self.idle_s, self.timeout_s, self.connect_timeout_s = idle_s, timeout_s, connect_timeout_s
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._limit = limit
        self._open: set[_Connection] = set()

    def request(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        """The whole request (head and body) as written on the wire; build it before a timed phase."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        return (f"POST {self.prefix}{path} HTTP/1.1\r\n{extra}{self._head}{len(body)}\r\n\r\n").encode() + body

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl,
                                   server_hostname=self.host if self.ssl else None),
            self.connect_timeout_s)
        self._open.add(conn)
        return conn

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be dropped by the server
            if not conn.closed and now - conn.idle_since < self.idle_s:
                return conn
            self._close(conn)
        return None

    def _close(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if not conn.closed and conn.transport is not None:
            conn.transport.close()
        conn.closed = True

    async def warm(self, n: int) -> None:
        """Have n connections open and idle (at most the pool's limit)."""
        fresh = [c for c in self._idle if not c.closed and time.monotonic() - c.idle_since < self.idle_s]
        for conn in [c for c in self._idle if c not in fresh]:
            self._close(conn)
        self._idle = deque(fresh)
        missing = min(n, self._limit) - len(self._idle)
        if missing > 0:
            conns = await asyncio.gather(*(self._connect() for _ in range(missing)))
            self._idle.extend(conns)

    async def send(self, request: bytes, stream: bool = False) -> Reply:
        """One request on a pooled connection; resent once on a fresh connection if an idle one was dropped."""
        async with self._slots:
            for attempt in (0, 1):
                conn = self._take_idle() if attempt == 0 else None
                if conn is None:
                    conn = await self._connect()
                future = conn.send(request, stream)
                timer = asyncio.get_running_loop().call_later(self.timeout_s, conn._fail,
                                                              TimeoutError())
                try:
                    reply = await future
                except ConnectionDropped:
                    self._close(conn)
                    if attempt:
                        raise
                    continue
                except BaseException:
                    self._close(conn)
                    raise
                finally:
                    timer.cancel()
                if conn.closed:
                    self._open.discard(conn)
                else:
                    self._idle.append(conn)
                return reply
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in list(self._open):
            self._close(conn)
        self._idle.clear()
