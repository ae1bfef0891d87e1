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
   with their task-bootstrap standard error; *pass* = budgeted - best baseline >= -1 SE. **AIQ** of
   each policy's single operating point (:func:`point_aiq`, the closed form of
   :func:`training.eval.curves.aiq` for one point and the always-local anchor, cost normalised
   between always-local and always-frontier) with paired task-bootstrap differences (budgeted -
   baseline; anchors, success and cost recomputed in every resample): *aiq_passes* = AIQ difference
   to the best baseline by AIQ >= -1 SE.
6. **The domain's own evidence** (``evidence``, :class:`DomainEvidence`; off by default): the model
   of the other domains does not transfer its ordering to every domain (on the shipped pairs it
   ranks telecom backwards), but every run that stays local reports the weak model's outcome when it
   ends. Prequentially (only runs that ended before a run arrives inform its decision): once
   ``min_labelled`` local runs have ended, and again every ``refit_every`` more, the rankers are
   compared on the domain's own ended local runs by the AUC of their run score against the weak
   run's *failure* (the label the deployment observes; the benefit's other half, the strong side,
   is not observed on local runs): the *prior* (the other domains' model, never trained on these
   runs), a *domain* model (the same LightGBM on the domain's labelled runs, its AUC cross-fitted
   over ``folds`` task-grouped folds) and *none* (no ordering: AUC 0.5, runs in their tie-break
   order, i.e. random mixing under the budget). The prior stays unless another ranker's AUC beats
   the prior's by more than the task-bootstrap SE of the paired difference (``n_boot`` resamples);
   of those that do, the highest AUC wins (the architecture's rule: a domain's model is active
   only when its evidence beats the prior by more than its uncertainty). The domain model scores
   every run by *one* fold model that never saw it: a labelled run by its own fold's (its
   cross-fitted score), any other run by a run-stable draw (crc32 of its id) among the fold models;
   so the window's scores and those of the runs still to come are exchangeable and the conformal
   rank keeps the share (a full refit would score its own training runs apart from new ones). On
   a switch or a refit the budget's window is rebuilt from the ended runs' scores under the new
   ranker (escalated flags kept, so the catch-up still counts the spend). The per-step-threshold baseline
   keeps the prior's scores (the bundle's P, what that policy reads).
   **6b. Expected benefit** (``rescue_n0 > 0``): the weak run's failure is half of the benefit; the
   other half, whether the strong tier rescues it, is seen on every escalated run when it ends.
   The ranker's step score ``p`` is multiplied by a rescue factor ``Q``: a Beta posterior mean whose
   prior mean is the training domains' rescue rate (the strong tier's mean success on their weak
   runs that failed, :attr:`DomainScores.rescue_rate`) with weight ``rescue_n0``, plus the strong
   outcomes ``s_j`` of the domain's ended escalated runs weighted by a kernel ``w_j``:
   ``Q = (n0 m0 + sum w_j s_j) / (n0 + sum w_j)``. The kernel's space (``rescue_space``): *score*,
   ``w_j = exp(-|u - u_j| / h)`` with ``u`` the step score's rank among the ended runs' max scores
   and ``u_j`` the rank of the running max at which run ``j`` escalated (the prior's top may be
   the tasks nobody solves); *embedding*, ``w_j = exp((cos(e, e_j) - 1) / h)`` over the task
   embeddings (tasks like ones the strong tier failed). A run's own outcome never weighs its own
   ``Q``; after each escalated run ends the window is rebuilt under the new scores (spend kept).
   ``target = "no-known-loss"`` widens the rankers' label to the ended escalated runs (1 where the
   strong tier succeeded, 0 where it failed: escalating that run is known to have bought nothing),
   each read on the steps it ran locally.
7. **Knob choice inside the training domains** (:func:`select_evidence`): each candidate
   :class:`DomainEvidence` (and ``None``) is run with each *training* domain arriving and the prior
   trained on the other training domains only; the candidate with the highest mean budgeted
   success over those inner domains and ``seeds`` arrival orders is the one used on the held-out
   domain. The held-out domain informs no choice.

Knobs: ``share`` (the budget), ``window`` / ``min_window`` (of the budget), ``n_estimators``,
``seed`` (arrival order, bootstrap), ``prices``, ``evidence`` (:class:`DomainEvidence`:
``min_labelled``, ``refit_every``, ``folds``, ``n_estimators``, ``n_boot``, ``rescue_n0``,
``rescue_space``, ``rescue_h``, ``target``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
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
from training.eval.trials import N_BOOT, Interval, bootstrap_mean_ci, paired_diff_ci

__all__ = [
    "DomainBudgetResult",
    "DomainEvidence",
    "DomainScores",
    "PairedRows",
    "POLICIES",
    "domain_scores",
    "evaluate_budget",
    "inner_scores",
    "lodo_budget",
    "budget_run",
    "aiq_intervals",
    "point_aiq",
    "select_evidence",
    "threshold_for_share",
]


@dataclass(frozen=True)
class DomainEvidence:
    """Knobs of the domain's own evidence (module docstring, step 6)."""

    min_labelled: int = 20  # ended local runs before the rankers are first compared
    refit_every: int = 20  # more ended local runs between comparisons
    folds: int = 3  # task-grouped folds of the domain model's cross-fitted AUC
    n_estimators: int = 60  # trees of the domain model
    n_boot: int = 200  # task-bootstrap resamples of the AUC differences
    # step 6b: rank by expected benefit P(weak fails) x Q, Q the strong tier's success near the run
    # (Beta prior: the training domains' rescue rate with weight rescue_n0; 0 = off)
    rescue_n0: float = 0.0
    # the kernel's space: "score" (the step score's rank among the ended runs' max scores, kernel
    # exp(-|u - u_j| / h)) or "embedding" (the task embeddings' cosine, kernel exp((cos - 1) / h))
    rescue_space: str = "score"
    rescue_h: float = 0.1  # the kernel's bandwidth
    # the rankers' label: "weak-failure" (ended local runs) or "no-known-loss" (also ended escalated
    # runs, 0 where the strong tier failed: escalation is known not to have helped)
    target: str = "weak-failure"

    def label(self) -> str:
        out = f"evidence(min {self.min_labelled}, every {self.refit_every}"
        if self.rescue_n0 > 0:
            out += f", benefit/{self.rescue_space} n0 {self.rescue_n0:g}"
        if self.target != "weak-failure":
            out += f", {self.target}"
        return out + ")"


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
    aiq: dict[str, Interval] = field(default_factory=dict)  # policy -> AIQ of its operating point
    aiq_diff_vs: dict[str, Interval] = field(default_factory=dict)  # baseline -> budgeted - baseline
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best_baseline(self) -> str:
        return max(self.diff_vs, key=lambda b: self.success[b].mean)

    @property
    def passes(self) -> bool:
        d = self.diff_vs[self.best_baseline]
        return d.mean >= -d.se

    @property
    def best_aiq_baseline(self) -> str:
        return max(self.aiq_diff_vs, key=lambda b: self.aiq[b].mean)

    @property
    def aiq_passes(self) -> bool:
        d = self.aiq_diff_vs[self.best_aiq_baseline]
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


def point_aiq(cost: Any, success: Any, c_local: Any, q_local: Any, c_frontier: Any) -> Any:
    """AIQ of one operating point (cost, success) with the always-local anchor: the closed form of
    :func:`training.eval.curves.aiq` for a single point (elementwise over arrays; NaN when
    ``c_frontier <= c_local``). With ``x = (cost - c_local) / (c_frontier - c_local)``: ``q_local`` if
    the point is no better than always-local, its success if ``x <= 0``, else the area under the line
    from the anchor to the point, flat after it (cut at ``x = 1``)."""
    c, q = np.asarray(cost, dtype=float), np.asarray(success, dtype=float)
    cl, ql, cf = (
        np.asarray(c_local, dtype=float),
        np.asarray(q_local, dtype=float),
        np.asarray(c_frontier, dtype=float),
    )
    span = cf - cl
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (c - cl) / span
        inside = x * (ql + q) / 2 + (1 - x) * q
        beyond = ql + (q - ql) / (2 * x)
    out = np.where(x <= 0, q, np.where(x >= 1, beyond, inside))
    out = np.where(q <= ql, ql, out)
    return np.where(span > 0, out, np.nan)


def _tiers_from(k: int | None, n: int) -> np.ndarray:
    t = np.full(n, LOCAL, dtype=np.int64)
    if k is not None:
        t[k:] = FRONTIER
    return t


@dataclass
class PairedRows:
    """The paired log's step rows once (features, labels, run, domain) and its outcome records."""

    X: np.ndarray
    y: np.ndarray  # needs_frontier per step row (NaN: unlabelled)
    rids: np.ndarray
    row_dom: np.ndarray
    records: dict[str, RunRecord]
    embed: dict[str, np.ndarray] = field(default_factory=dict)  # run -> unit task embedding

    @classmethod
    def of(cls, log: Any) -> PairedRows:
        from training.dataset import build_dataset

        ds = build_dataset(log)
        runs = log.runs
        dom_of = {
            str(r): str(t).split("/", 1)[0]
            for r, t in zip(runs["run_id"], runs["task_id"], strict=True)
            if isinstance(t, str) and "/" in t
        }
        rids = ds.meta["run_id"].astype(str).to_numpy()
        return cls(
            X=ds.escalation_X(),
            y=ds.meta["y_frontier"].to_numpy(dtype=float),
            rids=rids,
            row_dom=np.array([dom_of.get(r, "") for r in rids], dtype=object),
            records=records_from_frames(log.runs, log.steps),
            embed=_unit_embeddings(runs),
        )

    @property
    def domains(self) -> list[str]:
        return sorted({str(d) for d in self.row_dom if d})


@dataclass
class DomainScores:
    """One held-out domain: its scored weak runs (the escalation model never saw the domain)."""

    domain: str
    records: list[RunRecord]
    step_scores: dict[str, list[float]]  # run -> the model's score per step
    prior: np.ndarray  # the training runs' maximum scores (the budget's warm start)
    train_rows: int
    step_X: dict[str, np.ndarray] = field(default_factory=dict)  # run -> its step feature rows
    train_domains: tuple[str, ...] = ()
    embed: dict[str, np.ndarray] = field(default_factory=dict)  # run -> unit task embedding
    # the training domains' rescue rate: the strong tier's mean success on their weak runs that
    # failed (the Beta prior's mean of step 6b; NaN: unknown)
    rescue_rate: float = math.nan


def _lgbm(n_estimators: int, seed: int) -> Any:
    from lightgbm import LGBMClassifier

    return LGBMClassifier(
        n_estimators=n_estimators,
        learning_rate=0.05,
        num_leaves=15,
        min_child_samples=20,
        random_state=seed,
        n_jobs=1,  # tiny fits: threads only contend (60 ms per tree with the default on 2 busy cores)
        verbose=-1,
    )


def _score_domain(
    rows: PairedRows, dom: str, train_doms: Sequence[str], n_estimators: int, seed: int
) -> DomainScores:
    y = rows.y
    train = np.isin(rows.row_dom, list(train_doms)) & ~np.isnan(y)
    clf = _lgbm(n_estimators, seed).fit(rows.X[train], y[train])
    rid_tr = rows.rids[train]
    prior = np.maximum.reduceat(np.asarray(clf.predict_proba(rows.X[train]))[:, 1], _starts(rid_tr))
    held = rows.row_dom == dom
    p = np.asarray(clf.predict_proba(rows.X[held]))[:, 1]
    step_scores: dict[str, list[float]] = {}
    step_rows: dict[str, list[int]] = {}
    for j, (r, sc) in enumerate(zip(rows.rids[held].tolist(), p.tolist(), strict=True)):
        step_scores.setdefault(r, []).append(sc)
        step_rows.setdefault(r, []).append(j)
    Xh = rows.X[held]
    recs = [rows.records[r] for r in step_scores if r in rows.records and rows.records[r].quality_known]
    step_X = {r.run_id: Xh[step_rows[r.run_id]] for r in recs}
    emb = {r.run_id: rows.embed[r.run_id] for r in recs if r.run_id in rows.embed}
    return DomainScores(
        dom,
        recs,
        step_scores,
        prior,
        int(train.sum()),
        step_X,
        tuple(train_doms),
        emb,
        _rescue_rate(rows, train_doms),
    )


def _rescue_rate(rows: PairedRows, train_doms: Sequence[str]) -> float:
    """Mean strong expected success over the weak runs of ``train_doms`` that failed (never a run of
    another domain: the held-out domain's outcomes do not enter)."""
    dom_of = {str(r): str(d) for r, d in zip(rows.rids, rows.row_dom, strict=True)}
    vals = [
        float(r.strong_expected)
        for rid, r in rows.records.items()
        if dom_of.get(rid) in train_doms
        and r.quality_known
        and not r.weak_success
        and r.strong_expected is not None
    ]
    return float(np.mean(vals)) if vals else math.nan


def _unit_embeddings(runs: Any) -> dict[str, np.ndarray]:
    """Run -> its task embedding scaled to unit length (runs without one are left out)."""
    if "task_embedding" not in runs:
        return {}
    out: dict[str, np.ndarray] = {}
    for rid, e in zip(runs["run_id"], runs["task_embedding"], strict=True):
        if e is None or isinstance(e, float) or len(e) == 0:
            continue
        v = np.asarray(e, dtype=float)
        n = float(np.linalg.norm(v))
        if n > 0:
            out[str(rid)] = v / n
    return out


def domain_scores(log: Any, *, n_estimators: int = 80, seed: int = 0) -> list[DomainScores]:
    """Steps 1-2 of the module docstring: per domain, a model trained on the other domains scores it.
    ``log``: a run log, or its :class:`PairedRows`."""
    rows = log if isinstance(log, PairedRows) else PairedRows.of(log)
    doms = rows.domains
    return [_score_domain(rows, d, [o for o in doms if o != d], n_estimators, seed) for d in doms]


def inner_scores(rows: PairedRows, held: str, *, n_estimators: int = 80, seed: int = 0) -> list[DomainScores]:
    """Step 7: each *training* domain of ``held`` scored by a model of the other training domains
    (``held`` never enters)."""
    doms = [d for d in rows.domains if d != held]
    return [
        _score_domain(rows, d, [o for o in doms if o != d], n_estimators, seed) for d in doms if len(doms) > 1
    ]


POLICIES = ("budgeted", "per-step-threshold", "random-mixing", "always-local", "always-frontier")


class _Rankers:
    """Step 6 of the module docstring: which ranker orders the domain's runs, from its ended runs."""

    def __init__(self, d: DomainScores, ev: DomainEvidence, seed: int):
        self.d, self.ev, self.seed = d, ev, seed
        self.choice = "prior"
        self.base: dict[str, list[float]] = d.step_scores  # the chosen ranker's step scores
        self.scores: dict[str, list[float]] = d.step_scores  # base x rescue factor (step 6b)
        self.history: list[tuple[int, str, float, float]] = []  # (labelled, choice, prior AUC, domain AUC)
        self._last = 0
        self._ids = list(d.step_X)
        self._X = np.vstack([d.step_X[r] for r in self._ids]) if self._ids else np.zeros((0, 0))
        self._ptr = np.concatenate([[0], np.cumsum([len(d.step_X[r]) for r in self._ids])]).astype(np.int64)
        # step 6b: ended runs; ended escalated runs (id, escalation step, strong outcome observed)
        self._ended: list[str] = []
        self._rescued: list[tuple[str, int, float]] = []
        m0 = d.rescue_rate
        self._m0 = 1.0 if math.isnan(m0) else m0
        self._emb_ids = [r for r in d.step_scores if r in d.embed]
        self._E = np.vstack([d.embed[r] for r in self._emb_ids]) if self._emb_ids else np.zeros((0, 0))
        self._row = {r: i for i, r in enumerate(self._emb_ids)}

    @property
    def benefit(self) -> bool:
        return self.ev.rescue_n0 > 0

    def due(self, n_labelled: int) -> bool:
        ev = self.ev
        return n_labelled >= ev.min_labelled and (
            self._last == 0 or n_labelled - self._last >= ev.refit_every
        )

    def observe_end(self, rec: RunRecord, k: int | None) -> bool:
        """A run ended (escalated at step ``k``, or None); an escalated run reports the strong tier's
        outcome, which updates the rescue factor (step 6b). True when the scores changed."""
        self._ended.append(rec.run_id)
        if not self.benefit or k is None or rec.strong_success is None:
            return False
        if self.ev.rescue_space == "embedding" and rec.run_id not in self._row:
            return False
        self._rescued.append((rec.run_id, k, 1.0 if rec.strong_success else 0.0))
        self._rescale()
        return True

    def _rescale(self) -> None:
        """``scores`` = ``base`` x the rescue factor Q (step 6b): a Beta posterior mean, prior mean the
        training domains' rescue rate with weight ``rescue_n0``, plus the strong outcomes of the
        ended escalated runs weighted by a kernel; a run's own outcome never weighs its own Q."""
        if not self._rescued:
            self.scores = self.base
            return
        ids = [r for r, _, _ in self._rescued]
        s = np.array([v for _, _, v in self._rescued])
        n0, m0, h = self.ev.rescue_n0, self._m0, self.ev.rescue_h
        if self.ev.rescue_space == "embedding":  # per run: cosine of the task embeddings
            cos = self._E @ self._E[[self._row[r] for r in ids]].T  # runs x escalated runs
            w = np.exp((cos - 1.0) / h)
            for j, r in enumerate(ids):
                w[self._row[r], j] = 0.0
            q = (n0 * m0 + w @ s) / (n0 + w.sum(axis=1))
            qr = dict(zip(self._emb_ids, q.tolist(), strict=True))
            self.scores = {r: [x * qr.get(r, m0) for x in v] for r, v in self.base.items()}
            return
        # per step: the score's rank among the ended runs' max scores (scale-free), against the
        # rank of the running max at which each escalated run was sent
        ref = np.sort([max(self.base[r]) for r in self._ended])
        esc_u = np.searchsorted(ref, [max(self.base[r][: k + 1]) for r, k, _ in self._rescued]) / len(ref)
        own = {r: j for j, r in enumerate(ids)}
        out: dict[str, list[float]] = {}
        for r, v in self.base.items():
            x = np.asarray(v, dtype=float)
            u = np.searchsorted(ref, x) / len(ref)
            w = np.exp(-np.abs(u[:, None] - esc_u[None, :]) / h)
            if r in own:
                w[:, own[r]] = 0.0
            out[r] = (x * (n0 * m0 + w @ s) / (n0 + w.sum(axis=1))).tolist()
        self.scores = out

    def update(self, labelled: list[tuple[RunRecord, int | None]], n_labelled: int) -> bool:
        """Compare the rankers on ``labelled`` (ended runs, with their escalation step; ``n_labelled``
        of them carry a label for ``target``); True when the scores changed. ``target =
        "weak-failure"`` reads the local runs only."""
        from sklearn.model_selection import GroupKFold

        self._last = n_labelled
        runs, y, used = [], [], []
        for rec, k in labelled:
            if k is None:
                runs.append(rec)
                y.append(0.0 if rec.weak_success else 1.0)
                used.append(rec.n_steps)
            elif self.ev.target == "no-known-loss" and rec.strong_success is not None:
                runs.append(rec)  # the steps seen on the local tier, up to the escalation
                y.append(1.0 if rec.strong_success else 0.0)
                used.append(k + 1)
        ya = np.array(y)
        tasks = np.array([r.task_id or r.run_id for r in runs], dtype=object)
        if len(ya) == 0 or ya.min() == ya.max() or len(set(tasks.tolist())) < self.ev.folds:
            return False
        prior = np.array([max(self.d.step_scores[r.run_id][:u]) for r, u in zip(runs, used, strict=True)])
        preds: list[np.ndarray] = []  # per fold model: its P on every step row of the domain
        fold_of: dict[str, int] = {}
        for tr, te in GroupKFold(self.ev.folds).split(prior, ya, tasks):
            if ya[tr].min() == ya[tr].max():
                return False
            m = self._fit([(runs[i], used[i]) for i in tr], ya[tr])
            fold_of.update({runs[i].run_id: len(preds) for i in te})
            preds.append(np.asarray(m.predict_proba(self._X))[:, 1])
        # every run is scored by ONE fold model it was not trained on: a labelled run by its own
        # fold's, any other by a run-stable draw; so the window's scores and those of the runs still
        # to come are exchangeable (a full refit would score its own training runs apart)
        dom_scores = {
            r: preds[fold_of.get(r, zlib.crc32(r.encode()) % len(preds))][
                self._ptr[i] : self._ptr[i + 1]
            ].tolist()
            for i, r in enumerate(self._ids)
        }
        oof = np.array([max(dom_scores[r.run_id][:u]) for r, u in zip(runs, used, strict=True)])
        cand = {"prior": prior, "none": np.full(len(ya), 0.5), "domain": oof}
        auc = _boot_auc(cand, ya, tasks, self.ev.n_boot, self.seed)
        ref = auc["prior"]
        better = [
            k for k in cand if k != "prior" and auc[k][0] - ref[0] > float(np.std(auc[k][1] - ref[1], ddof=1))
        ]
        new = max(better, key=lambda k: auc[k][0]) if better else "prior"
        self.history.append((n_labelled, new, ref[0], auc["domain"][0]))
        changed = new != self.choice or new == "domain"
        self.choice = new
        if new == "prior":
            self.base = self.d.step_scores
        elif new == "none":
            self.base = {r: [0.5] * len(v) for r, v in self.d.step_scores.items()}
        else:
            self.base = dom_scores
        self._rescale()
        return changed

    def _fit(self, runs: list[tuple[RunRecord, int]], y: np.ndarray) -> Any:
        Xs = [self.d.step_X[r.run_id][:u] for r, u in runs]
        ys = np.concatenate([np.full(len(x), v) for x, v in zip(Xs, y, strict=True)])
        return _lgbm(self.ev.n_estimators, self.seed).fit(np.vstack(Xs), ys)


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    from scipy.stats import rankdata

    pos = y == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return math.nan
    r = rankdata(s)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _boot_auc(
    cand: dict[str, np.ndarray], y: np.ndarray, tasks: np.ndarray, n_boot: int, seed: int
) -> dict[str, tuple[float, np.ndarray]]:
    """Each ranker's AUC and its task-bootstrap replicates (the same resamples for every ranker)."""
    uniq, inv = np.unique(tasks.astype(str), return_inverse=True)
    members = [np.flatnonzero(inv == t) for t in range(len(uniq))]
    rng = np.random.default_rng(seed)
    draws = [
        np.concatenate([members[t] for t in rng.integers(0, len(uniq), len(uniq))]) for _ in range(n_boot)
    ]
    out = {}
    for k, s in cand.items():
        reps = np.array([_auc(y[i], s[i]) for i in draws])
        out[k] = (_auc(y, s), np.where(np.isnan(reps), 0.5, reps))
    return out


def evaluate_budget(
    d: DomainScores,
    share: float,
    *,
    window: int = 200,
    min_window: int = 10,
    seed: int = 0,
    prices: Prices | None = None,
    evidence: DomainEvidence | None = None,
    n_boot: int = N_BOOT,
) -> DomainBudgetResult:
    """Steps 3-6 of the module docstring on one scored domain at budget ``share``."""
    pr = prices or Prices()
    recs = d.records
    n = len(recs)
    order = np.random.default_rng(seed).permutation(n)
    cfg = FrontierBudget(share=share, window=window, min_window=min_window)
    bq = BudgetQuantile(cfg, d.prior)
    succ = {k: np.zeros(n) for k in POLICIES}
    cost = {k: np.zeros(n) for k in POLICIES}
    esc = np.zeros(n, dtype=bool)
    steps: list[int | None] = [None] * n
    rankers = _Rankers(d, evidence, seed) if evidence is not None else None
    ended: list[int] = []
    labelled: list[tuple[RunRecord, int | None]] = []  # ended runs whose outcome the router saw
    n_local = 0
    for i in order.tolist():
        rec = recs[i]
        scores = d.step_scores if rankers is None else rankers.scores
        k = budget_run(np.asarray(scores[rec.run_id]), bq, d.domain, rec.run_id)
        esc[i], steps[i] = k is not None, k
        t = _tiers_from(k, rec.n_steps)
        succ["budgeted"][i] = run_success(rec, t) or 0.0
        cost["budgeted"][i] = run_costs(rec, t, pr)[0]
        ended.append(i)
        if rankers is None:
            continue
        # the run ends: a local run reports the weak model's outcome, an escalated one the strong's
        labelled.append((rec, k))
        n_local += k is None
        changed = rankers.observe_end(rec, k)
        n_lab = n_local if rankers.ev.target == "weak-failure" else len(labelled)
        if rankers.due(n_lab):
            changed = rankers.update(labelled, n_lab) or changed
        if changed:
            bq = BudgetQuantile(cfg, d.prior)  # the window under the new scores, spend kept
            for j in ended:
                r = recs[j]
                bq.observe(d.domain, tie_break(max(rankers.scores[r.run_id]), r.run_id), bool(esc[j]))
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
    baselines = ("per-step-threshold", "random-mixing")
    aiq, aiq_diff = aiq_intervals(succ, cost, tasks, baselines, n_boot, seed)
    return DomainBudgetResult(
        domain=d.domain,
        runs=n,
        tasks=len(set(tasks)),
        budget=share,
        realised_share=s_real,
        success={k: _ci(v, tasks, seed, n_boot) for k, v in succ.items()},
        cost_per_run={k: float(v.mean()) if n else 0.0 for k, v in cost.items()},
        cost_ci={k: _ci(v, tasks, seed, n_boot) for k, v in cost.items()},
        diff_vs={b: _diff(succ["budgeted"], succ[b], tasks, seed, n_boot) for b in baselines},
        per_step_threshold=t_ps,
        aiq=aiq,
        aiq_diff_vs=aiq_diff,
        extra={
            "per_step_share": float((run_max >= t_ps).mean()) if n else 0.0,
            "final_threshold": bq.threshold(d.domain),
            "train_rows": d.train_rows,
            "ranker": None if rankers is None else rankers.choice,
            "ranker_history": [] if rankers is None else rankers.history,
            "evidence": None if evidence is None else evidence.label(),
            # arrival order and each run's escalation step (None: stayed local)
            "decisions": [(recs[i].run_id, steps[i]) for i in order.tolist()],
        },
    )


def select_evidence(
    rows: PairedRows,
    held: str,
    share: float,
    candidates: Sequence[DomainEvidence | None],
    *,
    seeds: int = 2,
    n_estimators: int = 80,
) -> tuple[DomainEvidence | None, dict[str, float]]:
    """Step 7: the candidate with the highest mean budgeted success over the training domains of
    ``held`` (each arriving, the prior trained on the others) and ``seeds`` arrival orders; returns
    it and every candidate's inner figure (``held`` informs nothing)."""
    inner = inner_scores(rows, held, n_estimators=n_estimators)
    figs: dict[str, float] = {}
    best: tuple[float, DomainEvidence | None] | None = None
    for c in candidates:
        v = (
            float(
                np.mean(
                    [
                        np.mean(
                            [
                                evaluate_budget(d, share, seed=s, evidence=c, n_boot=50)
                                .success["budgeted"]
                                .mean
                                for s in range(seeds)
                            ]
                        )
                        for d in inner
                    ]
                )
            )
            if inner
            else math.nan
        )
        figs["prior only" if c is None else c.label()] = v
        if best is None or v > best[0] + 1e-12:
            best = (v, c)
    return (None if best is None else best[1]), figs


def lodo_budget(
    log: Any,
    *,
    share: float = 0.2,
    window: int = 200,
    min_window: int = 10,
    n_estimators: int = 80,
    seed: int = 0,
    prices: Prices | None = None,
    evidence: DomainEvidence | None = None,
) -> list[DomainBudgetResult]:
    """One :class:`DomainBudgetResult` per domain of ``log`` (the module docstring)."""
    return [
        evaluate_budget(
            d, share, window=window, min_window=min_window, seed=seed, prices=prices, evidence=evidence
        )
        for d in domain_scores(log, n_estimators=n_estimators, seed=seed)
    ]


def _starts(rids: np.ndarray) -> np.ndarray:
    """Indices where a new run starts in a run-sorted id array (for ``np.maximum.reduceat``)."""
    if len(rids) == 0:
        return np.array([], dtype=np.int64)
    change = np.flatnonzero(rids[1:] != rids[:-1]) + 1
    return np.concatenate([[0], change]).astype(np.int64)


def _ci(v: np.ndarray, tasks: list[str], seed: int, n_boot: int = N_BOOT) -> Interval:
    ci = bootstrap_mean_ci(v, tasks, seed=seed, n_boot=n_boot)
    return ci if ci is not None else Interval(float("nan"), float("nan"), float("nan"), 0.0, 0)


def _diff(a: np.ndarray, b: np.ndarray, tasks: list[str], seed: int, n_boot: int = N_BOOT) -> Interval:
    ci = paired_diff_ci(a, b, tasks, seed=seed, n_boot=n_boot)
    return ci if ci is not None else Interval(float("nan"), float("nan"), float("nan"), 0.0, 0)


def aiq_intervals(
    succ: dict[str, np.ndarray],
    cost: dict[str, np.ndarray],
    tasks: list[str],
    baselines: Sequence[str],
    n_boot: int,
    seed: int,
    ref: str = "budgeted",
) -> tuple[dict[str, Interval], dict[str, Interval]]:
    """Step 5's AIQ of every policy (per-run ``succ`` / ``cost``, incl. ``always-local`` and
    ``always-frontier``, the anchors) and ``ref`` - each of ``baselines``, over ``n_boot`` task
    resamples (95% percentile intervals, SE = the replicates' std; the mean is the sample's own)."""
    if not tasks:
        return {}, {}
    _, inv = np.unique(np.asarray(tasks, dtype=object).astype(str), return_inverse=True)
    t = int(inv.max()) + 1
    counts = np.bincount(inv, minlength=t).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(t, np.full(t, 1.0 / t), size=n_boot).astype(float)
    w = np.vstack([np.ones(t), draws])  # row 0: the sample itself
    den = w @ counts

    def means(v: np.ndarray) -> np.ndarray:
        return (w @ np.bincount(inv, weights=v, minlength=t)) / den

    ms = {k: means(v) for k, v in succ.items()}
    mc = {k: means(v) for k, v in cost.items()}
    a = {
        k: point_aiq(mc[k], ms[k], mc["always-local"], ms["always-local"], mc["always-frontier"])
        for k in succ
    }

    def interval(x: np.ndarray) -> Interval:
        reps = x[1:][~np.isnan(x[1:])]
        if len(reps) < 2:
            return Interval(float(x[0]), float(x[0]), float(x[0]), 0.0, t)
        lo, hi = np.percentile(reps, [2.5, 97.5])
        return Interval(float(x[0]), float(lo), float(hi), float(np.std(reps, ddof=1)), t)

    return {k: interval(v) for k, v in a.items()}, {b: interval(a[ref] - a[b]) for b in baselines}
