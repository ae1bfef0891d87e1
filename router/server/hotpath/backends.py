"""The sidecar's upstreams as the step engine sees them, and the request-reading helpers of the hot path.

- :class:`Backend`: one upstream (name, tier, model, root URL, headers, the policy's price/latency
  template incl. a frontier's cache-write price) with this router's live in-flight count, the
  protocols it speaks (``urls``: protocol -> URL, e.g. an Anthropic frontier only ``messages``, an
  Azure deployment ``chat`` and ``responses``) and the client model names mapped to it
  (``patterns``: ``frontiers[].models`` / ``local.models``).
- :class:`BackendPool`: fresh :class:`~router.policy.types.BackendState` per step = the template +
  the latest scrape (health, running, waiting, KV usage) + this router's in-flight count; with
  ``neutral`` (a new run while the shared store is down) no load figures at all, so the placement
  is the policy's rendezvous hash alone and routers that share no pin still agree on a run's
  replica. ``for_request``: the backends one request may use: the local replicas and *one*
  frontier, the entry the client's model alias maps to, else the run's pinned frontier, else the
  default entry (the policy chooses the tier, config maps the model); a request naming a concrete
  backend model sees every backend (the policy is bypassed for it). ``cache_reading``: a local
  replica's prefix-cache counter for the engine (capacity ``local.kv_cache_tokens`` else the
  scraped ``cache_config_info``).
- :func:`read_body`: the body under ``max_body`` (``Content-Length`` checked before reading, a
  chunked body counted while reading; 413 ``body_too_large``).
- :func:`client_gone`: whether the client has disconnected, from a ``receive`` message that is
  already there (starlette's ``Request.is_disconnected`` without its anyio cancel scope, which cost
  ~10% of the sidecar's own CPU per request: a scope, a task cancel and the task's repr).
- :func:`priority_tenant`: the run's priority class (header, unknown classes -> ``batch``) and
  tenant (header, else ``metadata.tenant``, else the request's user).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request

from router.core.runs import CacheReading
from router.policy.admission import PRIORITIES
from router.policy.types import BackendState
from router.server.errors import ProxyError

if TYPE_CHECKING:
    from router.server.metrics.scrape import Scraper
    from router.server.settings import AdmissionSettings

__all__ = ["Backend", "BackendPool", "read_body", "priority_tenant", "state_of"]


@dataclass
class Backend:
    """One upstream the router may send a step to, with its live in-flight count."""

    name: str
    tier: str
    model: str
    root: str
    headers: dict[str, str]
    state_template: BackendState
    inflight: int = 0
    urls: dict[str, str] = field(default_factory=dict)
    patterns: Any = None  # name -> bool: client model names mapped here (None: none)
    pass_model: bool = False  # send the client's aliased model name upstream

    def __post_init__(self) -> None:
        if not self.urls and self.root:
            self.urls = {"chat": self.root + "/v1/chat/completions"}

    @property
    def chat_url(self) -> str:
        return self.urls.get("chat", self.root + "/v1/chat/completions")


class BackendPool:
    """The backends of one app and their per-step states (module docstring)."""

    def __init__(self, backends: list[Backend], scraper: Scraper | None, kv_cache_tokens: int | None = None):
        self.backends = {b.name: b for b in backends}
        self.models = {b.model: b.tier for b in backends}
        self.local = [b for b in backends if b.tier == "local"]
        self.frontiers = [b for b in backends if b.tier == "frontier"]
        self.scraper = scraper
        self.kv_cache_tokens = kv_cache_tokens

    def cache_reading(self, replica: str) -> CacheReading | None:
        st = self.scraper.stats.get(replica) if self.scraper is not None else None
        if st is None or not st.scraped:
            return None
        return CacheReading(st.computed_tokens, self.kv_cache_tokens or st.cache_tokens or None)

    def alias(self, name: str) -> Backend | None:
        """The frontier entry a client's model name maps to (``frontiers[].models``)."""
        for b in self.frontiers:
            if b.patterns is not None and b.patterns(name):
                return b
        return None

    def aliases(self, name: str) -> str | None:
        """The backend a client's model name maps to (a frontier entry, else a local replica whose
        ``local.models`` patterns match), or None."""
        b = self.alias(name)
        if b is None:
            b = next((x for x in self.local if x.patterns is not None and x.patterns(name)), None)
        return b.name if b is not None else None

    def for_request(self, requested: str | None, alias: str | None, pinned: str | None) -> list[Backend]:
        if requested is not None or len(self.frontiers) <= 1:
            return list(self.backends.values())
        chosen = self.alias(alias) if alias is not None else None
        if chosen is None:
            chosen = next((b for b in self.frontiers if b.name == pinned), self.frontiers[0])
        return [*self.local, chosen]

    def states(self, neutral: bool = False, backends: list[Backend] | None = None) -> list[BackendState]:
        stats = self.scraper.stats if self.scraper is not None else {}
        if neutral:
            stats = {n: replace(st, running=0, waiting=0, kv_usage=0.0) for n, st in stats.items()}
        out = []
        for b in self.backends.values() if backends is None else backends:
            t = b.state_template
            st = stats.get(b.name)
            out.append(
                BackendState(
                    name=b.name,
                    tier=t.tier,
                    model=t.model,
                    healthy=st.healthy if st is not None else t.healthy,
                    max_context=t.max_context,
                    running=(int(st.running) if st is not None else 0) + (0 if neutral else b.inflight),
                    waiting=int(st.waiting) if st is not None else 0,
                    kv_usage=st.kv_usage if st is not None else 0.0,
                    price_in_per_m=t.price_in_per_m,
                    price_cached_in_per_m=t.price_cached_in_per_m,
                    price_cache_write_per_m=t.price_cache_write_per_m,
                    price_out_per_m=t.price_out_per_m,
                    prefill_s_per_token=t.prefill_s_per_token,
                    ttft_base_s=t.ttft_base_s,
                    gpu_usd_per_hour=t.gpu_usd_per_hour,
                )
            )
        return out


def state_of(states: list[BackendState], name: str) -> BackendState | None:
    for b in states:
        if b.name == name:
            return b
    return None


class FirstHeaders(Headers):
    """starlette's ``Headers`` whose lookups (``get``, ``[]``, ``in``) read a dict of each name's
    first value, built once: starlette scans the list per lookup and raises a KeyError inside
    ``get`` for every absent name, and the hot path looks up about ten names per request, most of
    them absent. Same answers (names compared lower-cased, the first value of a repeated name)."""

    def __init__(self, scope: Any) -> None:
        super().__init__(scope=scope)
        first: dict[bytes, bytes] = {}
        for k, v in self._list:
            if k not in first:
                first[k] = v
        self._first = first

    def get(self, key: str, default: Any = None) -> Any:
        v = self._first.get(key.lower().encode("latin-1"))
        return default if v is None else v.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        v = self._first.get(key.lower().encode("latin-1"))
        if v is None:
            raise KeyError(key)
        return v.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return key.lower().encode("latin-1") in self._first


class HotRequest(Request):
    """The hot path's request: its headers are :class:`FirstHeaders`."""

    @property
    def headers(self) -> Headers:
        h: Headers | None = getattr(self, "_headers", None)
        if h is None:
            h = self._headers = FirstHeaders(self.scope)
        return h


async def read_body(request: Request, max_body: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise ProxyError(400, "invalid_json", "bad Content-Length") from None
        if n > max_body:  # answered before reading; the connection closes (the body stays unread)
            raise ProxyError(
                413,
                "body_too_large",
                f"body of {n} bytes exceeds the limit of {max_body}",
                {"connection": "close"},
            )
        return await _whole_body(request)
    parts, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_body:
            raise ProxyError(413, "body_too_large", f"body exceeds the limit of {max_body} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def _whole_body(request: Request) -> bytes:
    """``await request.body()`` (starlette 1.x: the same messages read, the same state left on the
    request: ``_body``, ``_stream_consumed``, ``_is_disconnected`` + :class:`ClientDisconnect`),
    read with plain awaits instead of through the ``stream()`` async generator."""
    if hasattr(request, "_body"):
        return request._body  # type: ignore[no-any-return]
    if request._stream_consumed:
        raise RuntimeError("Stream consumed")
    receive = request.receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            body = message.get("body", b"")
            if body:
                chunks.append(body)
            if not message.get("more_body", False):
                request._stream_consumed = True
                break
        elif kind == "http.disconnect":
            request._is_disconnected = True
            raise ClientDisconnect()
    body = request._body = b"".join(chunks)
    return body


def client_gone(request: Request) -> bool:
    """Starlette's ``await request.is_disconnected()``, synchronously: the request's ``receive``
    is run up to its first suspension; a message it returns at once is read (``http.disconnect``:
    gone; anything else is dropped, as starlette drops it), and one it would have to wait for means
    the client is still there (the coroutine is closed there, so its wait is unregistered). The
    answer is kept on the request like starlette's."""
    if getattr(request, "_is_disconnected", False):
        return True
    coro: Any = request.receive()
    if not inspect.iscoroutine(coro):  # not a coroutine (every ASGI server's is): cannot be peeked at
        getattr(coro, "close", lambda: None)()
        return False
    try:
        coro.send(None)
    except StopIteration as done:
        msg = done.value
    else:  # it would wait: nothing is there yet
        coro.close()
        return False
    if isinstance(msg, dict) and msg.get("type") == "http.disconnect":
        request._is_disconnected = True
        return True
    return False


def priority_tenant(
    a: AdmissionSettings, request: Request, body: dict[str, Any], user: str | None = None
) -> tuple[str, str | None]:
    """``a``: the admission settings (header names, default priority); ``user``: the request's
    user (chat/Responses ``user``, Messages ``metadata.user_id``), the tenant when nothing else
    names one."""
    raw = request.headers.get(a.priority_header)
    prio = a.default_priority if raw is None else raw.strip().lower()
    if prio not in PRIORITIES:
        prio = "batch"  # unknown classes shed first
    tenant = request.headers.get(a.tenant_header)
    if tenant is None:
        meta = body.get("metadata")
        t = meta.get("tenant") if isinstance(meta, dict) else None
        tenant = t if isinstance(t, str) and t else user
    return prio, tenant
