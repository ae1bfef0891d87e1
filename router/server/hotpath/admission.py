"""The sidecar's side of admission control: the shared slot counter, leak bounds, the capacity view.

The decision itself is the step engine's (:mod:`router.core.admission`: one order and one set of
reason codes for the sidecar, the simulator and replay). :class:`LiveAdmission` owns what needs the
run-state store (async I/O):

1. ``active()``: active local runs from the store's shared counter (what the gate's load snapshot
   counts); ``claim(limit)``: the store's atomic ``try_admit(key, limit)``, so router replicas
   sharing a Redis counter never admit past the budget together (a refused claim makes the engine
   shed the run: ``budget-race``); ``release(run)``: gives the slot back when the run ends
   (``POST /v1/runs/{id}/end``) and when it expires idle.
2. Leak bounds: every router tracks the runs it admitted (the traffic model); a sweep every
   ``sweep_s`` looks at those idle longer than ``idle_release_s`` and asks the store: a run the store
   forgot (its pin expired after ``store.ttl_s`` without a step) is released; a run ended through
   another router left a tombstone (``admitted == "ended"``, kept ``store.ttl_s``) and is only
   forgotten; a run still in the store (served by another router) is kept. So a leaked slot lives
   at most ``max(idle_release_s, store.ttl_s) + sweep_s`` unless its router process dies; slots of
   a dead router stay in the shared counter until the Redis counter's own expiry
   (``RedisStore.admit_ttl_s``) or an operator reset, which is why that expiry should be set in
   multi-router deployments.
3. ``capacity(scraped)``: the figures behind ``GET /v1/capacity`` and the capacity gauges.

Knobs: ``key`` (the store's counter), ``idle_release_s``, ``sweep_s`` (0 = no background sweep),
``horizons_s`` (forecast horizons), ``default_run_s`` (mean run duration before any run ended).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from router.core.admission import UNLIMITED, AdmissionGate
from router.core.capacity import capacity_plan
from router.policy.admission import admissible_runs, predict_short_step_latency
from router.policy.types import RunState
from router.server.background import BackgroundTask

if TYPE_CHECKING:
    from router.server.state.store import RunStateStore

__all__ = ["LiveAdmission"]

log = logging.getLogger("runroute.admission")


@dataclass
class AdmissionStats:
    released_end: int = 0
    released_idle: int = 0


class LiveAdmission(BackgroundTask):
    """The store-backed side of admission (module docstring). ``healthy`` returns ``(healthy local
    replica names, frontier healthy)`` for the capacity view."""

    def __init__(
        self,
        gate: AdmissionGate,
        store: RunStateStore,
        *,
        key: str = "local",
        idle_release_s: float = 3600.0,
        sweep_s: float = 10.0,
        healthy: Callable[[], tuple[list[str], bool]] = lambda: ([], False),
        horizons_s: tuple[float, ...] = (300.0, 900.0, 3600.0),
        default_run_s: float = 60.0,
    ):
        self.gate = gate
        self.cfg = gate.cfg
        self.load = gate.traffic
        self.store = store
        self.key = key
        self.idle_release_s = idle_release_s
        self.sweep_s = sweep_s
        self.healthy = healthy
        self.horizons_s = horizons_s
        self.default_run_s = default_run_s
        self.stats = AdmissionStats()
        self.last_active = 0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ the shared counter
    async def active(self) -> int:
        self.last_active = await self.store.active(self.key)
        return self.last_active

    async def claim(self, limit: int) -> bool:
        ok = bool(await self.store.try_admit(self.key, max(limit, 0)))
        if ok:
            self.last_active += 1
        return ok

    async def claim_unlimited(self) -> None:
        await self.store.try_admit(self.key, UNLIMITED)

    async def release(self, run: RunState | None, holds_slot: bool) -> None:
        """The run ended (``run`` may be None: the slot is counted per key, not per run);
        ``holds_slot``: the engine says it held a local slot (give it back)."""
        if holds_slot:
            await self.store.release(self.key)
            self.stats.released_end += 1

    async def sweep_once(self) -> int:
        """Release slots of runs idle past ``idle_release_s`` that the store forgot; returns how many."""
        n = 0
        for run_id in self.load.idle_runs(self.idle_release_s):
            state = await self.store.get(run_id)
            if state is None:  # expired: nobody will end it any more
                self.gate.released(run_id)
                await self.store.release(self.key)
                self.stats.released_idle += 1
                n += 1
            elif state.admitted == "ended":  # ended through another router, which released it
                self.gate.released(run_id)
            else:  # still alive in the shared store (served elsewhere): look again later
                self.load.touch(run_id)
        return n

    def start(self) -> None:
        self._start_periodic(self.sweep_s, self.sweep_once, log, "admission sweep")

    # ------------------------------------------------------------------ capacity
    async def capacity(self, scraped: dict[str, Any]) -> dict[str, Any]:
        """The figures behind ``GET /v1/capacity`` (and the capacity gauges)."""
        try:
            active = await self.store.active(self.key)
        except Exception:  # noqa: BLE001 - a store outage must not break the capacity view
            active = self.last_active
        self.last_active = active
        cfg = self.cfg
        names, frontier_ok = self.healthy()
        load = self.gate.load([], active)
        load.healthy_replicas, load.frontier_healthy = len(names), frontier_ok
        load.waiting_requests = int(sum(st.waiting for n, st in scraped.items() if n in names))
        rate = load.run_token_rate
        t_now, rho_now = predict_short_step_latency(cfg, load, extra_runs=0)
        replicas = []
        for name, rep in self.load.replicas.items():
            st = scraped.get(name)
            work = rep.work.rate(self.load.clock())
            replicas.append(
                {
                    "name": name,
                    "healthy": name in names,
                    "utilisation": work / cfg.tokens_per_s,
                    "work_tokens_per_s": work,
                    "inflight_steps": rep.inflight_steps,
                    "inflight_prefill_tokens": rep.prefill_tokens,
                    "inflight_decode_tokens": rep.decode_tokens,
                    "running": st.running if st is not None else None,
                    "waiting": st.waiting if st is not None else None,
                    "kv_usage": st.kv_usage if st is not None else None,
                }
            )
        mean_run = self.load.run_duration_s or self.default_run_s
        now_wall = self.load.wall()
        forecast = []
        spill_ok = cfg.spill and frontier_ok
        for h in self.horizons_s:
            plan = capacity_plan(cfg, self.load.forecaster, now_wall, h, mean_run, rate, max(len(names), 0))
            shed = plan.expected_shed_share if cfg.enabled else 0.0
            forecast.append(
                {
                    "horizon_s": h,
                    "runs_per_s": plan.forecast_runs_per_s,
                    "expected_active_runs": plan.expected_active_runs,
                    "recommended_replicas": plan.recommended_replicas,
                    "expected_spill_share": shed if spill_ok else 0.0,
                    "expected_reject_share": 0.0 if spill_ok else shed,
                }
            )
        return {
            "admission": {
                "enabled": cfg.enabled,
                "slo_short_step_s": cfg.slo_short_step_s,
                "verdicts": dict(self.gate.verdicts),
                "shedding": dict(self.gate.controller.shedding),
                "released_on_end": self.stats.released_end,
                "released_idle": self.stats.released_idle,
            },
            "local": {
                "healthy_replicas": len(names),
                "active_runs": active,
                "tracked_runs": len(self.load.runs),
                "run_token_rate": rate,
                "run_token_rate_default": cfg.default_run_token_rate,
                "replica_tokens_per_s": cfg.tokens_per_s,
                "utilisation": rho_now,
                "predicted_short_step_s": t_now,
                "admissible_runs": {p: admissible_runs(cfg, load, p) for p in self.gate.controller.shedding},
                "predicted_remaining_tokens": self.load.predicted_remaining_tokens(),
                "mean_remaining_run_s": load.mean_remaining_run_s,
                "mean_run_s": mean_run,
                "step_cycle_s": self.load.step_cycle_s,
            },
            "replicas": replicas,
            "forecast": forecast,
        }
