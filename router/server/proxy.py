"""The hot path: ``POST /v1/chat/completions`` — read, run the step engine, forward, relay, record.

Algorithm per request (the decisions are the step engine's, :mod:`router.core.engine`; this module
does the I/O around it):

1. Auth (:mod:`router.server.auth`: optional client keys), body size limit (``Content-Length``
   checked before reading, the stream counted while reading), one ``orjson.loads`` and validation
   of every field the router reads (:mod:`router.server.chat`, :mod:`router.server.validate`).
2. Run identity (:mod:`router.server.identity`, header-safe ids) and the run's track
   (:class:`RunHistory`, bounded by ``server.run_history_runs`` / ``run_history_steps``); under a
   per-run lock (so concurrent steps of one run see each other's pin): the run's pin and its step
   index from the run-state store in one atomic call (``begin_step``: the index is unique across
   router replicas; a run owned by another key answers 404 ``run_not_found``), the step the engine
   sees (:func:`router.server.proto.step_request`), fresh backend states (scraped health, running,
   waiting, KV usage + this router's in-flight counts), and for a new run the store's active-run
   count; then ``engine.plan``. An admission slot claim the plan asks for goes to the store's
   atomic counter (:class:`router.server.admission.LiveAdmission`) and back to the engine; a
   rejected new run answers 429 ``run_rejected_overload`` with ``Retry-After`` and nothing is
   stored; otherwise ``engine.commit``, and the pin is stored (a new run's first pin with
   set-if-absent: when another router pinned it first, ``engine.adopt`` moves the step there).
3. Forward the client's bytes with only ``model`` rewritten (:func:`router.server.proto.rewrite_body`).
   Streaming: the first upstream chunk is awaited before the client's headers are sent (so a failure
   before the first byte can still fall back), then :class:`router.server.relay.SSERelay` relays it.
4. Fallback: a connect error, a timeout or a 5xx before the first byte retries once on the other
   tier when ``fallback.enabled`` (and ``on_requested_model`` for concrete-model requests) through
   ``engine.fallback`` (reason ``fallback-<kind>``, pinned there); otherwise 502/503/504.
5. Record: ``engine.finish`` with what the upstream reported (usage incl. cached tokens, tool calls,
   TTFT for streams, latency) -> the run's summary (``GET /v1/runs/{id}``), the run-log ``step``
   record to the background writer (prompt text only with ``runlog.log_prompts``), metrics. With
   ``runlog.durability: ack`` the response completes only after the record is fsynced. A
   non-streaming request whose client went away meanwhile is logged 499 ``client_cancelled``.

Release is structural: once a step is committed, every exit (an answer, an upstream failure, a
client disconnect, an exception anywhere, cancellation) goes through :meth:`Proxy._close`, once:
the step is finished (an exception: 500 ``internal_error``; a cancellation: 499), the in-flight
counts are given back (``try/finally``), and a run whose *first* step was not served gives back its
admission slot (``engine.unserved_start``), so a failed start never holds a slot.

Clocks are injected (``clock``: monotonic seconds for the engine; ``wall``: epoch seconds for the
run log; ``perf``: latency), so tests drive time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.core.engine import StepEngine, StepPlan
from router.core.record import StepResult, step_entry
from router.core.runs import CacheReading, RunTrack, RunTracker
from router.policy.types import BackendState, RunState
from router.server import chat as proto
from router.server.answers import reject_error, step_headers
from router.server.auth import Access
from router.server.backends import Backend, BackendPool, priority_tenant, read_body, state_of
from router.server.errors import ProxyError, error_response
from router.server.identity import run_id_for
from router.server.relay import SSERelay
from router.server.upstream import UpstreamError

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
    done: bool = False


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
        self.pool = BackendPool(backends, scraper, getattr(local, "kv_cache_tokens", None))
        self.backends = self.pool.backends
        self.models = {b.model: b.tier for b in backends}
        self.access = Access(settings.server)
        self.max_body = settings.server.max_body_bytes
        self.max_depth = settings.server.max_json_depth
        self.tracker: RunTracker[RunHistory] = RunTracker(
            settings.server.run_history_runs,
            settings.server.run_history_steps,
            factory=RunHistory.new,  # type: ignore[arg-type]
        )
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

    def backend_states(self, neutral: bool = False) -> list[BackendState]:
        return self.pool.states(neutral)

    # ------------------------------------------------------------------ endpoint
    async def chat(self, request: Request) -> Response:
        t0 = self.perf()
        arrival = self.wall()
        try:
            owner = self.check_auth(request)
            try:
                raw = await read_body(request, self.max_body)
            except ClientDisconnect:
                return Response(status_code=499)
            req = proto.read_request(raw, self.models, self.max_depth)
            return await self._route(request, req, t0, arrival, owner)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message, e.headers)

    async def _route(
        self, request: Request, req: proto.ChatRequest, t0: float, arrival: float, owner: str | None
    ) -> Response:
        body = req.body
        run_id, id_source = run_id_for(request.headers.get("x-run-id"), body)
        serving = self.holder.current
        if serving is None:
            raise ProxyError(503, "bundle_not_loaded", "no model bundle is loaded")
        now = self.clock()
        hist, created = self.tracker.track(run_id, now)
        if created:
            hist.id_source = id_source
            hist.entries = deque(maxlen=self.tracker.max_steps)
            hist.owner = owner
        # one decision at a time per run (get -> decide -> put), so concurrent steps of a run,
        # even with a remote store, see each other's pin
        async with hist.lock:
            ctx = await self._decide(request, req, hist, serving, now, t0, arrival, owner)
        self.m.child(self.m.decisions, ctx.plan.decision.tier, ctx.plan.decision.reason).inc()
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
        req: proto.ChatRequest,
        hist: RunHistory,
        serving: Any,
        now: float,
        t0: float,
        arrival: float,
        owner: str | None,
    ) -> _Step:
        """Under the run's lock: pin + step index, plan, admission, commit, store (module doc, 2)."""
        engine, body, run_id = self.engine, req.body, hist.run_id
        pin, index = await self.store.begin_step(run_id, hist.next_step)
        if pin is not None and pin.admitted != "ended" and not self.access.owns(pin.owner, owner):
            await self.store.unstep(run_id, index)  # another key's run: as if it did not exist
            raise ProxyError(404, "run_not_found", f"run {run_id!r} is not known to this router")
        first = pin is None or pin.admitted == "ended"  # a new run: admitted afresh
        if pin is None:
            run = RunState(run_id=run_id, owner=owner)
        elif pin.admitted == "ended":  # the run id was ended before: a new run
            run = RunState(run_id=run_id, steps_seen=pin.steps_seen, owner=owner)
        else:
            run = pin
        run.steps_seen = max(run.steps_seen, index)  # the store's index: the engine claims it
        claimed = False
        try:
            prio, tenant = priority_tenant(self.s.admission, request, body)
            # the estimate builds on the previous step's counts only when this router saw it
            fresh = hist.base.steps and hist.next_step >= run.steps_seen
            sreq = proto.step_request(req, hist.last_tokens if fresh else None, priority=prio, tenant=tenant)
            adm = self.admission
            active = await adm.active() if adm is not None and run.admitted is None else 0
            plan = engine.plan(
                run,
                hist,
                sreq,
                self.backend_states(neutral=first and getattr(self.store, "degraded", False)),
                now=now,
                policy=serving.policy,
                predictor=serving.predictor,
                active_local_runs=active,
            )
            if plan.claim_limit is not None:
                claimed = await adm.claim(plan.claim_limit)
                engine.claimed(plan, run, hist, claimed)
            elif plan.late_local:
                await adm.claim_unlimited()
                claimed = True
                engine.late_local_claimed(plan, run)
            if plan.admission_decision is not None:
                ad = plan.admission_decision
                verdict = "reject" if plan.rejected else ad.verdict
                self.m.child(self.m.admission, verdict, prio, ad.reason).inc()
            if plan.rejected:  # nothing is stored; the index goes back: the retry is again step 0
                self.m.child(self.m.requests, "none", "429").inc()
                await self.store.unstep(run_id, plan.step)
                raise reject_error(plan, run.run_id, self.s.admission)
            decision = plan.decision
            backend = self.backends.get(decision.backend)
            if backend is not None and not any(b.healthy for b in plan.snapshot.backends):
                backend = None  # every backend is marked down: answer at once instead of timing out
        except BaseException:
            if claimed:  # claimed but never committed: the slot goes back at once
                await self._give_back(run, engine.run_ended(run))
            raise
        if backend is None:
            engine.commit(plan, run, hist, None)
            none = Backend("", decision.tier, "", "", {}, BackendState("", "local", ""))
            ctx = _Step(plan, run, hist, none, req, t0, arrival, proto.Capture())
            try:
                await self.store.put(run)
            finally:
                await self._close(ctx, 503, "no_healthy_backend", locked=True)
            raise ProxyError(503, "no_healthy_backend", f"no healthy backend available ({decision.reason})")
        engine.commit(plan, run, hist, state_of(plan.snapshot.backends, backend.name))
        ctx = _Step(plan, run, hist, backend, req, t0, arrival, proto.Capture(strip_usage=req.strip_usage))
        try:
            if pin is None:  # a new run's first pin: set-if-absent, so two routers agree on one
                winner = await self.store.claim(run)
                if winner is not None:  # another router pinned this new run first: adopt its pin
                    if engine.adopt(plan, run, winner):
                        await self._give_back(None, True)
                    ctx.backend = self.backends.get(plan.decision.backend, backend)
                    await self.store.put(run)
            else:
                await self.store.put(run)
        except BaseException:
            await self._close(ctx, 500, "internal_error", locked=True)
            raise
        if plan.flapped:
            self.m.flaps.inc()
        return ctx

    async def _call(self, ctx: _Step) -> tuple[Any, Any, bytes | None]:
        """Send to ctx.backend. Returns (response, chunk iterator, first chunk) or raises UpstreamError.

        Non-2xx responses come back with iterator None and the whole body as ``first``.
        """
        b = ctx.backend
        fwd = proto.rewrite_body(ctx.req.raw, ctx.req.body, b.model, ctx.req.stream)
        resp = await self.upstream.post(b.tier, b.chat_url, fwd, b.headers)
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
            finally:
                b.inflight -= 1
            if kind is None:
                break
            d = None
            if allow_fb and attempt == 0:
                d = self.engine.fallback(ctx.plan, ctx.run, b.name, kind, self.backend_states())
            if d is None:
                status, code = {
                    "timeout": (504, "upstream_timeout"),
                    "connect": (502, "upstream_unreachable"),
                }.get(kind, (502, "upstream_error"))
                detail = f" (upstream status {resp.status})" if resp is not None else ""
                await self._close(ctx, status, code)
                return error_response(
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
            data = first or b""
            if resp.status == 200:
                ctx.capture.json(data)
            if await request.is_disconnected():  # nobody got the answer: logged as cancelled
                await self._close(ctx, 499, "client_cancelled")
            else:
                await self._close(ctx, resp.status, None if resp.status < 400 else f"upstream_{resp.status}")
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
            self.m.child(self.m.upstream_errors, backend.tier, "stream").inc()

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
        return step_headers(ctx.plan, ctx.run.run_id, ctx.backend.tier, ctx.backend.name)

    # ------------------------------------------------------------------ record
    async def _close(self, ctx: _Step, status: int, error_code: str | None, locked: bool = False) -> None:
        """Finish the step (once) and await what must happen before the answer completes."""
        after = self._finish(ctx, status, error_code, locked)
        if after is not None:
            await after

    async def _give_back(self, run: RunState | None, holds: bool, lock: asyncio.Lock | None = None) -> None:
        """Release an admission slot (``holds``) and store ``run`` (when given), under ``lock``."""
        if lock is not None:
            async with lock:
                return await self._give_back(run, holds)
        if holds and self.admission is not None:
            await self.admission.release(run, True)
        if run is not None:
            await self.store.put(run)

    async def _after(self, give: Awaitable[None] | None, durable: Any) -> None:
        if give is not None:
            await give
        if durable is not None:
            try:
                await durable
            except Exception as e:  # noqa: BLE001 - the answer still goes out; the loss is logged
                log.error("run log: step record not durable: %s", e)

    def _finish(
        self, ctx: _Step, status: int, error_code: str | None, locked: bool = False
    ) -> Awaitable[None] | None:
        """Record the step (once: later calls are no-ops); returns the work the answer waits for
        (an unserved first step's give-back, the record's fsync with ``durability: ack``)."""
        if ctx.done:
            return None
        ctx.done = True
        latency = self.perf() - ctx.t0
        prompt, cached, completion = ctx.capture.counts()
        names, keys = ctx.capture.tools()
        b = ctx.backend
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
        durable = None
        if self.writer is not None:
            out = dict(rec.__dict__)
            if self.s.runlog.log_prompts:
                out["prompt_text"] = orjson.dumps(ctx.req.body.get("messages")).decode()
            durable = self.writer.submit(out)
        give = None
        if status != 200 and ctx.plan.admission is not None:  # a first step not served
            holds = self.engine.unserved_start(ctx.plan, ctx.run)
            give = self._give_back(ctx.run, holds, None if locked else ctx.hist.lock)
        m = self.m
        tier = b.tier or "none"
        m.child(m.requests, tier, str(status)).inc()
        if status == 200:
            short = names or rec.completion_tokens <= self.s.slo.short_step_tokens
            m.child(m.step_latency, tier, "short" if short else "long").observe(latency)
            m.child(m.prompt_tokens, tier).inc(rec.prompt_tokens)
            if rec.cached_tokens:
                m.child(m.cache_hit_tokens, tier, b.name).inc(rec.cached_tokens)
            m.child(m.slo_steps, "yes" if latency <= self.s.slo.step_latency_s else "no").inc()
        if ctx.ttft_s is not None:
            m.child(m.ttft, tier).observe(ctx.ttft_s)
        if give is None and durable is None:
            return None
        return self._after(give, durable)
