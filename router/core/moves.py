"""The step engine's moves outside the plan: the fallback of a step whose backend failed before its
first byte (module docstring of :mod:`router.core.engine`, 7) and the races of several routers on
one run (9: :meth:`EngineMoves.adopt` another router's first pin, :meth:`EngineMoves.unserved_start`).

A mixin of :class:`router.core.engine.StepEngine` (it uses the engine's ``traffic``,
``fallback_weights``, ``cache_lags``, ``admission``, ``_reading`` and ``run_ended``); split out so
the engine module stays small.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from router.policy.filters import ScoreWeights, other_tier, place
from router.policy.types import BackendState, Decision, RunState, apply_decision

if TYPE_CHECKING:  # pragma: no cover
    from router.core.engine import StepPlan

__all__ = ["EngineMoves"]


class EngineMoves:
    """Mixin: see the module docstring."""

    traffic: Any
    admission: Any
    fallback_weights: ScoreWeights
    cache_lags: bool

    def _reading(self, replica: str | None) -> Any:  # pragma: no cover - the engine's
        raise NotImplementedError

    def run_ended(self, run: RunState) -> bool:  # pragma: no cover - the engine's
        raise NotImplementedError

    # ------------------------------------------------------------------ 7: fallback
    def fallback(
        self, plan: StepPlan, run: RunState, failed: str, kind: str, backends: list[BackendState]
    ) -> Decision | None:
        """Re-place a step whose backend ``failed`` before its first byte on the other tier.

        ``backends``: fresh states (the failed one is marked unhealthy here). Returns the applied
        decision (reason ``fallback-<kind>``), or None when the other tier has no candidate."""
        failed_tier = None
        for st in backends:
            if st.name == failed:
                st.healthy = False
                failed_tier = st.tier
        if failed_tier is None:
            return None
        target = other_tier(failed_tier)
        snap = replace(plan.snapshot, run=run, backends=backends)
        b, _ = place(snap, target, self.fallback_weights)
        if b is None or b.tier != target:
            return None
        d = Decision(tier=b.tier, backend=b.name, model=b.model, reason=f"fallback-{kind}", switched=True)
        plan.fallback_from = failed
        plan.decision = d
        plan.flapped = True
        apply_decision(run, d, plan.step)
        self._recharge(plan, run, b)
        plan.cache_start = self._reading(b.name) if b.tier == "local" and self.cache_lags else None
        return d

    def _recharge(self, plan: StepPlan, run: RunState, b: Any) -> None:
        """The step moved to ``b``: the first attempt's traffic charge is undone (it served nothing)
        and ``b`` is charged afresh."""
        if self.traffic is not None and plan.traffic_token is not None:
            self.traffic.step_finished(plan.traffic_token, None, 0, 0, 0, False)
            plan.traffic_token = self.traffic.step_started(
                b.name if b.tier == "local" else None,
                run.run_id,
                plan.request.prompt_tokens,
                plan.predictions.cache_reuse_tokens,
                plan.predictions,
            )

    # ------------------------------------------------------------------ 9: races, unserved starts
    def adopt(self, plan: StepPlan, run: RunState, winner: RunState) -> bool:
        """Another router stored this new run's first pin before us (set-if-absent refused ours):
        take ``winner``'s pin for this step. Returns True when this router's own admission slot
        must be given back (the winner's router holds the run's slot)."""
        give_back = run.admitted == "admit-local" and self.admission is not None
        if give_back:
            assert self.admission is not None
            self.admission.released(run.run_id)
        same = (winner.tier, winner.replica) == (run.tier, run.replica)
        for f in (
            "tier",
            "replica",
            "pinned_at_step",
            "switches",
            "last_switch_step",
            "admitted",
            "owner",
            "explore_post",
        ):
            setattr(run, f, getattr(winner, f))
        run.steps_seen = max(run.steps_seen, winner.steps_seen, plan.step + 1)
        plan.admission = winner.admitted
        if same or winner.replica is None:
            return give_back
        b = next((x for x in plan.snapshot.backends if x.name == winner.replica), None)
        if b is None:
            return give_back
        plan.decision = Decision(tier=b.tier, backend=b.name, model=b.model, reason="pin-race")
        self._recharge(plan, run, b)
        plan.cache_start = self._reading(b.name) if b.tier == "local" else None
        return give_back

    def unserved_start(self, plan: StepPlan, run: RunState) -> bool:
        """A run's first step ended without being served: give its admission back (the next step
        is a first step again). Returns True when the adapter must release a slot."""
        if plan.admission is None or run.admitted is None:
            return False
        holds = self.run_ended(run)
        run.admitted = None
        plan.admission = None
        return holds
