"""Cache-reuse predictor: prompt tokens of the arriving step that will hit the local prefix cache
if the run stays on its local replica.

Algorithm: a LightGBM regressor on the prefix features. The label depends on more than the prefix:
how long the run paused (``tool_pause_s``) and how much else went through the cache meanwhile
(``local_cache_pressure``) decide whether the run's blocks were evicted, and both are features.
With ``prompt_col`` set (the index of ``ctx_tokens`` in the feature layout), the model learns the
*share* of the new prompt that hits, with an L1 loss weighted by the prompt size (so the loss is the
absolute error in tokens), and predictions are ``clip(share, 0, 1) * prompt tokens``: never more
than the prompt, never negative. Without ``prompt_col`` it regresses tokens directly.

Knobs: ``prompt_col``; ``objective`` (LightGBM objective, default ``"l1"``: the reported metric is
MAE in tokens); LightGBM's ``n_estimators``, ``learning_rate``, ``num_leaves``,
``min_child_samples``, ``max_bin``, ``subsample``, ``colsample_bytree``, ``random_state``, ``n_jobs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from models.escalation import lgb_dataset, train_booster

__all__ = ["CacheReuseRegressor"]


class CacheReuseRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn ships no type stubs
    """LightGBM regressor of cached prompt tokens; see the module docstring."""

    def __init__(
        self,
        prompt_col: int | None = None,
        objective: str = "l1",
        n_estimators: int = 200,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_child_samples: int = 20,
        max_bin: int = 255,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        random_state: int | None = 0,
        n_jobs: int | None = None,
    ) -> None:
        self.prompt_col = prompt_col
        self.objective = objective
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

    def fit(self, X: Any, y: Any) -> CacheReuseRegressor:
        X, y = validate_data(self, X, y, ensure_all_finite="allow-nan", dtype=np.float64, y_numeric=True)
        y = np.asarray(y, dtype=np.float64)
        if self.prompt_col is not None:
            if not 0 <= self.prompt_col < X.shape[1]:
                raise ValueError(f"prompt_col {self.prompt_col} outside 0..{X.shape[1] - 1}")
            if np.any(y < 0):
                raise ValueError("cache-reuse labels must be >= 0 tokens")
            denom = np.maximum(np.nan_to_num(X[:, self.prompt_col]), 1.0)
            data = lgb_dataset(self, X, np.clip(y / denom, 0.0, 1.0), weight=denom)
        else:
            data = lgb_dataset(self, X, y)
        self.booster_ = train_booster(self, data, self.objective)
        return self

    def _finish(self, X: np.ndarray, raw: np.ndarray) -> np.ndarray:
        if self.prompt_col is None:
            return raw
        out: np.ndarray = np.clip(raw, 0.0, 1.0) * np.maximum(np.nan_to_num(X[:, self.prompt_col]), 0.0)
        return out

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "booster_")
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64)
        return self._finish(X, self.booster_.predict(X))

    def predict_fast(self, x2d: np.ndarray) -> float:
        """Serving fast path for one pre-validated float64 row of shape (1, n)."""
        return float(self._finish(x2d, self.booster_.predict(x2d))[0])
