"""The frontier budget's online state in the step engine (one per router process, across runs).

Algorithm (:class:`BudgetTracker`): the policy stays pure; the engine keeps, per policy name, a
:class:`router.policy.budget.BudgetQuantile` and, per run in flight, its running max score, its
domain and whether any step was served on the frontier:

- **plan** (:meth:`BudgetTracker.threshold`): a policy with a ``frontier_budget`` gets
  ``Snapshot.budget_threshold`` = the quantile state's threshold for the run's domain (``unit =
  runs``) before it decides;
- **finish** (:meth:`BudgetTracker.step`): steps of runs admission spilled or shed (reason
  ``admission-*``) are left out (spills are reported apart from the policy's escalations, and a
  spilled run never enters the window); the step's escalation score (``Decision.scores
  ["p_frontier"]``: the score the policy compared, trouble term included) raises the run's running
  max (tie-broken per run, :func:`router.policy.budget.tie_break`); a frontier step marks the run
  escalated (a ``fallback-*`` step does not: the local backend failed, the policy did not choose).
  With ``unit = steps`` each step's score and tier enter the window at once;
- **run end** (:meth:`BudgetTracker.ended`, from ``StepEngine.run_ended``): the run's final running
  max and escalated flag enter its domain's window.

Runs whose end never arrives are forgotten oldest-first beyond ``max_runs`` (they never enter the
window). Each router process keeps its own windows (as it keeps its exploration budget): N sidecar
replicas each hold their share of the traffic to the budget. Knob: ``max_runs``.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from router.policy.budget import BudgetQuantile, FrontierBudget, tie_break

__all__ = ["BudgetTracker"]


class BudgetTracker:
    """See the module docstring."""

    __slots__ = ("max_runs", "states", "_runs")

    def __init__(self, max_runs: int = 100_000):
        self.max_runs = max_runs
        self.states: dict[str, BudgetQuantile] = {}  # policy name -> its quantile state
        # run id -> [policy name, domain, running max, escalated]
        self._runs: OrderedDict[str, list[object]] = OrderedDict()

    def state(self, name: str, cfg: FrontierBudget) -> BudgetQuantile:
        st = self.states.get(name)
        if st is None or st.cfg != cfg:  # new, or a reload changed the budget: start afresh
            st = self.states[name] = BudgetQuantile(cfg)
        return st

    def threshold(self, name: str, cfg: FrontierBudget, domain: str | None) -> float | None:
        return self.state(name, cfg).threshold(domain)

    def step(
        self,
        name: str,
        cfg: FrontierBudget,
        run_id: str,
        domain: str | None,
        score: float | None,
        tier: str | None,
        reason: str = "",
    ) -> None:
        if reason.startswith("admission-"):  # spilled or shed by admission: not the policy's to spend
            self._runs.pop(run_id, None)
            return
        s = -math.inf if score is None or score != score else tie_break(float(score), run_id)
        # a fallback to the frontier (the local backend failed) is not an escalation the budget paid
        frontier = tier == "frontier" and not reason.startswith("fallback-")
        if cfg.unit == "steps":
            if tier is not None:
                self.state(name, cfg).observe(domain, s if s > -math.inf else math.nan, frontier)
            return
        rec = self._runs.get(run_id)
        if rec is None:
            rec = self._runs[run_id] = [name, domain, -math.inf, False]
            if len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        rec[2] = max(float(rec[2]), s)  # type: ignore[arg-type]
        rec[3] = bool(rec[3]) or frontier

    def ended(self, run_id: str) -> None:
        rec = self._runs.pop(run_id, None)
        if rec is None:
            return
        name, domain, mx, esc = rec
        st = self.states.get(str(name))
        if st is None:
            return
        m = float(mx)  # type: ignore[arg-type]
        st.observe(None if domain is None else str(domain), m if m > -math.inf else math.nan, bool(esc))

    def realised_share(self, name: str, domain: str | None) -> float | None:
        st = self.states.get(name)
        return None if st is None else st.realised_share(domain)
