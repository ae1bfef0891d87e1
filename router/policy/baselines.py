"""Baseline policies: the same ``decide(snapshot) -> Decision`` interface as the learned policy.

Every comparison (replay, simulator, live shadow) runs the same code path, so these differ from the
learned policy only in the tier rule and the replica affinity:

- ``always-local`` (:class:`AlwaysLocalPolicy`): every step to the least-loaded healthy local
  replica, chosen afresh each step (a plain load balancer: load terms only, no run affinity, ties
  broken per step) unless ``sticky``. Reason ``always-local``.
- ``prefix-aware`` (:class:`PrefixAwarePolicy`): local only, every step placed afresh by the
  prefix-cost pick (:func:`router.policy.filters.prefix_cost_pick`: prefill the replica would still
  compute after the prefix the prefix index says it holds, plus load, with the bounded-imbalance
  rule); a run stays where its cache is unless load says otherwise. Reason ``prefix-aware``.
- ``always-frontier`` (:class:`AlwaysFrontierPolicy`): every step to the frontier. Reason
  ``always-frontier``.
- ``per-step-threshold`` (:class:`PerStepThresholdPolicy`, RouteLLM-like): each step independently,
  frontier iff ``p_frontier >= threshold`` (no hysteresis, no dwell); the local replica keeps the
  run's pin. Reasons ``threshold-frontier`` / ``threshold-local``.
- ``session-sticky`` (:class:`SessionStickyPolicy`, production-stack-like): local only; the replica
  is a consistent (rendezvous) hash of the run id over the healthy replicas, ignoring load, kept
  while healthy. Never escalates. Reason ``sticky``.
- ``stall-escalation`` (:class:`StallEscalationPolicy`, LiteLLM-like fallback): one tier up (to
  the frontier) while the newest tool call repeats an earlier identical call or the newest tool
  result is an error; back to the local pin otherwise. Reasons ``stall-escalate`` / ``stall-local``.
- ``oracle`` (:class:`OraclePolicy`, evaluation only): reads ``snapshot.label_needs_frontier`` and
  puts a needs-frontier run on the frontier from its first step. Reasons ``oracle-frontier``,
  ``oracle-local``, ``oracle-unknown`` (no label: local).

All of them honour ``requested_model`` (``requested-model``) and the placement fallbacks of
:func:`router.policy.filters.place` (``failover``, ``no-healthy-local``, ``no-healthy-frontier``,
``context-too-long``, ``no-healthy-backend``). Knobs: ``scoring`` weights for every policy;
``sticky`` (always-local); ``threshold`` (per-step-threshold; default the bundle's
``p_frontier_up``).
"""

from __future__ import annotations

from router.policy.filters import DEFAULT_WEIGHTS, ScoreWeights, make_decision, place, place_requested
from router.policy.types import Decision, Snapshot, Tier

__all__ = [
    "AlwaysLocalPolicy",
    "PrefixAwarePolicy",
    "AlwaysFrontierPolicy",
    "PerStepThresholdPolicy",
    "SessionStickyPolicy",
    "StallEscalationPolicy",
    "OraclePolicy",
]

_NO_LOAD = ScoreWeights(warm=0.0, queue=0.0, running=0.0, kv=0.0)
_LOAD_ONLY = ScoreWeights(warm=0.0)
# = config.PrefixAwareConfig's scoring
_PREFIX_COST = ScoreWeights(load_tokens=512.0, kv_tokens=2000.0, min_gain_tokens=1024.0)


class _Fixed:
    """Shared body: requested model first, then the subclass's tier rule, then placement.

    ``keeps_local_pin``: the tier rule reads no backend and placement keeps the pin, so a run pinned
    to a local replica that passes the filter (healthy, context fits) and names no model is placed
    on that replica or on a frontier backend, whatever the other local replicas' states: an adapter
    may give such a step only that replica and the frontier backends (the simulator does)."""

    __slots__ = ("name", "weights")

    def __init__(self, weights: ScoreWeights = DEFAULT_WEIGHTS, name: str = ""):
        self.weights = weights
        self.name = name

    @property
    def keeps_local_pin(self) -> bool:
        return True

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        raise NotImplementedError

    def _place(self, snap: Snapshot, tier: Tier, reason: str, scores: dict[str, float] | None) -> Decision:
        backend, fallback = place(snap, tier, self.weights)
        return make_decision(snap, backend, fallback or reason, scores, tier)

    def decide(self, snapshot: Snapshot) -> Decision:
        if snapshot.requested_model is not None:
            b = place_requested(snapshot, self.weights)
            if b is not None:
                return make_decision(snapshot, b, "requested-model")
        tier, reason, scores = self._tier(snapshot)
        return self._place(snapshot, tier, reason, scores)


class AlwaysLocalPolicy(_Fixed):
    __slots__ = ("sticky",)

    def __init__(self, weights: ScoreWeights = _LOAD_ONLY, sticky: bool = False, name: str = "always-local"):
        super().__init__(weights, name)
        self.sticky = sticky

    @property
    def keeps_local_pin(self) -> bool:
        return self.sticky

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        return "local", "always-local", None

    def _place(self, snap: Snapshot, tier: Tier, reason: str, scores: dict[str, float] | None) -> Decision:
        salt = "" if self.sticky else f"#{snap.step_index}"
        backend, fallback = place(snap, tier, self.weights, sticky=self.sticky, salt=salt)
        if fallback == "failover" and not self.sticky:
            fallback = None  # no affinity: a moved replica is the normal case, not a failover
        return make_decision(snap, backend, fallback or reason, scores, tier)


class PrefixAwarePolicy(AlwaysLocalPolicy):
    __slots__ = ()

    def __init__(self, weights: ScoreWeights = _PREFIX_COST, name: str = "prefix-aware"):
        if weights.load_tokens <= 0:
            raise ValueError("prefix-aware: weights.load_tokens must be > 0 (prefix-cost mode)")
        super().__init__(weights, sticky=False, name=name)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        return "local", "prefix-aware", None


class AlwaysFrontierPolicy(_Fixed):
    __slots__ = ()

    def __init__(self, weights: ScoreWeights = DEFAULT_WEIGHTS, name: str = "always-frontier"):
        super().__init__(weights, name)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        return "frontier", "always-frontier", None


class PerStepThresholdPolicy(_Fixed):
    __slots__ = ("threshold",)

    def __init__(
        self, threshold: float, weights: ScoreWeights = DEFAULT_WEIGHTS, name: str = "per-step-threshold"
    ):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"per-step-threshold: threshold must be in [0, 1] (got {threshold})")
        super().__init__(weights, name)
        self.threshold = float(threshold)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        p = snap.predictions.p_frontier
        scores = {"p_frontier": p, "threshold": self.threshold}
        if p >= self.threshold:
            return "frontier", "threshold-frontier", scores
        return "local", "threshold-local", scores


class SessionStickyPolicy(_Fixed):
    __slots__ = ()

    def __init__(self, weights: ScoreWeights = _NO_LOAD, name: str = "session-sticky"):
        super().__init__(weights, name)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        return "local", "sticky", None


class StallEscalationPolicy(_Fixed):
    __slots__ = ()

    def __init__(self, weights: ScoreWeights = DEFAULT_WEIGHTS, name: str = "stall-escalation"):
        super().__init__(weights, name)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        if snap.last_tool_repeated or snap.last_tool_errored:
            return "frontier", "stall-escalate", None
        return "local", "stall-local", None


class OraclePolicy(_Fixed):
    __slots__ = ()

    def __init__(self, weights: ScoreWeights = DEFAULT_WEIGHTS, name: str = "oracle"):
        super().__init__(weights, name)

    def _tier(self, snap: Snapshot) -> tuple[Tier, str, dict[str, float] | None]:
        label = snap.label_needs_frontier
        if label is None:
            return "local", "oracle-unknown", None
        return ("frontier", "oracle-frontier", None) if label else ("local", "oracle-local", None)
