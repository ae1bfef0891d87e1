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

Knobs (:class:`AdmissionConfig`, the one definition: the sidecar's settings extend it and the
simulator derives it from its node profile): ``enabled``; ``slo_short_step_s`` (:mod:`router.policy.defaults`); the local
tier's speed, in *work tokens* (decode-token equivalents: ``completion + prefill_weight x uncached
prompt``): ``decode_s_per_token`` (0.01, one sequence's decode time per token), ``replica_slots``
(32, sequences a replica decodes at about that speed), ``prefill_s_per_token`` (1e-4) and
``ttft_base_s`` (0.02) of the local tier; derived unless set: ``base_short_step_s`` (``ttft_base_s
+ 512 x prefill_s_per_token + 64 x decode_s_per_token``, an idle replica's short step),
``replica_tokens_per_s`` (``replica_slots / decode_s_per_token``), ``prefill_weight``
(``prefill_s_per_token x replica_slots / decode_s_per_token``: GPU time of a prefill token over that
of a decode token amortised over a full batch, so ``work / replica_tokens_per_s`` is GPU time);
``default_run_token_rate`` (20 work tokens/s per
active run before history exists); ``headroom`` per priority (``interactive`` 0.9, ``batch`` 0.6 of
the SLO), ``hysteresis`` (0.1), ``spill``, ``retry_after_min_s``/``max_s`` (1, 120),
``max_runs_per_replica`` (a hard cap independent of the latency model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from router.policy.defaults import SLO_SHORT_STEP_S

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
    """Admission knobs (see the module docstring for the algorithm and each knob)."""

    enabled: bool = True
    slo_short_step_s: float = Field(
        default=SLO_SHORT_STEP_S, gt=0, description="per-step SLO for short steps (seconds)"
    )
    decode_s_per_token: float = Field(default=0.01, gt=0, description="one sequence's decode time per token")
    replica_slots: int = Field(
        default=32, ge=1, description="sequences a replica decodes at about that speed"
    )
    prefill_s_per_token: float = Field(
        default=1e-4, ge=0, description="local prefill time per uncached token"
    )
    ttft_base_s: float = Field(default=0.02, ge=0, description="local fixed time to first token")
    base_short_step_s: float | None = Field(
        default=None, gt=0, description="short-step latency on an idle replica (unset: derived)"
    )
    replica_tokens_per_s: float | None = Field(
        default=None, gt=0, description="sustainable work tokens/s per replica (unset: derived)"
    )
    prefill_weight: float | None = Field(
        default=None, ge=0, description="work tokens per uncached prefill token (unset: derived)"
    )
    default_run_token_rate: float = Field(
        default=20.0, gt=0, description="work tokens/s per active run before history"
    )
    headroom: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 0.9, "batch": 0.6},
        description="fraction of the SLO the predicted latency may reach before a class sheds",
    )
    hysteresis: float = Field(
        default=0.1, ge=0, lt=1, description="utilisation margin before a shedding class resumes"
    )
    spill: bool = True
    retry_after_min_s: float = Field(default=1.0, ge=0)
    retry_after_max_s: float = Field(default=120.0, gt=0)
    max_runs_per_replica: int | None = Field(default=None, ge=1)

    @field_validator("headroom")
    @classmethod
    def _headroom(cls, v: dict[str, float]) -> dict[str, float]:
        if "interactive" not in v or not all(0 < x <= 1 for x in v.values()):
            raise ValueError("admission.headroom needs 'interactive' and values in (0, 1]")
        return v

    @property
    def short_step_s(self) -> float:
        """``base_short_step_s``, or its derivation from the local tier's speed."""
        if self.base_short_step_s is not None:
            return self.base_short_step_s
        return self.ttft_base_s + 512 * self.prefill_s_per_token + 64 * self.decode_s_per_token

    @property
    def tokens_per_s(self) -> float:
        """``replica_tokens_per_s``, or ``replica_slots / decode_s_per_token``."""
        if self.replica_tokens_per_s is not None:
            return self.replica_tokens_per_s
        return self.replica_slots / self.decode_s_per_token

    @property
    def work_prefill_weight(self) -> float:
        """``prefill_weight``, or ``prefill_s_per_token x replica_slots / decode_s_per_token``."""
        if self.prefill_weight is not None:
            return self.prefill_weight
        return self.prefill_s_per_token * self.replica_slots / self.decode_s_per_token


@dataclass(slots=True)
class LoadSnapshot:
    """The local tier's load as the caller sees it when a new run arrives."""

    healthy_replicas: int
    active_local_runs: int
    run_token_rate: float | None = None  # tokens/s per active run (EWMA); None -> config default
    waiting_requests: int = 0  # queued requests over all local replicas (vllm:num_requests_waiting)
    frontier_healthy: bool = True
    mean_remaining_run_s: float | None = None  # predicted time until an average active run ends
    slot_free_s: tuple[float, ...] = ()  # predicted seconds until each active run's slot frees, soonest first


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
    rho = (load.active_local_runs + extra_runs) * rate / (replicas * cfg.tokens_per_s)
    inflation = 1.0 / max(1.0 - rho, 0.02)
    t = cfg.short_step_s * inflation + (load.waiting_requests / replicas) * cfg.short_step_s
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
    wait = (load.waiting_requests / load.healthy_replicas) * cfg.short_step_s
    n = 0
    if limit > wait + cfg.short_step_s:
        rate = (
            load.run_token_rate
            if load.run_token_rate and load.run_token_rate > 0
            else cfg.default_run_token_rate
        )
        rho_star = 1.0 - cfg.short_step_s / (limit - wait)
        n = int(math.floor(rho_star * load.healthy_replicas * cfg.tokens_per_s / rate + 1e-9))
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
        wait = (load.waiting_requests / replicas) * cfg.short_step_s
        cap_hit = (
            cfg.max_runs_per_replica is not None
            and load.active_local_runs + 1 > cfg.max_runs_per_replica * max(load.healthy_replicas, 0)
        )
        # every class's hysteresis flag follows the current load (not only the asking class's), so
        # a flag never goes stale while only other classes arrive
        for cls in PRIORITIES:
            limit = self._limit(cls)
            rho_star = 1.0 - cfg.short_step_s / max(limit - wait, 1e-9) if limit > wait else 0.0
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
        """Seconds until enough active runs finish for a new one to fit under the limit: the
        ``need``-th soonest predicted slot release (``load.slot_free_s``) when known, else active
        runs ending uniformly over ``2 x mean_remaining_run_s``; with neither, ``retry_after_min_s``."""
        cfg = self.cfg
        n = max(load.active_local_runs, 1)
        # runs that must finish for the prediction to fall below the limit (search downwards)
        need = 0
        probe = replace(load)  # a copy (every field is an init field)
        while need < n:
            probe.active_local_runs = load.active_local_runs - need
            if predict_short_step_latency(cfg, probe)[0] <= limit:
                break
            need += 1
        need = max(need, 1)
        if load.slot_free_s:
            eta = load.slot_free_s[min(need, len(load.slot_free_s)) - 1]
        elif load.mean_remaining_run_s is not None:
            # active runs end roughly uniformly over the next 2 x mean_left seconds
            eta = 2.0 * load.mean_remaining_run_s * (need / n)
        else:
            eta = cfg.retry_after_min_s
        return float(min(max(eta, cfg.retry_after_min_s), cfg.retry_after_max_s))
