"""Exploration with logged propensities: a wrapper that makes any policy a logging policy for
off-policy evaluation, without flapping.

Algorithm (:class:`ExplorePolicy`, one call per step; pure: state only through ``snapshot.run``):

1. **Exploring runs.** A run *explores* when ``u_run < rate`` (``u_run`` = a uniform draw from
   ``(seed, run_id)``, see :func:`draw`) and, at its first step, the step engine's exploration
   budget has room (``snapshot.explore_allowed``, :mod:`router.core.explore`). Any other run
   follows the base policy, step for step.
2. **The exploration schedule** ``q`` (what an exploring run does; the base policy is ignored):
   at its first step the frontier with probability ``start_frontier_share``, else the local tier;
   while on the local tier, at each step ``1 <= k <= max_step`` one escalation with probability
   ``escalate_hazard`` (draw ``u_k`` from ``(seed, run_id, k)``); once on the frontier it stays
   there. So an exploring run switches tier at most once (one randomised escalation point, no
   de-escalation): exploration adds no flapping.
3. **Propensities.** Whether a run explores is not visible in its actions, so the propensity of
   the action ``a`` taken at a step is its marginal probability given the run's decisions so far::

       mu(a) = (1 - post) * [base's tier == a] + post * q(a)
       post' = post * q(a) / mu(a)                        (Bayes: P(exploring | decisions so far))

   with ``post`` = ``rate`` at the first step (0 when the budget is closed) and
   :attr:`~router.policy.types.RunState.explore_post` afterwards (carried by
   ``Decision.explore_post``). The product of a run's propensities is the probability of its tier
   sequence under the logging policy, which is what importance sampling needs; a step where no
   other tier was possible has propensity 1.0. Options are compared as *placed* tiers (a wanted
   tier with no healthy backend falls back, :func:`router.policy.filters.place`), so a forced
   placement is deterministic.
4. ``Decision.explore`` is True for every decision of an exploring run; a decision that differs
   from the base's tier gets reason ``explore-start-local`` / ``explore-start-frontier`` /
   ``explore-escalate`` / ``explore-hold`` (stays on the frontier) / ``explore-stay`` (stays local).
   A client that names a concrete model (``requested-model``) is never explored. Every draw is a
   function of ``(seed, run_id, step)``, so the sidecar, the simulator and a replay make the same
   draws.

Knobs (:class:`ExploreConfig`, the ``explore`` block of any policy config; absent = off, the
production default): ``rate``, ``start_frontier_share``, ``escalate_hazard``, ``max_step``,
``budget_usd`` / ``budget_window_s`` (the cap on the frontier spend of exploring runs, kept by the
step engine), ``seed``.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from router.policy.filters import DEFAULT_WEIGHTS, make_decision, place
from router.policy.types import Decision, Policy, RunState, Snapshot, Tier

__all__ = ["ExploreConfig", "ExplorePolicy", "draw", "EXPLORE_REASONS"]

EXPLORE_REASONS = (
    "explore-start-local",
    "explore-start-frontier",
    "explore-escalate",
    "explore-hold",
    "explore-stay",
)


class ExploreConfig(BaseModel):
    """The ``explore`` block of a policy config (module docstring of router.policy.explore)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(default=0.1, ge=0.0, le=1.0, description="share of runs that explore")
    start_frontier_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="an exploring run starts on the frontier with this probability",
    )
    escalate_hazard: float = Field(
        default=0.2, ge=0.0, le=1.0, description="per-step escalation probability of a local exploring run"
    )
    max_step: int = Field(default=16, ge=0, description="last step at which an exploring run may escalate")
    budget_usd: float | None = Field(
        default=None, ge=0.0, description="frontier USD exploring runs may spend per window (None: no cap)"
    )
    budget_window_s: float = Field(default=3600.0, gt=0.0, description="the budget's window, seconds")
    seed: int = Field(default=0, description="seed of the per-run draws")


def draw(seed: int, run_id: str, tag: int | str) -> float:
    """A uniform draw in [0, 1) that depends only on ``(seed, run_id, tag)`` (blake2b, 64 bits)."""
    h = hashlib.blake2b(f"{seed}|{run_id}|{tag}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 18446744073709551616.0


class ExplorePolicy:
    """``base`` with exploration (module docstring); its name is the base's."""

    __slots__ = ("base", "cfg", "name", "weights")

    def __init__(self, base: Policy, cfg: ExploreConfig):
        self.base = base
        self.cfg = cfg
        self.name = base.name
        self.weights = getattr(base, "weights", DEFAULT_WEIGHTS)

    def q_frontier(self, run: RunState, step: int) -> float:
        """The exploration schedule's probability of the frontier at this step."""
        cfg = self.cfg
        if run.tier is None:
            return cfg.start_frontier_share
        if run.tier == "frontier":
            return 1.0
        return cfg.escalate_hazard if 1 <= step <= cfg.max_step else 0.0

    def _placed(self, snap: Snapshot, tier: Tier, reason: str) -> Decision:
        b, fb = place(snap, tier, self.weights)
        return make_decision(snap, b, fb or reason, None, tier)

    def decide(self, snapshot: Snapshot) -> Decision:
        snap = snapshot
        d = self.base.decide(snap)
        if d.reason == "requested-model":
            return d
        run, cfg = snap.run, self.cfg
        start = run.tier is None
        if start:
            post = cfg.rate if snap.explore_allowed else 0.0
        else:
            post = run.explore_post or 0.0
        if post <= 0.0:
            return replace(d, explore_post=0.0) if start else d
        k = snap.step_index
        qf = self.q_frontier(run, k)
        if start:
            why_f, why_l = "explore-start-frontier", "explore-start-local"
        elif run.tier == "local":
            why_f, why_l = "explore-escalate", "explore-stay"
        else:
            why_f, why_l = "explore-hold", "explore-stay"
        d_f = d if d.tier == "frontier" else (self._placed(snap, "frontier", why_f) if qf > 0.0 else None)
        d_l = d if d.tier == "local" else (self._placed(snap, "local", why_l) if qf < 1.0 else None)
        q = {"local": 0.0, "frontier": 0.0}
        if d_f is not None:
            q[d_f.tier] += qf
        if d_l is not None:
            q[d_l.tier] += 1.0 - qf
        exploring = draw(cfg.seed, run.run_id, "run") < cfg.rate
        taken = d
        if exploring:
            pick = d_f if d_f is not None and (d_l is None or draw(cfg.seed, run.run_id, k) < qf) else d_l
            assert pick is not None
            taken = pick
        a = taken.tier
        mu = (1.0 - post) * (1.0 if d.tier == a else 0.0) + post * q[a]
        return replace(
            taken,
            propensity=min(1.0, mu),
            explore=exploring,
            explore_post=post * q[a] / mu if mu > 0 else 0.0,
        )
