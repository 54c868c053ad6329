"""The load test's HTTP/1.1 request path against real sockets: framing, streams, dropped and closed connections."""
from __future__ import annotations

import asyncio

import pytest
from spillway.loadtest.http1 import ConnectionDropped, Http1Pool


class Server:
    """A scripted HTTP/1.1 server: `reply(head, body)` returns the bytes to write (a list: written apart)."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self.transports: list[asyncio.Transport] = []

    async def __aenter__(self):  # -> Server
        outer = self

        class Proto(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                outer.connections += 1
                outer.transports.append(transport)
                self.transport, self.buf = transport, bytearray()

            def data_received(self, data: bytes) -> None:
                self.buf += data
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end])
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(self.buf) < end + 4 + length:
                    return
                body = bytes(self.buf[end + 4:end + 4 + length])
                del self.buf[:end + 4 + length]
                outer.requests.append(head + b"\r\n\r\n" + body)
                asyncio.ensure_future(self._write(outer.reply(head, body)))

            async def _write(self, parts) -> None:
                for part in parts:
                    if part == b"CLOSE":
                        self.transport.close()
                        return
                    self.transport.write(part)
                    await asyncio.sleep(0.02)

        self.server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/base"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()


def run(coro):
    return asyncio.run(coro)


async def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for `condition()` to hold, yielding to the event loop; fail after timeout_s."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_content_length_reply_keeps_the_connection_and_writes_the_request_exactly():
    async def main():
        reply = b'{"usage":{"prompt_tokens":3}}'
        async with Server(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply), reply]) as srv:
            pool = Http1Pool(srv.url, limit=2, headers={"Authorization": "Bearer t"})
            first = await pool.send(pool.request("/v1/completions", b'{"prompt":[1,2,3]}'))
            second = await pool.send(pool.request("/v1/completions", b"{}"))
            pool.close()
            return srv, first, second, reply

    srv, first, second, reply = run(main())
    assert (first.status, first.body, second.body) == (200, reply, reply)
    assert srv.connections == 1  # kept alive
    head, body = srv.requests[0].split(b"\r\n\r\n")
    assert head.startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer t" in head and b"Content-Length: 18" in head and body == b'{"prompt":[1,2,3]}'


def test_a_request_s_own_headers_reach_the_server_with_the_pool_s():
    """`prefix-groups --tenant-session` names each prompt's tenant this way (a router's session key)."""
    async def main():
        async with Server(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]) as srv:
            pool = Http1Pool(srv.url, limit=1, headers={"Authorization": "Bearer t"})
            await pool.send(pool.request("/v1/completions", b"{}", {"x-session-id": "tenant-3"}))
            await pool.send(pool.request("/v1/completions", b"{}"))
            pool.close()
            return srv

    srv = run(main())
    keyed, plain = (r.split(b"\r\n\r\n")[0].split(b"\r\n") for r in srv.requests)
    assert b"x-session-id: tenant-3" in keyed and b"Authorization: Bearer t" in keyed
    assert not any(line.startswith(b"x-session-id") for line in plain)


def test_chunked_stream_times_the_first_choice_not_the_first_byte():
    events = [b'data: {"id":"x","choices":[],"usage":null}\n\n',  # no choice yet
              b'data: {"choices":[{"index":0,"text":"a"}]}\n\n',
              b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\ndata: [DONE]\n\n']

    def reply(head, body):
        out = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"]
        out += [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
        return out + [b"0\r\n\r\n"]

    async def main():
        async with Server(reply) as srv:
            pool = Http1Pool(srv.url, limit=1)
            got = await pool.send(pool.request("/v1/completions", b"{}"), stream=True)
            again = await pool.send(pool.request("/v1/completions", b"{}"), stream=True)
            pool.close()
            return srv, got, again

    srv, got, again = run(main())
    assert got.body == b"".join(events) and again.body == got.body
    # the choice came in the second of three writes 20 ms apart: after the first byte, before the end
    assert 0.015 < got.first_event_s < got.seconds - 0.01
    assert srv.connections == 1


def test_connection_close_and_http10_replies_are_not_reused():
    async def main():
        async with Server(lambda h, b: [b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbusy"]) as srv:
            pool = Http1Pool(srv.url, limit=1)
            a = await pool.send(pool.request("/x", b""))
            b = await pool.send(pool.request("/x", b""))
            pool.close()
            return srv, a, b

    srv, a, b = run(main())
    assert (a.status, a.body, b.status) == (503, b"busy", 503)
    assert srv.connections == 2


def test_a_connection_dropped_by_the_server_while_idle_is_replaced_without_failing_the_request():
    async def main():
        async with Server(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]) as srv:
            pool = Http1Pool(srv.url, limit=1, idle_s=60)
            await pool.send(pool.request("/x", b""))
            for transport in srv.transports:  # the server drops its idle connection (uvicorn: after 5 s)
                transport.close()
            await until(lambda: all(conn.closed for conn in pool._idle))  # the pool saw the close
            reply = await pool.send(pool.request("/x", b""))
            pool.close()
            return srv, reply

    srv, reply = run(main())
    assert reply.body == b"ok" and srv.connections == 2


def test_a_server_that_closes_before_replying_twice_raises_connection_dropped():
    async def main():
        async with Server(lambda h, b: [b"CLOSE"]) as srv:
            pool = Http1Pool(srv.url, limit=1)
            with pytest.raises(ConnectionDropped):
                await pool.send(pool.request("/x", b""))
            return srv

    srv = run(main())
    assert srv.connections == 2  # the request was sent once more on a fresh connection


def test_idle_connections_older_than_idle_s_are_not_reused_and_warm_opens_them_ahead():
    async def main():
        async with Server(lambda h, b: [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]) as srv:
            # Long enough that a slow machine cannot age the warmed connections before the burst uses them.
            pool = Http1Pool(srv.url, limit=8, idle_s=60)
            await pool.warm(5)
            opened_by_warm = srv.connections
            await asyncio.gather(*(pool.send(pool.request("/x", b"")) for _ in range(5)))
            after_burst = srv.connections
            pool.idle_s = 0.0  # every idle connection is now older than idle_s: none may be reused
            await pool.send(pool.request("/x", b""))
            pool.close()
            return opened_by_warm, after_burst, srv.connections

    opened_by_warm, after_burst, total = run(main())
    assert (opened_by_warm, after_burst) == (5, 5)  # the burst used the warmed connections
    assert total == 6  # the stale ones were closed, a fresh one opened


def test_a_reply_slower_than_the_timeout_fails_with_timeout():
    async def main():
        async with Server(lambda h, b: []) as srv:  # never answers
            pool = Http1Pool(srv.url, limit=1, timeout_s=0.2)
            with pytest.raises(asyncio.TimeoutError):
                await pool.send(pool.request("/x", b""))
            pool.close()

    run(main())
