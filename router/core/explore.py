"""The exploration budget: a cap on the frontier spend of exploring runs, across runs.

Algorithm (:class:`ExploreBudget`, a leaky bucket on the engine's clock): every step served on
the frontier by an exploring run (``Decision.explore``) adds its price (:func:`router.core.accounting.backend_step_usd`
at the serving backend's token prices) to ``level``; ``level`` drains at
``budget_usd / window_s`` USD per second of the clock the engine is given (``now`` of plan and
finish; a log without timestamps never drains). While ``level >= budget_usd`` the budget is
closed: a new run cannot start exploring (``Snapshot.explore_allowed`` is False at its first step;
its propensities then say it could not have explored). Runs already exploring go on, so spend may
overshoot the cap by what they spend after it closed.

The step engine keeps one budget per policy name (it survives bundle reloads); each router
process has its own, so N sidecar replicas spend up to N caps. Knobs: ``budget_usd`` and
``window_s`` (from :class:`router.policy.explore.ExploreConfig`).
"""

from __future__ import annotations

from router.core.accounting import backend_step_usd

__all__ = ["ExploreBudget", "step_price_usd"]


step_price_usd = backend_step_usd  # USD of one step on a backend (router.core.accounting)


class ExploreBudget:
    """See the module docstring."""

    __slots__ = ("budget_usd", "window_s", "level", "spent_usd", "closed_starts", "_t")

    def __init__(self, budget_usd: float, window_s: float):
        if budget_usd < 0 or window_s <= 0:
            raise ValueError("budget_usd must be >= 0 and window_s > 0")
        self.budget_usd = float(budget_usd)
        self.window_s = float(window_s)
        self.level = 0.0
        self.spent_usd = 0.0  # all exploring frontier spend so far
        self.closed_starts = 0  # run starts that found the budget closed
        self._t: float | None = None

    def _drain(self, now: float | None) -> None:
        if now is None:
            return
        if self._t is not None and now > self._t:
            self.level = max(0.0, self.level - (now - self._t) * self.budget_usd / self.window_s)
        if self._t is None or now > self._t:
            self._t = now

    def open(self, now: float | None) -> bool:
        """May a run starting now explore?"""
        self._drain(now)
        ok = self.level < self.budget_usd
        if not ok:
            self.closed_starts += 1
        return ok

    def charge(self, usd: float, now: float | None) -> None:
        self._drain(now)
        self.level += usd
        self.spent_usd += usd
