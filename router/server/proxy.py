"""The hot path: ``POST /v1/chat/completions`` — read, run the step engine, forward, relay, record.

Algorithm per request (the decisions are the step engine's, :mod:`router.core.engine`; this module
does the I/O around it):

1. Auth (optional bearer keys), body size limit (``Content-Length`` checked before reading, the
   stream counted while reading), one ``orjson.loads`` and validation (:mod:`router.server.chat`).
2. Run identity (:mod:`router.server.identity`) and the run's track (:class:`RunHistory`, bounded
   by ``server.run_history_runs`` / ``run_history_steps``); under a per-run lock (so concurrent
   steps of one run see each other's pin): the run's pin from the run-state store, the step the
   engine sees (:func:`router.server.proto.step_request`), fresh backend states (scraped health,
   running, waiting, KV usage + this router's in-flight counts), and for a new run the store's
   active-run count; then ``engine.plan``. An admission slot claim the plan asks for goes to the
   store's atomic counter (:class:`router.server.admission.LiveAdmission`) and back to the engine;
   a rejected new run answers 429 ``run_rejected_overload`` with ``Retry-After`` and nothing is
   stored; otherwise ``engine.commit`` and the pin is stored.
3. Forward the client's bytes with only ``model`` rewritten (:func:`router.server.proto.rewrite_body`).
   Streaming: the first upstream chunk is awaited before the client's headers are sent (so a failure
   before the first byte can still fall back), then :class:`router.server.relay.SSERelay` relays it.
4. Fallback: a connect error, a timeout or a 5xx before the first byte retries once on the other
   tier when ``fallback.enabled`` (and ``on_requested_model`` for concrete-model requests) through
   ``engine.fallback`` (reason ``fallback-<kind>``, pinned there); otherwise 502/503/504.
5. Record: ``engine.finish`` with what the upstream reported (usage incl. cached tokens, tool calls,
   TTFT for streams, latency) -> the run's summary (``GET /v1/runs/{id}``), the run-log ``step``
   record to the background writer (prompt text only with ``runlog.log_prompts``), metrics.

Tracing (:mod:`router.server.tracing`, off by default: each hook is then one ``is None`` test).

Clocks are injected (``clock``: monotonic seconds for the engine; ``wall``: epoch seconds for the
run log; ``perf``: latency), so tests drive time.
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

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.core.engine import StepEngine, StepPlan
from router.core.record import StepResult, step_entry
from router.core.runs import CacheReading, RunTrack, RunTracker
from router.policy.admission import PRIORITIES
from router.policy.types import BackendState, RunState
from router.server import chat as proto
from router.server.errors import ProxyError, error_response
from router.server.identity import run_id_for
from router.server.relay import SSERelay
from router.server.scrape import backend_states
from router.server.upstream import UpstreamError

__all__ = ["Backend", "RunHistory", "Proxy"]

log = logging.getLogger("runroute.proxy")


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

    @property
    def chat_url(self) -> str:
        return self.root + "/v1/chat/completions"


@dataclass(slots=True)
class RunHistory(RunTrack):
    """The engine's run track plus what the sidecar shows and locks per run."""

    id_source: str = "hash"
    entries: deque[dict[str, Any]] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: bool = False


@dataclass(slots=True)
class _Step:
    """Everything the proxy holds about one step while it is being served."""

    plan: StepPlan
    run: RunState
    hist: RunHistory
    backend: Backend
    req: proto.ChatRequest
    t0: float
    arrival_s: float
    capture: proto.Capture
    ttft_s: float | None = None
    span: Any = None  # tracing: the step span and the open upstream span
    up_span: Any = None


class Proxy:
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
        tracing: Any = None,
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
        self.tracing = tracing  # None = off: every tracing hook below is one `is None` test
        self.clock, self.wall, self.perf = clock, wall, perf
        self.backends = {b.name: b for b in backends}
        self.models = {b.model: b.tier for b in backends}
        self.keys = settings.server.client_keys()
        self.max_body = settings.server.max_body_bytes
        self.tracker: RunTracker[RunHistory] = RunTracker(
            settings.server.run_history_runs,
            settings.server.run_history_steps,
            factory=RunHistory.new,  # type: ignore[arg-type]
        )
        local = getattr(settings, "local", None)
        self.kv_cache_tokens: int | None = getattr(local, "kv_cache_tokens", None)
        if engine.cache_reader is None:
            engine.cache_reader = self.cache_reading

    @property
    def runs(self) -> dict[str, RunHistory]:
        return self.tracker.runs

    # ------------------------------------------------------------------ helpers
    def check_auth(self, request: Request) -> None:
        if not self.keys:
            return
        auth = request.headers.get("authorization", "")
        token = auth[7:] if auth[:7].lower() == "bearer " else ""
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

    def backend_states(self) -> list[BackendState]:
        """Fresh backend states: scraped health/load + this router's in-flight count."""
        return backend_states(self.backends.values(), self.scraper.stats if self.scraper is not None else {})

    def _state_of(self, plan: StepPlan, name: str) -> BackendState | None:
        for b in plan.snapshot.backends:
            if b.name == name:
                return b
        return None

    def _priority_tenant(self, request: Request, body: dict[str, Any]) -> tuple[str, str | None]:
        a = self.s.admission
        raw = request.headers.get(a.priority_header)
        prio = a.default_priority if raw is None else raw.strip().lower()
        if prio not in PRIORITIES:
            prio = "batch"  # unknown classes shed first
        tenant = request.headers.get(a.tenant_header)
        if tenant is None:
            meta = body.get("metadata")
            t = meta.get("tenant") if isinstance(meta, dict) else None
            tenant = t if isinstance(t, str) and t else None
        return prio, tenant

    # ------------------------------------------------------------------ endpoint
    async def chat(self, request: Request) -> Response:
        t0 = self.perf()
        arrival = self.wall()
        try:
            self.check_auth(request)
            try:
                raw = await self._read_body(request)
            except ClientDisconnect:
                self.m.request_rejected(499)
                return Response(status_code=499)
            req = proto.read_request(raw, self.models)
        except ProxyError as e:
            self.m.request_rejected(e.status)
            return error_response(e.status, e.code, e.message, e.headers)
        try:
            return await self._route(request, req, t0, arrival)
        except ProxyError as e:  # counted where it was raised (a rejection, or a finished step)
            return error_response(e.status, e.code, e.message, e.headers)

    async def _route(self, request: Request, req: proto.ChatRequest, t0: float, arrival: float) -> Response:
        body = req.body
        run_id, id_source = run_id_for(request.headers.get("x-run-id"), body)
        serving = self.holder.current
        if serving is None:
            self.m.request_rejected(503)
            raise ProxyError(503, "bundle_not_loaded", "no model bundle is loaded")
        span = self.tracing.start_step(request.headers) if self.tracing is not None else None
        now = self.clock()
        hist, created = self.tracker.track(run_id, now)
        if created:
            hist.id_source = id_source
            hist.entries = deque(maxlen=self.tracker.max_steps)
        engine = self.engine
        # one decision at a time per run (get -> decide -> put), so concurrent steps of a run,
        # even with a remote store, see each other's pin
        async with hist.lock:
            run = await self.store.get(run_id) or RunState(run_id=run_id)
            if run.admitted == "ended":  # the run id was ended before: a new run
                run = RunState(run_id=run_id, steps_seen=run.steps_seen)
            prio, tenant = self._priority_tenant(request, body)
            # the estimate builds on the previous step's counts only when this router saw it
            fresh = hist.base.steps and hist.next_step >= run.steps_seen
            sreq = proto.step_request(req, hist.last_tokens if fresh else None, priority=prio, tenant=tenant)
            adm = self.admission
            active = await adm.active() if adm is not None and run.admitted is None else 0
            plan = engine.plan(
                run,
                hist,
                sreq,
                self.backend_states(),
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
                self.m.admission_verdict(verdict, prio, ad.reason)
            if plan.rejected:
                if span is not None:
                    self.tracing.end_refused(span, run_id, 429, "run_rejected_overload")
                self._reject(plan, run)
            decision = plan.decision
            backend = self.backends.get(decision.backend)
            if backend is not None and not any(b.healthy for b in plan.snapshot.backends):
                backend = None  # every backend is marked down: answer at once instead of timing out
            if backend is None:
                engine.commit(plan, run, hist, None)
                await self.store.put(run)
                none = Backend("", decision.tier, "", "", {}, BackendState("", "local", ""))
                ctx = _Step(plan, run, hist, none, req, t0, arrival, proto.Capture(), span=span)
                self._finish(ctx, 503, "no_healthy_backend")
                raise ProxyError(
                    503, "no_healthy_backend", f"no healthy backend available ({decision.reason})"
                )
            prev_tier = run.tier
            engine.commit(plan, run, hist, self._state_of(plan, backend.name))
            await self.store.put(run)
        self.m.decided(decision, prev_tier, plan.flapped)
        cap = proto.Capture(strip_usage=req.strip_usage)
        return await self._forward(_Step(plan, run, hist, backend, req, t0, arrival, cap, span=span))

    def _reject(self, plan: StepPlan, run: RunState) -> None:
        ad = plan.admission_decision
        assert ad is not None
        retry = max(1, math.ceil(plan.retry_after_s or self.s.admission.retry_after_min_s))
        self.m.request_rejected(429)
        raise ProxyError(
            429,
            "run_rejected_overload",
            f"new run refused: the local tier is at capacity ({ad.reason}, predicted short step "
            f"{ad.predicted_short_step_s:.2f}s vs SLO {self.s.admission.slo_short_step_s:g}s); "
            f"retry after {retry}s",
            {
                "retry-after": str(retry),
                "x-runroute-run-id": run.run_id,
                "x-runroute-reason": plan.decision.reason,
                "x-runroute-admission": "reject",
            },
        )

    async def _call(self, ctx: _Step) -> tuple[Any, Any, bytes | None]:
        """Send to ctx.backend. Returns (response, chunk iterator, first chunk) or raises UpstreamError.

        Non-2xx responses come back with iterator None and the whole body as ``first``.
        """
        b = ctx.backend
        fwd = proto.rewrite_body(ctx.req.raw, ctx.req.body, b.model, ctx.req.stream)
        headers = b.headers
        if ctx.span is not None:
            ctx.up_span, headers = self.tracing.start_upstream(ctx.span, b)
        resp = await self.upstream.post(b.tier, b.chat_url, fwd, headers)
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

    async def _forward(self, ctx: _Step) -> Response:
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
                    self.m.upstream_error(b.tier, "5xx")
            except UpstreamError as e:
                kind = e.kind
                self.m.upstream_error(b.tier, e.kind)
                if e.kind == "connect" and self.scraper is not None:
                    self.scraper.mark_failed(b.name)
                resp = it = first = None
            finally:
                b.inflight -= 1
            if kind is None:
                break
            if ctx.up_span is not None:
                self.tracing.end_upstream(ctx.up_span, resp.status if resp is not None else None, kind)
                ctx.up_span = None
            d = None
            if allow_fb and attempt == 0:
                d = self.engine.fallback(ctx.plan, ctx.run, b.name, kind, self.backend_states())
            if d is None:
                status, code = {
                    "timeout": (504, "upstream_timeout"),
                    "connect": (502, "upstream_unreachable"),
                }.get(kind, (502, "upstream_error"))
                detail = f" (upstream status {resp.status})" if resp is not None else ""
                self._finish(ctx, status, code)
                return error_response(
                    status, code, f"{b.tier} upstream {b.name} failed: {kind}{detail}", self._headers(ctx)
                )
            attempt += 1
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

        if it is None:  # non-streaming, or a non-2xx status in either mode
            data = first or b""
            if resp.status == 200:
                ctx.capture.json(data)
            self._finish(ctx, resp.status, None if resp.status < 400 else f"upstream_{resp.status}")
            return Response(
                data,
                status_code=resp.status,
                media_type=resp.headers.get("content-type", "application/json"),
                headers=self._headers(ctx),
            )
        backend = ctx.backend

        def inflight(n: int) -> None:
            backend.inflight += n

        def stream_error() -> None:
            self.m.upstream_error(backend.tier, "stream")

        return SSERelay(
            resp,
            it,
            first or b"",
            self._headers(ctx),
            ctx.capture.event,
            lambda status, code: self._finish(ctx, status, code),
            on_stream_error=stream_error,
            label=f"{backend.tier} upstream {backend.name}",
            inflight=inflight,
        )

    def _headers(self, ctx: _Step) -> dict[str, str]:
        p = ctx.plan
        h = {
            "x-runroute-run-id": ctx.run.run_id,
            "x-runroute-tier": ctx.backend.tier,
            "x-runroute-replica": ctx.backend.name,
            "x-runroute-reason": p.decision.reason,
            "x-runroute-step": str(p.step),
        }
        if p.fallback_from:
            h["x-runroute-fallback-from"] = p.fallback_from
        if p.admission in ("admit-local", "spill"):
            h["x-runroute-admission"] = p.admission
        return h

    # ------------------------------------------------------------------ record
    def _finish(self, ctx: _Step, status: int, error_code: str | None) -> None:
        latency = self.perf() - ctx.t0
        prompt, cached, completion = ctx.capture.counts()
        names, keys = ctx.capture.tools()
        b = ctx.backend
        prev_tokens = ctx.hist.last_tokens if ctx.hist.base.steps else 0
        res = StepResult(
            status=status,
            error_code=error_code,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            tool_calls=names,
            tool_call_keys=keys,
            ttft_s=ctx.ttft_s,
            latency_s=latency,
        )
        rec = self.engine.finish(
            ctx.plan,
            ctx.hist,
            res,
            now=self.clock(),
            tier=b.tier or None,
            replica=b.name or None,
            model=b.model or None,
            arrival_s=ctx.arrival_s,
        )
        ctx.hist.entries.append(step_entry(rec, ctx.plan.fallback_from, ctx.plan.decision.switched))
        if self.writer is not None:
            out = dict(rec.__dict__)
            if self.s.runlog.log_prompts:
                out["prompt_text"] = orjson.dumps(ctx.req.body.get("messages")).decode()
            self.writer.submit(out)
        self.m.step_finished(rec, prev_tokens, self._state_of(ctx.plan, b.name) if b.name else None)
        if ctx.span is not None:
            self.tracing.end_step(ctx.span, rec, ctx.up_span)
