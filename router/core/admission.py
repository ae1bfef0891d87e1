"""The step engine's admission gate: one order and one set of reason codes for every adapter.

Order (the engine calls the gate after the policy decided the step):

1. A run's **first** step whose decision is **local** asks the controller
   (:class:`router.policy.admission.AdmissionController`) with a
   :class:`~router.policy.admission.LoadSnapshot` built from the step's backends (healthy local
   replicas, their waiting requests, frontier health), the active local runs (the adapter's slot
   counter) and the traffic model's per-run rate and predicted time left. A first step the
   policy sends to the frontier holds no local slot and is not asked (verdict ``frontier``): a
   what-if never rejects a run the sidecar would have sent to the frontier.
2. ``admit-local`` -> the adapter claims a slot with its atomic counter (``try_admit(limit)``,
   ``limit`` = :func:`~router.policy.admission.admissible_runs`), so router replicas sharing one
   counter never admit past the budget together; a refused claim sheds the run (``budget-race``).
3. Shedding -> ``spill`` (the whole run is pinned to the frontier) when spilling is enabled, the
   frontier is healthy, the client did not name the local model and the tenant's spill budget
   allows it; otherwise ``reject``.
4. Later steps: a spilled run stays on the frontier; a run first placed on the frontier that the
   policy moves local is counted (its slot claimed without a limit), never refused; steps of
   admitted runs are never rejected for load.

Reason codes (``Decision.reason`` of the first step; the verdict is logged as ``Step.admission``):
``admission-spill-<why>`` / ``admission-reject-<why>`` with ``<why>`` one of
``predicted-slo-breach``, ``max-runs``, ``budget-race``; later steps of a spilled run
``admission-spilled``.

:class:`TenantSpillBudget` (the controller's budget hook): a per-tenant cap on concurrently spilled
runs; a tenant over its cap gets ``reject`` instead of ``spill``.

Knobs: the :class:`~router.policy.admission.AdmissionConfig`, ``budget_hook`` (``tenant -> bool``,
replaces the tenant budget), ``tenant_budget``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from router.core.traffic import TrafficModel
from router.policy.admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionDecision,
    LoadSnapshot,
    admissible_runs,
)
from router.policy.types import BackendState

__all__ = ["AdmissionGate", "TenantSpillBudget", "UNLIMITED", "SPILLED_REASON"]

UNLIMITED = 1 << 40
SPILLED_REASON = "admission-spilled"


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


class AdmissionGate:
    """Admission decisions for the step engine (module docstring); sync, no I/O."""

    def __init__(
        self,
        cfg: AdmissionConfig,
        traffic: TrafficModel,
        *,
        budget_hook: Callable[[str | None], bool] | None = None,
        tenant_budget: TenantSpillBudget | None = None,
    ):
        self.cfg = cfg
        self.traffic = traffic
        self.tenant_budget = tenant_budget
        hook = budget_hook if budget_hook is not None else tenant_budget
        self.controller = AdmissionController(cfg, budget_hook=hook)
        self.verdicts: dict[str, int] = {}

    def load(self, backends: Sequence[BackendState], active_local_runs: int) -> LoadSnapshot:
        """The local tier's load as the controller sees it (from the step's backend states)."""
        healthy = 0
        waiting = 0
        frontier = False
        for b in backends:
            if not b.healthy:
                continue
            if b.tier == "local":
                healthy += 1
                waiting += b.waiting
            else:
                frontier = True
        t = self.traffic
        return LoadSnapshot(
            healthy_replicas=healthy,
            active_local_runs=active_local_runs,
            run_token_rate=t.run_token_rate(),
            waiting_requests=waiting,
            frontier_healthy=frontier,
            mean_remaining_run_s=t.mean_remaining_run_s(),
            slot_free_s=t.slot_free_s(),
        )

    def _count(self, verdict: str) -> None:
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1

    def frontier_first(self) -> None:
        """A new run the policy placed on the frontier: an arrival, no slot."""
        self.traffic.run_arrived()
        self._count("frontier")

    def first_step(
        self, load: LoadSnapshot, priority: str, tenant: str | None, spill_ok: bool
    ) -> tuple[AdmissionDecision, int | None]:
        """The verdict for a new run placed locally, and the slot limit to claim on ``admit-local``."""
        self.traffic.run_arrived()
        if not spill_ok:
            load.frontier_healthy = False
        d = self.controller.decide(load, priority, tenant)
        if d.verdict == "admit-local":
            limit = admissible_runs(self.cfg, load, priority) if self.cfg.enabled else UNLIMITED
            return d, max(limit, 0)
        return d, None

    def race_lost(self, load: LoadSnapshot, priority: str, tenant: str | None) -> AdmissionDecision:
        """The shared counter refused a slot the controller granted: shed the run."""
        return self.controller.shed(load, priority, tenant, "budget-race")

    def admitted(self, run_id: str, priority: str, tenant: str | None) -> None:
        self.traffic.admitted(run_id, priority, tenant)
        self._count("admit-local")

    def spilled(self, run_id: str, tenant: str | None) -> None:
        if self.tenant_budget is not None:
            self.tenant_budget.take(run_id, tenant)
        self._count("spill")

    def rejected(self) -> None:
        self._count("reject")

    def late_local(self, run_id: str, priority: str, tenant: str | None) -> None:
        """A run first placed on the frontier moved local: tracked, never refused."""
        self.traffic.admitted(run_id, priority, tenant)

    def released(self, run_id: str) -> bool:
        """The run ended: forget it; True when it was tracked as an active local run."""
        if self.tenant_budget is not None:
            self.tenant_budget.give(run_id)
        return self.traffic.release(run_id)
