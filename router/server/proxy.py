"""The hot path: ``POST /v1/chat/completions`` — decide, forward, relay, record.

Algorithm per request:

1. Auth (optional bearer keys), body size limit (``Content-Length`` checked before reading, the
   stream counted while reading), one ``orjson.loads``; only ``model``, ``messages``, ``stream``,
   ``stream_options``, ``tools``, ``response_format``, ``metadata``, ``user`` are looked at.
2. Run identity (:mod:`router.server.identity`), the run's pin from the run-state store, and its recent
   steps from the in-process history (``RunHistory.base``: the finished steps with their running
   feature aggregates, grown through ``RunPrefix.append`` so extraction is O(1) per step; a run
   longer than ``server.run_history_steps`` keeps its latest 75-100% of that many steps); a
   :class:`RunPrefix` sharing that list and aggregate plus the request: prompt size
   (request bytes / 4, an estimate: the router has no tokenizer), tool results after the last
   assistant message (count, size, error flag: the result starts with or mentions ``error``,
   ``exception`` or ``traceback`` in its first 200 characters), tools offered, JSON mode, tool pause,
   and ``local_cache_pressure`` (:meth:`Proxy.cache_pressure`: the run's local replica's scraped
   ``queries - hits`` counter since the run's previous step / its KV cache size in tokens).
3. Features -> ``predict`` (one feature extraction shared by the bundle and the snapshot) ->
   ``build_snapshot`` -> ``policy.decide`` -> ``apply_decision`` -> store, under a per-run lock (so
   concurrent steps of one run see each other's pin) with a step index claimed once per request
   (the store's count or this process's, whichever is ahead). A concrete model in the
   request is passed as ``requested_model`` (the policy places it on that model's tier, keeping the
   pin); ``auto`` (or no model) lets the policy choose.
4. Forward the client's original bytes with only ``model`` rewritten (a byte splice when the body
   has exactly one ``"model": "..."`` pair; otherwise one orjson re-serialisation). Streaming
   requests also get ``stream_options.include_usage`` so usage (incl. cached tokens) is always
   captured; when the client did not ask for it the usage-only chunk is removed from its stream.
5. Streaming: the first upstream chunk is awaited before the client's headers are sent (so a
   failure before the first byte can still fall back), then the upstream's SSE bytes are relayed
   unchanged as soon as each event is complete (up to its blank line); events are only parsed when
   they mention ``usage`` or ``tool_calls``. A task watches the client
   connection: a disconnect aborts the upstream request and logs the step as cancelled (499).
6. Fallback: a connect error or a 5xx (or a timeout) before the first byte retries once on the
   other tier when ``fallback.enabled`` (and ``on_requested_model`` for concrete-model requests),
   logged with reason ``fallback-<kind>`` and pinned there; otherwise 502/503/504 (router.server.errors).
7. Record: TTFT (streaming), end-to-end latency, usage, tool calls -> the run's history
   (``GET /v1/runs/{id}``), a run-log ``step`` record to the background writer, metrics.

Admission (when a :class:`router.server.admission.LiveAdmission` is injected; see that module): at a run's
first step (``RunState.admitted`` unset) whose policy decision is local, the run is admitted
(``admit-local``: it holds a slot in the store's shared counter until it ends), spilled (all its
steps go to the frontier, reason ``admission-spill-*`` on the first step and ``admission-spilled``
after) or rejected: 429 ``run_rejected_overload`` with ``Retry-After``; nothing is stored, so the
retry is again a first step. Priority from the ``X-Run-Priority`` header, tenant from ``X-Tenant``
or ``metadata.tenant``. Later steps only read ``run.admitted`` (no extra await); steps of admitted
runs are never refused for load. The load model is charged per step (sync).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from features.prefix import RunPrefix, StepView
from models.types import Predictions
from router.policy.admission import PRIORITIES
from router.policy.types import BackendState, Decision, RunState, Tier, apply_decision
from router.server.errors import ProxyError, error_body, error_response
from router.server.identity import run_id_for
from router.server.upstream import UpstreamError

__all__ = ["Backend", "RunHistory", "Proxy", "rewrite_body"]

log = logging.getLogger("runroute.proxy")

_MODEL_RE = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
_ERR_WORDS = ("error", "exception", "traceback")
AUTO_MODELS = frozenset({"auto", "runroute-auto"})


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


@dataclass
class RunHistory:
    run_id: str
    id_source: str
    started_s: float
    # the run's finished steps (the last ``server.run_history_steps``) with their running feature
    # aggregates; grown only through ``base.append`` so extraction stays O(1) per step
    base: RunPrefix
    entries: deque[dict[str, Any]]
    last_end_s: float | None = None
    last_tokens: int = 0
    next_step: int = 0
    ended: bool = False
    # local_cache_pressure bookkeeping: the run's local replica (the last one that served it) and
    # that replica's computed-token counter (queries - hits) when the run's previous step ended:
    # the baseline (``cache_mark``, the step's own tokens included) and the raw scraped value
    cache_replica: str | None = None
    cache_mark: float | None = None
    cache_seen: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def rewrite_body(raw: bytes, body: dict[str, Any], model: str, include_usage: bool) -> bytes:
    """The client's bytes with ``model`` set (and ``stream_options.include_usage`` when asked)."""
    so = body.get("stream_options")
    need_usage = include_usage and not (isinstance(so, dict) and so.get("include_usage") is True)
    if need_usage and so is not None:
        return _reserialise(body, model, True)
    new_model = b'"model":' + orjson.dumps(model)
    matches = _MODEL_RE.findall(raw) if b'"model"' in raw else []
    if isinstance(body.get("model"), str) and len(matches) == 1:
        i = raw.find(matches[0])
        raw = raw[:i] + new_model + raw[i + len(matches[0]) :]
        prefix = b""
    elif "model" not in body and not matches:
        prefix = new_model + b","
    else:
        return _reserialise(body, model, need_usage)
    if need_usage:
        prefix += b'"stream_options":{"include_usage":true},'
    if prefix:
        j = raw.find(b"{")
        raw = raw[: j + 1] + prefix + raw[j + 1 :]
    return raw


def _reserialise(body: dict[str, Any], model: str, need_usage: bool) -> bytes:
    out = dict(body)
    out["model"] = model
    if need_usage:
        so = dict(out.get("stream_options") or {})
        so["include_usage"] = True
        out["stream_options"] = so
    return orjson.dumps(out)


def _content_len(c: Any) -> int:
    if isinstance(c, str):
        return len(c)
    return len(orjson.dumps(c)) if c is not None else 0


def _looks_error(c: Any) -> bool:
    head = (c if isinstance(c, str) else orjson.dumps(c).decode() if c is not None else "")[:200].lower()
    return any(w in head for w in _ERR_WORDS)


def _tool_key(name: str, args: str) -> str:
    return hashlib.blake2b(f"{name}\x00{args}".encode(), digest_size=8).hexdigest()


@dataclass
class _Step:
    """Everything known about one step while it is being served."""

    run: RunState
    hist: RunHistory
    step: int
    t0: float
    arrival_s: float
    prefix: RunPrefix
    predictions: Predictions
    features: dict[str, float]
    decision: Decision
    backend: Backend
    stream: bool
    strip_usage: bool
    prompt_est: int
    body: dict[str, Any]
    raw: bytes
    fallback_from: str | None = None
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    tool_names: dict[int, str] = field(default_factory=dict)
    tool_args: dict[int, str] = field(default_factory=dict)
    structured: bool = False
    admission: str | None = None  # first-step verdict (x-runroute-admission)
    load_token: Any = None  # router.server.admission.StepToken
    cache_start: float | None = None  # the backend's computed-token counter when the step was sent


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
        admission: Any = None,
    ):
        self.s = settings
        self.admission = admission
        self.load = admission.load if admission is not None else None
        self.upstream = upstream
        self.store = store
        self.holder = holder
        self.scraper = scraper
        self.writer = writer
        self.m = metrics
        self.backends = {b.name: b for b in backends}
        self.by_tier: dict[str, list[Backend]] = {}
        for b in backends:
            self.by_tier.setdefault(b.tier, []).append(b)
        self.models = {b.model: b.tier for b in backends}
        self.keys = settings.server.client_keys()
        self.max_body = settings.server.max_body_bytes
        self.runs: OrderedDict[str, RunHistory] = OrderedDict()
        self.max_runs = settings.server.run_history_runs
        self.max_steps = settings.server.run_history_steps
        local = getattr(settings, "local", None)
        self.kv_cache_tokens: int | None = getattr(local, "kv_cache_tokens", None)
        from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, StepAggregate, extract
        from router.policy.snapshot import build_snapshot

        self._extract, self._names, self.spec_version = extract, FEATURE_NAMES, FEATURE_SPEC_VERSION
        self._new_aggregate = StepAggregate
        self._build_snapshot = build_snapshot

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

    def history(self, run_id: str, id_source: str, now: float) -> RunHistory:
        h = self.runs.get(run_id)
        if h is None:
            base = RunPrefix(run_id=run_id, aggregate=self._new_aggregate())
            h = RunHistory(run_id, id_source, now, base, deque(maxlen=self.max_steps))
            self.runs[run_id] = h
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(run_id)
        return h

    def backend_states(self, run: RunState, hist: RunHistory) -> list[BackendState]:
        stats = self.scraper.stats if self.scraper is not None else {}
        out = []
        for b in self.backends.values():
            t = b.state_template
            st = stats.get(b.name)
            out.append(
                BackendState(
                    name=b.name,
                    tier=t.tier,
                    model=t.model,
                    healthy=st.healthy if st is not None else t.healthy,
                    max_context=t.max_context,
                    running=(int(st.running) if st is not None else 0) + b.inflight,
                    waiting=int(st.waiting) if st is not None else 0,
                    kv_usage=st.kv_usage if st is not None else 0.0,
                    warm_prefix_tokens=hist.last_tokens if run.replica == b.name else 0,
                    price_in_per_m=t.price_in_per_m,
                    price_cached_in_per_m=t.price_cached_in_per_m,
                    price_out_per_m=t.price_out_per_m,
                    prefill_s_per_token=t.prefill_s_per_token,
                    ttft_base_s=t.ttft_base_s,
                )
            )
        return out

    def _prefix(
        self, run_id: str, hist: RunHistory, body: dict[str, Any], raw: bytes, now: float
    ) -> RunPrefix:
        msgs = body["messages"]
        n, errs, toks = 0, [], []
        for m in reversed(msgs):
            role = m.get("role")
            if role == "assistant":
                break
            if role == "tool":
                c = m.get("content")
                n += 1
                errs.append(_looks_error(c))
                toks.append(_content_len(c) // 4)
        errs.reverse()
        toks.reverse()
        rf = body.get("response_format")
        tools = body.get("tools")
        base = hist.base
        return RunPrefix(
            run_id=run_id,
            steps=base.steps,  # shared, not copied: the aggregate below covers exactly this list
            run_started_s=hist.started_s,
            now_s=now,
            new_prompt_tokens=len(raw) // 4,
            new_tool_results_n=n,
            new_tool_result_errors=tuple(errs),
            new_tool_result_tokens=tuple(toks),
            new_tool_pause_s=(now - hist.last_end_s) if hist.last_end_s is not None else None,
            new_n_tools_offered=len(tools) if isinstance(tools, list) else 0,
            new_wants_json=isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"),
            local_cache_pressure=self.cache_pressure(hist),
            aggregate=base.aggregate,
        )

    def cache_pressure(self, hist: RunHistory) -> float | None:
        """Prefix-cache turnover on the run's local replica since the run's previous step.

        = (the replica's scraped ``queries - hits`` counter now - its value when the run's previous
        step ended) / the replica's KV cache in tokens (``local.kv_cache_tokens``, else the scraped
        ``vllm:cache_config_info``), clipped to [0, 1]. A counter below the value scraped at the run's
        previous step means the replica restarted and lost its cache: 1. None (a NaN feature) at a
        run's first step, before the run was served locally, or when the counters or the capacity
        are unknown. Reads only in-memory state (the background scraper's latest figures): no I/O on
        the request path.
        """
        mark = hist.cache_mark
        if mark is None or self.scraper is None:
            return None
        st = self.scraper.stats.get(hist.cache_replica)
        if st is None or not st.scraped:
            return None
        cap = self.kv_cache_tokens or st.cache_tokens
        if not cap:
            return None
        now = st.computed_tokens
        if now < hist.cache_seen:
            return 1.0
        d = now - mark
        if d <= 0:  # the scrape has not caught up with the previous step's own tokens yet
            return 0.0
        return d / cap if d < cap else 1.0

    def _cache_mark(self, ctx: _Step, own_tokens: int) -> None:
        """At the end of a step: remember the run's local replica and its computed-token counter.

        The counter comes from the last scrape, which may predate this step's own prefill; the step's
        own newly computed tokens (``own_tokens``: prompt - cached of a served step, 0 of a failed one)
        are then added to the value seen when it was sent, so that they never count as turnover at the
        run's next step."""
        hist, b = ctx.hist, ctx.backend
        if b.tier == "local" and b.name:
            hist.cache_replica = b.name
        st = self.scraper.stats.get(hist.cache_replica) if self.scraper is not None else None
        if st is None or not st.scraped:
            hist.cache_mark = None
            return
        seen = st.computed_tokens
        mark = seen
        if ctx.cache_start is not None and hist.cache_replica == b.name and ctx.cache_start <= seen:
            mark = max(mark, ctx.cache_start + max(0, own_tokens))
        hist.cache_mark, hist.cache_seen = mark, seen

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

    def _frontier_backend(self) -> Backend | None:
        cands = self.by_tier.get("frontier") or []
        return cands[0] if cands else None

    async def _admit(
        self, request: Request, body: dict[str, Any], run: RunState, decision: Decision, requested: str | None
    ) -> tuple[Decision, str | None]:
        """Admission bookkeeping for one step; returns the (possibly overridden) decision and the
        first-step verdict. Raises the 429 for a rejected new run."""
        adm = self.admission
        if run.admitted is None:
            prio, tenant = self._priority_tenant(request, body)
            run.priority, run.tenant = prio, tenant
            if decision.tier != "local":
                run.admitted = "frontier"  # the policy chose the frontier: no local slot
                adm.load.run_arrived()
                return decision, None
            ad = await adm.first_step(run.run_id, prio, tenant, spill_ok=requested is None)
            self.m.child(self.m.admission, ad.verdict, prio, ad.reason).inc()
            if ad.verdict == "admit-local":
                run.admitted = "admit-local"
                return decision, ad.verdict
            if ad.verdict == "spill":
                fr = self._frontier_backend()
                if fr is not None:
                    run.admitted = "spill"
                    scores = {**decision.scores, **ad.scores}
                    return Decision("frontier", fr.name, fr.model, f"admission-{ad.reason}", scores), "spill"
            retry = max(1, math.ceil(ad.retry_after_s or self.s.admission.retry_after_min_s))
            self.m.child(self.m.requests, "none", "429").inc()
            raise ProxyError(
                429,
                "run_rejected_overload",
                f"new run refused: the local tier is at capacity ({ad.reason}, predicted short step "
                f"{ad.predicted_short_step_s:.2f}s vs SLO {self.s.admission.slo_short_step_s:g}s); "
                f"retry after {retry}s",
                {
                    "retry-after": str(retry),
                    "x-runroute-run-id": run.run_id,
                    "x-runroute-reason": f"admission-{ad.reason}",
                    "x-runroute-admission": "reject",
                },
            )
        if run.admitted == "frontier" and decision.tier == "local":
            await adm.count_late_local(run.run_id, run.priority, run.tenant)
            run.admitted = "admit-local"
        return decision, None

    # ------------------------------------------------------------------ endpoint
    async def chat(self, request: Request) -> Response:
        t0 = time.perf_counter()
        arrival = time.time()
        try:
            self.check_auth(request)
            try:
                raw = await self._read_body(request)
            except ClientDisconnect:
                return Response(status_code=499)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
            if not isinstance(body, dict):
                raise ProxyError(422, "body_not_object", "request body must be a JSON object")
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                raise ProxyError(
                    422, "invalid_messages", "'messages' must be a non-empty list of message objects"
                )
            model = body.get("model", "auto")
            if not isinstance(model, str):
                raise ProxyError(422, "invalid_model", "'model' must be a string")
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise ProxyError(422, "invalid_stream", "'stream' must be a boolean")
            requested = None if model in AUTO_MODELS else model
            if requested is not None and requested not in self.models:
                raise ProxyError(
                    404,
                    "model_not_found",
                    f"model {requested!r} is not served here; use 'auto' or one of {sorted(self.models)}",
                )
            return await self._route(request, raw, body, requested, stream, t0, arrival)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message, e.headers)

    async def _route(
        self,
        request: Request,
        raw: bytes,
        body: dict[str, Any],
        requested: str | None,
        stream: bool,
        t0: float,
        arrival: float,
    ) -> Response:
        run_id, id_source = run_id_for(request.headers.get("x-run-id"), body)
        if self.holder.current is None:
            raise ProxyError(503, "bundle_not_loaded", "no model bundle is loaded")
        now = time.monotonic()
        hist = self.history(run_id, id_source, now)
        # one decision at a time per run (get -> decide -> put), so concurrent steps of a run,
        # even with a remote store, see each other's pin
        async with hist.lock:
            run = await self.store.get(run_id) or RunState(run_id=run_id)
            if run.admitted == "ended":  # the run id was ended before: a new run
                run = RunState(run_id=run_id, steps_seen=run.steps_seen)
            # the step index: the store's count (shared by router replicas) or this process's, whichever
            # is ahead, claimed synchronously so concurrent steps of one run never share an index
            step = max(run.steps_seen, hist.next_step)
            hist.next_step = step + 1
            prefix = self._prefix(run_id, hist, body, raw, now)
            serving = self.holder.current
            predictor = serving.predictor
            x = self._extract(prefix)
            if prefix.aggregate is not hist.base.aggregate:  # extract rebuilt it: keep it for next time
                hist.base.aggregate = prefix.aggregate
            features = dict(zip(self._names, x.tolist(), strict=True))
            pf = getattr(predictor, "predict_features", None)
            predictions = pf(x) if pf is not None else predictor.predict(prefix)
            snap = self._build_snapshot(
                run,
                prefix,
                predictions,
                self.backend_states(run, hist),
                requested_model=requested,
                features=features,
            )
            decision = serving.policy.decide(snap)
            so = body.get("stream_options")
            ctx = _Step(
                run=run,
                hist=hist,
                step=step,
                t0=t0,
                arrival_s=arrival,
                prefix=prefix,
                predictions=predictions,
                features=features,
                decision=decision,
                backend=None,  # type: ignore[arg-type]
                stream=stream,
                strip_usage=stream and not (isinstance(so, dict) and so.get("include_usage") is True),
                prompt_est=prefix.new_prompt_tokens,
                body=body,
                raw=raw,
            )
            backend = self.backends.get(decision.backend)
            if backend is not None and not any(b.healthy for b in snap.backends):
                backend = None  # every backend is marked down: answer at once instead of timing out
            if backend is None:
                run.steps_seen = step + 1
                await self.store.put(run)
                ctx.backend = Backend("", decision.tier, "", "", {}, BackendState("", "local", ""))
                self._finish(ctx, 503, "no_healthy_backend")
                raise ProxyError(
                    503, "no_healthy_backend", f"no healthy backend available ({decision.reason})"
                )
            # admitted runs (the common case) skip this entirely: no await, no lookups
            if self.admission is not None and run.admitted != "admit-local":
                if run.admitted == "spill":  # pinned to the frontier for the rest of the run
                    fr = self._frontier_backend()
                    if fr is not None:
                        moved = run.tier is not None and (run.tier != "frontier" or run.replica != fr.name)
                        decision = Decision(
                            "frontier", fr.name, fr.model, "admission-spilled", switched=moved
                        )
                elif run.admitted is None or decision.tier == "local":
                    try:
                        decision, ctx.admission = await self._admit(request, body, run, decision, requested)
                    except ProxyError:
                        hist.next_step = step  # nothing stored: the retry is again this run's first step
                        raise
                ctx.decision = decision
                backend = self.backends.get(decision.backend) or backend
            if decision.switched and run.tier is not None:
                self.m.flaps.inc()
            apply_decision(run, decision, step)
            await self.store.put(run)
            if self.load is not None:
                reuse = max(
                    predictions.cache_reuse_tokens, hist.last_tokens if run.replica == backend.name else 0
                )
                ctx.load_token = self.load.step_started(
                    backend.name if backend.tier == "local" else None,
                    run_id,
                    prefix.new_prompt_tokens,
                    reuse,
                    predictions,
                )
        self.m.child(self.m.decisions, decision.tier, decision.reason).inc()
        ctx.backend = backend
        return await self._forward(ctx, requested, request)

    def _other(self, ctx: _Step) -> Backend | None:
        other = "frontier" if ctx.backend.tier == "local" else "local"
        cands = self.by_tier.get(other) or []
        stats = self.scraper.stats if self.scraper is not None else {}
        healthy = [b for b in cands if b.name not in stats or stats[b.name].healthy]
        if not healthy:
            return None
        return min(
            healthy,
            key=lambda b: (
                b.inflight + (stats[b.name].running + stats[b.name].waiting if b.name in stats else 0),
                b.name,
            ),
        )

    async def _call(self, ctx: _Step) -> tuple[Any, Any, bytes | None]:
        """Send to ctx.backend. Returns (response, chunk iterator, first chunk) or raises UpstreamError.

        Non-2xx responses come back with iterator None and the whole body as ``first``.
        """
        b = ctx.backend
        st = self.scraper.stats.get(b.name) if self.scraper is not None and b.tier == "local" else None
        ctx.cache_start = st.computed_tokens if st is not None and st.scraped else None
        fwd = rewrite_body(ctx.raw, ctx.body, b.model, ctx.stream)
        resp = await self.upstream.post(b.tier, b.chat_url, fwd, b.headers)
        if resp.status >= 300 or not ctx.stream:
            return resp, None, await resp.read()
        it = resp.iter_chunks().__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            first = b""
        except BaseException:
            resp.close()
            raise
        ctx.ttft_s = time.perf_counter() - ctx.t0
        return resp, it, first

    async def _forward(self, ctx: _Step, requested: str | None, request: Request) -> Response:
        allow_fb = self.s.fallback.enabled and (requested is None or self.s.fallback.on_requested_model)
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
            other = self._other(ctx) if allow_fb and attempt == 0 else None
            if other is None:
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
            self.m.child(self.m.fallbacks, b.tier, other.tier).inc()
            log.warning(
                "run %s step %d: %s on %s, falling back to %s",
                ctx.run.run_id,
                ctx.step,
                kind,
                b.name,
                other.name,
            )
            ctx.fallback_from = b.name
            d = Decision(
                tier=cast(Tier, other.tier),
                backend=other.name,
                model=other.model,  # type: ignore[arg-type]
                reason=f"fallback-{kind}",
                scores={},
                switched=True,
            )
            ctx.decision = d
            apply_decision(ctx.run, d, ctx.step)
            self.m.flaps.inc()
            await self.store.put(ctx.run)
            self.m.child(self.m.decisions, d.tier, d.reason).inc()
            ctx.backend = other
            ctx.ttft_s = None

        if it is None:  # non-streaming, or a non-2xx status in either mode
            data = first or b""
            if resp.status == 200:
                self._capture_json(ctx, data)
            self._finish(ctx, resp.status, None if resp.status < 400 else f"upstream_{resp.status}")
            return Response(
                data,
                status_code=resp.status,
                media_type=resp.headers.get("content-type", "application/json"),
                headers=self._headers(ctx),
            )
        return _SSERelay(self, ctx, resp, it, first or b"")

    def _headers(self, ctx: _Step) -> dict[str, str]:
        h = {
            "x-runroute-run-id": ctx.run.run_id,
            "x-runroute-tier": ctx.backend.tier,
            "x-runroute-replica": ctx.backend.name,
            "x-runroute-reason": ctx.decision.reason,
            "x-runroute-step": str(ctx.step),
        }
        if ctx.fallback_from:
            h["x-runroute-fallback-from"] = ctx.fallback_from
        if ctx.admission:
            h["x-runroute-admission"] = ctx.admission
        return h

    # ------------------------------------------------------------------ response capture
    def _capture_json(self, ctx: _Step, data: bytes) -> None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        u = obj.get("usage")
        if isinstance(u, dict):
            ctx.usage = u
        ch = obj.get("choices")
        if isinstance(ch, list) and ch and isinstance(ch[0], dict):
            msg = ch[0].get("message") or {}
            for i, tc in enumerate(msg.get("tool_calls") or ()):
                fn = tc.get("function") or {}
                ctx.tool_names[i] = fn.get("name") or ""
                ctx.tool_args[i] = fn.get("arguments") or ""

    def _capture_event(self, ctx: _Step, ev: bytes) -> bytes | None:
        """Inspect one SSE event that mentions usage/tool_calls; return bytes to relay (None = drop)."""
        i = ev.find(b"data:")
        if i < 0:
            return ev
        payload = ev[i + 5 :].strip()
        if payload == b"[DONE]":
            return ev
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return ev
        if not isinstance(obj, dict):
            return ev
        for ch in obj.get("choices") or ():
            delta = ch.get("delta") or {}
            for tc in delta.get("tool_calls") or ():
                idx = tc.get("index", 0)
                fn = tc.get("function") or {}
                if fn.get("name"):
                    ctx.tool_names[idx] = fn["name"]
                if fn.get("arguments"):
                    ctx.tool_args[idx] = ctx.tool_args.get(idx, "") + fn["arguments"]
        u = obj.get("usage")
        if isinstance(u, dict):
            ctx.usage = u
            if ctx.strip_usage:
                if not obj.get("choices"):
                    return None
                del obj["usage"]
                return ev[:i] + b"data: " + orjson.dumps(obj)
        return ev

    # ------------------------------------------------------------------ record
    def _finish(self, ctx: _Step, status: int, error_code: str | None) -> None:
        end = time.perf_counter()
        latency = end - ctx.t0
        u = ctx.usage or {}
        prompt = int(u.get("prompt_tokens") or ctx.prompt_est)
        completion = int(u.get("completion_tokens") or 0)
        details = u.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = min(int(cached), prompt) if cached is not None else None
        names = [ctx.tool_names[k] for k in sorted(ctx.tool_names)]
        keys = [
            _tool_key(ctx.tool_names.get(k, ""), ctx.tool_args.get(k, "")) for k in sorted(ctx.tool_names)
        ]
        p = ctx.prefix
        b = ctx.backend
        d = ctx.decision
        structured = bool(names) or p.new_wants_json
        ok = status == 200
        if ok:
            base = ctx.hist.base
            base.append(
                StepView(
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cached_tokens=cached,
                    tool_calls=tuple(names),
                    tool_call_keys=tuple(keys),
                    tool_results_n=p.new_tool_results_n,
                    tool_result_errors=p.new_tool_result_errors,
                    tool_result_tokens=p.new_tool_result_tokens,
                    tool_pause_s=p.new_tool_pause_s,
                    arrival_s=p.now_s,
                    latency_s=latency,
                    structured=structured,
                    tier=b.tier,
                )
            )
            if len(base.steps) > self.max_steps:
                # drop the oldest quarter at once: the running aggregate is then rebuilt (one scan)
                # once per max_steps / 4 steps, O(1) amortised, instead of at every step
                del base.steps[: max(1, self.max_steps // 4)]
            ctx.hist.last_tokens = prompt + completion
        ctx.hist.last_end_s = time.monotonic()
        self._cache_mark(ctx, prompt - (cached or 0) if ok else 0)
        preds = ctx.predictions.as_dict()
        entry = {
            "step": ctx.step,
            "tier": b.tier or None,
            "replica": b.name or None,
            "model": b.model or None,
            "reason": d.reason,
            "switched": bool(d.switched),
            "fallback_from": ctx.fallback_from,
            "predictions": preds,
            "status": status,
            "error_code": error_code,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
            "tool_calls": names,
            "ttft_s": ctx.ttft_s,
            "latency_s": latency,
            "arrival_s": ctx.arrival_s,
        }
        ctx.hist.entries.append(entry)
        if ctx.load_token is not None:
            self.load.step_finished(
                ctx.load_token, b.name if b.tier == "local" else None, prompt, cached or 0, completion, ok
            )
        rec = {
            "record": "step",
            "run_id": ctx.run.run_id,
            "step": ctx.step,
            "arrival_s": ctx.arrival_s,
            "tool_pause_s": p.new_tool_pause_s,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
            "tool_calls": names,
            "tool_call_keys": keys,
            "tool_results_n": p.new_tool_results_n,
            "tool_result_tokens": list(p.new_tool_result_tokens),
            "tool_result_errors": list(p.new_tool_result_errors),
            "structured": structured,
            "tier": b.tier or None,
            "replica": b.name or None,
            "model": b.model or None,
            "ttft_s": ctx.ttft_s,
            "latency_s": latency,
            "status": status,
            "error_code": error_code,
            "feature_spec_version": self.spec_version,
            "features": list(ctx.features.values()),
            "predictions": preds,
            "decision": f"{d.tier}:{d.backend}" if d.backend else None,
            "reason": d.reason,
        }
        if self.s.runlog.log_prompts:
            rec["prompt_text"] = orjson.dumps(ctx.body.get("messages")).decode()
        if self.writer is not None:
            self.writer.submit(rec)
        m = self.m
        tier = b.tier or "none"
        m.child(m.requests, tier, str(status)).inc()
        if ok:
            kind = "short" if (names or completion <= self.s.slo.short_step_tokens) else "long"
            m.child(m.step_latency, tier, kind).observe(latency)
            m.child(m.prompt_tokens, tier).inc(prompt)
            if cached:
                m.child(m.cache_hit_tokens, tier, b.name).inc(cached)
            m.child(m.slo_steps, "yes" if latency <= self.s.slo.step_latency_s else "no").inc()
        if ctx.ttft_s is not None:
            m.child(m.ttft, tier).observe(ctx.ttft_s)


class _SSERelay(Response):
    """Raw ASGI streaming response: relays SSE bytes, watches for client disconnect."""

    def __init__(self, proxy: Proxy, ctx: _Step, resp: Any, it: Any, first: bytes):
        self.proxy, self.ctx, self.resp, self.it, self.first = proxy, ctx, resp, it, first
        self.status_code = resp.status
        hdrs = {
            "content-type": resp.headers.get("content-type", "text/event-stream"),
            "cache-control": "no-cache",
            **proxy._headers(ctx),
        }
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in hdrs.items()]
        self.background = None
        self._tail = b""

    def _filter(self, chunk: bytes) -> bytes:
        buf = self._tail + chunk if self._tail else chunk
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._tail = buf
            return b""
        complete, self._tail = buf[: cut + 2], buf[cut + 2 :]
        if b'"usage"' not in complete and b'"tool_calls"' not in complete:
            return complete
        out = []
        for ev in complete.split(b"\n\n"):
            if not ev:
                continue
            if b'"usage"' in ev or b'"tool_calls"' in ev:
                kept = self.proxy._capture_event(self.ctx, ev)
                if kept is None:
                    continue
                ev = kept
            out.append(ev + b"\n\n")
        return b"".join(out)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ctx, proxy = self.ctx, self.proxy
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    disconnected = True
                    self.resp.close()
                    return

        watcher = asyncio.ensure_future(watch())
        status, code = 200, None
        ctx.backend.inflight += 1
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            out = self._filter(self.first)
            if out:
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
                    proxy.m.child(proxy.m.upstream_errors, ctx.backend.tier, "stream").inc()
                    err = error_body(
                        502, code, f"{ctx.backend.tier} upstream {ctx.backend.name} failed mid-stream"
                    )
                    await send(
                        {
                            "type": "http.response.body",
                            "body": self._tail + b"data: " + err + b"\n\n",
                            "more_body": True,
                        }
                    )
                    self._tail = b""
            if disconnected:
                status, code = 499, "client_cancelled"
            else:
                await send({"type": "http.response.body", "body": self._tail, "more_body": False})
        except (OSError, asyncio.CancelledError) as e:
            status, code = 499, "client_cancelled"
            self.resp.close()
            if isinstance(e, asyncio.CancelledError):
                proxy._finish(ctx, status, code)
                raise
        finally:
            ctx.backend.inflight -= 1
            watcher.cancel()
            with contextlib.suppress(Exception):
                self.resp.close()
        proxy._finish(ctx, status, code)
