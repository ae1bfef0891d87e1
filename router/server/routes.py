"""The sidecar's endpoints besides the hot path: models, health, readiness, metrics, capacity, runs, admin.

``GET /v1/models``, ``GET /health``, ``GET /ready`` (every tier reachable, a bundle serving and,
with ``store.kind: redis``, Redis answering a PING within 1 s; else 503),
``GET /metrics`` (Prometheus text, or OpenMetrics when the scrape's ``Accept`` asks for it;
scraped figures and the capacity gauges refreshed on each scrape), ``GET /v1/capacity`` (utilisation per replica, forecast new runs/s for the next 5/15/60
minutes, the replica count that holds the SLO at that forecast, expected spill and reject shares),
``GET /v1/runs/{run_id}`` (with the run's ``domain``, how it was known, its ``signals``, and
``domain_mode`` / ``domain_reason`` for that domain and ``domain_modes`` for every domain of the
serving bundle's benefit model: ``model`` or ``prior`` and why),
``POST /v1/runs/{run_id}/signal`` (body ``{"kind": one of features.prefix.SIGNAL_KINDS, "detail":
{...} optional, never stored}``: :meth:`router.server.runs.lifecycle.RunLifecycle.signal`; bad input
400/413/422 with a code, an unknown run 404, 409 past ``MAX_SIGNALS``), ``POST /v1/runs/{run_id}/end`` (:meth:`router.server.runs.lifecycle.RunLifecycle.end`:
logs the outcome, gives back the run's admission slot and leaves an ``ended`` tombstone in the store
for ``store.ttl_s``; a repeated end updates the outcome), ``POST /v1/messages/count_tokens`` (asked of the backend the next step would go to, else the
sidecar's estimate; the model resolved as ``/v1/messages`` resolves it; Anthropic's error shape:
:func:`count_message_tokens`), ``POST /admin/reload``,
``GET /openapi.json`` (:mod:`router.server.openapi`). Every error is the OpenAI error shape with a
code (:mod:`router.server.errors`), but on Anthropic's paths (:data:`ANTHROPIC_PATHS`: an unknown
``/v1/messages/...`` path or method), which answer in Anthropic's shape. Access (:mod:`router.server.auth`): ``/v1/*`` needs a client
key when keys are configured and run ids live in the caller key's namespace
(:func:`router.server.runs.identity.scoped_id`: another key's run is unknown here, 404);
``/admin/*`` needs an admin key; ``/metrics`` a metrics key when configured. A run id in a path is
cleaned like a request's (:func:`router.server.runs.identity.clean_id`), so the header value and its
decoded form both find the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from features.prefix import SIGNAL_KINDS
from router.core.engine import StepEngine
from router.server.errors import ProxyError, error_response
from router.server.hotpath.backends import Backend
from router.server.hotpath.proxy import Proxy
from router.server.hotpath.upstream import Upstream, UpstreamError
from router.server.openapi import (
    ChatCompletionRequest,
    CountTokensRequest,
    ErrorBody,
    MessagesRequest,
    ResponsesRequest,
    RunEndRequest,
    RunSignalRequest,
    error_responses,
    install_openapi,
    request_body,
)
from router.server.runs.identity import clean_id, client_id, scoped_id
from router.server.runs.lifecycle import MAX_SIGNALS

if TYPE_CHECKING:
    from router.server.bundles import Serving

__all__ = ["Parts", "register_routes", "json_response"]


def _run_domain_mode(serving: Serving | None, domain: str | None) -> dict[str, str | None]:
    """``domain_mode`` / ``domain_reason`` the run's domain is served in (None without a benefit
    model or a domain: the escalation classifier alone)."""
    benefit = getattr(serving.predictor, "benefit", None) if serving is not None else None
    if benefit is None or domain is None:
        return {"domain_mode": None, "domain_reason": None}
    mode, reason = benefit.mode(domain)
    return {"domain_mode": mode, "domain_reason": reason}


def _domain_modes(serving: Serving | None) -> dict[str, dict[str, str]]:
    """``{domain: {mode, reason}}`` of the serving bundle's benefit model (:mod:`models.benefit`):
    ``model`` where a domain's evidence beat the prior, else ``prior``, and why; empty without one."""
    benefit = getattr(serving.predictor, "benefit", None) if serving is not None else None
    if benefit is None:
        return {}
    return {k: {"mode": d.mode, "reason": d.reason} for k, d in sorted(benefit.domains.items())}


def _prefix_index_state(engine: StepEngine, app: FastAPI) -> dict[str, Any] | None:
    """``/ready``'s view of the prefix index (router.core.prefix_index): its mode per local replica
    (``precise``: its vLLM KV events, router.server.state.kv_events; ``approximate``: what the routers
    sent where) and why, its blocks held and whether it is shared through Redis; None without an
    index."""
    idx = engine.prefix_index
    if idx is None:
        return None
    share = getattr(app, "prefix_share", None)
    kv = getattr(app, "kv_events", None)
    ev = kv.state() if kv is not None else {}
    fed = kv.feeds if kv is not None else {}
    modes = idx.modes()
    return {
        "block_tokens": idx.block_tokens,
        "replicas": {
            n: {
                "mode": modes[n],
                "reason": ev.get(n, {}).get("reason", "precise mode off"),
                "blocks": len(r),
                "capacity_blocks": r.capacity,
            }
            | ({"kv_events": ev[n]} if n in fed else {})
            for n, r in idx.replicas.items()
        },
        "shared": share is not None,
        "share_errors": share.errors if share is not None else None,
    }


def json_response(obj: object, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


@dataclass
class Parts:
    """The app's parts the endpoints use (built by :func:`router.server.app.create_app`)."""

    proxy: Proxy
    engine: StepEngine
    holder: Any
    metrics: Any
    writer: Any
    scraper: Any
    store: Any
    admission: Any
    upstream: Any
    backends: list[Backend]
    wall: Callable[[], float]


def _hot(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await handler(request)

    return endpoint


def register_routes(app: FastAPI, parts: Parts) -> None:
    """Add every endpoint but the hot path's handler (which :class:`_RouterApp` short-cuts)."""
    proxy, holder, metrics, writer = parts.proxy, parts.holder, parts.metrics, parts.writer
    scraper, st, admission, up = parts.scraper, parts.store, parts.admission, parts.upstream
    backends = parts.backends

    access = proxy.access

    # also routed normally (so the route table and /openapi.json are complete); _RouterApp
    # short-cuts it before routing, so FastAPI never parses the body
    async def chat_completions(request: Request) -> Response:
        return await proxy.chat(request)

    app.add_api_route(
        "/v1/chat/completions",
        chat_completions,
        methods=["POST"],
        summary="OpenAI chat completions, routed (model 'auto')",
        openapi_extra=request_body(ChatCompletionRequest),
        responses={
            200: {"description": "the upstream's answer (JSON, or SSE with stream: true)"},
            **error_responses(400, 401, 404, 413, 422, 429, 431, 502, 503, 504),
        },
    )
    for path, handler, what, model in (
        ("/v1/responses", proxy.responses, "OpenAI Responses, routed (model 'auto')", ResponsesRequest),
        (
            "/v1/messages",
            proxy.messages,
            "Anthropic Messages, routed (model 'auto' or a mapped name)",
            MessagesRequest,
        ),
    ):
        app.add_api_route(
            path,
            _hot(handler),
            methods=["POST"],
            summary=what,
            openapi_extra=request_body(model),
            responses={
                200: {"description": "the upstream's answer (JSON, or SSE with stream: true)"},
                **error_responses(400, 401, 404, 413, 422, 429, 431, 502, 503, 504),
            },
        )

    @app.post(
        "/v1/messages/count_tokens",
        summary="Anthropic token count",
        responses=error_responses(400, 401, 408, 413),
        openapi_extra=request_body(CountTokensRequest),
    )
    async def count_tokens(request: Request) -> Response:
        return await count_message_tokens(proxy, up, request)

    install_openapi(
        app,
        (
            ChatCompletionRequest,
            ResponsesRequest,
            MessagesRequest,
            CountTokensRequest,
            RunEndRequest,
            RunSignalRequest,
            ErrorBody,
        ),
    )

    @app.exception_handler(StarletteHTTPException)
    async def _http_exc(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None  # 405: Allow
        if request.url.path.startswith(ANTHROPIC_PATHS):  # an Anthropic client reads its own shape
            return proxy.adapters["messages"].error_response(exc.status_code, code, str(exc.detail), headers)
        return error_response(exc.status_code, code, str(exc.detail), headers)

    def guarded(request: Request) -> Response | None:
        try:
            proxy.check_auth(request)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)
        return None

    def check(rule: Callable[[Request], object], request: Request) -> Response | None:
        try:
            rule(request)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)
        return None

    def not_found(run_id: str) -> Response:
        return error_response(404, "run_not_found", f"run {run_id!r} is not known to this router")

    @app.get("/v1/models", responses=error_responses(401))
    async def models(request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        now = int(time.time())
        data = [{"id": "auto", "object": "model", "created": now, "owned_by": "runroute"}]
        seen = set()
        for b in backends:
            if b.model not in seen:
                seen.add(b.model)
                data.append(
                    {"id": b.model, "object": "model", "created": now, "owned_by": f"runroute:{b.tier}"}
                )
        return json_response({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        async def reach(b: Backend) -> bool:
            url = b.root + ("/health" if b.tier == "local" else "/v1/models")
            try:
                status, _ = await up.get(b.tier, url, 1.0)
            except UpstreamError:
                return False
            return status < 500

        async def store_ok() -> bool:
            primary = getattr(st, "primary", None)  # the Redis store behind the fallback
            if primary is None:
                return True
            try:
                return bool(await asyncio.wait_for(primary.ping(), 1.0))
            except Exception:  # noqa: BLE001 - unreachable, refused, timed out: not ready
                return False

        store_reachable = await store_ok()
        ok = await asyncio.gather(*(reach(b) for b in backends))
        reachable = {b.name: r for b, r in zip(backends, ok, strict=True)}
        tiers_ok = all(
            any(reachable[b.name] for b in backends if b.tier == t) for t in {b.tier for b in backends}
        )
        serving = holder.current
        body = {
            "ready": serving is not None and tiers_ok and store_reachable,
            "store": "ok" if store_reachable else "unreachable",
            "bundle": serving.version if serving is not None else None,
            "bundle_registry_version": serving.registry_version if serving is not None else None,
            "bundle_error": holder.last_error,
            "bundle_source_error": getattr(holder, "probe_error", None),
            "backends": reachable,
            "prefix_index": _prefix_index_state(proxy.engine, app),
        }
        return json_response(body, 200 if body["ready"] else 503)

    @app.get(
        "/metrics",
        responses={
            200: {
                "description": "Prometheus text exposition (OpenMetrics when Accept asks for it)",
                "content": {
                    "text/plain; version=0.0.4": {"schema": {"type": "string"}},
                    "application/openmetrics-text; version=1.0.0": {"schema": {"type": "string"}},
                },
            },
            **error_responses(401),
        },
        response_class=Response,
    )
    async def prom(request: Request) -> Response:
        if (r := check(access.metrics, request)) is not None:
            return r
        metrics.set_backends(backends, scraper.stats)
        if admission is not None:
            metrics.set_capacity(await admission.capacity(scraper.stats))
        metrics.store_degraded.set(1 if getattr(st, "degraded", False) else 0)
        metrics.runlog_overflow.inc(max(0, writer.overflowed - _overflow_seen[0]))
        _overflow_seen[0] = writer.overflowed
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, headers={"content-type": content_type})

    _overflow_seen = [0]

    @app.get("/v1/capacity", responses=error_responses(401, 404))
    async def capacity(request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        if admission is None:
            return error_response(404, "no_local_tier", "capacity figures need a local tier")
        cap = await admission.capacity(scraper.stats)
        metrics.set_capacity(cap)
        return json_response(cap)

    # ``:path``: an id with "/" (sent as ``a%2Fb`` in the URL, decoded by the server) still names one run
    @app.get("/v1/runs/{run_id:path}", responses=error_responses(401, 404))
    async def get_run(run_id: str, request: Request) -> Response:
        try:
            caller = proxy.check_auth(request)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)
        run_id = clean_id(run_id)
        sid = scoped_id(caller, run_id)  # the caller's namespace: another tenant's run is not there
        h = proxy.runs.get(sid)
        if h is None:
            return not_found(run_id)
        state = await st.get(sid)
        if not access.owns(state.owner if state is not None else h.owner, caller):
            return not_found(run_id)
        entries = list(h.entries)
        return json_response(
            {
                "run_id": run_id,
                "id_source": h.id_source,
                "ended": h.ended,
                "n_steps": len(entries),
                "pinned": {"tier": state.tier, "replica": state.replica} if state else None,
                "switches": state.switches if state else None,
                "admission": (
                    {"verdict": state.admitted, "priority": state.priority, "tenant": state.tenant}
                    if state
                    else None
                ),
                "domain": h.domain,
                "domain_source": h.domain_source,
                **_run_domain_mode(holder.current, h.domain),
                "signals": list(await st.signals(sid)),
                "tiers": sorted({e["tier"] for e in entries if e["tier"]}),
                "replicas": sorted({e["replica"] for e in entries if e["replica"]}),
                "steps": entries,
                "domain_modes": _domain_modes(holder.current),
            }
        )

    async def owned_run(run_id: str, request: Request) -> tuple[str, str, Response | None]:
        """``(clean run id, its scoped id, None)`` when the caller may act on a run this router or
        the store knows in the caller's namespace; else the response to send (the auth error, or
        404 for an unknown run: another tenant's is unknown here)."""
        try:
            caller = proxy.check_auth(request)
        except ProxyError as e:
            return run_id, run_id, error_response(e.status, e.code, e.message)
        run_id = clean_id(run_id)
        sid = scoped_id(caller, run_id)
        h = proxy.runs.get(sid)
        state = await st.get(sid)
        owner = state.owner if state is not None else (h.owner if h is not None else None)
        if (h is None and state is None) or not access.owns(owner, caller):
            return run_id, sid, not_found(run_id)
        return run_id, sid, None

    @app.post(
        "/v1/runs/{run_id:path}/end",
        responses=error_responses(400, 401, 404, 422),
        openapi_extra=request_body(RunEndRequest, required=False),
    )
    async def end_run(run_id: str, request: Request) -> Response:
        run_id, sid, refused = await owned_run(run_id, request)
        if refused is not None:
            return refused
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return error_response(400, "invalid_json", "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(422, "body_not_object", "request body must be a JSON object")
        outcome = body.get("outcome")  # None: no label (an earlier one stays)
        reward = body.get("reward")
        if outcome is not None and outcome not in ("success", "failure", "unknown"):
            return error_response(422, "invalid_outcome", "'outcome' must be success, failure or unknown")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            return error_response(422, "invalid_reward", "'reward' must be a number")
        done = await proxy.lifecycle.end(sid, outcome=outcome, reward=reward, reason="client")
        if done is None:
            return not_found(run_id)
        return json_response({**done, "run_id": client_id(done["run_id"])})

    @app.post(
        "/v1/runs/{run_id:path}/signal",
        responses=error_responses(400, 401, 404, 409, 413, 422),
        openapi_extra=request_body(RunSignalRequest),
    )
    async def signal_run(run_id: str, request: Request) -> Response:
        run_id, sid, refused = await owned_run(run_id, request)
        if refused is not None:
            return refused
        raw = await request.body()
        kind, err = parse_signal(raw)
        if err is not None:
            return error_response(*err)
        done = await proxy.lifecycle.signal(sid, kind)
        if done is None:
            return not_found(run_id)
        if done["signals"] < 0:
            return error_response(
                409, "signal_limit_reached", f"run {run_id!r} holds {MAX_SIGNALS} signals already"
            )
        metrics.signal_posted(kind)
        return json_response({**done, "run_id": client_id(done["run_id"])})

    @app.post("/admin/reload", responses=error_responses(401, 403, 409))
    async def reload(request: Request) -> Response:
        if (r := check(access.admin, request)) is not None:
            return r
        if not holder.has_source:
            return error_response(
                409, "no_bundle_source", "no bundle source configured (bundle.path / mlflow_uri)"
            )
        try:
            serving = await holder.reload()
        except Exception as e:  # noqa: BLE001 - refused: the old bundle keeps serving
            old = holder.current.version if holder.current else None
            return error_response(409, "bundle_refused", f"bundle refused, still serving {old}: {e}")
        return json_response({"reloaded": True, "version": serving.version})


# paths of Anthropic's API: an unknown path or method under them answers in Anthropic's error shape
ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")

_SIGNAL_BODY_MAX = 64 * 1024


def parse_signal(raw: bytes) -> tuple[str, tuple[int, str, str] | None]:
    """``(kind, None)`` of a signal body, or ``("", (status, code, message))`` for bad input
    (the ``detail`` is checked to be an object and then dropped: never stored or logged)."""
    if len(raw) > _SIGNAL_BODY_MAX:
        return "", (413, "body_too_large", f"a signal body is at most {_SIGNAL_BODY_MAX} bytes")
    try:
        body = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError:
        return "", (400, "invalid_json", "request body is not valid JSON")
    if not isinstance(body, dict):
        return "", (422, "body_not_object", "request body must be a JSON object with a 'kind'")
    extra = sorted(set(body) - {"kind", "detail"})
    if extra:
        return "", (422, "unknown_field", f"unknown field(s) {extra}; a signal has 'kind' and 'detail'")
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in SIGNAL_KINDS:
        return "", (422, "invalid_signal_kind", f"'kind' must be one of {', '.join(SIGNAL_KINDS)}")
    detail = body.get("detail")
    if detail is not None and not isinstance(detail, dict):
        return "", (422, "invalid_signal_detail", "'detail' must be a JSON object (or absent)")
    return kind, None


async def count_message_tokens(proxy: Proxy, up: Upstream, request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: the count of the backend the next step would go to.

    The model is resolved as ``/v1/messages`` resolves it (an unknown model is the same 404
    ``model_not_found``, in Anthropic's shape). The backend asked: the one serving a concrete
    model; else the backend the run is pinned to (``X-Run-Id`` or the Claude Code session header
    names the run); else the first healthy local replica, else the frontier entry the alias maps
    to. Its own ``/v1/messages/count_tokens`` answers (so the figure is the one its tokenizer gives
    the step: on the embedded defaults it equals the step's prompt tokens, ``input_tokens +
    cache_read_input_tokens + cache_creation_input_tokens``); when that backend has no Messages
    endpoint or does not answer 200, the sidecar's estimate (:func:`count_tokens_estimate`)."""
    from router.server.protocols.base import resolve_model
    from router.server.protocols.messages import count_tokens_estimate, validate

    proto = proxy.adapters["messages"]
    try:
        proxy.check_auth(request)
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ProxyError(400, "invalid_json", "request body is not valid JSON") from None
        validate(body, need_max_tokens=False)
        requested, alias = resolve_model(body.get("model"), proxy.models, proxy.pool.aliases)
    except ProxyError as e:
        return proto.error_response(e.status, e.code, e.message)
    for b in await _count_backends(proxy, request, requested, alias):
        url = b.urls.get("messages")
        if url is None:
            continue
        fwd = dict(body)
        fwd["model"] = alias if b.pass_model and alias is not None and b.patterns(alias) else b.model
        try:
            resp = await up.post(b.tier, url + "/count_tokens", orjson.dumps(fwd), b.headers)
            data = await resp.read()
        except UpstreamError:
            break
        if resp.status == 200:
            return Response(data, media_type="application/json")
        break
    return json_response({"input_tokens": count_tokens_estimate(body)})


async def _count_backends(
    proxy: Proxy, request: Request, requested: str | None, alias: str | None
) -> list[Backend]:
    """The backends ``count_tokens`` asks, first choice first (see :func:`count_message_tokens`)."""
    pool = proxy.pool
    if requested is not None:
        return [b for b in pool.backends.values() if b.model == requested]
    sid = request.headers.get(proxy.adapters["messages"].session_header)
    run_id = request.headers.get("x-run-id") or (f"cc-{sid.strip()}" if sid else None)
    if run_id:
        state = await proxy.store.get(clean_id(run_id))
        pinned = pool.backends.get(state.replica) if state is not None and state.replica else None
        if pinned is not None:
            return [pinned]
    healthy = [s.name for s in pool.states() if s.tier == "local" and s.healthy]
    out = [pool.backends[n] for n in healthy]
    chosen = pool.alias(alias) if alias is not None else None
    out += [chosen] if chosen is not None else pool.frontiers
    return out
