"""The hot path: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages`` — read, run the
step engine, forward, relay, record; the same code for every protocol.

Algorithm per request (the decisions are the step engine's, :mod:`router.core.engine`; the protocol
details are the adapter's, :mod:`router.server.protocols.base`; this module does the I/O around them):

1. Auth (:mod:`router.server.auth`: optional client keys), body size limit (``Content-Length``
   checked before reading, the stream counted while reading), one ``orjson.loads`` and validation
   of every field the router reads (``adapter.read``: :mod:`router.server.protocols.chat`,
   :mod:`router.server.protocols.responses`, :mod:`router.server.protocols.messages`, :mod:`router.server.protocols.validate`);
   bad input is a 4xx in the protocol's own error shape.
2. Run identity (:class:`router.server.runs.lifecycle.RunLifecycle`: header, ``metadata.run_id``, the
   protocol's own id, the opening hash with generations; header-safe ids) and the run's track
   (:class:`RunHistory`, bounded by ``server.run_history_runs`` / ``run_history_steps``); under a
   per-run lock (so concurrent steps of one run see each other's pin): the run's pin and its step
   index from the run-state store in one atomic call (``begin_step``: the index is unique across
   router replicas; a run owned by another key answers 404 ``run_not_found``), the step the engine
   sees (``adapter.step_request``), fresh backend states (:class:`router.server.hotpath.backends.BackendPool`:
   the local replicas + the frontier the request's model maps to; scraped health, running, waiting,
   KV usage + this router's in-flight counts), for a new run the store's active-run count, the run
   context (:mod:`router.server.runs.context`: domain and task embedding at its first step, the
   signals posted since its previous step); then the step's turn (``engine.begin``,
   :mod:`router.core.driver`: the engine's call order) ``turn.plan``. An admission slot claim the
   plan asks for goes to the store's atomic counter (:class:`router.server.hotpath.admission.LiveAdmission`)
   and back to the turn (``turn.claim``); a
   rejected new run answers 429 ``run_rejected_overload`` with ``Retry-After`` (the predicted time
   until a slot frees) and nothing is stored; otherwise ``turn.commit``, and the pin is stored (a new run's first pin with
   set-if-absent: when another router pinned it first, ``turn.adopt`` moves the step there).
3. Forward (``adapter.outbound``, :mod:`router.server.hotpath.stepio`): to a backend that speaks the
   client's protocol, the client's bytes with only ``model`` rewritten (the fast path); otherwise a
   translation (:mod:`router.server.protocols.translate`). Streaming: the first upstream chunk is awaited
   before the client's headers are sent (so a failure before the first byte can still fall back),
   then :class:`router.server.protocols.relay.SSERelay` relays it through the adapter's capture.
4. Fallback: a connect error, a timeout or a 5xx before the first byte retries once on the other
   tier when ``fallback.enabled`` (and ``on_requested_model`` for concrete-model requests) through
   ``turn.fallback`` (once per step; reason ``fallback-<kind>``, pinned there); otherwise 502/503/504. A backend
   that answers 401/403 refused the *router's* credentials (the client's were checked here): 502
   ``upstream_auth`` naming the backend, not the backend's own error about "your" key.
5. Record: ``turn.finish`` with what the upstream reported (usage incl. cached tokens, tool calls,
   TTFT for streams, latency) -> the run's summary (``GET /v1/runs/{id}``), the run-log ``step``
   record (``protocol`` = chat / responses / messages) to the background writer (prompt text only
   with ``runlog.log_prompts``), metrics; ``adapter.remember`` keeps a Responses answer for
   ``previous_response_id`` chaining. With
   ``runlog.durability: ack`` the response completes only after the record is fsynced. A
   non-streaming request whose client went away meanwhile is logged 499 ``client_cancelled``.

Release is structural: once a step is committed, every exit (an answer, an upstream failure, a
client disconnect, an exception anywhere, cancellation) goes through :meth:`Proxy._close`, once:
the step is finished (an exception: 500 ``internal_error``; a cancellation: 499), the in-flight
counts are given back (``try/finally``), and a run whose *first* step was not served gives back its
admission slot (``turn.finish``: ``turn.unserved`` / ``turn.release_slot``), so a failed start never holds a slot.

Clocks are injected (``clock``: monotonic seconds for the engine; ``wall``: epoch seconds for the
run log; ``perf``: latency), so tests drive time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.core.engine import StepEngine
from router.core.runs import CacheReading, RunTrack, RunTracker
from router.policy.types import BackendState, RunState
from router.server.auth import Access
from router.server.errors import ProxyError
from router.server.hotpath.answers import reject_error
from router.server.hotpath.backends import Backend, BackendPool, client_gone, priority_tenant, read_body
from router.server.hotpath.stepio import StepContext, StepIO
from router.server.hotpath.upstream import Upstream, UpstreamError
from router.server.metrics.specs import HANDLERS
from router.server.protocols.base import Adapter, ClientRequest
from router.server.protocols.chat import ChatAdapter
from router.server.protocols.messages import MessagesAdapter
from router.server.protocols.relay import SSERelay
from router.server.protocols.responses import ResponsesAdapter, ResponseStore
from router.server.runs.context import RunContext, RunContextSettings
from router.server.runs.identity import client_id
from router.server.runs.lifecycle import RunLifecycle

if TYPE_CHECKING:  # pragma: no cover
    from router.server.bundles import BundleHolder, Serving
    from router.server.hotpath.admission import LiveAdmission
    from router.server.metrics.registry import RouterMetrics
    from router.server.metrics.scrape import Scraper
    from router.server.runs.log_writer import RunLogWriter
    from router.server.settings import RouterSettings
    from router.server.state.store import RunStateStore
    from router.server.tracing import Tracing

__all__ = ["Backend", "RunHistory", "Proxy"]

log = logging.getLogger("runroute.proxy")


@dataclass(slots=True)
class RunHistory(RunTrack):
    """The engine's run track plus what the sidecar shows and locks per run."""

    id_source: str = "hash"
    entries: deque[dict[str, Any]] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: bool = False
    owner: str | None = None
    inflight: int = 0  # steps of this run being served now (the idle sweep leaves it alone)
    served_opening: bool = False  # an opening step (no assistant turn yet) was answered
    tenant: str | None = None
    protocols: set[str] = field(default_factory=set)
    last_seen_s: float | None = None  # arrival of the latest step (a long stream is not idle)
    context_done: bool = False  # domain resolved, embedding started (router.server.runs.context)
    domain_source: str | None = None  # the rule that gave the domain
    embed_future: Any = None  # the task embedding being computed

    @property
    def busy(self) -> bool:
        return self.inflight > 0


_Step = StepContext


class Proxy(StepIO):
    """Owns the request path; built by :func:`router.server.app.create_app` from injected parts."""

    def __init__(
        self,
        *,
        settings: RouterSettings,
        upstream: Upstream,
        store: RunStateStore,
        holder: BundleHolder,
        scraper: Scraper | None,
        writer: RunLogWriter | None,
        metrics: RouterMetrics,
        backends: list[Backend],
        engine: StepEngine,
        admission: LiveAdmission | None = None,
        tracing: Tracing | None = None,
        context: RunContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
    ):
        self.s = settings
        self.engine = engine
        self.admission = admission
        self.upstream = upstream
        self.store = store
        self.holder = holder
        self.scraper = scraper
        self.writer = writer
        self.m = metrics
        self.tracing = tracing  # None = off: every tracing hook is then one `is None` test
        self.context = context if context is not None else RunContext(RunContextSettings(embed="off"))
        self.clock, self.wall, self.perf = clock, wall, perf
        local = getattr(settings, "local", None)
        self.pool = BackendPool(backends, scraper, getattr(local, "kv_cache_tokens", None))
        self.backends = self.pool.backends
        self.models = self.pool.models
        self.access = Access(settings.server)
        self.max_body = settings.server.max_body_bytes
        self.max_depth = settings.server.max_json_depth
        self.tracker: RunTracker[RunHistory] = RunTracker(
            settings.server.run_history_runs,
            settings.server.run_history_steps,
            factory=RunHistory.new,  # type: ignore[arg-type]
        )
        ident = settings.identity
        self.lifecycle = RunLifecycle(
            tracker=self.tracker,
            store=store,
            engine=engine,
            admission=admission,
            writer=writer,
            identity=ident,
            clock=clock,
            wall=wall,
            context=self.context,
        )
        self.adapters: dict[str, Any] = {
            "chat": ChatAdapter(),
            "responses": ResponsesAdapter(ResponseStore(ident.response_store_entries)),
            "messages": MessagesAdapter(ident.session_header),
        }
        srv = settings.server
        for a in self.adapters.values():  # incremental parse of a run's growing body
            a.use_parse_cache(srv.parse_cache_runs, int(srv.parse_cache_mb * (1 << 20)))
        if engine.cache_reader is None:
            engine.cache_reader = self.cache_reading

    @property
    def runs(self) -> dict[str, RunHistory]:
        return self.tracker.runs

    # ------------------------------------------------------------------ helpers
    def check_auth(self, request: Request) -> str | None:
        """The caller's key id (None without client keys); raises 401 (:mod:`router.server.auth`)."""
        return self.access.client(request)

    def cache_reading(self, replica: str) -> CacheReading | None:
        return self.pool.cache_reading(replica)

    def backend_states(
        self, neutral: bool = False, backends: list[Backend] | None = None
    ) -> list[BackendState]:
        return self.pool.states(neutral, backends)

    # ------------------------------------------------------------------ endpoints
    async def chat(self, request: Request) -> Response:
        return await self.handle(request, self.adapters["chat"])

    async def responses(self, request: Request) -> Response:
        return await self.handle(request, self.adapters["responses"])

    async def messages(self, request: Request) -> Response:
        return await self.handle(request, self.adapters["messages"])

    async def handle(self, request: Request, proto: Adapter) -> Response:
        t0 = self.perf()
        arrival = self.wall()
        try:
            owner = self.check_auth(request)
            try:
                raw = await read_body(request, self.max_body)
            except ClientDisconnect:
                self.m.request_rejected(499, HANDLERS[proto.name])
                return Response(status_code=499)
            req = proto.read(raw, self.models, self.pool.aliases, self.max_depth)
            req.tenant = owner  # the run-id namespace (router.server.runs.identity.scoped_id)
            fwd = {k: v for k in ("anthropic-beta", "openai-beta") if (v := request.headers.get(k))}
            if fwd:
                req.extra["headers"] = fwd
            return await self._route(request, proto, req, t0, arrival, owner)
        except ProxyError as e:
            self.m.request_rejected(e.status, HANDLERS[proto.name])  # before routing / no backend
            return proto.error_response(e.status, e.code, e.message, e.headers)

    async def _route(
        self,
        request: Request,
        proto: Adapter,
        req: ClientRequest,
        t0: float,
        arrival: float,
        owner: str | None,
    ) -> Response:
        run_id, id_source, user = self.lifecycle.resolve(request.headers, proto, req)
        serving = self.holder.current
        if serving is None:
            raise ProxyError(503, "bundle_not_loaded", "no model bundle is loaded")
        now = self.clock()
        hist, created = self.tracker.track(run_id, now)
        if created:
            hist.id_source = id_source
            hist.entries = deque(maxlen=self.tracker.max_steps)
            hist.owner = owner
        hist.last_seen_s = now
        hist.inflight += 1
        try:
            return await self._locked_step(request, proto, req, hist, serving, now, t0, arrival, owner, user)
        finally:
            hist.inflight -= 1

    async def _locked_step(
        self,
        request: Request,
        proto: Adapter,
        req: ClientRequest,
        hist: RunHistory,
        serving: Serving,
        now: float,
        t0: float,
        arrival: float,
        owner: str | None,
        user: str | None,
    ) -> Response:
        # one decision at a time per run (get -> decide -> put), so concurrent steps of a run,
        # even with a remote store, see each other's pin
        span = self.tracing.start_step(request.headers) if self.tracing is not None else None
        async with hist.lock:
            try:
                ctx = await self._decide(request, proto, req, hist, serving, now, t0, arrival, owner, user)
            except ProxyError as e:  # refused (404, 429) or answered without a backend (503)
                if span is not None and self.tracing is not None:
                    self.tracing.end_refused(span, hist.run_id, e.status, e.code)
                raise
        ctx.span = span
        try:
            return await self._forward(ctx, request)
        except BaseException as e:  # every exit of a committed step closes it, once
            cancelled = isinstance(e, (asyncio.CancelledError, ClientDisconnect))
            await self._close(
                ctx, 499 if cancelled else 500, "client_cancelled" if cancelled else "internal_error"
            )
            raise

    async def _decide(
        self,
        request: Request,
        proto: Adapter,
        req: ClientRequest,
        hist: RunHistory,
        serving: Serving,
        now: float,
        t0: float,
        arrival: float,
        owner: str | None,
        user: str | None,
    ) -> _Step:
        """Under the run's lock: pin + step index, plan, admission, commit, store (module doc, 2)."""
        engine, body, run_id = self.engine, req.body, hist.run_id
        pin, index = await self.store.begin_step(run_id, hist.next_step)
        if pin is not None and not self.access.owns(pin.owner, owner):
            # the run ids are scoped by key (router.server.runs.identity.scoped_id), so only a pin stored
            # without a scope (open mode before keys were configured) can get here
            await self.store.unstep(run_id, index)
            raise ProxyError(404, "run_not_found", f"run {client_id(run_id)!r} is not known to this router")
        first = pin is None or pin.admitted == "ended"  # a new run: admitted afresh
        if pin is None:
            run = RunState(run_id=run_id, owner=owner)
        elif pin.admitted == "ended":  # the run id was ended before: a new run
            run = RunState(
                run_id=run_id, steps_seen=pin.steps_seen, owner=owner, signals_seen=pin.signals_seen
            )
        else:
            run = pin
        run.steps_seen = max(run.steps_seen, index)  # the store's index: the engine claims it
        hist.ended = False
        turn = engine.begin(run, hist)  # the engine's call order (router.core.driver)
        try:
            prio, tenant = priority_tenant(self.s.admission, request, body, user)
            hist.tenant = hist.tenant or tenant
            hist.protocols.add(proto.name)
            # the estimate builds on the previous step's counts only when this router saw it
            fresh = hist.base.steps and hist.next_step >= run.steps_seen
            sreq = proto.step_request(req, hist.last_tokens if fresh else None, priority=prio, tenant=tenant)
            sreq.signals = await self.context.step(
                hist,
                request.headers,
                proto,
                req,
                tenant,
                self.store,
                run,
                serving.predictor,
                engine.keep_features,
            )
            adm = self.admission
            active = await adm.active() if adm is not None and run.admitted is None else 0
            candidates = self.pool.for_request(req.requested, req.model_alias, run.replica)
            plan = turn.plan(
                sreq,
                self.backend_states(first and getattr(self.store, "degraded", False), candidates),
                now=now,
                policy=serving.policy,
                predictor=serving.predictor,
                active_local_runs=active,
            )
            if turn.needs_claim:  # a slot on the store's counter: limited (a first step) or not
                assert adm is not None  # only a gated engine asks for a claim
                if plan.claim_limit is not None:
                    turn.claim(await adm.claim(plan.claim_limit))
                else:
                    await adm.claim_unlimited()
                    turn.claim(True)
            if plan.admission_decision is not None:
                ad = plan.admission_decision
                verdict = "reject" if plan.rejected else ad.verdict
                self.m.admission_verdict(verdict, prio, ad.reason)
            if turn.rejected:  # nothing is stored; the index goes back: the retry is again step 0
                await self.store.unstep(run_id, plan.step)
                raise reject_error(plan, run.run_id, self.s.admission)
        except BaseException:
            if turn.claimed_slot:  # claimed but never committed: the slot goes back at once
                await self._give_back(run, turn.abandon())
            raise
        # the chosen backend's state; None: nothing can serve it (every backend is marked down:
        # answered at once instead of timing out)
        chosen = turn.commit()
        backend = self.backends.get(chosen.name) if chosen is not None else None
        if backend is None:
            decision = plan.decision
            none = Backend("", decision.tier, "", "", {}, BackendState("", "local", ""))
            ctx = _Step(
                turn, plan, run, hist, none, req, proto, t0, arrival, proto.capture(req, req.protocol)
            )
            try:
                await self.store.put(run)
            finally:
                await self._close(ctx, 503, "no_healthy_backend", locked=True)
            raise ProxyError(503, "no_healthy_backend", f"no healthy backend available ({decision.reason})")
        ctx = _Step(turn, plan, run, hist, backend, req, proto, t0, arrival, proto.capture(req, req.protocol))
        try:
            if pin is None:  # a new run's first pin: set-if-absent, so two routers agree on one
                winner = await self.store.claim(run)
                if winner is not None:  # another router pinned this new run first: adopt its pin
                    if turn.adopt(winner):
                        await self._give_back(None, True)
                    ctx.backend = self.backends.get(plan.decision.backend, backend)
                    await self.store.put(run)
            else:
                await self.store.put(run)
        except BaseException:
            await self._close(ctx, 500, "internal_error", locked=True)
            raise
        self.m.decided(plan)
        return ctx

    async def _call(self, ctx: _Step) -> tuple[Any, Any, bytes | None]:
        """Send to ctx.backend. Returns (response, chunk iterator, first chunk) or raises UpstreamError.

        Non-2xx responses come back with iterator None and the whole body as ``first``.
        """
        b = ctx.backend
        url, body, headers = self._outbound(ctx)
        if ctx.span is not None and self.tracing is not None:
            ctx.up_span, headers = self.tracing.start_upstream(ctx.span, b, headers)
        resp = await self.upstream.post(b.tier, url, body, headers)
        if resp.status >= 300 or not ctx.req.stream:
            return resp, None, await resp.read()
        it = resp.iter_chunks().__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            first = b""
        except BaseException:
            resp.close()
            raise
        ctx.ttft_s = self.perf() - ctx.t0
        return resp, it, first

    async def _forward(self, ctx: _Step, request: Request) -> Response:
        allow_fb = self.s.fallback.enabled and (
            ctx.req.requested is None or self.s.fallback.on_requested_model
        )
        while True:
            b = ctx.backend
            b.inflight += 1
            kind = None
            try:
                resp, it, first = await self._call(ctx)
                if resp.status >= 500:
                    kind = "5xx"
                    self.m.upstream_error(b.tier, "5xx")
            except UpstreamError as e:
                kind = e.kind
                self.m.upstream_error(b.tier, e.kind)
                if e.kind == "connect" and self.scraper is not None:
                    self.scraper.mark_failed(b.name)
                resp = it = first = None
            except ProxyError as e:  # the request cannot be sent there (e.g. untranslatable): a 4xx
                await self._close(ctx, e.status, e.code)
                raise
            finally:
                b.inflight -= 1
            if kind is None:
                break
            if ctx.up_span is not None and self.tracing is not None:  # the attempt's span ends with its error
                self.tracing.end_upstream(ctx.up_span, resp.status if resp else None, kind)
                ctx.up_span = None
            d = None
            if allow_fb:  # the engine falls back once per step (a second failure ends it)
                others = self.pool.for_request(ctx.req.requested, ctx.req.model_alias, None)
                d = ctx.turn.fallback(b.name, kind, self.backend_states(False, others))
            if d is None:
                status, code = {
                    "timeout": (504, "upstream_timeout"),
                    "connect": (502, "upstream_unreachable"),
                }.get(kind, (502, "upstream_error"))
                detail = f" (upstream status {resp.status})" if resp is not None else ""
                await self._close(ctx, status, code)
                return ctx.proto.error_response(
                    status, code, f"{b.tier} upstream {b.name} failed: {kind}{detail}", self._headers(ctx)
                )
            other = self.backends[d.backend]
            self.m.fell_back(b.tier, d)
            log.warning(
                "run %s step %d: %s on %s, falling back to %s",
                ctx.run.run_id,
                ctx.plan.step,
                kind,
                b.name,
                other.name,
            )
            await self.store.put(ctx.run)
            ctx.backend = other
            ctx.ttft_s = None

        if it is None and resp.status in (401, 403):  # the backend refused the router's own key
            b = ctx.backend
            await self._close(ctx, 502, "upstream_auth")
            return ctx.proto.error_response(
                502,
                "upstream_auth",
                f"{b.tier} upstream {b.name} rejected the router's credentials (status {resp.status}): "
                "check the key its api_key_env names in the router's config; the client's key was fine",
                self._headers(ctx),
            )
        if it is None:  # non-streaming, or a non-2xx status in either mode
            data, media = self._answer_body(ctx, resp, first or b"")
            if client_gone(request):  # nobody got the answer: logged as cancelled
                await self._close(ctx, 499, "client_cancelled")
            else:
                await self._close(ctx, resp.status, None if resp.status < 400 else f"upstream_{resp.status}")
            return Response(data, status_code=resp.status, media_type=media, headers=self._headers(ctx))
        backend = ctx.backend

        def inflight(n: int) -> None:
            backend.inflight += n

        def stream_error() -> None:
            self.m.upstream_error(backend.tier, "stream")

        cap = ctx.capture
        return SSERelay(
            resp,
            it,
            first or b"",
            self._headers(ctx),
            cap.event,
            lambda status, code: self._finish(ctx, status, code),
            on_stream_error=stream_error,
            label=f"{backend.tier} upstream {backend.name}",
            inflight=inflight,
            markers=cap.markers,
            finish_stream=cap.finish_stream,
            error_event=ctx.proto.stream_error,
        )
