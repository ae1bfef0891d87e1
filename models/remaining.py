"""Remaining-work predictor: quantiles (p50, p90 by default) of a run's remaining steps or tokens.

Algorithm: one LightGBM regressor with the quantile (pinball) objective per requested quantile. With
``log_target`` (default) each model learns quantiles of ``log1p(y)`` and predictions are mapped back
with ``expm1``: quantiles commute with monotone maps, and the log scale tames heavy-tailed run
lengths. Predicted quantiles are sorted per row so p50 <= p90 always (no quantile crossing).

Knobs: ``quantiles`` (increasing, in (0, 1)); ``log_target`` (needs y >= 0); LightGBM's
``n_estimators``, ``learning_rate``, ``num_leaves``, ``min_child_samples``, ``max_bin``,
``subsample``, ``colsample_bytree``, ``random_state``, ``n_jobs``.

``predict`` returns the first quantile (the median by default), as scikit-learn regressors return
one value per row; ``predict_quantiles`` returns all of them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from models.escalation import lgb_dataset, train_booster

__all__ = ["RemainingWorkRegressor", "pinball_loss"]


def pinball_loss(y: np.ndarray, q_pred: np.ndarray, q: float) -> float:
    """Mean pinball (quantile) loss of predictions ``q_pred`` of quantile ``q``."""
    d = np.asarray(y, dtype=np.float64) - np.asarray(q_pred, dtype=np.float64)
    return float(np.mean(np.maximum(q * d, (q - 1.0) * d)))


class RemainingWorkRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn ships no type stubs
    """Quantile LightGBM models; see the module docstring."""

    def __init__(
        self,
        quantiles: tuple[float, ...] = (0.5, 0.9),
        log_target: bool = True,
        n_estimators: int = 150,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_child_samples: int = 20,
        max_bin: int = 255,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        random_state: int | None = 0,
        n_jobs: int | None = None,
    ) -> None:
        self.quantiles = quantiles
        self.log_target = log_target
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.max_bin = max_bin
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.random_state = random_state
        self.n_jobs = n_jobs

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def fit(self, X: Any, y: Any) -> RemainingWorkRegressor:
        qs = tuple(float(q) for q in self.quantiles)
        if not qs or any(not 0.0 < q < 1.0 for q in qs) or list(qs) != sorted(qs):
            raise ValueError(f"quantiles must be increasing values in (0, 1), got {self.quantiles!r}")
        X, y = validate_data(self, X, y, ensure_all_finite="allow-nan", dtype=np.float64, y_numeric=True)
        y = np.asarray(y, dtype=np.float64)
        if self.log_target:
            if np.any(y < 0):
                raise ValueError("log_target=True needs y >= 0 (remaining steps/tokens)")
            z = np.log1p(y)
        else:
            z = y
        data = lgb_dataset(self, X, z)  # binned once, shared by the quantile models
        self.boosters_ = [train_booster(self, data, "quantile", alpha=q) for q in qs]
        self.quantiles_ = qs
        return self

    def _finish(self, z: np.ndarray) -> np.ndarray:
        z = np.sort(z, axis=1)
        return np.expm1(z) if self.log_target else z

    def predict_quantiles(self, X: Any) -> np.ndarray:
        """(n_rows, n_quantiles) predictions, sorted per row."""
        check_is_fitted(self, "boosters_")
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64)
        return self._finish(np.column_stack([b.predict(X) for b in self.boosters_]))

    def predict(self, X: Any) -> np.ndarray:
        return self.predict_quantiles(X)[:, 0]

    def predict_fast(self, x2d: np.ndarray) -> list[float]:
        """The quantiles for one pre-validated float64 row of shape (1, n), without validation."""
        return self.finish_fast([float(b.predict(x2d)[0]) for b in self.boosters_])

    def finish_fast(self, z: list[float]) -> list[float]:
        """Raw per-quantile booster outputs of one row -> sorted quantiles on the target scale."""
        z = sorted(z)
        if self.log_target:
            return [math.expm1(v) for v in z]
        return z
