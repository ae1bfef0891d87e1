"""The upstream-client seam: how the sidecar talks to vLLM replicas and the frontier API.

The proxy only sees :class:`Upstream` (``post``/``get``/``close``) and :class:`UpstreamResponse`
(``status``, ``headers``, ``read()``, ``iter_chunks()``, ``close()``). Two implementations:

- :class:`AiohttpUpstream`, the production client: one pooled ``aiohttp.ClientSession`` per tier
  (``local``, ``frontier``), keep-alive, no per-request session; with ``lean`` (the default) a
  ``POST`` to a plain ``http://`` URL goes through :class:`router.server.hotpath.h1client.H1Pool`
  instead (one per tier: an asyncio protocol around httptools' parser, the same timeouts and error
  kinds, a third of aiohttp's CPU per request; issue 26), ``https://`` and every ``GET`` (the
  metrics scraper) stay on aiohttp. aiohttp was chosen by
  measurement (../shared/bench-peers: the same FastAPI front held 400 req/s at 0.4-0.9 ms CPU per
  request with aiohttp, where httpx cost 2-3 ms and collapsed). Knobs: ``connect_s`` (TCP connect),
  ``first_byte_s`` (socket read timeout: until headers, and between stream chunks), ``total_s``
  (whole request), ``limit`` (pooled connections per tier).
- :class:`FakeUpstream`, in memory, for unit tests: a handler function answers each call with a
  :class:`FakeReply` (status, body or SSE chunks) or raises :class:`UpstreamError`.

Failures before a response are raised as :class:`UpstreamError` with ``kind`` ``connect`` or
``timeout``; failures while reading a body as ``kind="stream"``. ``UpstreamResponse.close()``
aborts the upstream request (the connection is dropped, so the backend sees the cancel).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "UpstreamError",
    "UpstreamResponse",
    "Upstream",
    "AiohttpUpstream",
    "FakeReply",
    "FakeUpstream",
]


class UpstreamError(Exception):
    """An upstream call failed; ``kind`` is ``connect``, ``timeout`` or ``stream``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class UpstreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes: ...
    def iter_chunks(self) -> AsyncIterator[bytes]: ...
    def close(self) -> None: ...


class Upstream(Protocol):
    async def start(self) -> None: ...
    async def post(
        self, tier: str, url: str, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse: ...
    async def get(self, tier: str, url: str, timeout_s: float) -> tuple[int, bytes]: ...
    async def close(self) -> None: ...


class _AiohttpResponse:
    __slots__ = ("_r", "status", "headers")

    def __init__(self, r: aiohttp.ClientResponse):
        self._r = r
        self.status: int = r.status
        self.headers: Mapping[str, str] = r.headers

    async def read(self) -> bytes:
        import aiohttp

        try:
            return await self._r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise UpstreamError("stream", f"upstream body read failed: {type(e).__name__}") from None
        finally:
            self._r.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        import aiohttp

        try:
            async for chunk in self._r.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise UpstreamError("stream", f"upstream stream failed: {type(e).__name__}") from None

    def close(self) -> None:
        self._r.close()


class AiohttpUpstream:
    """One pooled aiohttp session per tier; create inside the running loop via :meth:`start`."""

    def __init__(
        self,
        *,
        connect_s: float = 2.0,
        first_byte_s: float = 60.0,
        total_s: float = 600.0,
        limit: int = 1000,
        tiers: tuple[str, ...] = ("local", "frontier"),
        lean: bool = True,
    ):
        self.connect_s, self.first_byte_s, self.total_s, self.limit = connect_s, first_byte_s, total_s, limit
        self.tiers = tiers
        self.lean = lean
        self._sessions: dict[str, Any] = {}
        self._h1: dict[str, Any] = {}  # tier -> H1Pool (plain-http posts, router.server.hotpath.h1client)

    async def start(self) -> None:
        import aiohttp

        if self.lean:
            from router.server.hotpath.h1client import H1Pool

            for t in self.tiers:
                if t not in self._h1:
                    self._h1[t] = H1Pool(
                        connect_s=self.connect_s,
                        read_s=self.first_byte_s,
                        total_s=self.total_s,
                        limit=self.limit,
                    )
        for t in self.tiers:
            if t not in self._sessions:
                self._sessions[t] = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self.limit, keepalive_timeout=60, ttl_dns_cache=300),
                    timeout=aiohttp.ClientTimeout(
                        total=self.total_s, sock_connect=self.connect_s, sock_read=self.first_byte_s
                    ),
                    auto_decompress=False,
                    skip_auto_headers=("User-Agent",),
                )

    async def post(self, tier: str, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        if url.startswith("http://"):
            h1 = self._h1.get(tier)
            if h1 is not None:
                return await h1.post(url, body, headers)  # type: ignore[no-any-return]
        import aiohttp

        try:
            r = await self._sessions[tier].post(url, data=body, headers=headers)
        except asyncio.TimeoutError:
            raise UpstreamError("timeout", f"no response from {tier} upstream within the timeout") from None
        except aiohttp.ClientError as e:
            raise UpstreamError("connect", f"cannot reach {tier} upstream: {type(e).__name__}") from None
        return _AiohttpResponse(r)

    async def get(self, tier: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with self._sessions[tier].get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status, await r.read()
        except asyncio.TimeoutError:
            raise UpstreamError("timeout", f"GET {url} timed out") from None
        except aiohttp.ClientError as e:
            raise UpstreamError("connect", f"GET {url} failed: {type(e).__name__}") from None

    async def close(self) -> None:
        for h in self._h1.values():
            await h.close()
        self._h1.clear()
        for s in self._sessions.values():
            await s.close()
        self._sessions.clear()


# ---------------------------------------------------------------- in-memory fake (unit tests)


@dataclass
class FakeReply:
    """What the fake upstream answers: ``body`` (non-streaming) or ``chunks`` (streamed bytes)."""

    status: int = 200
    body: bytes = b""
    chunks: list[bytes] | None = None
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    chunk_delay_s: float = 0.0
    fail_after_chunks: int | None = None  # raise UpstreamError("stream") after this many chunks


@dataclass
class FakeCall:
    tier: str
    url: str
    body: bytes
    headers: dict[str, str]


class _FakeResponse:
    def __init__(self, reply: FakeReply, on_close: Callable[[], None]):
        self._reply = reply
        self.status = reply.status
        self.headers: Mapping[str, str] = reply.headers
        self._on_close = on_close
        self.closed = False

    async def read(self) -> bytes:
        if self._reply.chunks is not None:
            return b"".join(self._reply.chunks)
        return self._reply.body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        chunks = self._reply.chunks if self._reply.chunks is not None else [self._reply.body]
        for i, c in enumerate(chunks):
            if self.closed:
                return
            if self._reply.fail_after_chunks is not None and i >= self._reply.fail_after_chunks:
                raise UpstreamError("stream", "fake upstream failed mid-stream")
            if self._reply.chunk_delay_s:
                await asyncio.sleep(self._reply.chunk_delay_s)
            yield c

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()


class FakeUpstream:
    """In-memory upstream: ``handler(call) -> FakeReply`` or raise UpstreamError. Records calls."""

    def __init__(self, handler: Callable[[FakeCall], FakeReply]):
        self.handler = handler
        self.calls: list[FakeCall] = []
        self.closed_responses = 0
        self.get_replies: dict[str, tuple[int, bytes]] = {}

    async def start(self) -> None:
        return None

    async def post(self, tier: str, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        call = FakeCall(tier, url, body, dict(headers))
        self.calls.append(call)
        reply = self.handler(call)

        def _closed() -> None:
            self.closed_responses += 1

        return _FakeResponse(reply, _closed)

    async def get(self, tier: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        for suffix, reply in self.get_replies.items():
            if url.endswith(suffix):
                return reply
        raise UpstreamError("connect", f"fake: no GET reply for {url}")

    async def close(self) -> None:
        return None
