"""Do two bundles agree on held-out data? Paired, run-clustered bootstrap of their metric gaps.

Algorithm (:func:`heldout_agreement`): both bundles score the same held-out rows (escalation AUC and
Brier on the labelled rows, cache-reuse MAE in tokens, remaining-steps pinball p50). The rows of a
run are correlated, so the bootstrap resamples whole runs (with replacement, ``n_boot`` times,
seeded) and recomputes both bundles' metrics on each resample: ``se`` = the standard deviation of
the resampled metric (the larger of the two bundles'), ``se_gap`` = that of the resampled gaps
(paired: much smaller, the models share the rows). Two bundles agree on a metric when
``|gap| <= z * se`` (the gap is within the metric's own SE; ``z`` = 1 by default). Used to check that Dask training (:mod:`training.dask_train`) and serial training give
the same models up to noise.

Knobs: ``n_boot``, ``seed``, ``z``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from models.bundle import ModelBundle
    from training.dataset import Dataset

__all__ = ["heldout_agreement"]


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else float("nan")


def heldout_agreement(
    a: ModelBundle, b: ModelBundle, held: Dataset, *, n_boot: int = 200, seed: int = 0, z: float = 1.0
) -> dict[str, dict[str, float | bool]]:
    """Per metric: value of ``a`` and ``b``, gap, SE of the gap, agree (the module docstring)."""
    m, X = held.meta, held.X
    runs = m["run_id"].astype(str).to_numpy()
    preds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, Any]] = {}
    lab = m["y_frontier"].notna().to_numpy()
    if lab.any():
        pa, pb = (x.escalation.predict_proba(X[lab])[:, 1] for x in (a, b))
        preds["escalation_auc"] = (lab, pa, pb, lambda yy, p: _auc(yy, p))
        preds["escalation_brier"] = (lab, pa, pb, lambda yy, p: float(np.mean((p - yy) ** 2)))
    c = m["y_cache"].notna().to_numpy()
    if c.any() and a.cache_reuse is not None and b.cache_reuse is not None:
        ca, cb = (x.cache_reuse.predict(X[c]) for x in (a, b))
        preds["cache_mae_tokens"] = (c, ca, cb, lambda yy, p: float(np.mean(np.abs(p - yy))))
    allrows = np.ones(len(m), dtype=bool)
    ra, rb = (x.remaining_steps.predict_quantiles(X)[:, 0] for x in (a, b))
    preds["remaining_pinball_p50"] = (
        allrows,
        ra,
        rb,
        lambda yy, p: float(np.mean(np.maximum(0.5 * (yy - p), (0.5 - 1) * (yy - p)))),
    )
    ycol = {"escalation": "y_frontier", "cache": "y_cache", "remaining": "y_rem_steps"}
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float | bool]] = {}
    for name, (mask, pa_, pb_, f) in preds.items():
        yy = m[ycol[name.split("_")[0]]].to_numpy(dtype=np.float64)[mask]
        rr = runs[mask]
        uniq, inv = np.unique(rr, return_inverse=True)
        rows_of = np.argsort(inv, kind="stable")
        starts = np.searchsorted(inv[rows_of], np.arange(len(uniq)))
        ends = np.append(starts[1:], len(rows_of))
        boots = np.empty((n_boot, 2))
        for i in range(n_boot):
            pick = rng.integers(0, len(uniq), len(uniq))
            idx = np.concatenate([rows_of[starts[k] : ends[k]] for k in pick])
            boots[i] = f(yy[idx], pa_[idx]), f(yy[idx], pb_[idx])
        va, vb = f(yy, pa_), f(yy, pb_)
        se = float(max(np.nanstd(boots[:, 0], ddof=1), np.nanstd(boots[:, 1], ddof=1)))
        out[name] = {
            "a": va,
            "b": vb,
            "gap": va - vb,
            "se": se,
            "se_gap": float(np.nanstd(boots[:, 0] - boots[:, 1], ddof=1)),
            "agree": bool(abs(va - vb) <= z * se) if se > 0 else bool(va == vb),
        }
    return out
