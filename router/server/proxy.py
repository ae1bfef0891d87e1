"""The hot path: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages`` — read, run the
step engine, forward, relay, record; the same code for every protocol.

Algorithm per request (the decisions are the step engine's, :mod:`router.core.engine`; the protocol
details are the adapter's, :mod:`router.server.protocol`; this module does the I/O around them):

1. Auth (optional client keys: ``Authorization: Bearer``, ``x-api-key`` or ``api-key``), body size
   limit (``Content-Length`` checked before reading, the stream counted while reading), one
   ``orjson.loads`` and validation (``adapter.read``; bad input is a 4xx in the protocol's shape).
2. Run identity (:class:`router.server.lifecycle.RunLifecycle`) and the run's track
   (:class:`RunHistory`, bounded by ``server.run_history_runs`` / ``run_history_steps``); under a
   per-run lock (so concurrent steps of one run see each other's pin): the run's pin from the
   run-state store, the step the engine sees (``adapter.step_request``), fresh backend states
   (:class:`router.server.backends.BackendSet`: local replicas + the frontier the request's model
   maps to), and for a new run the store's active-run count; then ``engine.plan``. An admission
   slot claim the plan asks for goes to the store's atomic counter
   (:class:`router.server.admission.LiveAdmission`) and back to the engine; a rejected new run
   answers 429 ``run_rejected_overload`` with ``Retry-After`` (the predicted time until a slot
   frees) and nothing is stored; otherwise ``engine.commit`` and the pin is stored.
3. Forward (``adapter.outbound``): to a backend that speaks the client's protocol, the client's
   bytes with only ``model`` rewritten (the fast path); otherwise a translation
   (:mod:`router.server.translate`). Streaming: the first upstream chunk is awaited before the
   client's headers are sent (so a failure before the first byte can still fall back), then
   :class:`router.server.relay.SSERelay` relays it through the adapter's capture.
4. Fallback: a connect error, a timeout or a 5xx before the first byte retries once on the other
   tier when ``fallback.enabled`` (and ``on_requested_model`` for concrete-model requests) through
   ``engine.fallback`` (reason ``fallback-<kind>``, pinned there); otherwise 502/503/504.
5. Record: ``engine.finish`` with what the upstream reported (usage incl. cached tokens, tool calls,
   TTFT for streams, latency) -> the run's summary (``GET /v1/runs/{id}``), the run-log ``step``
   record (``protocol`` = chat / responses / messages) to the background writer (prompt text only
   with ``runlog.log_prompts``), metrics; ``adapter.remember`` keeps a Responses answer for
   ``previous_response_id`` chaining.

Hooks for other layers (metrics, tracing, validation) are the small methods ``_route``,
``_call``, ``_forward``, ``_finish``. Clocks are injected (``clock``: monotonic seconds for the
engine; ``wall``: epoch seconds for the run log; ``perf``: latency), so tests drive time.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.core.engine import StepEngine, StepPlan
from router.core.runs import CacheReading, RunTrack, RunTracker
from router.policy.admission import PRIORITIES
from router.policy.types import BackendState, RunState
from router.server.backends import Backend, BackendSet
from router.server.chat import ChatAdapter
from router.server.errors import ProxyError
from router.server.lifecycle import RunLifecycle
from router.server.messages import MessagesAdapter
from router.server.protocol import Adapter, ClientRequest, pick_protocol
from router.server.relay import SSERelay
from router.server.responses import ResponsesAdapter, ResponseStore
from router.server.stepio import StepContext, StepIO
from router.server.upstream import UpstreamError

__all__ = ["Backend", "RunHistory", "Proxy"]

log = logging.getLogger("runroute.proxy")
_FORWARD_HEADERS = {"messages": ("anthropic-beta",), "responses": ("openai-beta",), "chat": ()}


@dataclass(slots=True)
class RunHistory(RunTrack):
    """The engine's run track plus what the sidecar shows and locks per run."""

    id_source: str = "hash"
    entries: deque[dict[str, Any]] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: bool = False
    inflight: int = 0  # steps of this run being served now (the idle sweep leaves it alone)
    served_opening: bool = False  # an opening step (no assistant turn yet) was answered
    tenant: str | None = None
    protocols: set[str] = field(default_factory=set)
    last_seen_s: float | None = None  # arrival of the latest step (a long stream is not idle)

    @property
    def busy(self) -> bool:
        return self.inflight > 0


class Proxy(StepIO):
    """Owns the request path; built by :func:`router.server.app.create_app` from injected parts."""

    def __init__(
        self,
        *,
        settings: Any,
        upstream: Any,
        store: Any,
        holder: Any,
        scraper: Any,
        writer: Any,
        metrics: Any,
        backends: list[Backend],
        engine: StepEngine,
        admission: Any = None,
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
        self.clock, self.wall, self.perf = clock, wall, perf
        local = getattr(settings, "local", None)
        self.kv_cache_tokens: int | None = getattr(local, "kv_cache_tokens", None)
        self.set = BackendSet(backends, scraper)
        self.backends = self.set.all
        self.models = self.set.models
        self.keys = settings.server.client_keys()
        self.max_body = settings.server.max_body_bytes
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
        )
        self.adapters: dict[str, Any] = {
            "chat": ChatAdapter(),
            "responses": ResponsesAdapter(ResponseStore(ident.response_store_entries)),
            "messages": MessagesAdapter(ident.session_header),
        }
        if engine.cache_reader is None:
            engine.cache_reader = self.cache_reading

    @property
    def runs(self) -> dict[str, RunHistory]:
        return self.tracker.runs

    # ------------------------------------------------------------------ helpers
    def check_auth(self, request: Request) -> None:
        if not self.keys:
            return
        h = request.headers
        auth = h.get("authorization", "")
        token = auth[7:] if auth[:7].lower() == "bearer " else (h.get("x-api-key") or h.get("api-key") or "")
        if not token or not any(hmac.compare_digest(token, k) for k in self.keys):
            raise ProxyError(401, "invalid_api_key", "missing or invalid API key (Authorization: Bearer ...)")

    async def _read_body(self, request: Request) -> bytes:
        cl = request.headers.get("content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise ProxyError(400, "invalid_json", "bad Content-Length") from None
            if n > self.max_body:
                raise ProxyError(
                    413, "body_too_large", f"body of {n} bytes exceeds the limit of {self.max_body}"
                )
            return await request.body()
        parts, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_body:
                raise ProxyError(413, "body_too_large", f"body exceeds the limit of {self.max_body} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def cache_reading(self, replica: str) -> CacheReading | None:
        """A local replica's prefix-cache counter from the latest scrape (vLLM ``queries - hits``
        in tokens; capacity ``local.kv_cache_tokens`` else the scraped ``cache_config_info``)."""
        st = self.scraper.stats.get(replica) if self.scraper is not None else None
        if st is None or not st.scraped:
            return None
        return CacheReading(st.computed_tokens, self.kv_cache_tokens or st.cache_tokens or None)

    def backend_states(self, backends: list[Backend] | None = None) -> list[BackendState]:
        return self.set.states(list(self.backends.values()) if backends is None else backends)

    def _state_of(self, plan: StepPlan, name: str) -> BackendState | None:
        for b in plan.snapshot.backends:
            if b.name == name:
                return b
        return None

    def _priority_tenant(
        self, request: Request, body: dict[str, Any], user: str | None
    ) -> tuple[str, str | None]:
        a = self.s.admission
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
            self.check_auth(request)
            try:
                raw = await self._read_body(request)
            except ClientDisconnect:
                return Response(status_code=499)
            req = proto.read(raw, self.models, self.set.aliases)
            fwd = {k: v for k in ("anthropic-beta", "openai-beta") if (v := request.headers.get(k))}
            if fwd:
                req.extra["headers"] = fwd
            return await self._route(request, proto, req, t0, arrival)
        except ProxyError as e:
            return proto.error_response(e.status, e.code, e.message, e.headers)

    async def _route(
        self, request: Request, proto: Adapter, req: ClientRequest, t0: float, arrival: float
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
        hist.inflight += 1
        hist.last_seen_s = now
        try:
            return await self._plan_and_forward(request, proto, req, hist, t0, arrival, now, user, serving)
        finally:
            hist.inflight -= 1

    async def _plan_and_forward(
        self,
        request: Request,
        proto: Adapter,
        req: ClientRequest,
        hist: RunHistory,
        t0: float,
        arrival: float,
        now: float,
        user: str | None,
        serving: Any,
    ) -> Response:
        run_id = hist.run_id
        engine = self.engine
        # one decision at a time per run (get -> decide -> put), so concurrent steps of a run,
        # even with a remote store, see each other's pin
        async with hist.lock:
            run = await self.store.get(run_id) or RunState(run_id=run_id)
            if run.admitted == "ended":  # the run id was ended before: a new run
                run = RunState(run_id=run_id, steps_seen=run.steps_seen)
            hist.ended = False
            prio, tenant = self._priority_tenant(request, req.body, user)
            hist.tenant = hist.tenant or tenant
            hist.protocols.add(proto.name)
            # the estimate builds on the previous step's counts only when this router saw it
            fresh = hist.base.steps and hist.next_step >= run.steps_seen
            sreq = proto.step_request(req, hist.last_tokens if fresh else None, priority=prio, tenant=tenant)
            adm = self.admission
            active = await adm.active() if adm is not None and run.admitted is None else 0
            candidates = self.set.for_request(req.requested, req.model_alias, run.replica)
            plan = engine.plan(
                run,
                hist,
                sreq,
                self.set.states(candidates),
                now=now,
                policy=serving.policy,
                predictor=serving.predictor,
                active_local_runs=active,
            )
            if plan.claim_limit is not None:
                engine.claimed(plan, run, hist, await adm.claim(plan.claim_limit))
            elif plan.late_local:
                await adm.claim_unlimited()
                engine.late_local_claimed(plan, run)
            if plan.admission_decision is not None:
                ad = plan.admission_decision
                verdict = "reject" if plan.rejected else ad.verdict
                self.m.child(self.m.admission, verdict, prio, ad.reason).inc()
            if plan.rejected:
                self._reject(plan, run)
            decision = plan.decision
            backend = self.backends.get(decision.backend)
            if backend is not None and not any(b.healthy for b in plan.snapshot.backends):
                backend = None  # every backend is marked down: answer at once instead of timing out
            if backend is None:
                engine.commit(plan, run, hist, None)
                await self.store.put(run)
                none = Backend("", decision.tier, "", "", {}, BackendState("", "local", ""))
                ctx = StepContext(
                    plan, run, hist, none, req, proto, t0, arrival, proto.capture(req, req.protocol)
                )
                self._finish(ctx, 503, "no_healthy_backend")
                raise ProxyError(
                    503, "no_healthy_backend", f"no healthy backend available ({decision.reason})"
                )
            engine.commit(plan, run, hist, self._state_of(plan, backend.name))
            if plan.flapped:
                self.m.flaps.inc()
            await self.store.put(run)
        self.m.child(self.m.decisions, decision.tier, decision.reason).inc()
        ctx = StepContext(plan, run, hist, backend, req, proto, t0, arrival, None)
        return await self._forward(ctx)

    def _reject(self, plan: StepPlan, run: RunState) -> None:
        ad = plan.admission_decision
        assert ad is not None
        wait = plan.retry_after_s if plan.retry_after_s is not None else self.s.admission.retry_after_min_s
        retry = max(1, math.ceil(wait))
        self.m.child(self.m.requests, "none", "429").inc()
        raise ProxyError(
            429,
            "run_rejected_overload",
            f"new run refused: the local tier is at capacity ({ad.reason}, predicted short step "
            f"{ad.predicted_short_step_s:.2f}s vs SLO {self.s.admission.slo_short_step_s:g}s); "
            f"retry after {retry}s",
            {
                "retry-after": str(retry),
                "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
                # the SDKs retry silently on their own (openai: Retry-After up to 120 s, anthropic:
                # any); past client_retry_max_s they are told not to, so the caller sees the 429 now
                "x-should-retry": "true" if retry <= self.s.admission.client_retry_max_s else "false",
                "x-runroute-run-id": run.run_id,
                "x-runroute-reason": plan.decision.reason,
                "x-runroute-admission": "reject",
            },
        )

    def _outbound(self, ctx: StepContext) -> tuple[str, bytes, dict[str, str]]:
        """URL, body and headers for ctx.backend (the fast path or a translation); sets the capture."""
        b, req = ctx.backend, ctx.req
        bp = pick_protocol(req.protocol, b.urls)
        model = req.model_alias if b.pass_model and req.model_alias else b.model
        ctx.capture = ctx.proto.capture(req, bp)
        body = ctx.proto.outbound(req, bp, model, b.name)
        headers = b.headers
        fwd = _FORWARD_HEADERS.get(bp, ())
        if fwd and req.extra.get("headers"):
            headers = {**headers, **{k: v for k, v in req.extra["headers"].items() if k in fwd}}
        return b.urls[bp], body, headers

    async def _call(self, ctx: StepContext) -> tuple[Any, Any, bytes | None]:
        """Send to ctx.backend. Returns (response, chunk iterator, first chunk) or raises UpstreamError.

        Non-2xx responses come back with iterator None and the whole body as ``first``.
        """
        b = ctx.backend
        url, body, headers = self._outbound(ctx)
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

    async def _forward(self, ctx: StepContext) -> Response:
        allow_fb = self.s.fallback.enabled and (
            ctx.req.requested is None or self.s.fallback.on_requested_model
        )
        attempt = 0
        while True:
            b = ctx.backend
            b.inflight += 1
            kind = None
            try:
                resp, it, first = await self._call(ctx)
                if resp.status >= 500:
                    kind = "5xx"
                    self.m.child(self.m.upstream_errors, b.tier, "5xx").inc()
            except UpstreamError as e:
                kind = e.kind
                self.m.child(self.m.upstream_errors, b.tier, e.kind).inc()
                if e.kind == "connect" and self.scraper is not None:
                    self.scraper.mark_failed(b.name)
                resp = it = first = None
            except ProxyError as e:  # the request cannot be sent there (e.g. untranslatable): a 4xx
                self._finish(ctx, e.status, e.code)
                raise
            finally:
                b.inflight -= 1
            if kind is None:
                break
            d = None
            if allow_fb and attempt == 0:
                d = self.engine.fallback(
                    ctx.plan, ctx.run, b.name, kind, self.backend_states(self._fallback_candidates(ctx))
                )
            if d is None:
                status, code = {
                    "timeout": (504, "upstream_timeout"),
                    "connect": (502, "upstream_unreachable"),
                }.get(kind, (502, "upstream_error"))
                detail = f" (upstream status {resp.status})" if resp is not None else ""
                self._finish(ctx, status, code)
                return ctx.proto.error_response(
                    status, code, f"{b.tier} upstream {b.name} failed: {kind}{detail}", self._headers(ctx)
                )
            attempt += 1
            other = self.backends[d.backend]
            self.m.child(self.m.fallbacks, b.tier, other.tier).inc()
            log.warning(
                "run %s step %d: %s on %s, falling back to %s",
                ctx.run.run_id,
                ctx.plan.step,
                kind,
                b.name,
                other.name,
            )
            self.m.flaps.inc()
            await self.store.put(ctx.run)
            self.m.child(self.m.decisions, d.tier, d.reason).inc()
            ctx.backend = other
            ctx.ttft_s = None

        if it is None:  # non-streaming, or a non-2xx status in either mode
            return self._unary(ctx, resp, first or b"")
        backend = ctx.backend

        def inflight(n: int) -> None:
            backend.inflight += n

        def stream_error() -> None:
            self.m.child(self.m.upstream_errors, backend.tier, "stream").inc()

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

    def _fallback_candidates(self, ctx: StepContext) -> list[Backend]:
        return self.set.for_request(ctx.req.requested, ctx.req.model_alias, None)
