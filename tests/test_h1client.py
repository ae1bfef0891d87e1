"""The lean plain-http upstream client (router.server.hotpath.h1client) against the aiohttp client it
replaces for ``http://`` POSTs: the same status, content type, body and error kinds from the same
raw server, for every response shape the sidecar meets (length, chunked, SSE in pieces, errors,
bodies over the buffer's high-water mark), plus keep-alive, the abort on close and the limit."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from router.server.hotpath.h1client import H1Pool, ResponseHeaders, split_url
from router.server.hotpath.upstream import AiohttpUpstream, UpstreamError

JSON = b'{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3}}'


class RawServer:
    """A server that answers each request with ``script(request_head, body, writer)``."""

    def __init__(self, script):
        self.script = script
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.closed = 0
        self.server: asyncio.base_events.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":", 1)[1])
                body = await reader.readexactly(n)
                self.requests.append((head, body))
                keep = await self.script(head, body, writer)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            with contextlib.suppress(Exception):
                writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def _length(body: bytes, status: int = 200, ctype: bytes = b"application/json", extra: bytes = b""):
    async def script(head, req_body, w):
        w.write(
            b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, ctype, len(body), extra)
            + body
        )
        return b"connection: close" not in extra.lower()

    return script


def _chunked(pieces: list[bytes], delay: float = 0.0, ctype: bytes = b"text/event-stream"):
    async def script(head, req_body, w):
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % ctype)
        for p in pieces:
            w.write(b"%x\r\n%s\r\n" % (len(p), p))
            await w.drain()
            if delay:
                await asyncio.sleep(delay)
        w.write(b"0\r\n\r\n")
        return True

    return script


async def _outcome(up: AiohttpUpstream, url: str, stream: bool, body: bytes = b'{"a":1}'):
    """(status, content-type, body) or ("error", kind, where) of one POST."""
    try:
        r = await up.post("local", url, body, {"content-type": "application/json", "X-Key": "k"})
    except UpstreamError as e:
        return ("error", e.kind, "post")
    try:
        if stream:
            got = b""
            async for c in r.iter_chunks():
                got += c
        else:
            got = await r.read()
    except UpstreamError as e:
        return ("error", e.kind, "body")
    finally:
        r.close()
    return (r.status, r.headers.get("Content-Type"), got)


async def _both(script, stream: bool, **kw):
    outs = []
    for lean in (False, True):
        up = AiohttpUpstream(lean=lean, **kw)
        await up.start()
        try:
            async with RawServer(script) as url:
                outs.append(await _outcome(up, url, stream))
        finally:
            await up.close()
    return outs


SHAPES = {
    "json": (_length(JSON), False),
    "json-empty": (_length(b""), False),
    "json-big": (_length(b"[" + b"1," * 1_500_000 + b"1]"), False),
    "error-500": (_length(b'{"error":"boom"}', 500), False),
    "error-429": (_length(b'{"error":{"message":"slow down"}}', 429, extra=b"Retry-After: 3\r\n"), False),
    "redirect-307": (_length(b"", 307, extra=b"Location: /elsewhere\r\n"), False),
    "chunked-json": (_chunked([JSON[:10], JSON[10:]], ctype=b"application/json"), False),
    "sse": (_chunked([b'data: {"x":%d}\n\n' % i for i in range(16)] + [b"data: [DONE]\n\n"], 0.002), True),
    "sse-big": (_chunked([b"data: " + b"y" * 300_000 + b"\n\n"] * 5), True),
    "sse-split-events": (_chunked([b"data: {", b'"x":1}\n', b"\ndata: [DONE]\n\n"], 0.001), True),
    "length-stream": (_length(b"data: 1\n\ndata: [DONE]\n\n", ctype=b"text/event-stream"), True),
    "connection-close": (_length(JSON, extra=b"Connection: close\r\n"), False),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_same_answer_as_aiohttp(shape):
    script, stream = SHAPES[shape]
    old, new = await _both(script, stream)
    if shape == "redirect-307":  # aiohttp follows it (to a path this server answers the same way)
        assert new[0] == 307 and new[2] == b""
        return
    assert new == old


async def test_request_bytes_reach_the_server():
    srv = RawServer(_length(JSON))
    up = AiohttpUpstream()
    await up.start()
    try:
        async with srv as url:
            body = b'{"model":"m","messages":[' + b'{"role":"user","content":"x"},' * 1000 + b"{}]}"
            r = await up.post(
                "local", url + "?q=1", body, {"content-type": "application/json", "X-Key": "k1"}
            )
            assert await r.read() == JSON
        head, got = srv.requests[0]
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /v1/chat/completions?q=1 HTTP/1.1"
        hdrs = {ln.split(b":", 1)[0].lower(): ln.split(b":", 1)[1].strip() for ln in lines[1:] if ln}
        assert hdrs[b"host"] == url.split("//")[1].split("/")[0].encode()
        assert hdrs[b"content-length"] == str(len(body)).encode()
        assert hdrs[b"content-type"] == b"application/json" and hdrs[b"x-key"] == b"k1"
        assert got == body
    finally:
        await up.close()


async def test_keep_alive_reuses_one_connection_and_drops_closed_ones():
    srv = RawServer(_length(JSON))
    pool = H1Pool()
    async with srv as url:
        for _ in range(5):
            r = await pool.post(url, b"{}", {})
            assert await r.read() == JSON
            r.close()  # after the end: nothing (the connection is back in the pool)
        assert (srv.connections, pool.opened) == (1, 1)
        srv2 = RawServer(_length(JSON, extra=b"Connection: close\r\n"))
        async with srv2 as url2:
            for _ in range(3):
                r = await pool.post(url2, b"{}", {})
                assert await r.read() == JSON
            assert srv2.connections == 3
    await pool.close()


async def test_server_closing_an_idle_connection_is_not_reused():
    closing = RawServer(_length(JSON))
    pool = H1Pool()
    async with closing as url:
        r = await pool.post(url, b"{}", {})
        assert await r.read() == JSON
        assert closing.server is not None
        closing.server.close()
        for t in asyncio.all_tasks():  # the server's handler of the kept connection
            if t is not asyncio.current_task() and "handle" in repr(t):
                t.cancel()
        await asyncio.sleep(0.05)
        srv = RawServer(_length(JSON))
        async with srv as url2:
            r = await pool.post(url2, b"{}", {})
            assert await r.read() == JSON
    await pool.close()


async def _silent(head, body, w):
    await asyncio.sleep(5)
    return False


async def _close_before_headers(head, body, w):
    return False


async def _stall_mid_body(head, body, w):
    w.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    await w.drain()
    await asyncio.sleep(5)
    return False


async def _cut_mid_body(head, body, w):
    w.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"partial":')
    await w.drain()
    return False


async def _garbage(head, body, w):
    w.write(b"NOT HTTP AT ALL\r\n\r\n")
    return False


@pytest.mark.parametrize(
    "script,stream,want",
    [
        (_silent, False, ("error", "timeout", "post")),
        (_close_before_headers, False, ("error", "connect", "post")),
        (_stall_mid_body, True, ("error", "stream", "body")),
        (_stall_mid_body, False, ("error", "stream", "body")),
        (_cut_mid_body, False, ("error", "stream", "body")),
        (_garbage, False, ("error", "connect", "post")),
    ],
)
async def test_error_kinds_as_aiohttp(script, stream, want):
    old, new = await _both(script, stream, first_byte_s=0.3)
    assert old == want
    assert new == want


async def test_total_timeout_covers_the_body():
    async def slow_pieces(head, body, w):
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(40):
            w.write(b"2\r\nab\r\n")
            await w.drain()
            await asyncio.sleep(0.05)
        return False

    old, new = await _both(slow_pieces, True, first_byte_s=0.3, total_s=0.5)
    assert old == new == ("error", "stream", "body")


async def test_connect_refused_is_connect():
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    for lean in (False, True):
        up = AiohttpUpstream(lean=lean, connect_s=0.5)
        await up.start()
        try:
            assert await _outcome(up, url, False) == ("error", "connect", "post")
        finally:
            await up.close()


async def _stall_until_eof(head, body, w):
    w.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    await w.drain()
    with contextlib.suppress(ConnectionError):
        await w._reader.read()  # type: ignore[attr-defined]  # until the client drops the connection
    return False


async def test_close_mid_stream_aborts_the_connection():
    srv = RawServer(_stall_until_eof)
    pool = H1Pool()
    async with srv as url:
        r = await pool.post(url, b"{}", {})
        it = r.iter_chunks().__aiter__()
        assert await it.__anext__() == b"hello"
        r.close()
        for _ in range(100):
            if srv.closed:
                break
            await asyncio.sleep(0.01)
        assert srv.closed == 1  # the backend saw the cancel
        with pytest.raises(UpstreamError):
            await it.__anext__()
    await pool.close()


async def test_limit_queues_requests_beyond_it():
    async def slowish(head, body, w):
        await asyncio.sleep(0.02)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        return True

    srv = RawServer(slowish)
    pool = H1Pool(limit=2)
    async with srv as url:

        async def one(i: int) -> bytes:
            r = await pool.post(url, b"%d" % i, {})
            return await r.read()

        got = await asyncio.gather(*(one(i) for i in range(8)))
        assert got == [b"%d" % i for i in range(8)]
        assert srv.connections == 2
    await pool.close()


def test_split_url_and_headers():
    assert split_url("http://h:81/a/b?x=1") == ("h", 81, b"/a/b?x=1", b"h:81")
    assert split_url("http://h/") == ("h", 80, b"/", b"h")
    assert split_url("http://[::1]:9/p") == ("::1", 9, b"/p", b"[::1]:9")
    with pytest.raises(ValueError):
        split_url("https://h/p")
    h = ResponseHeaders({"content-type": "a/b"})
    assert h.get("Content-Type") == "a/b" and h["CONTENT-TYPE"] == "a/b" and "Content-type" in h
    assert h.get("x", "d") == "d"


async def test_https_stays_on_aiohttp():
    up = AiohttpUpstream()
    await up.start()
    try:
        with pytest.raises(UpstreamError) as e:  # nothing listens: aiohttp's connect error
            await up.post("local", "https://127.0.0.1:1/v1/chat/completions", b"{}", {})
        assert e.value.kind == "connect"
    finally:
        await up.close()


async def test_slow_stream_consumer_pauses_and_resumes_the_socket(monkeypatch):
    from router.server.hotpath import h1client

    pauses = []
    real = h1client._Conn.pause
    monkeypatch.setattr(h1client._Conn, "pause", lambda self: (pauses.append(1), real(self)))
    pieces = [b"data: " + bytes([65 + i % 26]) * 200_000 + b"\n\n" for i in range(20)]  # 4 MB
    srv = RawServer(_chunked(pieces))
    pool = H1Pool()
    async with srv as url:
        r = await pool.post(url, b"{}", {})
        got = []
        async for c in r.iter_chunks():
            got.append(c)
            await asyncio.sleep(0.01)
        assert b"".join(got) == b"".join(pieces)
        assert pauses  # the high-water mark was passed while the consumer slept
        r = await pool.post(url, b"{}", {})  # the connection is still good for the next request
        assert await r.read() == b"".join(pieces)
        assert srv.connections == 1
    await pool.close()
