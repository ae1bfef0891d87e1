"""Connection and body limits of the sidecar's HTTP server (uvicorn + httptools).

Algorithm:

- **Connections** (:class:`GuardedHttpToolsProtocol`, uvicorn's httptools protocol plus two
  timers): a connection with no request in progress (just accepted, or after a response) is closed
  after ``server.idle_timeout_s`` without a byte (uvicorn's own keep-alive timer does it between
  requests; the first timer here does it for a connection that never sends anything); from the
  first byte of a request, its headers must be complete within ``server.header_timeout_s``, else
  the connection is closed (a slow-header client holds a socket for at most that long). uvicorn's
  ``limit_concurrency`` = ``server.max_connections``: a request that arrives while that many
  connections are open is answered 503 at once (uvicorn's plain-text 503) and the connection closed.
- **Bodies** (:func:`read_body_guarded`, run by :class:`router.server.app` for every request
  outside the hot paths, and :func:`timed_receive` for the hot paths, whose handler reads its own
  body): one limit, ``server.max_body_bytes``, for every endpoint; a ``Content-Length`` above it
  is answered 413 ``body_too_large`` before a byte of the body is read (so a huge announced length
  with a small body gets its answer at once), a body that grows past it while read too; a body
  whose next piece takes longer than ``server.body_timeout_s`` is answered 408 ``body_timeout``.
  Both answers carry ``connection: close`` (the rest of the body is never read).
- **File descriptors** (:func:`raise_nofile`): ``runroute serve`` raises the process's soft
  ``RLIMIT_NOFILE`` towards ``max_connections`` plus a margin (never above the hard limit, and
  says so when the hard limit is lower).

Knobs (``server.*``, defaults and how they were chosen: docs/server-limits.md):
``header_timeout_s`` (10 s), ``idle_timeout_s`` (15 s), ``body_timeout_s`` (30 s),
``max_connections`` (8192), ``max_body_bytes`` (8 MiB).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.server.errors import ProxyError

if TYPE_CHECKING:
    from router.server.settings import ServerSettings

__all__ = [
    "BodyError",
    "read_body_guarded",
    "timed_receive",
    "replay_receive",
    "GuardedHttpToolsProtocol",
    "guarded_protocol",
    "uvicorn_options",
    "raise_nofile",
    "FD_MARGIN",
]

log = logging.getLogger("runroute.limits")

#: file descriptors kept beyond ``max_connections`` (upstream pools, Redis, run-log files, fakes)
FD_MARGIN = 512

Receive = Callable[[], Awaitable[Any]]

_CLOSE = {"connection": "close"}


class BodyError(ProxyError):
    """A body refused while it was read (413 / 408, ``connection: close``)."""


def too_large(n: int | None, limit: int) -> BodyError:
    what = f"body of {n} bytes" if n is not None else "body"
    return BodyError(413, "body_too_large", f"{what} exceeds the limit of {limit} bytes", dict(_CLOSE))


def _timeout(timeout_s: float) -> BodyError:
    return BodyError(
        408, "body_timeout", f"no part of the request body arrived for {timeout_s:g}s", dict(_CLOSE)
    )


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` (None when absent); 400 when it is not a number."""
    for k, v in headers:
        if k == b"content-length":
            try:
                n = int(v)
            except ValueError:
                raise BodyError(400, "invalid_content_length", "bad Content-Length", dict(_CLOSE)) from None
            if n < 0:
                raise BodyError(400, "invalid_content_length", "bad Content-Length", dict(_CLOSE))
            return n
    return None


async def read_body_guarded(
    receive: Receive, headers: list[tuple[bytes, bytes]], max_body: int, timeout_s: float
) -> bytes | None:
    """The whole body (module docstring); None when the client went away meanwhile."""
    n = content_length(headers)
    if n is not None and n > max_body:
        raise too_large(n, max_body)
    parts: list[bytes] = []
    total = 0
    while True:
        msg = await _receive_within(receive, timeout_s)
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        total += len(chunk)
        if total > max_body:
            raise too_large(None, max_body)
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


def replay_receive(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` once, then waits on the real one (disconnects)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


_TIMEOUT = getattr(asyncio, "timeout", None)


class _Resumed:
    """Awaits a coroutine that has already run up to its first suspension (``first``: what it
    yielded there): ``yield from`` that starts at the suspension (:func:`_receive_within`)."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Any, first: Any) -> None:
        self.coro, self.first = coro, first

    def __await__(self) -> Any:
        coro, out = self.coro, self.first
        self.coro = self.first = None
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # a cancellation (the deadline's) goes on into the coroutine
                try:
                    out = coro.throw(e)
                except StopIteration as done:
                    return done.value
                continue
            try:
                out = coro.send(sent)
            except StopIteration as done:
                return done.value


async def _receive_within(receive: Receive, timeout_s: float) -> Any:
    """The next ASGI message, or :class:`BodyError` 408 when none comes within ``timeout_s``.

    The ``receive`` coroutine is first run up to its first suspension: a message the server
    already holds (the usual case: uvicorn buffers what arrived) is returned without a timer;
    only a wait is put under the deadline (a timer on this task: ``asyncio.timeout``)."""
    coro: Any = receive()
    if _TIMEOUT is None or not asyncio.iscoroutine(coro):  # pragma: no cover - Python 3.10 / odd servers
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise _timeout(timeout_s) from None
    try:
        first = coro.send(None)
    except StopIteration as done:  # answered without waiting
        return done.value
    try:
        async with _TIMEOUT(timeout_s):
            return await _Resumed(coro, first)
    except TimeoutError:
        raise _timeout(timeout_s) from None


def timed_receive(receive: Receive, timeout_s: float) -> Receive:
    """A ``receive`` whose body messages must each arrive within ``timeout_s`` (408 otherwise,
    raised as :class:`BodyError`, which the hot path answers in its protocol's shape); once the
    body is complete it is the plain ``receive`` (a disconnect watch may wait as long as it likes).
    The deadline is ``asyncio.timeout`` on the caller's task (``wait_for`` made a task and a loop
    turn per body message: ~5% of the sidecar's own CPU per request)."""
    done = False

    async def timed() -> Any:
        nonlocal done
        if done:
            return await receive()
        msg = await _receive_within(receive, timeout_s)
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            done = True
        return msg

    return timed


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the idle and header timers (module docstring)."""

    header_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    _guard: asyncio.TimerHandle | None = None

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._guard = self.loop.call_later(delay, self._expire)

    def _disarm(self) -> None:
        g = self._guard
        if g is not None:
            g.cancel()
            self._guard = None

    def _expire(self) -> None:
        self._guard = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.idle_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded_protocol(server: ServerSettings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with ``server``'s (``ServerSettings``) timeouts."""
    return type(
        "RunrouteHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout_s": server.header_timeout_s, "idle_timeout_s": server.idle_timeout_s},
    )


def uvicorn_options(server: ServerSettings) -> dict[str, Any]:
    """The uvicorn.Config keyword arguments of ``server`` (``ServerSettings``) limits."""
    return {
        "http": guarded_protocol(server),
        "timeout_keep_alive": server.idle_timeout_s,
        "limit_concurrency": server.max_connections,
    }


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to ``wanted`` (at most the hard limit); ``(soft, hard)``
    after. Never lowers it; a platform without ``resource`` keeps what it has."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:  # pragma: no cover - a sandbox that forbids it
            log.warning("could not raise the open-file limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open-file limit %d is below server.max_connections + %d = %d: connections beyond it fail",
            soft,
            FD_MARGIN,
            wanted,
        )
    return soft, hard
