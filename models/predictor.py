"""The predictor seam: what the step engine, replay and policies need from a model.

:class:`Predictor` declares the three ways to ask, so callers never probe with ``getattr``:

- ``predict(prefix)``: features and predictions for one arriving step;
- ``predict_features(x)``: predictions for a feature vector already extracted (the step engine
  extracts once and shares the vector with the snapshot and the step record);
- ``predict_batch(X)``: one call for many rows (replay and training reports);

plus ``version`` (logged with every step). A :class:`~models.bundle.ModelBundle` satisfies it, and
so does :class:`ConstantPredictor`, the one stand-in for tests and for serving without a bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from features.extract import FEATURE_NAMES, extract
from features.prefix import RunPrefix
from models.types import Predictions

__all__ = ["Predictor", "FeaturePredictor", "ConstantPredictor"]

_CTX = FEATURE_NAMES.index("ctx_tokens")


@runtime_checkable
class Predictor(Protocol):
    @property
    def version(self) -> str: ...

    @property
    def needs_features(self) -> bool:
        """False when predictions do not depend on the feature vector (the step engine then asks
        ``predict(prefix)`` and extracts nothing unless the step record wants the vector); read-only,
        so a frozen predictor (:class:`ConstantPredictor`) satisfies it."""
        ...

    def predict(self, prefix: RunPrefix) -> Predictions: ...

    def predict_features(self, x: np.ndarray) -> Predictions: ...

    def predict_batch(self, X: np.ndarray) -> list[Predictions]: ...


class FeaturePredictor:
    """A base for predictors defined by ``predict_features(x)`` alone (stand-ins, baselines):
    ``predict`` extracts the vector, ``predict_batch`` loops over rows."""

    version: str = "unversioned"
    needs_features: bool = True

    def predict_features(self, x: np.ndarray) -> Predictions:
        raise NotImplementedError

    def predict(self, prefix: RunPrefix) -> Predictions:
        return self.predict_features(extract(prefix))

    def predict_batch(self, X: np.ndarray) -> list[Predictions]:
        return [self.predict_features(row) for row in np.asarray(X, dtype=np.float64)]


@dataclass(frozen=True)
class ConstantPredictor:
    """Returns the same :class:`Predictions` for every step, except that ``cache_reuse_tokens``
    is capped at the new prompt's size (a prediction above the prompt is impossible).

    Knobs: ``predictions`` (what to return; default: p_frontier 0, no cache reuse, one step left),
    ``version`` (logged with each step; ``none``).
    """

    predictions: Predictions = Predictions(p_frontier=0.0)
    version: str = "none"
    needs_features: bool = False

    def _capped(self, prompt: float) -> Predictions:
        p = self.predictions
        if p.cache_reuse_tokens <= prompt:
            return p
        return Predictions(
            p_frontier=p.p_frontier,
            cache_reuse_tokens=float(max(prompt, 0.0)),
            remaining_steps_p50=p.remaining_steps_p50,
            remaining_steps_p90=p.remaining_steps_p90,
            remaining_tokens_p50=p.remaining_tokens_p50,
            remaining_tokens_p90=p.remaining_tokens_p90,
        )

    def predict(self, prefix: RunPrefix) -> Predictions:
        p = self.predictions  # self._capped(...), its common case inline (called at every step)
        prompt = float(prefix.new_prompt_tokens)
        if p.cache_reuse_tokens <= prompt:
            return p
        return self._capped(prompt)

    def predict_features(self, x: np.ndarray) -> Predictions:
        return self._capped(float(x[_CTX]))

    def predict_batch(self, X: np.ndarray) -> list[Predictions]:
        return [self._capped(float(v)) for v in np.asarray(X)[:, _CTX]]
