"""Leave-one-domain-out test of the frontier budget: does the realised share land on the budget on a
domain the model never saw, and what does that share buy against baselines held to the same share?

Algorithm of :func:`lodo_budget`:

1. **Rows**: per-step features of every run of the paired log (:func:`training.dataset.build_dataset`,
   the serving code path); the outcome records (:func:`training.eval.outcome.records_from_frames`:
   each weak run's own outcome, the strong player's expected success over its trials on the task).
2. **Per held-out domain** (the part of ``task_id`` before ``/``): the escalation model (LightGBM,
   ``n_estimators`` trees, on the ``needs_frontier`` labels of the *other* domains' weak runs only)
   scores every step of the held-out domain. The bundle's calibration scores (the prior's warm start
   of :class:`router.policy.budget.BudgetQuantile`) are the training runs' maximum scores.
3. **Budgeted policy**: the held-out domain's weak runs arrive in a seeded random order; each run's
   steps are scored in turn and the run escalates at the first step whose running max exceeds the
   current threshold (:class:`router.policy.budget.BudgetQuantile`, ``unit = runs``); when the run
   ends its final running max enters the window. Realised share = escalated runs / runs.
4. **Baselines held to the same share** ``s`` (the realised one): *per-step-threshold* (a step goes to
   the frontier iff its score >= ``t``, no stickiness), ``t`` chosen on the held-out runs so that the
   share of runs with any frontier step is closest to ``s`` (this gives the baseline hindsight the
   budgeted policy does not have); *random mixing* (each run escalated at its first step with
   probability ``s``: expected success ``s * strong + (1 - s) * weak`` per run).
5. **Scores** (:mod:`training.eval.outcome`, base variant escalate-anytime): success per run, cost
   per run; success means with task-bootstrap intervals, paired differences (budgeted - baseline)
   with their task-bootstrap standard error; *pass* = budgeted - best baseline >= -1 SE.

Knobs: ``share`` (the budget), ``window`` / ``min_window`` (of the budget), ``n_estimators``,
``seed`` (arrival order, bootstrap), ``prices``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router.policy.budget import BudgetQuantile, FrontierBudget, tie_break
from training.eval.outcome import (
    FRONTIER,
    LOCAL,
    Prices,
    RunRecord,
    records_from_frames,
    run_costs,
    run_success,
)
from training.eval.trials import Interval, bootstrap_mean_ci, paired_diff_ci

__all__ = [
    "DomainBudgetResult",
    "DomainScores",
    "POLICIES",
    "domain_scores",
    "evaluate_budget",
    "lodo_budget",
    "budget_run",
    "threshold_for_share",
]


@dataclass
class DomainBudgetResult:
    domain: str
    runs: int
    tasks: int
    budget: float
    realised_share: float
    success: dict[str, Interval]  # policy -> success interval
    cost_per_run: dict[str, float]
    cost_ci: dict[str, Interval]  # policy -> cost per run (USD) interval
    diff_vs: dict[str, Interval]  # baseline -> paired difference (budgeted - baseline)
    per_step_threshold: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best_baseline(self) -> str:
        return max(self.diff_vs, key=lambda b: self.success[b].mean)

    @property
    def passes(self) -> bool:
        d = self.diff_vs[self.best_baseline]
        return d.mean >= -d.se


def budget_run(scores: np.ndarray, bq: BudgetQuantile, domain: str, run_id: str) -> int | None:
    """The escalation step of one run under the budget (None: stays local); observes its final max.

    Scores are tie-broken per run (:func:`router.policy.budget.tie_break`)."""
    run_max = -np.inf
    k: int | None = None
    for j, s in enumerate(scores.tolist()):
        run_max = max(run_max, tie_break(s, run_id))
        thr = bq.threshold(domain)
        if k is None and run_max > (math.inf if thr is None else thr):
            k = j
    bq.observe(domain, float(run_max), k is not None)
    return k


def threshold_for_share(run_max: np.ndarray, share: float) -> float:
    """The step threshold ``t`` (escalate at score >= t) whose share of runs with a max >= t is closest
    to ``share`` (candidates: the distinct run maxima, and +inf)."""
    cands = np.unique(run_max)
    best_t, best_gap = np.inf, share
    for t in cands:
        gap = abs(float((run_max >= t).mean()) - share)
        if gap < best_gap - 1e-12:
            best_t, best_gap = float(t), gap
    return best_t


def _tiers_from(k: int | None, n: int) -> np.ndarray:
    t = np.full(n, LOCAL, dtype=np.int64)
    if k is not None:
        t[k:] = FRONTIER
    return t


@dataclass
class DomainScores:
    """One held-out domain: its scored weak runs (the escalation model never saw the domain)."""

    domain: str
    records: list[RunRecord]
    step_scores: dict[str, list[float]]  # run -> the model's score per step
    prior: np.ndarray  # the training runs' maximum scores (the budget's warm start)
    train_rows: int


def domain_scores(log: Any, *, n_estimators: int = 80, seed: int = 0) -> list[DomainScores]:
    """Steps 1-2 of the module docstring: per domain, a model trained on the other domains scores it."""
    from lightgbm import LGBMClassifier

    from training.dataset import build_dataset

    ds = build_dataset(log)
    records = records_from_frames(log.runs, log.steps)
    runs = log.runs
    dom_of = {
        str(r): str(t).split("/", 1)[0]
        for r, t in zip(runs["run_id"], runs["task_id"], strict=True)
        if isinstance(t, str) and "/" in t
    }
    meta = ds.meta
    rids = meta["run_id"].astype(str).to_numpy()
    row_dom = np.array([dom_of.get(r, "") for r in rids], dtype=object)
    y = meta["y_frontier"].to_numpy(dtype=float)
    X = ds.escalation_X()
    out: list[DomainScores] = []
    for dom in sorted(set(dom_of.values())):
        train = (row_dom != dom) & (row_dom != "") & ~np.isnan(y)
        clf = LGBMClassifier(
            n_estimators=n_estimators,
            learning_rate=0.05,
            num_leaves=15,
            min_child_samples=20,
            random_state=seed,
            verbose=-1,
        )
        clf.fit(X[train], y[train])
        prior = np.maximum.reduceat(np.asarray(clf.predict_proba(X[train]))[:, 1], _starts(rids[train]))
        held = row_dom == dom
        p = np.asarray(clf.predict_proba(X[held]))[:, 1]
        step_scores: dict[str, list[float]] = {}
        for r, sc in zip(rids[held].tolist(), p.tolist(), strict=True):
            step_scores.setdefault(r, []).append(sc)
        recs = [records[r] for r in step_scores if r in records and records[r].quality_known]
        out.append(DomainScores(dom, recs, step_scores, prior, int(train.sum())))
    return out


POLICIES = ("budgeted", "per-step-threshold", "random-mixing", "always-local", "always-frontier")


def evaluate_budget(
    d: DomainScores,
    share: float,
    *,
    window: int = 200,
    min_window: int = 10,
    seed: int = 0,
    prices: Prices | None = None,
) -> DomainBudgetResult:
    """Steps 3-5 of the module docstring on one scored domain at budget ``share``."""
    pr = prices or Prices()
    recs = d.records
    n = len(recs)
    order = np.random.default_rng(seed).permutation(n)
    bq = BudgetQuantile(FrontierBudget(share=share, window=window, min_window=min_window), d.prior)
    succ = {k: np.zeros(n) for k in POLICIES}
    cost = {k: np.zeros(n) for k in POLICIES}
    esc = np.zeros(n, dtype=bool)
    for i in order.tolist():
        rec = recs[i]
        k = budget_run(np.asarray(d.step_scores[rec.run_id]), bq, d.domain, rec.run_id)
        esc[i] = k is not None
        t = _tiers_from(k, rec.n_steps)
        succ["budgeted"][i] = run_success(rec, t) or 0.0
        cost["budgeted"][i] = run_costs(rec, t, pr)[0]
    s_real = float(esc.mean()) if n else 0.0
    run_max = np.array([tie_break(max(d.step_scores[r.run_id]), r.run_id) for r in recs])
    t_ps = threshold_for_share(run_max, s_real)
    for i, rec in enumerate(recs):
        sc = np.asarray([tie_break(x, rec.run_id) for x in d.step_scores[rec.run_id]])
        tps = np.where(sc >= t_ps, FRONTIER, LOCAL).astype(np.int64)
        succ["per-step-threshold"][i] = run_success(rec, tps) or 0.0
        cost["per-step-threshold"][i] = run_costs(rec, tps, pr)[0]
        loc, fr = _tiers_from(None, rec.n_steps), _tiers_from(0, rec.n_steps)
        sl, sf = run_success(rec, loc) or 0.0, run_success(rec, fr) or 0.0
        cl, cf = run_costs(rec, loc, pr)[0], run_costs(rec, fr, pr)[0]
        succ["always-local"][i], succ["always-frontier"][i] = sl, sf
        cost["always-local"][i], cost["always-frontier"][i] = cl, cf
        succ["random-mixing"][i] = s_real * sf + (1 - s_real) * sl
        cost["random-mixing"][i] = s_real * cf + (1 - s_real) * cl
    tasks = [r.task_id or r.run_id for r in recs]
    return DomainBudgetResult(
        domain=d.domain,
        runs=n,
        tasks=len(set(tasks)),
        budget=share,
        realised_share=s_real,
        success={k: _ci(v, tasks, seed) for k, v in succ.items()},
        cost_per_run={k: float(v.mean()) if n else 0.0 for k, v in cost.items()},
        cost_ci={k: _ci(v, tasks, seed) for k, v in cost.items()},
        diff_vs={
            b: _diff(succ["budgeted"], succ[b], tasks, seed) for b in ("per-step-threshold", "random-mixing")
        },
        per_step_threshold=t_ps,
        extra={
            "per_step_share": float((run_max >= t_ps).mean()) if n else 0.0,
            "final_threshold": bq.threshold(d.domain),
            "train_rows": d.train_rows,
        },
    )


def lodo_budget(
    log: Any,
    *,
    share: float = 0.2,
    window: int = 200,
    min_window: int = 10,
    n_estimators: int = 80,
    seed: int = 0,
    prices: Prices | None = None,
) -> list[DomainBudgetResult]:
    """One :class:`DomainBudgetResult` per domain of ``log`` (the module docstring)."""
    return [
        evaluate_budget(d, share, window=window, min_window=min_window, seed=seed, prices=prices)
        for d in domain_scores(log, n_estimators=n_estimators, seed=seed)
    ]


def _starts(rids: np.ndarray) -> np.ndarray:
    """Indices where a new run starts in a run-sorted id array (for ``np.maximum.reduceat``)."""
    if len(rids) == 0:
        return np.array([], dtype=np.int64)
    change = np.flatnonzero(rids[1:] != rids[:-1]) + 1
    return np.concatenate([[0], change]).astype(np.int64)


def _ci(v: np.ndarray, tasks: list[str], seed: int) -> Interval:
    ci = bootstrap_mean_ci(v, tasks, seed=seed)
    return ci if ci is not None else Interval(float("nan"), float("nan"), float("nan"), 0.0, 0)


def _diff(a: np.ndarray, b: np.ndarray, tasks: list[str], seed: int) -> Interval:
    ci = paired_diff_ci(a, b, tasks, seed=seed)
    return ci if ci is not None else Interval(float("nan"), float("nan"), float("nan"), 0.0, 0)
