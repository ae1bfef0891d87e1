"""The sidecar's FastAPI app: ``create_app(settings)`` wires injected parts, no module globals.

Parts (each injectable for tests; built from settings otherwise):

- ``upstream``: :class:`router.server.hotpath.upstream.AiohttpUpstream` (one pooled session per tier);
- ``store``: run-state store (:class:`router.server.state.store.InProcessStore`, or the Redis store);
- ``bundle``: a predictor (``ModelBundle`` or any ``predict(prefix) -> Predictions`` object); when
  not given it is loaded from ``settings.bundle`` at start-up (a failure stops the start-up with
  the bundle's one-line error) and hot-reloaded by :mod:`router.server.bundles`;
- the policy is always built from ``settings.policy`` by ``router.policy.config.build_policy``
  with the bundle (thresholds not set in config come from the bundle).

The lifespan opens the upstream sessions, starts the run-log writer (and rolls JSONL files left
by crashed processes into Parquet), loads the bundle, starts the /metrics scraper and the bundle
watcher; on shutdown it stops them, closes the sessions and rolls the run log into Parquet.

The step engine (:mod:`router.core.engine`) and its admission gate are built by
:func:`router.server.wiring.make_engine` (admission on by default when a local tier exists; its
store-backed side :class:`router.server.hotpath.admission.LiveAdmission` sweeps idle slots in the
background); ``admission_budget_hook`` (``tenant -> bool``) replaces the per-tenant spill budget
built from settings. ``clock`` (monotonic) and ``wall`` (epoch) are injected into the engine, the
traffic model and the run log.

Endpoints: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``
(:mod:`router.server.hotpath.proxy`, short-cutting the middleware stack) and the rest
(:mod:`router.server.routes`; the read-only ones: runs list, stored Responses, ``/``, ``/ui`` in
:mod:`router.server.routes_read`). The idle-run sweep (:mod:`router.server.runs.lifecycle`) runs in the
background every ``identity.sweep_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from models.predictor import ConstantPredictor
from router.server.bundles import BundleHolder
from router.server.errors import error_response
from router.server.hotpath.backends import HotRequest
from router.server.hotpath.proxy import Proxy
from router.server.hotpath.upstream import AiohttpUpstream, Upstream
from router.server.limits import BodyError, read_body_guarded, replay_receive, timed_receive, uvicorn_options
from router.server.loopwatch import StallMonitor, tune_gc, untune_gc
from router.server.metrics.registry import RouterMetrics
from router.server.metrics.scrape import Scraper
from router.server.protocols.messages import anthropic_error
from router.server.routes import Parts, register_routes
from router.server.routes_read import register_read_routes
from router.server.runs.context import RunContext
from router.server.runs.log_writer import RunLogWriter
from router.server.settings import RouterSettings
from router.server.tracing import make_tracing
from router.server.wiring import make_backends, make_engine, make_kv_events, make_prefix_share, make_store

if TYPE_CHECKING:
    from models.predictor import Predictor
    from router.server.runs.context import EmbedFn
    from router.server.state.store import RunStateStore

__all__ = ["create_app", "make_backends", "serve_in_thread"]

log = logging.getLogger("runroute.app")


def _json(obj: object, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


class _RouterApp(FastAPI):
    """FastAPI, except that the hot paths (``POST /v1/chat/completions``, ``/v1/responses``,
    ``/v1/messages``) skip the middleware stack.

    The hot path answers every error itself (OpenAI-style); an unexpected exception still becomes
    a 500 ``internal_error`` here. Measured: the stack's per-``send`` wrappers cost ~10 us per SSE
    chunk and ~40 us per request on this machine type. Every HTTP request first passes the header
    guard: more than ``max_headers`` headers or more than ``max_header_bytes`` of them answer 431
    ``headers_too_large`` (uvicorn's httptools parser has no such limit of its own); then the body
    guard (:mod:`router.server.limits`): every endpoint outside the hot paths gets its body read
    here under ``max_body_bytes`` and ``body_timeout_s`` (413 / 408 in the endpoint's error shape),
    the hot paths read their own under the same limit with ``body_timeout_s`` on each piece.
    """

    hot_paths: dict[str, Any] = {}
    on_request: Any = None  # (handler, status) for every other request (metrics)
    prefix_share: Any = None  # router.server.state.prefix_share.PrefixShare when the index is shared
    kv_events: Any = None  # router.server.state.kv_events.KvEventSubscriber in the index's precise mode
    max_headers: int = 100
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 8 * 1024 * 1024  # server.max_body_bytes (router.server.limits)
    body_timeout_s: float = 30.0  # server.body_timeout_s

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, e: BodyError) -> None:
        """A refused body, in the endpoint's protocol shape (Anthropic's for count_tokens)."""
        if scope["path"] == "/v1/messages/count_tokens":
            r: Response = Response(
                anthropic_error(e.status, e.code, e.message),
                status_code=e.status,
                media_type="application/json",
                headers=e.headers,
            )
        else:
            r = error_response(e.status, e.code, e.message, e.headers)
        await r(scope, receive, send)
        if self.on_request is not None:
            self.on_request("unmatched", e.status)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hdrs = scope["headers"]
            if len(hdrs) > self.max_headers or sum(len(k) + len(v) for k, v in hdrs) > self.max_header_bytes:
                msg = f"request headers exceed {self.max_headers} headers / {self.max_header_bytes} bytes"
                await error_response(431, "headers_too_large", msg)(scope, receive, send)
                if self.on_request is not None:
                    self.on_request(scope["path"] if scope["path"] in self.hot_paths else "unmatched", 431)
                return
        hot = (
            self.hot_paths.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if scope["type"] == "http":  # one body limit and read timeout for every endpoint
            if hot is not None:
                receive = timed_receive(receive, self.body_timeout_s)
            else:
                try:
                    body = await read_body_guarded(
                        receive, scope["headers"], self.max_body_bytes, self.body_timeout_s
                    )
                except BodyError as e:
                    await self._refuse(scope, receive, send, e)
                    return
                if body is None:  # the client went away before its body was complete
                    return
                receive = replay_receive(body, receive)
        if hot is not None:
            started = False

            async def tracking_send(msg: Message) -> None:
                nonlocal started
                started = True
                await send(msg)

            try:
                response = await hot(HotRequest(scope, receive))
                await response(scope, receive, tracking_send)
            except Exception:
                log.exception("unhandled error on the hot path %s", scope["path"])
                if self.on_request is not None:
                    self.on_request(scope["path"], 500)
                if not started:
                    await error_response(500, "internal_error", "internal router error")(scope, receive, send)
            return
        if scope["type"] != "http" or self.on_request is None:
            await super().__call__(scope, receive, send)
            return
        status = 500

        async def counting_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await super().__call__(scope, receive, counting_send)
        finally:
            route = scope.get("route")  # path_format: "/v1/runs/{run_id}" for "{run_id:path}" too
            self.on_request(getattr(route, "path_format", None) or "unmatched", status)


def create_app(
    settings: RouterSettings,
    *,
    upstream: Upstream | None = None,
    store: RunStateStore | None = None,
    bundle: Predictor | None = None,
    admission_budget_hook: Callable[[str | None], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    embed_fn: EmbedFn | None = None,
) -> FastAPI:
    """Build the app; see the module docstring for what is injected and what is built
    (``embed_fn``: the task-embedding function, default ``features.embed.embed_texts`` when
    ``context.embed`` turns it on; tests inject one)."""
    from router.policy.config import build_policy

    s = settings
    metrics = RouterMetrics(
        deprecated_names=s.metrics.deprecated_names,
        short_step_tokens=s.slo.short_step_tokens,
        step_slo_s=s.slo.step_latency_s,
    )
    up: Upstream = upstream or AiohttpUpstream(
        connect_s=s.timeouts.connect_s,
        first_byte_s=s.timeouts.first_byte_s,
        total_s=s.timeouts.total_s,
        lean=s.server.upstream_client == "lean",
    )
    st = store if store is not None else make_store(s)
    backends = make_backends(s)

    def policy_factory(predictor: Any) -> Any:
        return build_policy(s.policy, predictor if hasattr(predictor, "thresholds") else None)

    holder = BundleHolder(
        policy_factory,
        path=s.bundle.path,
        mlflow_uri=s.bundle.mlflow_uri,
        tracking_uri=s.bundle.tracking_uri(),
        watch_s=s.bundle.watch_s if bundle is None else 0.0,
        metrics=metrics,
    )
    local = {b.name: b.root for b in backends if b.tier == "local"}
    scraper = Scraper(
        local,
        up,
        interval_s=s.scrape.interval_s,
        timeout_s=s.scrape.timeout_s,
        unhealthy_after=s.scrape.unhealthy_after,
        model_name=s.local.model if s.local is not None else None,
    )
    writer = RunLogWriter(
        s.runlog.dir,
        flush_s=s.runlog.flush_s,
        queue_max=s.runlog.queue_max,
        rotate_bytes=s.runlog.rotate_bytes,
        log_prompts=s.runlog.log_prompts,
        parquet=s.runlog.parquet,
        durability=s.runlog.durability,
    )
    engine, admission = make_engine(s, st, scraper, backends, admission_budget_hook, clock, wall)
    prefix_share = make_prefix_share(s, engine)
    kv_events = make_kv_events(s, engine, on_mode=metrics.set_prefix_mode)
    tracing = make_tracing(s)
    proxy = Proxy(
        engine=engine,
        clock=clock,
        wall=wall,
        admission=admission,
        tracing=tracing,
        settings=s,
        upstream=up,
        store=st,
        holder=holder,
        scraper=scraper,
        writer=writer,
        metrics=metrics,
        backends=backends,
        context=RunContext(s.context, embed_fn),
    )

    stalls = StallMonitor(s.runtime) if s.runtime.stall_monitor else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await up.start()
        writer.start()
        await asyncio.to_thread(writer.roll_leftovers)
        if bundle is not None:
            holder.install(bundle)
        elif holder.has_source:
            await holder.reload()
        else:
            holder.install(ConstantPredictor())
        scraper.start()
        holder.start()
        if admission is not None:
            admission.start()
        proxy.lifecycle.start()
        proxy.context.start()
        if prefix_share is not None:
            prefix_share.start()
        if kv_events is not None:
            kv_events.start()
        # the bundle, settings and imported modules live for the whole process: move them out of the
        # collector's generations so a full collection under load does not walk them (tail latency)
        tune_gc(s.runtime)
        if stalls is not None:
            stalls.start()
        try:
            yield
        finally:
            untune_gc(s.runtime)
            if stalls is not None:
                stalls.stop()
            await proxy.lifecycle.stop()
            if prefix_share is not None:
                await prefix_share.stop()
            if kv_events is not None:
                await kv_events.stop()
            if admission is not None:
                await admission.stop()
            await scraper.stop()
            await holder.stop()
            await up.close()
            await proxy.context.drain()
            proxy.context.close()
            await asyncio.to_thread(writer.close)
            await st.close()
            if tracing is not None:
                tracing.shutdown()

    app = _RouterApp(
        title="runroute",
        version="0.1.0",
        description="Routing sidecar for agent runs (chat completions, OpenAI Responses, Anthropic Messages); "
        "errors: router.server.errors",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.prefix_share = prefix_share
    app.kv_events = kv_events
    app.hot_paths = {
        "/v1/chat/completions": proxy.chat,
        "/v1/responses": proxy.responses,
        "/v1/messages": proxy.messages,
    }
    app.on_request = metrics.request_served
    app.max_headers, app.max_header_bytes = s.server.max_headers, s.server.max_header_bytes
    app.max_body_bytes, app.body_timeout_s = s.server.max_body_bytes, s.server.body_timeout_s
    app.state.proxy = proxy
    app.state.holder = holder
    app.state.metrics = metrics
    app.state.writer = writer
    app.state.scraper = scraper
    app.state.store = st
    app.state.settings = s
    app.state.admission = admission
    app.state.tracing = tracing
    app.state.stalls = stalls

    parts = Parts(
        proxy=proxy,
        engine=engine,
        holder=holder,
        metrics=metrics,
        writer=writer,
        scraper=scraper,
        store=st,
        admission=admission,
        upstream=up,
        backends=backends,
        wall=wall,
    )
    register_routes(app, parts)
    register_read_routes(app, parts, s)  # GET /v1/runs, stored Responses, / and /ui
    return app


@contextlib.contextmanager
def serve_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 20.0
) -> Iterator[str]:
    """Run ``app`` under uvicorn in a background thread (tests, benchmarks); yields the base URL.

    Stops the server (lifespan shutdown included) when the block exits.
    """
    import threading

    import uvicorn

    settings = getattr(getattr(app, "state", None), "settings", None)
    limits = uvicorn_options(settings.server) if settings is not None else {}
    cfg = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", access_log=False, **limits
    )
    server = uvicorn.Server(cfg)
    t = threading.Thread(target=server.run, name="runroute-uvicorn", daemon=True)
    t.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not t.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    sock = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{sock[0]}:{sock[1]}"
    finally:
        server.should_exit = True
        t.join(timeout_s)
