"""The SSE relay: upstream event-stream bytes to the client as soon as each event is complete.

Algorithm: the first upstream chunk was already awaited (so a failure before the first byte could
still fall back); the response headers go out, then every chunk is cut at its last blank line
(``\\n\\n``) and the complete events are sent; the rest waits for the next chunk. Events are only
parsed when they contain one of the capture's ``markers`` (chat: ``usage``, ``tool_calls``; the
protocol's ``capture.event`` may rewrite or drop them, e.g. the usage chunk the client did not ask
for); ``markers=None`` (a translation) hands every event to ``event``, and ``finish_stream`` adds
what the end of the upstream stream implies (a translation's closing events). A task watches the client
connection: a disconnect aborts the upstream request and the step ends as cancelled (499). An
upstream failure mid-stream sends one error event in the client's protocol (``error_event``; 502
``upstream_stream_error``). ``finish`` is called exactly once, on every exit path (the whole body
of ``__call__`` is one ``try``), with the final status and error code, after ``finish_stream``
(so a translation's closing events, e.g. the Responses id, are known to it); what it returns (the
record's fsync, a give-back) is awaited before the stream's last body chunk goes out, or run as a
task when the relay was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.server.errors import error_body
from router.server.hotpath.upstream import UpstreamError, UpstreamResponse

__all__ = ["SSERelay"]

_BACKGROUND: set[asyncio.Future[None]] = set()  # give-backs of cancelled relays, until they finish


def _marked(data: bytes, marks: tuple[bytes, ...]) -> bool:
    """Whether ``data`` holds one of ``marks`` (a loop: a generator per chunk cost more than the
    searches)."""
    for m in marks:
        if m in data:
            return True
    return False


class SSERelay(Response):
    """Raw ASGI streaming response; see the module docstring."""

    def __init__(
        self,
        resp: UpstreamResponse,
        it: AsyncIterator[bytes],
        first: bytes,
        headers: dict[str, str],
        event: Callable[[bytes], bytes | None],
        finish: Callable[[int, str | None], Awaitable[None] | None],
        *,
        on_stream_error: Callable[[], None] | None = None,
        label: str = "upstream",
        inflight: Callable[[int], None] | None = None,
        markers: tuple[bytes, ...] | None = (b'"usage"', b'"tool_calls"'),
        finish_stream: Callable[[], bytes] | None = None,
        error_event: Callable[[int, str, str], bytes] | None = None,
    ):
        self.markers = markers
        self.finish_stream = finish_stream
        self.error_event = error_event
        self.resp, self.it, self.first = resp, it, first
        self.event, self.finish = event, finish
        self.on_stream_error, self.label, self.inflight = on_stream_error, label, inflight
        self.status_code = resp.status
        hdrs = {
            "content-type": resp.headers.get("content-type", "text/event-stream"),
            "cache-control": "no-cache",
            **headers,
        }
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in hdrs.items()]
        self.background = None
        self._tail = b""
        self._finished = False

    def _done(self, status: int, code: str | None) -> Awaitable[None] | None:
        if self._finished:
            return None
        self._finished = True
        return self.finish(status, code)

    def _done_later(self, status: int, code: str | None) -> None:
        after = self._done(status, code)
        if after is not None:
            fut = asyncio.ensure_future(after)
            _BACKGROUND.add(fut)
            fut.add_done_callback(_BACKGROUND.discard)

    def _filter(self, chunk: bytes) -> bytes:
        buf = self._tail + chunk if self._tail else chunk
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._tail = buf
            return b""
        complete, self._tail = buf[: cut + 2], buf[cut + 2 :]
        marks = self.markers
        if marks is not None and not _marked(complete, marks):  # most chunks: relayed as they are
            return complete
        out = []
        for ev in complete.split(b"\n\n"):
            if not ev:
                continue
            if marks is None or _marked(ev, marks):
                kept = self.event(ev)
                if kept is None:
                    continue
                ev = kept
            out.append(ev + b"\n\n")
        return b"".join(out)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    disconnected = True
                    self.resp.close()
                    return

        watcher: asyncio.Future[None] | None = None
        status, code = 200, None
        counted = False
        try:
            watcher = asyncio.ensure_future(watch())
            # let the watcher read a disconnect that happened while the first chunk was awaited:
            # uvicorn's send() to a gone client returns without yielding, so a stream whose chunks
            # are all buffered would otherwise be relayed (and logged 200) without the watcher
            # ever running
            await asyncio.sleep(0)
            if self.inflight is not None:
                self.inflight(1)
                counted = True
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            out = self._filter(self.first)
            if out and not disconnected:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            try:
                async for chunk in self.it:
                    if disconnected:
                        break
                    out = self._filter(chunk)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
            except UpstreamError:
                if not disconnected:
                    status, code = 502, "upstream_stream_error"
                    if self.on_stream_error is not None:
                        self.on_stream_error()
                    msg = f"{self.label} failed mid-stream"
                    if self.error_event is not None:
                        err = self.error_event(502, code, msg)
                    else:
                        err = b"data: " + error_body(502, code, msg) + b"\n\n"
                    tail = b"" if self.markers is None else self._tail
                    await send({"type": "http.response.body", "body": tail + err, "more_body": True})
                    self._tail = b""
            if not disconnected:
                await asyncio.sleep(0)  # one more turn for the watcher before the status is decided
            if disconnected:
                status, code = 499, "client_cancelled"
            end = b""
            if not disconnected:
                if self.markers is not None:
                    end = self._tail
                elif self._tail.strip():
                    end = self.event(self._tail) or b""
                if self.finish_stream is not None and status == 200:
                    end += self.finish_stream()
            after = self._done(status, code)
            if after is not None:
                await after
            if not disconnected:
                await send({"type": "http.response.body", "body": end, "more_body": False})
        except (OSError, asyncio.CancelledError) as e:
            status, code = 499, "client_cancelled"
            self.resp.close()
            if isinstance(e, asyncio.CancelledError):
                self._done_later(status, code)
                raise
        except BaseException:
            status, code = 502, "relay_error"
            self._done_later(status, code)
            raise
        finally:
            if counted and self.inflight is not None:
                self.inflight(-1)
            if watcher is not None:
                watcher.cancel()
            with contextlib.suppress(Exception):
                self.resp.close()
        self._done_later(status, code)
