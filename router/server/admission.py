"""The router's live load model and the live side of admission control.

:class:`LoadModel` (sync, no I/O, clocks injected) keeps, from what the router itself sees:

- **per local replica**, the work of its in-flight steps: prefill tokens (the new prompt minus the
  bundle's predicted prefix-cache reuse) and decode tokens (the run's mean output so far, else
  ``default_decode_tokens``), plus a time-decayed rate of the *work* it served, where work is
  counted in decode-token equivalents: ``completion + prefill_weight * uncached prompt`` (one
  prefill token costs ``prefill_weight`` of a decode token). The scraped vLLM ``/metrics`` (running,
  waiting, KV usage) sit beside it in :meth:`LoadModel.replicas_view`;
- **per active local run** (admitted here): its priority, tenant, last step time and the bundle's
  latest remaining-work predictions (``remaining_tokens_p50``, ``remaining_steps_p50``); their sum
  is the predicted remaining local work, and ``remaining_steps_p50 x`` the mean step cycle (EWMA of
  the time between a run's consecutive steps) is the predicted time until a run ends (Retry-After);
- **the per-run token rate**: the decayed local work rate divided by the time-averaged number of
  active local runs (both exponentially weighted with time constant ``tau_s`` and normalised for
  the warm-up, so the first ``tau_s`` seconds are not biased low); ``None`` until
  ``min_rate_steps`` local steps were seen (the admission config's default applies);
- **new-run arrivals**, fed to :class:`router.core.capacity.ArrivalForecaster`, and an EWMA of run
  durations (first step to end) for Little's law in the capacity plan.

:class:`LiveAdmission` joins that model, the pure :class:`router.policy.admission.AdmissionController`
(the same object the what-if simulator drives) and the run-state store:

1. At a run's first step whose policy decision is local, build a
   :class:`~router.policy.admission.LoadSnapshot` (healthy local replicas, active local runs from the
   store's shared counter, the per-run token rate, scraped waiting requests, frontier health,
   predicted time left of active runs) and ``decide``.
2. ``admit-local``: claim a slot with the store's atomic ``try_admit(key, limit)``, ``limit`` =
   :func:`~router.policy.admission.admissible_runs` for the run's priority, so router replicas sharing
   a Redis counter never admit past the budget together; a refused claim sheds the run
   (reason ``*-budget-race``).
3. ``spill``/``reject`` as the controller says; a spill is charged to the tenant's spill budget.

Slots are given back (``release``) when the run ends (``POST /v1/runs/{id}/end``) and when it
expires idle. Leak bounds: every router tracks the runs it admitted; a sweep every ``sweep_s``
looks at those idle longer than ``idle_release_s`` and asks the store: a run the store forgot (its
pin expired after ``store.ttl_s`` without a step) is released; a run ended through another router
left a tombstone (``admitted == "ended"``, kept ``store.ttl_s``) and is only forgotten; a run still in
the store (served by another router) is kept. So a leaked slot lives at most
``max(idle_release_s, store.ttl_s) + sweep_s`` unless its router process dies; slots of a dead
router stay in the shared counter until the Redis counter's own expiry (``RedisStore.admit_ttl_s``)
or an operator reset, which is why that expiry should be set in multi-router deployments.

Tenant budget (:class:`TenantSpillBudget`, the controller's ``budget_hook``): a per-tenant cap on
concurrently spilled runs (``tenant_spill_limits``, ``default_tenant_spill_limit``; in-process
counts); a tenant over its cap gets ``reject`` instead of ``spill``. Inject any
``hook(tenant) -> bool`` through ``create_app(admission_budget_hook=...)`` to replace it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.types import Predictions
from router.core.capacity import ArrivalForecaster, capacity_plan
from router.policy.admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionDecision,
    LoadSnapshot,
    admissible_runs,
    predict_short_step_latency,
)
from router.server.background import BackgroundTask

__all__ = ["DecayingRate", "DecayingMean", "LoadModel", "TenantSpillBudget", "LiveAdmission"]

log = logging.getLogger("runroute.admission")


class DecayingRate:
    """Events-per-second estimate with exponential time decay (time constant ``tau_s``).

    ``rate = sum_i x_i exp(-(now - t_i) / tau) / (tau (1 - exp(-(now - t0) / tau)))``: the
    denominator is the effective window, so the estimate is unbiased during the warm-up too.
    """

    __slots__ = ("tau", "t0", "t", "v")

    def __init__(self, tau_s: float, t0: float):
        self.tau, self.t0, self.t, self.v = tau_s, t0, t0, 0.0

    def _decay(self, now: float) -> None:
        if now > self.t:
            self.v *= math.exp(-(now - self.t) / self.tau)
            self.t = now

    def add(self, now: float, x: float) -> None:
        self._decay(now)
        self.v += x

    def rate(self, now: float) -> float:
        self._decay(now)
        window = self.tau * (1.0 - math.exp(-max(now - self.t0, 1e-9) / self.tau))
        return self.v / max(window, 1e-9)


class DecayingMean:
    """Time-weighted exponential mean of a piecewise-constant signal (e.g. the active run count)."""

    __slots__ = ("tau", "t0", "t", "value", "integral")

    def __init__(self, tau_s: float, t0: float):
        self.tau, self.t0, self.t, self.value, self.integral = tau_s, t0, t0, 0.0, 0.0

    def _advance(self, now: float) -> None:
        if now > self.t:
            k = math.exp(-(now - self.t) / self.tau)
            self.integral = self.integral * k + self.value * self.tau * (1.0 - k)
            self.t = now

    def set(self, now: float, value: float) -> None:
        self._advance(now)
        self.value = value

    def mean(self, now: float) -> float:
        self._advance(now)
        window = self.tau * (1.0 - math.exp(-max(now - self.t0, 1e-9) / self.tau))
        return self.integral / window if window > 1e-9 else self.value


@dataclass(slots=True)
class ActiveRun:
    run_id: str
    admitted_s: float
    last_s: float
    priority: str
    tenant: str | None
    remaining_tokens: float = 0.0
    remaining_steps: float = 0.0
    steps: int = 0
    completion_sum: int = 0


@dataclass(slots=True)
class ReplicaLoad:
    name: str
    work: DecayingRate
    inflight_steps: int = 0
    prefill_tokens: float = 0.0  # queued/running prefill work of in-flight steps (estimate)
    decode_tokens: float = 0.0  # queued/running decode work of in-flight steps (estimate)


@dataclass(slots=True)
class StepToken:
    """What :meth:`LoadModel.step_started` charged, so :meth:`LoadModel.step_finished` undoes it once."""

    replica: str | None
    run_id: str
    prefill: float
    decode: float
    done: bool = False


class LoadModel:
    """See the module docstring. Knobs: ``tau_s`` (decay time constant of the rates, s),
    ``prefill_weight`` (decode-token equivalents per uncached prefill token),
    ``default_decode_tokens`` (expected output of a step before a run has history),
    ``min_rate_steps`` (local steps seen before the per-run rate is trusted), ``forecaster``.
    """

    def __init__(
        self,
        replicas: list[str],
        *,
        tau_s: float = 30.0,
        prefill_weight: float = 0.01,
        default_decode_tokens: float = 64.0,
        min_rate_steps: int = 20,
        forecaster: ArrivalForecaster | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        now = clock()
        self.tau_s = tau_s
        self.prefill_weight = prefill_weight
        self.default_decode_tokens = default_decode_tokens
        self.min_rate_steps = min_rate_steps
        self.clock, self.wall = clock, wall
        self.forecaster = forecaster or ArrivalForecaster()
        self.replicas = {r: ReplicaLoad(r, DecayingRate(tau_s, now)) for r in replicas}
        self.runs: dict[str, ActiveRun] = {}
        self._work = DecayingRate(tau_s, now)
        self._active = DecayingMean(tau_s, now)
        self._local_steps = 0
        self.step_cycle_s: float | None = None  # EWMA of the time between a run's consecutive steps
        self.run_duration_s: float | None = None  # EWMA of admitted runs' durations

    # ------------------------------------------------------------------ runs
    def run_arrived(self) -> None:
        """A new run started (whatever the verdict): one arrival for the forecaster."""
        self.forecaster.observe(self.wall())

    def admitted(self, run_id: str, priority: str, tenant: str | None) -> None:
        now = self.clock()
        self.runs[run_id] = ActiveRun(run_id, now, now, priority, tenant)
        self._active.set(now, len(self.runs))

    def release(self, run_id: str) -> bool:
        """Forget an admitted run; True when this router was tracking it."""
        r = self.runs.pop(run_id, None)
        if r is None:
            return False
        now = self.clock()
        self._active.set(now, len(self.runs))
        d = max(now - r.admitted_s, 0.0)
        self.run_duration_s = d if self.run_duration_s is None else 0.9 * self.run_duration_s + 0.1 * d
        return True

    def idle_runs(self, idle_s: float) -> list[str]:
        now = self.clock()
        return [r.run_id for r in self.runs.values() if now - r.last_s > idle_s]

    def touch(self, run_id: str) -> None:
        r = self.runs.get(run_id)
        if r is not None:
            r.last_s = self.clock()

    # ------------------------------------------------------------------ steps
    def step_started(
        self,
        replica: str | None,
        run_id: str,
        prompt_tokens: int,
        reuse_tokens: float,
        predictions: Predictions | None,
    ) -> StepToken:
        """Charge an in-flight step to ``replica`` (None: not local): ``prompt_tokens`` minus the
        expected prefix-cache ``reuse_tokens`` of prefill, the run's mean output of decode; update
        the run's remaining-work predictions."""
        now = self.clock()
        r = self.runs.get(run_id)
        decode = self.default_decode_tokens
        if r is not None:
            if r.steps:
                self._cycle(now - r.last_s)
                decode = r.completion_sum / r.steps
            r.last_s = now
            if predictions is not None:
                r.remaining_tokens = max(float(predictions.remaining_tokens_p50), 0.0)
                r.remaining_steps = max(float(predictions.remaining_steps_p50), 0.0)
        rep = self.replicas.get(replica) if replica is not None else None
        if rep is None:
            return StepToken(None, run_id, 0.0, 0.0)
        prefill = max(prompt_tokens - reuse_tokens, 0.0)
        rep.inflight_steps += 1
        rep.prefill_tokens += prefill
        rep.decode_tokens += decode
        return StepToken(replica, run_id, prefill, decode)

    def _cycle(self, dt: float) -> None:
        if dt > 0:
            self.step_cycle_s = dt if self.step_cycle_s is None else 0.9 * self.step_cycle_s + 0.1 * dt

    def step_finished(
        self,
        token: StepToken | None,
        replica: str | None,
        prompt: int,
        cached: int,
        completion: int,
        ok: bool,
    ) -> None:
        """Undo the in-flight charge; count the served work when the step ended on a local replica."""
        if token is None or token.done:
            return
        token.done = True
        now = self.clock()
        if token.replica is not None:
            rep = self.replicas[token.replica]
            rep.inflight_steps -= 1
            rep.prefill_tokens = max(rep.prefill_tokens - token.prefill, 0.0)
            rep.decode_tokens = max(rep.decode_tokens - token.decode, 0.0)
        r = self.runs.get(token.run_id)
        if r is not None:
            r.last_s = now
            if ok:
                r.steps += 1
                r.completion_sum += completion
        dst = self.replicas.get(replica) if replica is not None else None
        if ok and dst is not None:
            w = completion + self.prefill_weight * max(prompt - cached, 0)
            dst.work.add(now, w)
            self._work.add(now, w)
            self._local_steps += 1

    # ------------------------------------------------------------------ estimates
    def run_token_rate(self) -> float | None:
        """Work tokens/s one active local run puts on the local tier (None before enough history)."""
        if self._local_steps < self.min_rate_steps:
            return None
        now = self.clock()
        active = self._active.mean(now)
        if active < 0.5:
            return None
        return self._work.rate(now) / active

    def replica_work_rate(self, name: str) -> float:
        rep = self.replicas.get(name)
        return rep.work.rate(self.clock()) if rep is not None else 0.0

    def mean_remaining_run_s(self) -> float | None:
        """Predicted seconds until an average active run ends.

        The larger of two estimates (so Retry-After does not invite retries too early): the bundle's
        ``remaining_steps_p50`` x the step cycle, and the history's ``run duration - age`` (at least
        one step cycle). None before either is known.
        """
        if not self.runs:
            return None
        now = self.clock()
        est: list[float] = []
        if self.step_cycle_s is not None:
            steps = [r.remaining_steps for r in self.runs.values() if r.remaining_steps > 0]
            if steps:
                est.append((sum(steps) / len(steps)) * self.step_cycle_s)
        if self.run_duration_s is not None:
            floor = self.step_cycle_s or 0.0
            left = [max(self.run_duration_s - (now - r.admitted_s), floor) for r in self.runs.values()]
            est.append(sum(left) / len(left))
        return max(est) if est else None

    def predicted_remaining_tokens(self) -> float:
        return float(sum(r.remaining_tokens for r in self.runs.values()))


class TenantSpillBudget:
    """Per-tenant cap on concurrently spilled runs (in-process); the controller's ``budget_hook``."""

    def __init__(self, limits: dict[str, int], default_limit: int | None):
        self.limits = dict(limits)
        self.default_limit = default_limit
        self.held: dict[str, str | None] = {}  # run_id -> tenant
        self.counts: dict[str | None, int] = {}

    def __call__(self, tenant: str | None) -> bool:
        limit = self.limits.get(tenant, self.default_limit) if tenant is not None else self.default_limit
        return limit is None or self.counts.get(tenant, 0) < limit

    def take(self, run_id: str, tenant: str | None) -> None:
        if run_id not in self.held:
            self.held[run_id] = tenant
            self.counts[tenant] = self.counts.get(tenant, 0) + 1

    def give(self, run_id: str) -> None:
        if run_id in self.held:
            t = self.held.pop(run_id)
            self.counts[t] = max(self.counts.get(t, 0) - 1, 0)


@dataclass
class AdmissionStats:
    verdicts: dict[str, int] = field(default_factory=dict)
    released_end: int = 0
    released_idle: int = 0


class LiveAdmission(BackgroundTask):
    """Admission at a run's first step, backed by the run-state store; see the module docstring.

    ``healthy`` is a callable returning ``(healthy local replica names, frontier healthy)``;
    ``waiting`` returns the scraped waiting requests over the local replicas.
    """

    def __init__(
        self,
        cfg: AdmissionConfig,
        store: Any,
        load: LoadModel,
        *,
        key: str = "local",
        idle_release_s: float = 3600.0,
        sweep_s: float = 10.0,
        budget_hook: Callable[[str | None], bool] | None = None,
        tenant_budget: TenantSpillBudget | None = None,
        healthy: Callable[[], tuple[list[str], bool]] = lambda: ([], False),
        waiting: Callable[[], float] = lambda: 0.0,
        horizons_s: tuple[float, ...] = (300.0, 900.0, 3600.0),
        default_run_s: float = 60.0,
    ):
        self.cfg = cfg
        self.store = store
        self.load = load
        self.key = key
        self.idle_release_s = idle_release_s
        self.sweep_s = sweep_s
        self.tenant_budget = tenant_budget
        hook = budget_hook if budget_hook is not None else tenant_budget
        self.controller = AdmissionController(cfg, budget_hook=hook)
        self.healthy = healthy
        self.waiting = waiting
        self.horizons_s = horizons_s
        self.default_run_s = default_run_s
        self.stats = AdmissionStats()
        self.last_active = 0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ snapshot
    def snapshot(self, active: int) -> LoadSnapshot:
        names, frontier_ok = self.healthy()
        return LoadSnapshot(
            healthy_replicas=len(names),
            active_local_runs=active,
            run_token_rate=self.load.run_token_rate(),
            waiting_requests=int(self.waiting()),
            frontier_healthy=frontier_ok,
            mean_remaining_run_s=self.load.mean_remaining_run_s(),
        )

    # ------------------------------------------------------------------ decisions
    async def first_step(
        self, run_id: str, priority: str, tenant: str | None, *, spill_ok: bool = True
    ) -> AdmissionDecision:
        """Decide a new run whose first step the policy placed locally; claims the slot on admit.

        ``spill_ok=False`` (the client named the local model) turns a spill into a reject.
        """
        self.load.run_arrived()
        active = await self.store.active(self.key)
        self.last_active = active
        load = self.snapshot(active)
        if not spill_ok:
            load.frontier_healthy = False
        d = self.controller.decide(load, priority, tenant)
        if d.verdict == "admit-local":
            limit = admissible_runs(self.cfg, load, priority) if self.cfg.enabled else 1 << 40
            if await self.store.try_admit(self.key, max(limit, 0)):
                self.load.admitted(run_id, priority, tenant)
                self.last_active = active + 1
            else:
                d = self.controller.shed(load, priority, tenant, "budget-race")
        if d.verdict == "spill" and self.tenant_budget is not None:
            self.tenant_budget.take(run_id, tenant)
        self.stats.verdicts[d.verdict] = self.stats.verdicts.get(d.verdict, 0) + 1
        return d

    async def count_late_local(self, run_id: str, priority: str, tenant: str | None) -> None:
        """A run first placed on the frontier by the policy moved local: count it, never refuse."""
        await self.store.try_admit(self.key, 1 << 40)
        self.load.admitted(run_id, priority, tenant)

    async def release(self, run_id: str, admitted: str | None) -> None:
        """The run ended: give back its local slot (if it held one) and its spill budget."""
        if self.tenant_budget is not None:
            self.tenant_budget.give(run_id)
        tracked = self.load.release(run_id)
        if admitted == "admit-local" or tracked:
            await self.store.release(self.key)
            self.stats.released_end += 1

    async def sweep_once(self) -> int:
        """Release slots of runs idle past ``idle_release_s`` that the store forgot; returns how many."""
        n = 0
        for run_id in self.load.idle_runs(self.idle_release_s):
            state = await self.store.get(run_id)
            if state is None:  # expired: nobody will end it any more
                self.load.release(run_id)
                if self.tenant_budget is not None:
                    self.tenant_budget.give(run_id)
                await self.store.release(self.key)
                self.stats.released_idle += 1
                n += 1
            elif state.admitted == "ended":  # ended through another router, which released it
                self.load.release(run_id)
            else:  # still alive in the shared store (served elsewhere): look again later
                self.load.touch(run_id)
        return n

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await self.sweep_once()
            except Exception:  # noqa: BLE001 - a store hiccup must not kill the sweeper
                log.exception("admission sweep failed")

    def start(self) -> None:
        if self.sweep_s > 0:
            self._start_task(self._loop)

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
        load = self.snapshot(active)
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
                    "utilisation": work / cfg.replica_tokens_per_s,
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
                "verdicts": dict(self.stats.verdicts),
                "shedding": dict(self.controller.shedding),
                "released_on_end": self.stats.released_end,
                "released_idle": self.stats.released_idle,
            },
            "local": {
                "healthy_replicas": len(names),
                "active_runs": active,
                "tracked_runs": len(self.load.runs),
                "run_token_rate": rate,
                "run_token_rate_default": cfg.default_run_token_rate,
                "replica_tokens_per_s": cfg.replica_tokens_per_s,
                "utilisation": rho_now,
                "predicted_short_step_s": t_now,
                "admissible_runs": {p: admissible_runs(cfg, load, p) for p in self.controller.shedding},
                "predicted_remaining_tokens": self.load.predicted_remaining_tokens(),
                "mean_remaining_run_s": load.mean_remaining_run_s,
                "mean_run_s": mean_run,
                "step_cycle_s": self.load.step_cycle_s,
            },
            "replicas": replicas,
            "forecast": forecast,
        }
