"""A frontier budget the user sets: the escalation threshold is an online conformal quantile.

Models only *order* runs; the budget decides how many escalate. The threshold that spends a budget
``b`` (share of runs, or of steps) is a quantile of the policy's own score on the domain's recent
traffic, re-estimated as traffic arrives:

- **Score.** ``unit = "runs"``: a run's score is the running maximum of the policy's escalation score
  over its steps so far (a run is escalated once, when its running max first exceeds the threshold);
  the window holds the *final* running max of each finished run. ``unit = "steps"``: each step's own
  score; the window holds the recent steps' scores.
- **Finite-sample rule (conformal rank).** With ``n`` scores ``s_(1) <= ... <= s_(n)`` in the
  window and a target level ``q``, the threshold is ``tau = s_(k)`` and a unit escalates iff its
  score ``> tau``. If the next unit's score is exchangeable with the window's and there are no ties,
  ``P(score > tau) = (n + 1 - k) / (n + 1)`` exactly. ``rule = "nearest"`` (default) takes ``k`` =
  the integer nearest ``(n + 1)(1 - q)``, so ``|P - q| <= 1 / (2 (n + 1))``: the share lands on the
  budget from both sides; ``rule = "cap"`` takes ``k = ceil((n + 1)(1 - q))``, so ``P`` lies in
  ``[q - 1/(n+1), q]``: never above the budget. ``k > n`` gives ``tau = +inf`` (nothing escalates),
  ``k < 1`` gives ``tau = -inf`` (everything does).
- **Catch-up.** Warm-start periods, drift and the rounding above leave the realised share off the
  budget; the level is corrected by the deficit over the domain's last ``window`` units:
  ``q = clip(b + (b * m - e) / catch_up, 0, 1)`` (``m`` units seen, ``e`` of them escalated), so an
  under-spent domain escalates a little more until its share is back on ``b`` (``catch_up = 0``:
  off, ``q = b``).
- **Ties.** Calibrated scores bunch on a few values (a tree model out of its domain often gives one
  value to most runs), and ``score > tau`` then escalates none or all of a tie. Every score is
  broken by a run-stable jitter (:func:`tie_break`: ``score + 1e-9 * u``, ``u`` in ``[0, 1)`` from the
  crc32 of the run id), so tied runs are ordered by an arbitrary but fixed key and the rule holds.
- **Sliding window per domain** (``scope = "domain"``): the last ``window`` scores of the domain;
  ``scope = "global"``: one window for all traffic.
- **Warm start.** A domain with fewer than ``min_window`` scores of its own uses, in this order, the
  global window (all traffic, when it has ``min_window`` scores), else the ``prior`` scores given at
  construction (e.g. training runs' final running max), else no threshold at all: the policy keeps
  its own calibrated thresholds (the bundle's, chosen at training for a target share) until the
  first ``min_window`` runs have ended. A domain with no model of its own is ordered by the
  prior's score under the same budget: the rule does not care which model scored.

The state (:class:`BudgetQuantile`) is plain data mutated only by :meth:`BudgetQuantile.observe`,
called by whoever tracks runs (the simulator, the replay, the sidecar's run tracker) when a unit
finishes; the policy reads :meth:`BudgetQuantile.threshold` and stays a pure function of it.

Knobs (:class:`FrontierBudget`, ``policy.frontier_budget``): ``share`` (the budget ``b``), ``unit``
(``runs`` or ``steps``), ``scope`` (``domain`` or ``global``), ``window`` (scores kept per scope),
``min_window`` (own scores before a domain's window is trusted), ``rule`` (``nearest`` or ``cap``),
``catch_up`` (units over which a deficit is repaid; 0 = off).
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections import deque
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FrontierBudget", "BudgetQuantile", "conformal_threshold", "tie_break", "budget_of"]

GLOBAL = "*"


class FrontierBudget(BaseModel):
    """The user's frontier budget (the module docstring states the rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(gt=0, lt=1, description="share of units (runs or steps) sent to the frontier")
    unit: Literal["runs", "steps"] = Field(
        default="runs", description="what the share counts: runs escalated at any step, or steps"
    )
    scope: Literal["domain", "global"] = Field(
        default="domain", description="one threshold per domain, or one for all traffic"
    )
    window: int = Field(default=200, ge=10, description="recent scores kept per scope (sliding window)")
    min_window: int = Field(
        default=10, ge=1, description="own scores a domain needs before its window sets its threshold"
    )
    rule: Literal["nearest", "cap"] = Field(
        default="nearest",
        description="conformal rank: nearest (share within 1/(2(n+1)) of the level) or cap (never above)",
    )
    catch_up: float = Field(
        default=20.0, ge=0, description="units over which a share deficit is repaid (0: off)"
    )


def budget_of(policy: object) -> FrontierBudget | None:
    """The ``frontier_budget`` of a policy, looking through wrappers (``base``: exploration)."""
    for _ in range(4):
        fb = getattr(policy, "frontier_budget", None)
        if isinstance(fb, FrontierBudget):
            return fb
        policy = getattr(policy, "base", None)
        if policy is None:
            return None
    return None


def tie_break(score: float, key: str) -> float:
    """``score`` plus a run-stable jitter below any calibrated difference (the module docstring)."""
    return score + 1e-9 * (zlib.crc32(key.encode()) / 4294967296.0)


def conformal_threshold(sorted_scores: list[float], share: float, rule: str = "nearest") -> float:
    """``s_(k)`` of ascending ``sorted_scores`` at level ``share`` (the module docstring's rank rule)."""
    n = len(sorted_scores)
    r = (n + 1) * (1.0 - share)
    k = math.ceil(r - 1e-12) if rule == "cap" else math.floor(r + 0.5)
    if n == 0 or k > n:
        return math.inf
    if k < 1:
        return -math.inf
    return sorted_scores[k - 1]


class _Window:
    __slots__ = ("fifo", "ordered", "size", "escalated", "n_escalated")

    def __init__(self, size: int):
        self.size = size
        self.fifo: deque[float] = deque()
        self.ordered: list[float] = []
        self.escalated: deque[bool] = deque()
        self.n_escalated = 0

    def add(self, s: float, escalated: bool) -> None:
        self.fifo.append(s)
        if s == s:  # a NaN score (no prediction) counts toward the share only
            bisect.insort(self.ordered, s)
        self.escalated.append(escalated)
        self.n_escalated += escalated
        if len(self.fifo) > self.size:
            old = self.fifo.popleft()
            if old == old:
                del self.ordered[bisect.bisect_left(self.ordered, old)]
            self.n_escalated -= self.escalated.popleft()

    def __len__(self) -> int:
        return len(self.fifo)


class BudgetQuantile:
    """Per-scope sliding windows of scores and the conformal threshold that spends the budget."""

    __slots__ = ("cfg", "_windows", "_prior")

    def __init__(self, cfg: FrontierBudget, prior: Iterable[float] = ()):
        self.cfg = cfg
        self._windows: dict[str, _Window] = {}
        self._prior = sorted(float(x) for x in prior if x == x)

    def _key(self, domain: str | None) -> str:
        return GLOBAL if self.cfg.scope == "global" or domain is None else domain

    def observe(self, domain: str | None, score: float, escalated: bool) -> None:
        """A finished unit: its score (a run's final running max, or a step's score) and whether it
        went to the frontier. A NaN score (no prediction) counts toward the share, not the window."""
        for key in {self._key(domain), GLOBAL}:
            w = self._windows.get(key)
            if w is None:
                w = self._windows[key] = _Window(self.cfg.window)
            w.add(float(score) if score == score else math.nan, bool(escalated))

    def level(self, domain: str | None) -> float:
        """The quantile level after catch-up: ``clip(b + (b m - e) / catch_up, 0, 1)``."""
        b = self.cfg.share
        w = self._windows.get(self._key(domain))
        if w is None or not len(w) or self.cfg.catch_up <= 0:
            return b
        q = b + (b * len(w) - w.n_escalated) / self.cfg.catch_up
        return 0.0 if q < 0.0 else (1.0 if q > 1.0 else q)

    def threshold(self, domain: str | None) -> float | None:
        """The current threshold of ``domain`` (escalate iff score > threshold); None while there is
        no evidence at all (no window, no prior scores): the policy then keeps its own calibrated
        thresholds (the bundle's, chosen at training for ``target_frontier_share``)."""
        q, rule = self.level(domain), self.cfg.rule
        own = self._windows.get(self._key(domain))
        if own is not None and len(own.ordered) >= self.cfg.min_window:
            return conformal_threshold(own.ordered, q, rule)
        pooled = self._windows.get(GLOBAL)
        if pooled is not None and len(pooled.ordered) >= self.cfg.min_window:
            return conformal_threshold(pooled.ordered, q, rule)
        if not self._prior:
            return None
        return conformal_threshold(self._prior, q, rule)

    def realised_share(self, domain: str | None) -> float | None:
        """Escalated units / units over the domain's window (None before any)."""
        w = self._windows.get(self._key(domain))
        return None if w is None or not len(w) else w.n_escalated / len(w)

    def n_scores(self, domain: str | None) -> int:
        w = self._windows.get(self._key(domain))
        return 0 if w is None else len(w)
