"""Training the benefit model (:class:`models.benefit.BenefitModel`): paired rows, heads, CV, the gate.

Algorithm (:func:`fit_benefit`):

1. **Rows** (:func:`benefit_rows`): every step of every run that has its own outcome *and* a strong
   outcome on the same task (``Run.strong_outcome``, written by the pairing,
   :func:`features.importers.pairing.label_domain_runs`): the step's feature vector (the training
   dataset's, i.e. the serving code path), the run's task embedding (``Run.task_embedding``, C1; None
   when absent), ``y_local`` = the run's own success, ``y_frontier`` = the strong outcome, the task
   (CV group) and the domain (:func:`run_domain`). Heads are fit on steps
   ``< train_steps`` with weight 1/(rows of the run), so every run counts once.
2. **Heads** (:func:`fit_heads`): for each arm a logistic regression (L2, ``C``) on the standardised
   inputs ``inputs`` = ``"struct"`` (the :data:`STRUCT_FEATURES` present in the feature spec),
   ``"embed"`` (PCA of the embedding to ``n_pca`` dims, fit on the training rows only) or ``"both"``.
3. **Evidence** (:func:`cross_validate`): task-grouped ``n_folds`` CV inside the domain (tasks dealt
   to folds by a seeded shuffle); out-of-fold predictions at the decision step ``eval_step``
   (the run-start decision by default) give the needs-frontier AUC of the benefit score
   ``p_frontier - p_local`` and its SE (bootstrap over tasks, ``n_boot``), Brier/ECE of each head,
   Qini coefficient / AUUC and AIQ (:mod:`training.uplift`).
4. **Gate**: a domain with ``>= min_runs`` labelled runs gets heads; its mode is ``"model"`` iff
   ``AUC - 0.5 > gate_z x SE`` (the prior ranks every run equally: AUC 0.5), else ``"prior"``; the
   reason names the figures. The final heads are fit on all the domain's rows.
5. **Prior**: per-domain base rates and the pooled rates (for a domain never seen).

Knobs (:class:`BenefitConfig`): ``min_runs``, ``gate_z``, ``inputs``, ``n_pca``, ``C``,
``n_folds``, ``n_boot``, ``train_steps``, ``eval_step``, ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from features.extract import FEATURE_NAMES
from models.benefit import BenefitModel, DomainBenefit, LogitHead
from training import uplift

__all__ = [
    "BenefitConfig",
    "BenefitRows",
    "STRUCT_FEATURES",
    "benefit_rows",
    "fit_heads",
    "cross_validate",
    "fit_benefit",
    "task_folds",
]

#: structural features that mean the same in every domain (no hashed tool buckets)
STRUCT_FEATURES = (
    "step_index",
    "ctx_tokens",
    "tokens_so_far",
    "n_tool_calls",
    "tool_errors",
    "repeated_tool_calls",
    "out_tokens_mean",
    "new_tool_results_n",
)


class BenefitConfig(BaseModel):
    """Knobs of the benefit model's training (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    min_runs: int = Field(default=30, ge=2, description="labelled runs a domain needs for its own heads")
    gate_z: float = Field(default=1.96, ge=0, description="a domain model is active iff AUC-0.5 > gate_z*SE")
    inputs: str = Field(default="embed", pattern="^(struct|embed|both)$", description="head inputs")
    n_pca: int = Field(default=16, ge=1, description="PCA dims of the task embedding")
    C: float = Field(default=0.1, gt=0, description="inverse L2 strength of the logistic heads")
    n_folds: int = Field(default=5, ge=2, description="task-grouped CV folds of the gate's evidence")
    n_boot: int = Field(default=200, ge=10, description="task-bootstrap resamples for SEs")
    train_steps: int = Field(default=1, ge=1, description="heads are fit on steps < train_steps")
    eval_step: int = Field(default=0, ge=0, description="the decision step the evidence is measured at")
    seed: int = 0


@dataclass
class BenefitRows:
    """Per-step paired rows: ``X`` features, ``E`` embeddings (None rows = NaN), labels, groups."""

    X: np.ndarray
    E: np.ndarray | None
    y_local: np.ndarray
    y_frontier: np.ndarray
    run_id: np.ndarray
    task: np.ndarray
    domain: np.ndarray
    step: np.ndarray
    #: the weak player (``agent/model``) of each row: comparisons across players are stratified by it
    player: np.ndarray | None = None

    def subset(self, m: np.ndarray) -> BenefitRows:
        return BenefitRows(
            self.X[m],
            None if self.E is None else self.E[m],
            self.y_local[m],
            self.y_frontier[m],
            self.run_id[m],
            self.task[m],
            self.domain[m],
            self.step[m],
            None if self.player is None else self.player[m],
        )

    def __len__(self) -> int:
        return len(self.y_local)

    @property
    def needs_frontier(self) -> np.ndarray:
        return ((self.y_local == 0) & (self.y_frontier == 1)).astype(np.float64)


def run_domain(task_id: Any, source: Any, domain: Any = None) -> str:
    """A run's domain: ``Run.domain`` when logged, else the ``task_id`` before ``/`` (tau2
    ``airline/3``), else its source."""
    if isinstance(domain, str) and domain:
        return domain
    if isinstance(task_id, str) and "/" in task_id:
        return task_id.split("/", 1)[0]
    return str(source)


def benefit_rows(runs: Any, X: np.ndarray, meta: Any, embed_dim: int = 384) -> BenefitRows | None:
    """Paired rows from a run frame and a per-step dataset (``X``, ``meta`` with run_id, step)."""
    import pandas as pd

    r = runs[(runs["record"] == "run")] if "record" in runs.columns else runs
    r = r.drop_duplicates("run_id", keep="last")
    r = r[r["outcome"].isin(["success", "failure"]) & r["strong_outcome"].isin(["success", "failure"])]
    if r.empty:
        return None
    r = r.assign(
        domain=r["domain"] if "domain" in r.columns else None,
        player=(r["agent"] if "agent" in r.columns else pd.Series("?", index=r.index)).fillna("?").astype(str)
        + "/"
        + (r["model"] if "model" in r.columns else pd.Series("?", index=r.index)).fillna("?").astype(str),
    )
    cols = ["run_id", "task_id", "source", "outcome", "strong_outcome", "domain", "player"]
    info = {str(row.run_id): row for row in r[cols].itertuples(index=False)}
    emb: dict[str, Any] = {}
    if "task_embedding" in r.columns:
        for rid, e in zip(r["run_id"].astype(str), r["task_embedding"], strict=True):
            if e is not None and len(e) == embed_dim:
                emb[rid] = np.asarray(e, dtype=np.float64)
    rid = meta["run_id"].astype(str).to_numpy()
    keep = np.array([x in info for x in rid], dtype=bool)
    if not keep.any():
        return None
    ids = rid[keep]
    rows = [info[x] for x in ids]
    E = None
    if emb:
        E = np.full((len(ids), embed_dim), np.nan)
        for i, x in enumerate(ids):
            if x in emb:
                E[i] = emb[x]
    return BenefitRows(
        X=np.asarray(X, dtype=np.float64)[keep],
        E=E,
        y_local=np.array([o.outcome == "success" for o in rows], dtype=np.float64),
        y_frontier=np.array([o.strong_outcome == "success" for o in rows], dtype=np.float64),
        run_id=ids.astype(object),
        task=np.array([str(o.task_id) for o in rows], dtype=object),
        domain=np.array([run_domain(o.task_id, o.source, o.domain) for o in rows], dtype=object),
        step=meta["step"].to_numpy()[keep],
        player=np.array([str(o.player) for o in rows], dtype=object),
    )


def has_inputs(rows: BenefitRows, inputs: str) -> bool:
    """Whether the head inputs exist on these rows (``embed`` needs task embeddings)."""
    if inputs in ("struct", "both"):
        return True
    return rows.E is not None and bool((~np.isnan(rows.E).any(axis=1)).any())


def _struct_idx() -> tuple[int, ...]:
    return tuple(FEATURE_NAMES.index(n) for n in STRUCT_FEATURES if n in FEATURE_NAMES)


def _fit_head(
    X: np.ndarray, E: np.ndarray | None, y: np.ndarray, w: np.ndarray, cfg: BenefitConfig, inputs: str
) -> LogitHead:
    from sklearn.linear_model import LogisticRegression

    idx = _struct_idx() if inputs in ("struct", "both") else ()
    comps = e_mean = None
    if inputs in ("embed", "both") and E is not None:
        ok = ~np.isnan(E).any(axis=1)
        if ok.sum() >= 2:
            e_mean = E[ok].mean(axis=0)
            Ec = E[ok] - e_mean
            # PCA by the eigenvectors of the d x d scatter matrix (d = 384: far cheaper than an SVD)
            vals, vecs = np.linalg.eigh(Ec.T @ Ec)
            k = min(cfg.n_pca, int(ok.sum()) - 1, E.shape[1])
            comps = np.ascontiguousarray(vecs[:, ::-1][:, :k].T)
    head = LogitHead(idx, np.zeros(0), 0.0, np.zeros(0), np.ones(0), comps, e_mean)
    k = len(idx) + (0 if comps is None else comps.shape[0])
    head.mean, head.scale = np.zeros(k), np.ones(k)
    Z = head.design(X, E)
    head.mean = Z.mean(axis=0)
    sd = Z.std(axis=0)
    head.scale = np.where(sd > 1e-12, sd, 1.0)
    Z = (Z - head.mean) / head.scale
    if len(np.unique(y)) < 2 or k == 0:
        rate = float(np.clip(np.average(y, weights=w), 1e-3, 1 - 1e-3))
        head.coef, head.intercept = np.zeros(k), float(np.log(rate / (1 - rate)))
        return head
    lr = LogisticRegression(C=cfg.C, max_iter=2000).fit(Z, y, sample_weight=w)
    head.coef, head.intercept = lr.coef_[0].astype(np.float64), float(lr.intercept_[0])
    return head


def _weights(rows: BenefitRows) -> np.ndarray:
    _, inv, counts = np.unique(rows.run_id.astype(str), return_inverse=True, return_counts=True)
    return 1.0 / counts[inv]


def fit_heads(
    rows: BenefitRows, cfg: BenefitConfig, inputs: str | None = None
) -> tuple[LogitHead, LogitHead]:
    """(local head, frontier head) on the rows' steps ``< train_steps``."""
    tr = rows.subset(rows.step < cfg.train_steps)
    w = _weights(tr)
    inp = inputs or cfg.inputs
    return (
        _fit_head(tr.X, tr.E, tr.y_local, w, cfg, inp),
        _fit_head(tr.X, tr.E, tr.y_frontier, w, cfg, inp),
    )


def task_folds(tasks: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold per row: the unique tasks shuffled (seeded) and dealt round-robin."""
    uniq, inv = np.unique(tasks.astype(str), return_inverse=True)
    perm = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = np.empty(len(uniq), dtype=np.int64)
    fold_of[perm] = np.arange(len(uniq)) % max(1, min(k, len(uniq)))
    return fold_of[inv]


def cross_validate(
    rows: BenefitRows, cfg: BenefitConfig, inputs: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold ``(p_local, p_frontier)`` for every row (task-grouped folds)."""
    fold = task_folds(rows.task, cfg.n_folds, cfg.seed)
    pl = np.full(len(rows), np.nan)
    pf = np.full(len(rows), np.nan)
    for f in np.unique(fold):
        te = fold == f
        hl, hf = fit_heads(rows.subset(~te), cfg, inputs)
        E = None if rows.E is None else rows.E[te]
        pl[te] = hl.predict(rows.X[te], E)
        pf[te] = hf.predict(rows.X[te], E)
    return pl, pf


def evidence(rows: BenefitRows, pl: np.ndarray, pf: np.ndarray, cfg: BenefitConfig) -> dict[str, Any]:
    """CV figures at the decision step: needs-frontier AUC of the benefit score with its task
    bootstrap SE, the heads' Brier / ECE / AUC, Qini / AUUC and AIQ (learned, random mix, failure
    ranking, oracle)."""
    at = rows.step == cfg.eval_step
    r = rows.subset(at)
    score = pf[at] - pl[at]
    nf = r.needs_frontier
    tau = r.y_frontier - r.y_local
    fail = 1.0 - pl[at]

    def se(fn: Any) -> float:
        return uplift.bootstrap_se(fn, r.task, cfg.n_boot, cfg.seed)

    auc = uplift.auc(nf, score)
    out: dict[str, Any] = {
        "n_runs": int(len(r)),
        "n_tasks": int(len(np.unique(r.task.astype(str)))),
        "needs_frontier_rate": float(nf.mean()) if len(r) else float("nan"),
        "auc": auc,
        "auc_se": se(lambda i: uplift.auc(nf[i], score[i])),
        "auc_failure_score": uplift.auc(nf, fail),
        "local": {
            "auc": uplift.auc(r.y_local, pl[at]),
            "brier": uplift.brier(r.y_local, pl[at]),
            "brier_base_rate": uplift.brier(r.y_local, np.full(len(r), r.y_local.mean())),
            "ece": uplift.ece(r.y_local, pl[at]),
        },
        "frontier": {
            "auc": uplift.auc(r.y_frontier, pf[at]),
            "brier": uplift.brier(r.y_frontier, pf[at]),
            "brier_base_rate": uplift.brier(r.y_frontier, np.full(len(r), r.y_frontier.mean())),
            "ece": uplift.ece(r.y_frontier, pf[at]),
        },
        "qini": uplift.qini_coefficient(score, tau),
        "qini_se": se(lambda i: uplift.qini_coefficient(score[i], tau[i])),
        "auuc": uplift.auuc(score, tau),
    }
    const = np.zeros(len(r))
    aiq = {
        "learned": (score, se(lambda i: uplift.aiq(score[i], r.y_local[i], r.y_frontier[i]))),
        "random_mix": (const, se(lambda i: uplift.aiq(const[i], r.y_local[i], r.y_frontier[i]))),
        "failure_threshold": (fail, se(lambda i: uplift.aiq(fail[i], r.y_local[i], r.y_frontier[i]))),
        "oracle": (tau, 0.0),
    }
    out["aiq"] = {k: {"aiq": uplift.aiq(s, r.y_local, r.y_frontier), "se": e} for k, (s, e) in aiq.items()}
    out["aiq_diff_vs_failure_threshold"] = {
        "diff": out["aiq"]["learned"]["aiq"] - out["aiq"]["failure_threshold"]["aiq"],
        "se": se(
            lambda i: (
                uplift.aiq(score[i], r.y_local[i], r.y_frontier[i])
                - uplift.aiq(fail[i], r.y_local[i], r.y_frontier[i])
            )
        ),
    }
    return out


def gate(ev: dict[str, Any], n_runs: int, cfg: BenefitConfig) -> tuple[str, str]:
    """``(mode, reason)`` of a domain from its CV evidence (module docstring, step 4)."""
    auc, se = ev.get("auc", float("nan")), ev.get("auc_se", float("nan"))
    if n_runs < cfg.min_runs:
        return "prior", f"{n_runs} labelled runs < min_runs {cfg.min_runs}: the prior"
    if not (np.isfinite(auc) and np.isfinite(se)):
        return "prior", "no CV evidence (one class at the decision step): the prior"
    if auc - 0.5 > cfg.gate_z * se:
        return "model", f"CV AUC {auc:.3f} +- {se:.3f} beats the prior's 0.5 by more than {cfg.gate_z} SE"
    return "prior", f"CV AUC {auc:.3f} +- {se:.3f} does not beat the prior's 0.5 by {cfg.gate_z} SE"


def fit_benefit(rows: BenefitRows, cfg: BenefitConfig) -> tuple[BenefitModel, dict[str, Any]]:
    """The gated model and the per-domain evidence (module docstring)."""
    first = rows.subset(rows.step == cfg.eval_step)
    model = BenefitModel(
        p_local=float(first.y_local.mean()),
        p_frontier=float(first.y_frontier.mean()),
        embed_dim=384 if rows.E is None else int(rows.E.shape[1]),
    )
    report: dict[str, Any] = {}
    for dom in sorted(set(rows.domain.tolist())):
        d_rows = rows.subset(rows.domain == dom)
        d_first = d_rows.subset(d_rows.step == cfg.eval_step)
        n = int(len(d_first))
        ev: dict[str, Any] = {}
        usable = has_inputs(d_first, cfg.inputs)
        if n >= cfg.min_runs and usable:
            pl, pf = cross_validate(d_rows, cfg)
            ev = evidence(d_rows, pl, pf, cfg)
        mode, reason = gate(ev, n, cfg)
        if not usable:
            mode, reason = (
                "prior",
                f"no {cfg.inputs} inputs on the domain's runs (no task embeddings): the prior",
            )
        heads = fit_heads(d_rows, cfg) if n >= cfg.min_runs and usable else (None, None)
        model.domains[dom] = DomainBenefit(
            domain=dom,
            mode=mode,
            reason=reason,
            p_local=float(d_first.y_local.mean()),
            p_frontier=float(d_first.y_frontier.mean()),
            n_runs=n,
            local=heads[0],
            frontier=heads[1],
            evidence={k: ev[k] for k in ("auc", "auc_se", "qini", "n_runs") if k in ev},
        )
        report[dom] = {"mode": mode, "reason": reason, "n_runs": n, **ev}
    return model, report
