"""Model evaluation against baselines on grouped folds (never split by row).

Algorithm: one fold assignment per CV group (task, else run): groups are shuffled, ordered by their
mean escalation label (unknown = -1) and dealt round-robin to the folds, so each fold sees both
classes (a fast stratified group k-fold). For every fold, the learned
model and each baseline are fit on the other folds and predict this one; the out-of-fold (OOF)
predictions are scored once, overall and at chosen step indices.

Baselines (same folds, same rows):
- escalation: ``constant`` (training prevalence); ``logreg_steps`` (logistic regression on the step
  index); ``stall`` (logistic regression on a stall score = tool errors + error streak + repeated
  identical tool calls + last call repeated, the LiteLLM-style "escalate when stuck" signal).
- cache reuse (MAE in tokens): ``zero``; ``constant`` (training median); ``hit_share`` (training
  mean of cached/prompt times this prompt).
- remaining steps (pinball loss at p50/p90): ``constant`` (training quantile); ``by_step``
  (training quantile among rows with the same step index, the global one beyond the seen steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.extract import FEATURE_NAMES
from models.escalation import group_folds
from models.remaining import pinball_loss
from training.calibration import expected_calibration_error

if TYPE_CHECKING:
    from models.bundle import ModelBundle
    from models.cache_reuse import CacheReuseRegressor
    from models.escalation import EscalationClassifier
    from models.remaining import RemainingWorkRegressor
    from training.dataset import Dataset

__all__ = [
    "assign_folds",
    "group_folds",
    "bundle_scores",
    "binary_metrics",
    "stall_score",
    "escalation_cv",
    "cache_cv",
    "remaining_cv",
    "ESCALATION_BASELINES",
]

_F = {n: i for i, n in enumerate(FEATURE_NAMES)}
ESCALATION_BASELINES = ("constant", "logreg_steps", "stall")


def assign_folds(groups: np.ndarray, strat: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Fold number per row; all rows of a group share a fold. ``strat``: per-row stratum labels."""
    n_groups = len(np.unique(groups))
    k = min(n_folds, n_groups)
    if k < 2:
        raise ValueError(f"grouped cross-validation needs >= 2 groups (tasks/runs), got {n_groups}")
    return group_folds(np.asarray(strat, dtype=np.float64), groups, k, seed)


def binary_metrics(y: np.ndarray, p: np.ndarray, n_bins: int = 10) -> dict[str, float]:
    """auc, pr_auc, brier, ece, n, pos_rate (auc/pr_auc NaN when one class only)."""
    from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    out: dict[str, float] = {"n": float(len(y)), "pos_rate": float(y.mean()) if len(y) else float("nan")}
    two = len(np.unique(y)) == 2
    out["auc"] = float(roc_auc_score(y, p)) if two else float("nan")
    out["pr_auc"] = float(average_precision_score(y, p)) if two else float("nan")
    out["brier"] = float(brier_score_loss(y, p)) if len(y) else float("nan")
    out["ece"] = expected_calibration_error(y, p, n_bins)
    return out


def stall_score(X: np.ndarray) -> np.ndarray:
    return (
        X[:, _F["tool_errors"]]
        + X[:, _F["tool_error_streak"]]
        + X[:, _F["repeated_tool_calls"]]
        + X[:, _F["last_call_repeated"]]
    )


def _logreg(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(y_tr)) < 2:
        return np.full(len(x_te), float(y_tr.mean()))
    mu, sd = x_tr.mean(), x_tr.std() or 1.0
    lr = LogisticRegression().fit(((x_tr - mu) / sd).reshape(-1, 1), y_tr)
    return lr.predict_proba(((x_te - mu) / sd).reshape(-1, 1))[:, 1]


def escalation_cv(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    fold: np.ndarray,
    make_model: Callable[[], EscalationClassifier],
    on_fold: Callable[[int], None] | None = None,
) -> dict[str, np.ndarray]:
    """OOF predictions: {"model": ..., "constant": ..., "logreg_steps": ..., "stall": ...}."""
    out = {k: np.full(len(y), np.nan) for k in ("model", *ESCALATION_BASELINES)}
    steps = X[:, _F["step_index"]]
    stall = stall_score(X)
    for f in np.unique(fold):
        te, tr = fold == f, fold != f
        if len(np.unique(y[tr])) < 2:
            out["model"][te] = out["constant"][te] = float(y[tr].mean())
            out["logreg_steps"][te] = out["stall"][te] = float(y[tr].mean())
        else:
            m = make_model().fit(X[tr], y[tr], groups=groups[tr])
            out["model"][te] = m.predict_proba(X[te])[:, 1]
            out["constant"][te] = float(y[tr].mean())
            out["logreg_steps"][te] = _logreg(steps[tr], y[tr], steps[te])
            out["stall"][te] = _logreg(stall[tr], y[tr], stall[te])
        if on_fold is not None:
            on_fold(int(f))
    return out


def escalation_report(
    y: np.ndarray, step: np.ndarray, oof: dict[str, np.ndarray], steps_at: Sequence[int]
) -> dict[str, Any]:
    """Metrics per predictor overall and at each step index in ``steps_at``."""
    rep: dict[str, Any] = {"overall": {k: binary_metrics(y, p) for k, p in oof.items()}}
    for k in steps_at:
        sel = step == k
        rep[f"step_{k}"] = {name: binary_metrics(y[sel], p[sel]) for name, p in oof.items()}
    return rep


def cache_cv(
    X: np.ndarray, y: np.ndarray, fold: np.ndarray, make_model: Callable[[], CacheReuseRegressor]
) -> dict[str, np.ndarray]:
    """OOF cached-token predictions: model, zero, constant, hit_share."""
    out = {k: np.full(len(y), np.nan) for k in ("model", "zero", "constant", "hit_share")}
    prompt = np.maximum(X[:, _F["ctx_tokens"]], 0.0)
    for f in np.unique(fold):
        te, tr = fold == f, fold != f
        out["model"][te] = make_model().fit(X[tr], y[tr]).predict(X[te])
        out["zero"][te] = 0.0
        out["constant"][te] = float(np.median(y[tr]))
        share = float(y[tr].sum() / max(prompt[tr].sum(), 1.0))
        out["hit_share"][te] = share * prompt[te]
    return out


def remaining_cv(
    X: np.ndarray,
    y: np.ndarray,
    fold: np.ndarray,
    make_model: Callable[[], RemainingWorkRegressor],
    quantiles: Sequence[float] = (0.5, 0.9),
) -> dict[str, np.ndarray]:
    """OOF quantile predictions, arrays of shape (n, len(quantiles)): model, constant, by_step."""
    nq = len(quantiles)
    out = {k: np.full((len(y), nq), np.nan) for k in ("model", "constant", "by_step")}
    step = X[:, _F["step_index"]].astype(np.int64)
    for f in np.unique(fold):
        te, tr = fold == f, fold != f
        out["model"][te] = make_model().fit(X[tr], y[tr]).predict_quantiles(X[te])
        glob = np.quantile(y[tr], quantiles)
        out["constant"][te] = glob
        tab = pd.DataFrame({"s": step[tr], "y": y[tr]}).groupby("s")["y"].quantile(list(quantiles)).unstack()
        known = tab.reindex(step[te])
        out["by_step"][te] = np.where(np.isnan(known.to_numpy()), glob, known.to_numpy())
    return out


def pinball_report(y: np.ndarray, oof: dict[str, np.ndarray], quantiles: Sequence[float]) -> dict[str, Any]:
    return {
        name: {f"pinball_p{round(q * 100)}": pinball_loss(y, pred[:, j], q) for j, q in enumerate(quantiles)}
        for name, pred in oof.items()
    }


def mae_report(y: np.ndarray, oof: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: float(np.mean(np.abs(y - p))) for name, p in oof.items()}


def bundle_scores(bundle: ModelBundle, ds: Dataset) -> dict[str, Any]:
    """Held-out scores of a bundle (``models.bundle.ModelBundle``) on a ``training.dataset.Dataset``:
    escalation metrics (:func:`binary_metrics`), cache-reuse MAE in tokens, remaining-steps pinball
    losses at p50 / p90. A predictor the bundle lacks, or a target with no label, is left out."""
    m = ds.meta
    out: dict[str, Any] = {"n_steps": len(ds)}
    lab = m["y_frontier"].notna().to_numpy()
    if lab.sum() and bundle.escalation is not None:
        p = bundle.escalation.predict_proba(ds.X[lab])[:, 1]
        out["escalation"] = binary_metrics(m["y_frontier"].to_numpy()[lab], p)
    c = m["y_cache"].notna().to_numpy()
    if c.sum() and bundle.cache_reuse is not None:
        out["cache_reuse"] = {
            "mae_tokens": float(
                np.mean(np.abs(bundle.cache_reuse.predict(ds.X[c]) - m["y_cache"].to_numpy()[c]))
            )
        }
    if len(ds) and bundle.remaining_steps is not None:
        q = bundle.remaining_steps.predict_quantiles(ds.X)
        y = m["y_rem_steps"].to_numpy()
        out["remaining_steps"] = {
            "pinball_p50": pinball_loss(y, q[:, 0], 0.5),
            "pinball_p90": pinball_loss(y, q[:, -1], 0.9),
        }
    return out
