"""A lean HTTP/1.1 client for plain-``http://`` upstreams (issue 26: the upstream call's CPU).

The sidecar's upstream call is one ``POST`` of a body it already holds as bytes, to a handful of
hosts, answered with a body (JSON) or a stream (SSE). aiohttp's client does much more per request
(URL objects, a request and a response object with their helpers, a payload registry lookup, a
timer rescheduled at every read, redirects, cookies, decompression): in the realistic bench its
Python code was ~17% of the sidecar's CPU samples. This client is an asyncio protocol around
httptools' response parser (the C parser uvicorn uses), with a keep-alive pool per host.

Algorithm per request (:meth:`H1Pool.post`):

1. The URL is split once (a cache by URL string: host, port, path, ``Host`` header).
2. An idle kept-alive connection to that host is taken (newest first; one that the peer closed
   or that idled over ``keepalive_s`` is dropped), else a new one is opened within ``connect_s``
   (at most ``limit`` connections per host at once; a request over it waits for one to free).
3. The request head (``POST <path> HTTP/1.1``, ``Host``, ``Content-Length``, the caller's
   headers) and the body go out in one ``writelines``.
4. The response is parsed as it arrives (httptools; chunked bodies de-chunked); the status and
   headers wake :meth:`post`; body pieces go to the response's queue (:meth:`H1Response.read`,
   :meth:`H1Response.iter_chunks`). A complete response whose connection may be kept alive
   (``should_keep_alive``) returns the connection to the pool; anything else closes it.

Timeouts, as aiohttp's ``ClientTimeout(total, sock_connect, sock_read)`` that the production
client used: ``connect_s`` for the TCP connect; ``read_s`` while no byte arrives (until the headers
and between body pieces); ``total_s`` for the whole request, its body included. One timer per
request: it fires at the earlier of the two deadlines and re-arms itself when data came meanwhile
(a read records only its time). Error kinds (:class:`router.server.hotpath.upstream.UpstreamError`)
as the aiohttp seam maps them: a refused or failed connect, a connection lost or a response that
does not parse before the headers: ``connect``; any timeout before the headers (the connect's
included): ``timeout``; anything after the headers (lost connection, parse error, timeout):
``stream``. :meth:`H1Response.close` before the end aborts the connection (the backend sees the
cancel); after the end it does nothing (the connection is back in the pool).

Differences from aiohttp that the sidecar does not rely on: no redirects are followed (a 3xx is
returned as it is; vLLM and OpenAI-compatible APIs do not redirect a completion), no
``Accept-Encoding`` is sent (the body is relayed as it comes; aiohttp ran with
``auto_decompress=False`` and asked for gzip), no cookies, no proxies from the environment.
``https://`` URLs are not handled here (:class:`router.server.hotpath.upstream.AiohttpUpstream`
keeps them on aiohttp).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools

from router.server.hotpath.upstream import UpstreamError

__all__ = ["H1Pool", "H1Response", "ResponseHeaders", "split_url"]

_HIGH_WATER = 1 << 20  # body bytes buffered before the socket's reading is paused
_LOW_WATER = 1 << 18


class ResponseHeaders(dict):  # type: ignore[type-arg]
    """A response's headers by lower-case name (the first value of a repeated name; the sidecar
    reads ``content-type`` only); :meth:`get` ignores case, as aiohttp's headers did."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


def split_url(url: str) -> tuple[str, int, bytes, bytes]:
    """``(host, port, request-target, Host header value)`` of an ``http://`` URL."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"not a plain http URL: {url!r}")
    port = u.port or 80
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = u.hostname
    shown = f"[{host}]" if ":" in host else host
    hosthdr = shown if port == 80 else f"{shown}:{port}"
    return host, port, target.encode("latin-1"), hosthdr.encode("latin-1")


class H1Response:
    """One response: ``status`` and ``headers`` once :meth:`H1Pool.post` returns it; the body
    through :meth:`read` (all of it) or :meth:`iter_chunks` (pieces as they arrive); ``close``."""

    __slots__ = (
        "status",
        "headers",
        "_conn",
        "_pool",
        "_loop",
        "_chunks",
        "_buffered",
        "_waiter",
        "_complete",
        "_error",
        "_started",
        "_timer",
        "_total_at",
        "_read_s",
        "_last",
        "_paused",
        "_streaming",
        "_raw",
    )

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop, total_at: float, read_s: float):
        self.status = 0
        self.headers: Mapping[str, str] = ResponseHeaders()
        self._conn: _Conn | None = conn
        self._loop = loop
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: UpstreamError | None = None
        self._started = False  # the headers arrived
        self._total_at = total_at
        self._read_s = read_s
        self._last = loop.time()
        self._paused = False
        self._streaming = False  # iter_chunks: the socket is paused while its consumer lags
        self._raw: list[tuple[bytes, bytes]] = []
        self._timer: asyncio.TimerHandle | None = loop.call_at(
            min(total_at, self._last + read_s), self._check
        )

    # ---------------------------------------------------------------- timer
    def _check(self) -> None:
        """The request's one timer: a deadline passed, or data came since it was armed (re-arm)."""
        self._timer = None
        if self._complete or self._error is not None:
            return
        now = self._loop.time()
        due = self._last + self._read_s
        if now >= self._total_at or now >= due:
            kind = "stream" if self._started else "timeout"
            conn = self._conn
            self._fail(UpstreamError(kind, "upstream timed out" + (" mid-body" if self._started else "")))
            if conn is not None:
                conn.abort()
            return
        self._timer = self._loop.call_at(min(self._total_at, due), self._check)

    def _stop_timer(self) -> None:
        t = self._timer
        if t is not None:
            t.cancel()
            self._timer = None

    # ---------------------------------------------------------------- from the protocol
    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _headers_done(self, status: int) -> None:
        self.status = status
        hdrs = ResponseHeaders()
        for k, v in self._raw:
            name = k.decode("latin-1").lower()
            if name not in hdrs:
                dict.__setitem__(hdrs, name, v.decode("latin-1"))
        self.headers = hdrs
        self._raw = []
        self._started = True
        self._wake()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and self._streaming and not self._paused and self._conn is not None:
            self._paused = True
            self._conn.pause()
        self._wake()

    def _done(self) -> None:
        self._complete = True
        if self._paused:  # the end was in the bytes read before the pause: the pool gets it reading
            self._paused = False
            if self._conn is not None:
                self._conn.resume()
        self._conn = None
        self._stop_timer()
        self._wake()

    def _fail(self, err: UpstreamError) -> None:
        if self._error is None and not self._complete:
            self._error = err
        self._conn = None
        self._stop_timer()
        self._wake()

    # ---------------------------------------------------------------- the caller's side
    async def _wait(self) -> None:
        w = self._waiter = self._loop.create_future()
        await w

    async def _headers(self) -> None:
        """Until the status and headers arrived (or the request failed)."""
        try:
            while not self._started and self._error is None:
                await self._wait()
        except BaseException:  # cancelled: the request is dropped with its connection
            self.close()
            raise
        if not self._started:
            assert self._error is not None
            raise self._error

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        if len(chunks):
            chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._conn is not None:
                self._conn.resume()
        return data

    async def read(self) -> bytes:
        """The whole body; ``UpstreamError("stream")`` when it cannot be read to its end."""
        try:
            while not self._complete and self._error is None:
                await self._wait()
        except BaseException:
            self.close()
            raise
        if self._error is not None:
            self.close()
            raise self._error
        if not self._chunks:
            return b""
        return self._take()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive (what is buffered when the caller asks, joined)."""
        self._streaming = True
        try:
            while True:
                if self._chunks:
                    yield self._take()
                    continue
                if self._error is not None:
                    raise self._error
                if self._complete:
                    return
                await self._wait()
        except GeneratorExit:
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Abort the request when its response is not complete (the connection is dropped, so the
        backend sees the cancel); nothing after the end."""
        self._stop_timer()
        conn = self._conn
        if conn is not None and not self._complete:
            self._conn = None
            if self._error is None:
                self._error = UpstreamError("stream", "upstream response closed")
            conn.abort()


class _Conn(asyncio.Protocol):
    """One TCP connection to one host: the protocol and httptools' callbacks."""

    __slots__ = ("pool", "key", "transport", "parser", "resp", "lost", "idle_at", "loop")

    def __init__(self, pool: H1Pool, key: tuple[str, int], loop: asyncio.AbstractEventLoop):
        self.pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: H1Response | None = None
        self.lost = False
        self.idle_at = 0.0

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:  # bytes on an idle connection: not a state it can be reused in
            self.abort()
            return
        r._last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            r = self.resp if self.resp is not None else r
            kind = "stream" if r._started else "connect"
            r._fail(UpstreamError(kind, f"upstream sent a malformed response: {type(e).__name__}"))
            self.resp = None
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the transport (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._forget(self)
        r = self.resp
        if r is None:
            return
        self.resp = None
        if r._started and not r._complete and exc is None and _ends_at_eof(self.parser, r):
            r._done()  # a body delimited by the connection's end (no length, not chunked)
            return
        kind = "stream" if r._started else "connect"
        r._fail(UpstreamError(kind, "upstream closed the connection" + (" mid-body" if r._started else "")))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        r = self.resp
        if r is not None:
            r._raw.append((name, value))

    def on_headers_complete(self) -> None:
        r = self.resp
        if r is not None:
            r._headers_done(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        r = self.resp
        if r is not None:
            r._feed(body)

    def on_message_complete(self) -> None:
        r = self.resp
        if r is None:
            return
        self.resp = None
        keep = self.parser.should_keep_alive() and not self.lost
        r._done()
        if keep:
            self.pool._release(self)
        else:
            self.abort()

    # helpers
    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abort(self) -> None:
        self.lost = True
        self.pool._forget(self)
        if self.transport is not None:
            self.transport.abort()


def _ends_at_eof(parser: Any, r: H1Response) -> bool:
    """Whether a response's body is delimited by the connection's end: neither a length nor
    chunked coding (HTTP/1.1 section 6.3, rule 7)."""
    h = r.headers
    return "content-length" not in h and "chunked" not in str(h.get("transfer-encoding", "")).lower()


class H1Pool:
    """Keep-alive HTTP/1.1 connections per (host, port); see the module docstring. Create inside
    the running loop (it binds to it at the first request)."""

    def __init__(
        self,
        *,
        connect_s: float = 2.0,
        read_s: float = 60.0,
        total_s: float = 600.0,
        limit: int = 1000,
        keepalive_s: float = 60.0,
    ):
        self.connect_s, self.read_s, self.total_s = connect_s, read_s, total_s
        self.limit, self.keepalive_s = limit, keepalive_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._waiters: dict[tuple[str, int], deque[asyncio.Future[None]]] = {}
        self._all: set[_Conn] = set()
        self._urls: dict[str, tuple[str, int, bytes, bytes]] = {}
        self.opened = 0  # connections opened (tests, benches)

    def _target(self, url: str) -> tuple[str, int, bytes, bytes]:
        t = self._urls.get(url)
        if t is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            t = self._urls[url] = split_url(url)
        return t

    # ---------------------------------------------------------------- the pool
    def _forget(self, conn: _Conn) -> None:
        if conn in self._all:
            self._all.discard(conn)
            key = conn.key
            self._open[key] -= 1
            idle = self._idle.get(key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake_one(key)

    def _wake_one(self, key: tuple[str, int]) -> None:
        q = self._waiters.get(key)
        while q:
            w = q.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _release(self, conn: _Conn) -> None:
        conn.idle_at = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one(conn.key)

    async def _acquire(self, key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            c = idle.pop()
            if not c.lost and c.transport is not None and not c.transport.is_closing():
                if time.monotonic() - c.idle_at <= self.keepalive_s:
                    return c
            c.abort()
        while self._open.get(key, 0) >= self.limit:
            w = loop.create_future()
            self._waiters.setdefault(key, deque()).append(w)
            await w
            idle = self._idle.get(key)
            while idle:
                c = idle.pop()
                if not c.lost and c.transport is not None and not c.transport.is_closing():
                    return c
                c.abort()
        self._open[key] = self._open.get(key, 0) + 1
        conn = _Conn(self, key, loop)
        self._all.add(conn)
        try:
            async with asyncio.timeout(self.connect_s):
                await loop.create_connection(lambda: conn, key[0], key[1])
        except TimeoutError:
            self._forget(conn)
            raise UpstreamError("timeout", f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as e:
            self._forget(conn)
            raise UpstreamError(
                "connect", f"cannot connect to {key[0]}:{key[1]}: {type(e).__name__}"
            ) from None
        except BaseException:
            self._forget(conn)
            conn.abort()
            raise
        self.opened += 1
        return conn

    # ---------------------------------------------------------------- requests
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> H1Response:
        """Send ``body`` to ``url``; returns once the status and headers arrived."""
        host, port, target, hosthdr = self._target(url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        conn = await self._acquire((host, port), loop)
        if conn.lost or conn.transport is None:  # a new connection the peer closed at once
            self._forget(conn)
            raise UpstreamError("connect", f"{host}:{port} closed the connection")
        head = [
            b"POST ",
            target,
            b" HTTP/1.1\r\nHost: ",
            hosthdr,
            b"\r\nContent-Length: ",
            str(len(body)).encode(),
        ]
        for k, v in headers.items():
            lk = k.lower()
            if lk in ("host", "content-length", "transfer-encoding", "connection"):
                continue
            head.append(b"\r\n")
            head.append(k.encode("latin-1"))
            head.append(b": ")
            head.append(v.encode("latin-1"))
        head.append(b"\r\n\r\n")
        total_left = self.total_s - (loop.time() - start)
        resp = H1Response(conn, loop, loop.time() + total_left, self.read_s)
        conn.resp = resp
        conn.transport.writelines((b"".join(head), body))
        await resp._headers()
        return resp

    async def close(self) -> None:
        for c in list(self._all):
            c.abort()
        self._all.clear()
        self._idle.clear()
        self._open.clear()
