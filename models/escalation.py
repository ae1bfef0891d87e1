"""Escalation predictor: calibrated P(run needs the frontier | prefix at step k).

Algorithm: a LightGBM binary classifier (trained with ``lightgbm.train`` on one binned Dataset that
the fold models reuse through ``Dataset.subset``) on the prefix features (:mod:`features.extract`); its raw
probabilities are calibrated on *out-of-fold* predictions: the training rows are split into ``cv``
folds by group (task or run id: never by row, so steps of one run never sit on both sides), a model
fit on the other folds scores each fold, and a monotone map (isotonic regression, or Platt's
sigmoid) is fit from those scores to the labels. The final model is then fit on all rows and its
scores go through the map. The map is stored as two arrays (``calib_x_``, ``calib_y_``) so serving
applies it with one ``np.interp``; it is made strictly increasing (ties of the isotonic steps broken
by the raw score, 1e-6 of probability: :func:`strictly_increasing`), so that a threshold for a
frontier share can separate any two runs.

Knobs:
- ``n_estimators``, ``learning_rate``, ``num_leaves``, ``min_child_samples``, ``max_bin``,
  ``subsample``/``colsample_bytree``: LightGBM's own (see its docs).
- ``calibration``: ``"isotonic"`` (default; needs a few hundred positive and negative rows),
  ``"sigmoid"`` (Platt; fewer rows) or ``"none"`` (raw scores).
- ``cv``: out-of-fold calibration folds (by group with ``groups``: groups dealt to folds in order of
  their mean label; else StratifiedKFold); capped by the number of groups / rows of the rarer
  class; below 2 the calibration is ``"none"``.
- ``calibration_max_rows``: compute the out-of-fold scores on a random subset of groups holding
  about this many rows (None = all): a calibration map needs far fewer rows than the model.
- ``random_state``, ``n_jobs``: determinism and threads (None = LightGBM default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

__all__ = [
    "EscalationClassifier",
    "fit_calibration_map",
    "strictly_increasing",
    "group_folds",
    "lgb_params",
    "lgb_dataset",
    "train_booster",
]

_CALIBRATIONS = ("isotonic", "sigmoid", "none")


def lgb_params(est: Any, objective: str, **extra: Any) -> dict[str, Any]:
    """``lightgbm.train`` parameters from an estimator's shared hyper-parameters."""
    params: dict[str, Any] = {
        "objective": objective,
        "learning_rate": est.learning_rate,
        "num_leaves": est.num_leaves,
        "min_data_in_leaf": est.min_child_samples,
        "max_bin": est.max_bin,
        "bagging_fraction": est.subsample,
        "bagging_freq": 1 if est.subsample < 1.0 else 0,
        "feature_fraction": est.colsample_bytree,
        "num_threads": est.n_jobs or 0,
        "verbose": -1,
    }
    if est.random_state is not None:
        params["seed"] = int(est.random_state)
    params.update(extra)
    return params


def lgb_dataset(est: Any, X: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> Any:
    """A constructed ``lightgbm.Dataset`` (binned once; reusable for several boosters and, through
    ``.subset(rows)``, for fold models without re-binning)."""
    import lightgbm as lgb

    dparams = {"max_bin": est.max_bin, "verbose": -1, "min_data_in_leaf": est.min_child_samples}
    return lgb.Dataset(X, label=y, weight=weight, params=dparams, free_raw_data=False).construct()


def train_booster(est: Any, data: Any, objective: str, **extra: Any) -> Any:
    """``lightgbm.train`` on a Dataset for ``est.n_estimators`` rounds (no sklearn wrapper: the
    wrapper would re-validate and re-bin the data on every fit)."""
    import lightgbm as lgb

    return lgb.train(lgb_params(est, objective, **extra), data, num_boost_round=est.n_estimators)


def group_folds(y: np.ndarray, groups: np.ndarray, k: int, seed: int | None) -> np.ndarray:
    """Fold per row: groups are shuffled, ordered by their mean label and dealt round-robin, so each
    fold gets about the same share of positive groups. O(n log n) (StratifiedGroupKFold took seconds
    on 300k rows)."""
    uniq, inv = np.unique(groups, return_inverse=True)
    mean = np.bincount(inv, weights=y, minlength=len(uniq)) / np.bincount(inv, minlength=len(uniq))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(uniq))
    order = perm[np.argsort(mean[perm], kind="stable")]
    fold_of_group = np.empty(len(uniq), dtype=np.int64)
    fold_of_group[order] = np.arange(len(uniq)) % k
    return fold_of_group[inv]


def _splits(y: np.ndarray, groups: np.ndarray | None, cv: int, seed: int | None) -> list[Any]:
    from sklearn.model_selection import StratifiedKFold

    minority = int(min(np.sum(y == 0), np.sum(y == 1)))
    if groups is not None:
        n = min(cv, len(np.unique(groups)), minority)
        if n < 2:
            return []
        fold = group_folds(y, groups, n, seed)
        idx = np.arange(len(y))
        return [(idx[fold != f], idx[fold == f]) for f in range(n)]
    n = min(cv, minority)
    if n < 2:
        return []
    return list(StratifiedKFold(n_splits=n, shuffle=True, random_state=seed).split(y, y))


class EscalationClassifier(ClassifierMixin, BaseEstimator):  # type: ignore[misc]  # sklearn ships no type stubs
    """LightGBM + out-of-fold calibration; binary. See the module docstring."""

    def __init__(
        self,
        n_estimators: int = 200,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_child_samples: int = 20,
        max_bin: int = 255,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        calibration: str = "isotonic",
        cv: int = 5,
        calibration_max_rows: int | None = None,
        random_state: int | None = 0,
        n_jobs: int | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.max_bin = max_bin
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.calibration = calibration
        self.cv = cv
        self.calibration_max_rows = calibration_max_rows
        self.random_state = random_state
        self.n_jobs = n_jobs

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        assert tags.classifier_tags is not None
        tags.classifier_tags.multi_class = False  # binary by design: P(needs frontier)
        return tags

    def fit(self, X: Any, y: Any, groups: Any = None) -> EscalationClassifier:
        """Fit on feature rows ``X`` and binary labels ``y``; ``groups`` (task/run ids) for the folds."""
        if self.calibration not in _CALIBRATIONS:
            raise ValueError(f"calibration must be one of {_CALIBRATIONS}, got {self.calibration!r}")
        X, y = validate_data(self, X, y, ensure_all_finite="allow-nan", dtype=np.float64)
        check_classification_targets(y)
        self.classes_: np.ndarray = np.unique(y)
        if len(self.classes_) > 2:
            raise ValueError(
                f"Only binary classification is supported (needs frontier or not); y has "
                f"{len(self.classes_)} classes"
            )
        if len(self.classes_) < 2:
            raise ValueError("y has 1 class: both outcomes are needed to learn P(needs frontier)")
        yb = (y == self.classes_[1]).astype(np.int64)
        g = None if groups is None else np.asarray(groups)
        if g is not None and len(g) != len(yb):
            raise ValueError(f"groups has {len(g)} entries for {len(yb)} rows")
        method = self.calibration
        full = lgb_dataset(self, X, yb.astype(np.float64))
        oof = np.full(len(yb), np.nan)
        if method != "none":
            # out-of-fold scores, on at most calibration_max_rows rows (a random subset of groups)
            cal = np.arange(len(yb))
            cap = self.calibration_max_rows
            if cap is not None and len(yb) > cap:
                rng = np.random.default_rng(self.random_state)
                if g is not None:
                    ug, inv = np.unique(g, return_inverse=True)
                    keep = rng.permutation(len(ug))[: max(2, int(len(ug) * cap / len(yb)))]
                    cal = np.flatnonzero(np.isin(inv, keep))
                else:
                    cal = np.sort(rng.choice(len(yb), size=cap, replace=False))
            for tr, te in _splits(yb[cal], None if g is None else g[cal], self.cv, self.random_state):
                tr_rows, te_rows = cal[tr], cal[te]
                if len(np.unique(yb[tr_rows])) < 2:
                    continue
                booster = train_booster(self, full.subset(tr_rows.tolist()), "binary")
                oof[te_rows] = booster.predict(X[te_rows])
        ok = ~np.isnan(oof)
        if method == "none" or ok.sum() < 2 or len(np.unique(yb[ok])) < 2:
            method = "none"
        self.calibration_used_ = method
        self.oof_raw_ = oof
        self.calib_x_, self.calib_y_ = fit_calibration_map(method, oof[ok], yb[ok])
        self.booster_ = train_booster(self, full, "binary")
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "booster_")
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64)
        p = self.calibrate(self.booster_.predict(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        p = self.predict_proba(X)[:, 1]
        labels: np.ndarray = self.classes_[(p >= 0.5).astype(int)]
        return labels

    def calibrate(self, raw: np.ndarray) -> np.ndarray:
        """Map raw LightGBM probabilities through the fitted calibration map."""
        out: np.ndarray = np.interp(raw, self.calib_x_, self.calib_y_)
        return out

    def predict_p_fast(self, x2d: np.ndarray) -> float:
        """Serving fast path: calibrated P for one pre-validated float64 row of shape (1, n)."""
        raw = self.booster_.predict(x2d)
        return float(np.interp(raw[0], self.calib_x_, self.calib_y_))


TIE_BREAK = 1e-6  # weight of the raw score in the calibrated p (strictly_increasing)


def strictly_increasing(
    xs: np.ndarray, ys: np.ndarray, tie: float = TIE_BREAK
) -> tuple[np.ndarray, np.ndarray]:
    """The map ``(xs, ys)`` extended to raw scores 0 and 1 and made strictly increasing:
    ``(1 - tie) * ys + tie * xs``. An isotonic map is a step function: its flat steps gave whole
    blocks of runs the same calibrated p (one step held up to ~15% of the runs' maxima), so a
    frontier-share threshold could only land on a step's edge (30% asked, 46% or 32% got, whichever
    edge the fitted steps happened to put nearest). Breaking the ties by the raw score (at most
    ``tie`` = 1e-6 of probability) lets the threshold resolve single runs; the calibration is
    unchanged to six decimals."""
    lo, hi = int(xs[0] > 0.0), int(xs[-1] < 1.0)
    xs = np.concatenate([[0.0]] * lo + [xs] + [[1.0]] * hi)
    ys = np.concatenate([ys[:1]] * lo + [ys] + [ys[-1:]] * hi)
    return xs, (1.0 - tie) * ys + tie * xs


def fit_calibration_map(method: str, raw: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calibration map as (x, y) knots for ``np.interp``, strictly increasing on [0, 1]
    (:func:`strictly_increasing`: ties broken by the raw score)."""
    if method == "none":
        return np.array([0.0, 1.0]), np.array([0.0, 1.0])
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(raw, y)
        xs = np.asarray(iso.X_thresholds_, dtype=np.float64)
        ys = np.asarray(iso.y_thresholds_, dtype=np.float64)
        if len(xs) == 1:
            xs, ys = np.array([0.0, 1.0]), np.array([ys[0], ys[0]])
        return strictly_increasing(xs, ys)
    from sklearn.linear_model import LogisticRegression

    eps = 1e-6
    z = np.log(np.clip(raw, eps, 1 - eps) / (1 - np.clip(raw, eps, 1 - eps)))
    lr = LogisticRegression(C=1e4).fit(z.reshape(-1, 1), y)
    grid = np.linspace(0.0, 1.0, 513)
    gz = np.log(np.clip(grid, eps, 1 - eps) / (1 - np.clip(grid, eps, 1 - eps)))
    return strictly_increasing(grid, lr.predict_proba(gz.reshape(-1, 1))[:, 1])
