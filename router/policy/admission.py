"""Admission control: admit a new run locally, spill it to the frontier, or reject it early.

The rule (Mooncake-style early rejection): under load, refuse or redirect *new* runs instead of
slowing the steps of runs already in flight — a delayed step stalls its whole agent loop while a
refused start costs little. Admission is decided once, at a run's first step; steps of admitted
runs are never rejected for load (the caller only consults this at step 0).

Algorithm (pure; the caller supplies a :class:`LoadSnapshot`, no clock, no I/O):

1. Offered local load if one more run is admitted, as a utilisation::

       rho = (active_local_runs + 1) * run_token_rate / (healthy_replicas * replica_tokens_per_s)

   ``run_token_rate`` is the tokens/s one active run puts on the local tier (prompt tokens not
   served from cache + output tokens, per second of wall time incl. tool pauses); the router and
   the simulator estimate it from their own recent history (EWMA), and the remaining-work model's
   predictions can replace it (``remaining_tokens_p50 / remaining_seconds``).
2. Predicted short-step latency, an M/M/1-style inflation of the unloaded latency plus the
   queue already waiting::

       t_short = base_short_step_s / max(1 - rho, eps) + waiting_per_replica * base_short_step_s

3. Compare with the SLO using per-priority headroom (``batch`` sheds first, at a lower load than
   ``interactive``, and always while ``interactive`` sheds) and hysteresis per priority class
   (every decision updates every class's flag from the current load): a class starts shedding when the prediction
   exceeds ``slo * headroom``, i.e. when utilisation exceeds the utilisation ``rho*`` at which the
   prediction equals that limit, and keeps shedding until utilisation falls below
   ``rho* - hysteresis``; so load hovering at the threshold does not flap decisions.
4. When shedding: ``spill`` (the whole run is pinned to the frontier) if the frontier is healthy,
   spilling is enabled and the tenant budget hook allows it; otherwise ``reject`` with a
   Retry-After estimated from how long until enough active runs finish.

Knobs (:class:`AdmissionConfig`): ``enabled``, ``slo_short_step_s``, ``base_short_step_s``,
``replica_tokens_per_s``, ``default_run_token_rate``, ``headroom`` (per priority, fraction of the
SLO the prediction may reach), ``hysteresis``, ``spill``, ``retry_after_min_s``/``max_s``,
``max_runs_per_replica`` (a hard cap independent of the latency model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "AdmissionConfig",
    "LoadSnapshot",
    "AdmissionDecision",
    "AdmissionController",
    "predict_short_step_latency",
    "admissible_runs",
    "PRIORITIES",
]

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[str, ...] = ("interactive", "batch")
Verdict = Literal["admit-local", "spill", "reject"]


class AdmissionConfig(BaseModel):
    """Admission knobs (see the module docstring for the algorithm)."""

    enabled: bool = True
    slo_short_step_s: float = Field(1.0, gt=0, description="per-step SLO for short steps (seconds)")
    base_short_step_s: float = Field(0.2, gt=0, description="short-step latency on an idle replica")
    replica_tokens_per_s: float = Field(20000.0, gt=0, description="sustainable local tokens/s per replica")
    default_run_token_rate: float = Field(200.0, gt=0, description="tokens/s per active run before history")
    headroom: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 0.9, "batch": 0.6},
        description="fraction of the SLO the predicted latency may reach before a class sheds",
    )
    hysteresis: float = Field(
        0.1, ge=0, lt=1, description="utilisation margin before a shedding class resumes"
    )
    spill: bool = True
    retry_after_min_s: float = 1.0
    retry_after_max_s: float = 120.0
    max_runs_per_replica: int | None = None


@dataclass(slots=True)
class LoadSnapshot:
    """The local tier's load as the caller sees it when a new run arrives."""

    healthy_replicas: int
    active_local_runs: int
    run_token_rate: float | None = None  # tokens/s per active run (EWMA); None -> config default
    waiting_requests: int = 0  # queued requests over all local replicas (vllm:num_requests_waiting)
    frontier_healthy: bool = True
    mean_remaining_run_s: float | None = None  # predicted time until an average active run ends


@dataclass(slots=True)
class AdmissionDecision:
    verdict: Verdict
    reason: str
    predicted_short_step_s: float
    utilisation: float
    retry_after_s: float | None = None
    scores: dict[str, float] = field(default_factory=dict)


def predict_short_step_latency(
    cfg: AdmissionConfig, load: LoadSnapshot, extra_runs: int = 1
) -> tuple[float, float]:
    """Predicted short-step latency (s) and utilisation if ``extra_runs`` more runs are admitted."""
    replicas = max(load.healthy_replicas, 0)
    if replicas == 0:
        return math.inf, math.inf
    rate = (
        load.run_token_rate if load.run_token_rate and load.run_token_rate > 0 else cfg.default_run_token_rate
    )
    rho = (load.active_local_runs + extra_runs) * rate / (replicas * cfg.replica_tokens_per_s)
    inflation = 1.0 / max(1.0 - rho, 0.02)
    t = cfg.base_short_step_s * inflation + (load.waiting_requests / replicas) * cfg.base_short_step_s
    return t, rho


def admissible_runs(cfg: AdmissionConfig, load: LoadSnapshot, priority: str = "interactive") -> int:
    """The most active local runs (incl. a new one) whose predicted short-step latency stays within
    ``priority``'s limit (``slo * headroom``), capped by ``max_runs_per_replica``.

    The count form of :meth:`AdmissionController.decide`'s entry test, used as the ``limit`` of the
    run-state store's atomic ``try_admit`` so several router replicas sharing one counter never
    admit past it together. Returns 0 when no replica is healthy.
    """
    if load.healthy_replicas <= 0:
        return 0
    head = cfg.headroom.get(priority, cfg.headroom.get("batch", min(cfg.headroom.values())))
    limit = cfg.slo_short_step_s * head
    wait = (load.waiting_requests / load.healthy_replicas) * cfg.base_short_step_s
    n = 0
    if limit > wait + cfg.base_short_step_s:
        rate = (
            load.run_token_rate
            if load.run_token_rate and load.run_token_rate > 0
            else cfg.default_run_token_rate
        )
        rho_star = 1.0 - cfg.base_short_step_s / (limit - wait)
        n = int(math.floor(rho_star * load.healthy_replicas * cfg.replica_tokens_per_s / rate + 1e-9))
    if cfg.max_runs_per_replica is not None:
        n = min(n, cfg.max_runs_per_replica * load.healthy_replicas)
    return max(n, 0)


class AdmissionController:
    """Stateful only in its hysteresis flags (one per priority class); decide() is pure otherwise.

    ``budget_hook(tenant) -> bool`` may refuse a spill for a tenant out of frontier budget.
    """

    def __init__(self, cfg: AdmissionConfig, budget_hook: Callable[[str | None], bool] | None = None):
        self.cfg = cfg
        self.budget_hook = budget_hook
        self.shedding: dict[str, bool] = {p: False for p in PRIORITIES}

    def _limit(self, priority: str) -> float:
        return self.cfg.slo_short_step_s * self.cfg.headroom.get(priority, self.cfg.headroom["interactive"])

    def decide(
        self, load: LoadSnapshot, priority: str = "interactive", tenant: str | None = None
    ) -> AdmissionDecision:
        cfg = self.cfg
        t, rho = predict_short_step_latency(cfg, load)
        scores = {"predicted_short_step_s": t, "utilisation": rho}
        if not cfg.enabled:
            return AdmissionDecision("admit-local", "admission-off", t, rho, scores=scores)
        if priority not in self.shedding:
            priority = "batch"  # unknown classes are treated as the most sheddable
        replicas = max(load.healthy_replicas, 1)
        wait = (load.waiting_requests / replicas) * cfg.base_short_step_s
        cap_hit = (
            cfg.max_runs_per_replica is not None
            and load.active_local_runs + 1 > cfg.max_runs_per_replica * max(load.healthy_replicas, 0)
        )
        # every class's hysteresis flag follows the current load (not only the asking class's), so
        # a flag never goes stale while only other classes arrive
        for cls in PRIORITIES:
            limit = self._limit(cls)
            rho_star = 1.0 - cfg.base_short_step_s / max(limit - wait, 1e-9) if limit > wait else 0.0
            if self.shedding[cls]:
                self.shedding[cls] = rho > rho_star - cfg.hysteresis or cap_hit
            else:
                self.shedding[cls] = t > limit or cap_hit
        # batch always sheds when interactive does (priority order)
        if self.shedding["interactive"]:
            self.shedding["batch"] = True
        if not self.shedding[priority]:
            return AdmissionDecision("admit-local", "admit", t, rho, scores=scores)
        return self.shed(load, priority, tenant, "max-runs" if cap_hit else "predicted-slo-breach")

    def shed(
        self,
        load: LoadSnapshot,
        priority: str = "interactive",
        tenant: str | None = None,
        reason: str = "shed",
    ) -> AdmissionDecision:
        """The shedding verdict for a run that cannot be admitted locally: spill, else reject.

        Also used by callers whose atomic budget check (the shared run-state store) refused a run
        :meth:`decide` admitted (another router took the last slot first).
        """
        cfg = self.cfg
        t, rho = predict_short_step_latency(cfg, load)
        scores = {"predicted_short_step_s": t, "utilisation": rho}
        if cfg.spill and load.frontier_healthy and (self.budget_hook is None or self.budget_hook(tenant)):
            return AdmissionDecision("spill", f"spill-{reason}", t, rho, scores=scores)
        limit = self._limit(priority if priority in self.shedding else "batch")
        return AdmissionDecision("reject", f"reject-{reason}", t, rho, self._retry_after(load, limit), scores)

    def _retry_after(self, load: LoadSnapshot, limit: float) -> float:
        """Seconds until enough active runs finish for a new one to fit under the limit."""
        cfg = self.cfg
        mean_left = load.mean_remaining_run_s or 30.0
        n = max(load.active_local_runs, 1)
        # runs that must finish for the prediction to fall below the limit (search downwards)
        need = 0
        probe = LoadSnapshot(**{**_asdict(load)})
        while need < n:
            probe.active_local_runs = load.active_local_runs - need
            if predict_short_step_latency(cfg, probe)[0] <= limit:
                break
            need += 1
        # active runs end roughly uniformly over the next 2 x mean_left seconds
        eta = 2.0 * mean_left * (max(need, 1) / n)
        return float(min(max(eta, cfg.retry_after_min_s), cfg.retry_after_max_s))


def _asdict(load: LoadSnapshot) -> dict:
    return {k: getattr(load, k) for k in LoadSnapshot.__slots__}  # type: ignore[attr-defined]
