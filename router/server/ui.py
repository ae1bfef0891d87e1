"""The live page: ``GET /ui`` (a static page, no build step, no CDN) and the JSON it polls.

Routes:

- ``GET /ui``: ``index.html``; ``GET /ui/static/{name}``: its script and stylesheet. The files ship
  in the package (``router/server/ui_assets/``, package data) and hold no figures, so they are served
  to anyone who can reach the port;
- ``GET /ui/data``: every figure the page shows (:func:`ui_data`), read from the same series
  ``GET /metrics`` exposes (the app's registry, gauges refreshed as a scrape refreshes them), so the
  page and a Prometheus scrape agree; the runs in flight come from the run history, like
  ``GET /v1/runs?state=active``;
- ``GET /ui/plots/{name}``: a PNG of the latest scorecard (``ui.report_dir``; only files that the
  listing in ``/ui/data`` names, so no path escapes the folder).

Access: when ``server.metrics_keys`` or ``server.admin_keys`` are set, ``/ui/data`` and the plots
need one of those keys (``Authorization: Bearer``); the page reads it from the URL fragment
(``/ui#key=...``, never sent to the server or its logs) or asks for it, and keeps it in the tab's
``sessionStorage``. Without such keys they are open, as ``/metrics`` is.

Figures (:func:`ui_data`): runs in flight by tier (the tier of the run's latest step; ``pending``
before its first answer) and domain; per local replica the cross-turn cache hit rate (cached /
prompt tokens of steps after a run's first) beside its upper bound, health, in-flight requests,
scraped running/waiting/KV usage; admission (active runs, predicted utilisation and short-step
latency, verdict counts) and the capacity forecast per horizon; spend in USD per tier and per
hour (the rate over ``ui.spend_window_s``: samples taken at each call, the app's start counting
as a zero sample); the frontier share of started runs against ``ui.frontier_share_budget``; the
PNGs and the ``generated_at`` of ``scorecard.json`` in ``ui.report_dir``.

Knobs: ``ui.report_dir``, ``ui.frontier_share_budget``, ``ui.refresh_s``, ``ui.spend_window_s``
(:class:`router.server.settings.UiSettings`).
"""

from __future__ import annotations

from collections import deque
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.server.errors import ProxyError, error_response
from router.server.routes import Parts, json_response
from router.server.settings import RouterSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from router.server.settings import UiSettings

__all__ = ["register_ui", "ui_data", "metric_samples", "ASSETS"]

ASSETS = {"index.html": "text/html", "ui.js": "text/javascript", "ui.css": "text/css"}


def metric_samples(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{sample name: [(labels, value)]}`` of a prometheus_client registry (what /metrics shows)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in registry.collect():
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _by(samples: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples:
        k = labels.get(label, "")
        out[k] = out.get(k, 0.0) + v
    return out


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    got = samples.get(name)
    return got[0][1] if got else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def ui_data(
    parts: Parts, ui: UiSettings, spend_samples: deque[tuple[float, float]], now: float
) -> dict[str, Any]:
    """Every figure of the page (module docstring); ``spend_samples`` is the window's
    ``(wall, total spend)`` history, appended to here."""
    m = parts.metrics
    s = metric_samples(m.registry)
    # runs in flight (run history; like GET /v1/runs?state=active)
    inflight: dict[tuple[str, str], int] = {}
    for h in parts.proxy.runs.values():
        if h.ended:
            continue
        tier = (h.entries[-1].get("tier") or "pending") if h.entries else "pending"
        cell = (tier, h.domain or "(none)")
        inflight[cell] = inflight.get(cell, 0) + 1
    # cache per local replica
    cached = _by(s.get("runroute_cross_turn_cached_tokens_total", []), "backend")
    prompt = _by(s.get("runroute_cross_turn_prompt_tokens_total", []), "backend")
    reusable = _by(s.get("runroute_cross_turn_reusable_tokens_total", []), "backend")
    gauges = {
        name: _by(s.get(f"runroute_{name}", []), "backend")
        for name in (
            "backend_healthy",
            "inflight_requests",
            "backend_running_requests",
            "backend_waiting_requests",
            "backend_kv_cache_usage_ratio",
        )
    }
    replicas = []
    for b in parts.backends:
        if b.tier != "local":
            continue
        n = b.name
        replicas.append(
            {
                "backend": n,
                "cached_tokens": cached.get(n, 0.0),
                "prompt_tokens": prompt.get(n, 0.0),
                "hit_rate": _ratio(cached.get(n, 0.0), prompt.get(n, 0.0)),
                "upper_bound": _ratio(reusable.get(n, 0.0), prompt.get(n, 0.0)),
                "healthy": gauges["backend_healthy"].get(n),
                "inflight": gauges["inflight_requests"].get(n, 0.0),
                "running": gauges["backend_running_requests"].get(n),
                "waiting": gauges["backend_waiting_requests"].get(n),
                "kv_usage": gauges["backend_kv_cache_usage_ratio"].get(n),
            }
        )
    # capacity per horizon
    horizons: dict[str, dict[str, float]] = {}
    for name, key in (
        ("runroute_capacity_forecast_runs_per_second", "forecast_runs_per_second"),
        ("runroute_capacity_recommended_replicas", "recommended_replicas"),
        ("runroute_capacity_expected_spill_ratio", "expected_spill_ratio"),
        ("runroute_capacity_expected_reject_ratio", "expected_reject_ratio"),
    ):
        for labels, v in s.get(name, []):
            horizons.setdefault(labels.get("horizon_s", ""), {})[key] = v
    # spend
    spend_by_tier = _by(s.get("runroute_spend_usd_total", []), "tier")
    total = sum(spend_by_tier.values())
    spend_samples.append((now, total))
    while len(spend_samples) > 2 and now - spend_samples[1][0] >= ui.spend_window_s:
        spend_samples.popleft()
    t0, v0 = spend_samples[0]
    per_hour = (total - v0) / (now - t0) * 3600.0 if now > t0 else None
    # frontier share of started runs
    started = _by(s.get("runroute_runs_started_total", []), "tier")
    n_started = sum(started.values())
    return {
        "generated_at": now,
        "refresh_s": ui.refresh_s,
        "runs_inflight": [{"tier": t, "domain": d, "runs": n} for (t, d), n in sorted(inflight.items())],
        "runs_inflight_total": sum(inflight.values()),
        "runs_started": started,
        "frontier_share": {
            "runs": _ratio(started.get("frontier", 0.0), n_started),
            "budget": ui.frontier_share_budget,
        },
        "replicas": replicas,
        "admission": {
            "active_runs": _one(s, "runroute_admission_active_runs"),
            "utilisation_ratio": _one(s, "runroute_admission_utilisation_ratio"),
            "predicted_short_step_seconds": _one(s, "runroute_admission_predicted_short_step_seconds"),
            "verdicts": _by(s.get("runroute_admission_verdicts_total", []), "verdict"),
        },
        "capacity": [
            {"horizon_s": h, **v} for h, v in sorted(horizons.items(), key=lambda kv: float(kv[0] or 0))
        ],
        "spend": {
            "total_usd": total,
            "by_tier": spend_by_tier,
            "per_hour_usd": per_hour,
            "window_s": now - t0,
        },
        **_report(Path(ui.report_dir)),
    }


def _report(folder: Path) -> dict[str, Any]:
    """The latest scorecard's PNGs and its ``generated_at`` (absent folder: none)."""
    plots = sorted(p.name for p in folder.glob("*.png")) if folder.is_dir() else []
    card = folder / "scorecard.json"
    generated = None
    if card.is_file():
        try:
            generated = orjson.loads(card.read_bytes()).get("generated_at")
        except (orjson.JSONDecodeError, OSError, AttributeError):
            generated = None
    return {
        "report": {
            "dir": str(folder),
            "scorecard_generated_at": generated,
            "plots": [{"name": n, "url": f"/ui/plots/{n}"} for n in plots],
        }
    }


def register_ui(app: FastAPI, parts: Parts, settings: RouterSettings) -> None:
    """Add ``/ui`` and its data, assets and plots (module docstring)."""
    ui = settings.ui
    access = parts.proxy.access
    assets = {name: (resources.files("router.server") / "ui_assets" / name).read_bytes() for name in ASSETS}
    spend_samples: deque[tuple[float, float]] = deque([(parts.wall(), 0.0)])

    def refused(request: Request) -> Response | None:
        try:
            if access.metrics_keys:
                access.metrics(request)
            elif access.admin_keys:
                access.admin(request)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)
        return None

    @app.get("/ui", include_in_schema=False)
    async def page() -> Response:
        return Response(assets["index.html"], media_type="text/html; charset=utf-8")

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in ASSETS or name == "index.html":
            return error_response(404, "not_found", f"no asset {name!r}")
        return Response(assets[name], media_type=ASSETS[name] + "; charset=utf-8")

    @app.get("/ui/data", include_in_schema=False)
    async def data(request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        metrics = parts.metrics
        metrics.set_backends(parts.backends, parts.scraper.stats)  # as a /metrics scrape does
        if parts.admission is not None:
            metrics.set_capacity(await parts.admission.capacity(parts.scraper.stats))
        return json_response(ui_data(parts, ui, spend_samples, parts.wall()))

    @app.get("/ui/plots/{name}", include_in_schema=False)
    async def plot(name: str, request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        folder = Path(ui.report_dir)
        names = {p.name for p in folder.glob("*.png")} if folder.is_dir() else set()
        if name not in names:
            return error_response(404, "not_found", f"no plot {name!r} in {folder}")
        return Response((folder / name).read_bytes(), media_type="image/png")
