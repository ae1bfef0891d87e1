"""The sidecar's FastAPI app: ``create_app(settings)`` wires injected parts, no module globals.

Parts (each injectable for tests; built from settings otherwise):

- ``upstream``: :class:`router.server.upstream.AiohttpUpstream` (one pooled session per tier);
- ``store``: run-state store (:class:`router.server.state.InProcessStore`, or the Redis store);
- ``bundle``: a predictor (``ModelBundle`` or any ``predict(prefix) -> Predictions`` object); when
  not given it is loaded from ``settings.bundle`` at start-up (a failure stops the start-up with
  the bundle's one-line error) and hot-reloaded by :mod:`router.server.bundles`;
- the policy is always built from ``settings.policy`` by ``router.policy.config.build_policy``
  with the bundle (thresholds not set in config come from the bundle).

The lifespan opens the upstream sessions, starts the run-log writer (and rolls JSONL files left
by crashed processes into Parquet), loads the bundle, starts the /metrics scraper and the bundle
watcher; on shutdown it stops them, closes the sessions and rolls the run log into Parquet.

Admission (``settings.admission``, on by default when a local tier exists): a
:class:`router.server.admission.LiveAdmission` over a :class:`router.server.admission.LoadModel`, the store and the
scraper's health; ``admission_budget_hook`` (``tenant -> bool``) replaces the per-tenant spill
budget built from settings. Its idle sweep starts and stops with the lifespan.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, ``GET /ready``,
``GET /metrics``, ``GET /v1/runs/{run_id}``, ``POST /v1/runs/{run_id}/end`` (also gives back the
run's admission slot and leaves an ``ended`` tombstone in the store for ``store.ttl_s``),
``GET /v1/capacity`` (utilisation per replica, forecast new runs/s for the next 5/15/60 minutes,
the replica count that holds the SLO at that forecast, expected spill and reject shares),
``POST /admin/reload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from models.predictor import ConstantPredictor
from router.core.engine import StepEngine
from router.policy.types import BackendState, RunState
from router.server.bundles import BundleHolder
from router.server.errors import ProxyError, error_response
from router.server.metrics import RouterMetrics
from router.server.proxy import Backend, Proxy
from router.server.runlog_writer import RunLogWriter
from router.server.scrape import Scraper
from router.server.settings import RouterSettings
from router.server.upstream import AiohttpUpstream, Upstream, UpstreamError

__all__ = ["create_app", "make_backends", "serve_in_thread"]

log = logging.getLogger("runroute.app")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


class _RouterApp(FastAPI):
    """FastAPI, except that ``POST /v1/chat/completions`` skips the middleware stack.

    The hot path answers every error itself (OpenAI-style); an unexpected exception still becomes
    a 500 ``internal_error`` here. Measured: the stack's per-``send`` wrappers cost ~10 us per SSE
    chunk and ~40 us per request on this machine type.
    """

    hot_path: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            self.hot_path is not None
            and scope["type"] == "http"
            and scope["path"] == "/v1/chat/completions"
            and scope["method"] == "POST"
        ):
            started = False

            async def tracking_send(msg: Any) -> None:
                nonlocal started
                started = True
                await send(msg)

            try:
                response = await self.hot_path(Request(scope, receive))
                await response(scope, receive, tracking_send)
            except Exception:
                log.exception("unhandled error on the chat-completions path")
                if not started:
                    await error_response(500, "internal_error", "internal router error")(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def make_backends(s: RouterSettings) -> list[Backend]:
    out = []
    if s.local is not None:
        hdr = {"content-type": "application/json"}
        if s.local.api_key_env:
            import os

            key = os.environ.get(s.local.api_key_env)
            if key:
                hdr["authorization"] = f"Bearer {key}"
        for name, url in zip(s.local.names or [], s.local.urls, strict=True):
            tmpl = BackendState(
                name=name,
                tier="local",
                model=s.local.model,
                max_context=s.local.max_context,
                prefill_s_per_token=s.local.prefill_s_per_token,
                ttft_base_s=s.local.ttft_base_s,
                gpu_usd_per_hour=s.local.gpu_usd_per_hour,
            )
            out.append(Backend(name, "local", s.local.model, url, hdr, tmpl))
    if s.frontier is not None:
        f = s.frontier
        hdr = {"content-type": "application/json"}
        key = f.api_key()
        if key:
            hdr["authorization"] = f"Bearer {key}"
        tmpl = BackendState(
            name=f.name,
            tier="frontier",
            model=f.model,
            max_context=f.max_context,
            price_in_per_m=f.price_in_per_m,
            price_cached_in_per_m=f.price_cached_in_per_m,
            price_out_per_m=f.price_out_per_m,
            ttft_base_s=f.ttft_base_s,
        )
        out.append(Backend(f.name, "frontier", f.model, f.url, hdr, tmpl))
    return out


def _make_store(s: RouterSettings) -> Any:
    """``memory``: InProcessStore. ``redis``: RedisStore behind FallbackStore (keeps serving from
    local pins while Redis is down, resyncs when it returns)."""
    from router.server.state import InProcessStore

    if s.store.kind == "memory":
        return InProcessStore(ttl_s=s.store.ttl_s)
    from router.server.state_redis import FallbackStore, RedisStore

    return FallbackStore(
        RedisStore(
            s.store.redis_url,
            key_prefix=s.store.key_prefix,
            ttl_s=s.store.ttl_s,
            admit_ttl_s=s.store.admit_ttl_s,
        ),
        InProcessStore(ttl_s=s.store.ttl_s),
    )


def create_app(
    settings: RouterSettings,
    *,
    upstream: Upstream | None = None,
    store: Any = None,
    bundle: Any = None,
    admission_budget_hook: Any = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> FastAPI:
    """Build the app; see the module docstring for what is injected and what is built."""
    from router.policy.config import build_policy

    s = settings
    metrics = RouterMetrics()
    up: Upstream = upstream or AiohttpUpstream(
        connect_s=s.timeouts.connect_s, first_byte_s=s.timeouts.first_byte_s, total_s=s.timeouts.total_s
    )
    st = store if store is not None else _make_store(s)
    backends = make_backends(s)

    def policy_factory(predictor: Any) -> Any:
        return build_policy(s.policy, predictor if hasattr(predictor, "thresholds") else None)

    holder = BundleHolder(
        policy_factory,
        path=s.bundle.path,
        mlflow_uri=s.bundle.mlflow_uri,
        tracking_uri=s.bundle.mlflow_tracking_uri,
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
    )
    engine, admission = _make_engine(s, st, scraper, backends, admission_budget_hook, clock, wall)
    proxy = Proxy(
        engine=engine,
        clock=clock,
        wall=wall,
        admission=admission,
        settings=s,
        upstream=up,
        store=st,
        holder=holder,
        scraper=scraper,
        writer=writer,
        metrics=metrics,
        backends=backends,
    )

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
        # the bundle, settings and imported modules live for the whole process: move them out of the
        # collector's generations so a full collection under load does not walk them (tail latency)
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            if admission is not None:
                await admission.stop()
            await scraper.stop()
            await holder.stop()
            await up.close()
            await asyncio.to_thread(writer.close)
            await st.close()

    app = _RouterApp(title="runroute", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.hot_path = proxy.chat
    app.state.proxy = proxy
    app.state.holder = holder
    app.state.metrics = metrics
    app.state.writer = writer
    app.state.scraper = scraper
    app.state.store = st
    app.state.settings = s
    app.state.admission = admission

    # also routed normally (so the route table is complete); _RouterApp short-cuts it
    app.router.routes.append(Route("/v1/chat/completions", proxy.chat, methods=["POST"]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_exc(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    def guarded(request: Request) -> Response | None:
        try:
            proxy.check_auth(request)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)
        return None

    @app.get("/v1/models")
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
        return _json({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        async def reach(b: Backend) -> bool:
            url = b.root + ("/health" if b.tier == "local" else "/v1/models")
            try:
                status, _ = await up.get(b.tier, url, 1.0)
            except UpstreamError:
                return False
            return status < 500

        ok = await asyncio.gather(*(reach(b) for b in backends))
        reachable = {b.name: r for b, r in zip(backends, ok, strict=True)}
        tiers_ok = all(
            any(reachable[b.name] for b in backends if b.tier == t) for t in {b.tier for b in backends}
        )
        serving = holder.current
        body = {
            "ready": serving is not None and tiers_ok,
            "bundle": serving.version if serving is not None else None,
            "bundle_error": holder.last_error,
            "backends": reachable,
        }
        return _json(body, 200 if body["ready"] else 503)

    @app.get("/metrics")
    async def prom() -> Response:
        for b in backends:
            metrics.inflight.labels(b.name).set(b.inflight)
        for name, stt in scraper.stats.items():
            metrics.healthy.labels(name).set(1 if stt.healthy else 0)
            metrics.running.labels(name).set(stt.running)
            metrics.waiting.labels(name).set(stt.waiting)
            metrics.kv_usage.labels(name).set(stt.kv_usage)
        if admission is not None:
            metrics.set_capacity(await admission.capacity(scraper.stats))
        metrics.store_degraded.set(1 if getattr(st, "degraded", False) else 0)
        metrics.runlog_overflow.inc(max(0, writer.overflowed - _overflow_seen[0]))
        _overflow_seen[0] = writer.overflowed
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    _overflow_seen = [0]

    @app.get("/v1/capacity")
    async def capacity(request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        if admission is None:
            return error_response(404, "no_local_tier", "capacity figures need a local tier")
        cap = await admission.capacity(scraper.stats)
        metrics.set_capacity(cap)
        return _json(cap)

    @app.get("/v1/runs/{run_id}")
    async def get_run(run_id: str, request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        h = proxy.runs.get(run_id)
        if h is None:
            return error_response(404, "run_not_found", f"run {run_id!r} is not known to this router")
        state = await st.get(run_id)
        entries = list(h.entries)
        return _json(
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
                "tiers": sorted({e["tier"] for e in entries if e["tier"]}),
                "replicas": sorted({e["replica"] for e in entries if e["replica"]}),
                "steps": entries,
            }
        )

    @app.post("/v1/runs/{run_id}/end")
    async def end_run(run_id: str, request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        h = proxy.runs.get(run_id)
        state = await st.get(run_id)
        if h is None:
            if state is not None and state.admitted not in (None, "ended"):
                # a run served by another router replica: give back its slot, leave the tombstone
                holds = engine.run_ended(state)
                if admission is not None:
                    await admission.release(state, holds)
                await st.put(RunState(run_id=run_id, admitted="ended", steps_seen=state.steps_seen))
                return _json({"run_id": run_id, "ended": True, "n_steps": state.steps_seen})
            return error_response(404, "run_not_found", f"run {run_id!r} is not known to this router")
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return error_response(400, "invalid_json", "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(422, "body_not_object", "request body must be a JSON object")
        outcome = body.get("outcome", "unknown")
        reward = body.get("reward")
        if outcome not in ("success", "failure", "unknown"):
            return error_response(422, "invalid_outcome", "'outcome' must be success, failure or unknown")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            return error_response(422, "invalid_reward", "'reward' must be a number")
        entries = list(h.entries)
        started = entries[0]["arrival_s"] if entries else None
        ended = wall()
        writer.submit(
            {
                "record": "run",
                "run_id": run_id,
                "source": "runroute",
                "started_at": started,
                "ended_at": max(ended, started or ended),
                "outcome": outcome,
                "reward": reward,
                "n_steps": len(entries),
            }
        )
        h.ended = True
        if state is not None and state.admitted != "ended":
            holds = engine.run_ended(state)
            if admission is not None:
                await admission.release(state, holds)
            # a tombstone (kept store.ttl_s) tells other routers' idle sweeps the slot is given back
            await st.put(RunState(run_id=run_id, admitted="ended", steps_seen=state.steps_seen))
        else:
            await st.delete(run_id)
        return _json({"run_id": run_id, "ended": True, "n_steps": len(entries), "outcome": outcome})

    @app.post("/admin/reload")
    async def reload(request: Request) -> Response:
        if (r := guarded(request)) is not None:
            return r
        if not holder.has_source:
            return error_response(
                503, "bundle_not_loaded", "no bundle source configured (bundle.path / mlflow_uri)"
            )
        try:
            serving = await holder.reload()
        except Exception as e:  # noqa: BLE001 - refused: the old bundle keeps serving
            old = holder.current.version if holder.current else None
            return error_response(409, "bundle_refused", f"bundle refused, still serving {old}: {e}")
        return _json({"reloaded": True, "version": serving.version})

    return app


def _make_engine(
    s: RouterSettings,
    store: Any,
    scraper: Scraper,
    backends: list[Backend],
    budget_hook: Any,
    clock: Callable[[], float],
    wall: Callable[[], float],
) -> tuple[StepEngine, Any]:
    """The step engine of this app and its store-backed admission (None without a local tier)."""
    from router.core.admission import AdmissionGate, TenantSpillBudget
    from router.core.capacity import ArrivalForecaster
    from router.core.traffic import TrafficModel
    from router.server.admission import LiveAdmission

    hist = s.server.run_history_steps
    if s.local is None:
        return StepEngine(max_steps=hist), None
    a = s.admission
    cfg = a.controller_config(s.local)
    local = [b.name for b in backends if b.tier == "local"]
    frontier = [b.name for b in backends if b.tier == "frontier"]
    traffic = TrafficModel(
        local,
        tau_s=a.rate_tau_s,
        prefill_weight=cfg.work_prefill_weight,
        min_rate_steps=a.min_rate_steps,
        forecaster=ArrivalForecaster(
            bucket_s=a.forecast_bucket_s, alpha=a.forecast_alpha, min_history_s=a.forecast_min_history_s
        ),
        clock=clock,
        wall=wall,
    )
    budget = None
    if budget_hook is None and (a.tenant_spill_limits or a.default_tenant_spill_limit is not None):
        budget = TenantSpillBudget(a.tenant_spill_limits, a.default_tenant_spill_limit)
    gate = AdmissionGate(cfg, traffic, budget_hook=budget_hook, tenant_budget=budget)

    def healthy() -> tuple[list[str], bool]:
        stats = scraper.stats
        return [n for n in local if n not in stats or stats[n].healthy], bool(frontier)

    live = LiveAdmission(
        gate,
        store,
        key=a.counter_key,
        idle_release_s=a.idle_release_s or s.store.ttl_s,
        sweep_s=a.sweep_s,
        healthy=healthy,
        horizons_s=a.horizons_s,
        default_run_s=a.default_run_s,
    )
    return StepEngine(admission=gate, max_steps=hist), live


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 20.0) -> Any:
    """Run ``app`` under uvicorn in a background thread (tests, benchmarks); yields the base URL.

    Stops the server (lifespan shutdown included) when the block exits.
    """
    import threading

    import uvicorn

    cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
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
