"""The predictor seam: anything with ``predict(prefix) -> Predictions``.

The router, the simulator and policies depend on this protocol, not on LightGBM: a
:class:`~models.bundle.ModelBundle` satisfies it, and so does :class:`ConstantPredictor`, the
stand-in for tests and for running without a trained bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from features.prefix import RunPrefix
from models.types import Predictions

__all__ = ["Predictor", "ConstantPredictor"]


@runtime_checkable
class Predictor(Protocol):
    def predict(self, prefix: RunPrefix) -> Predictions: ...


@dataclass(frozen=True)
class ConstantPredictor:
    """Returns the same :class:`Predictions` for every prefix, except that ``cache_reuse_tokens``
    is capped at the new prompt's size (a prediction above the prompt is impossible).

    Knobs: ``predictions`` (what to return; default: p_frontier 0, no cache reuse, one step left).
    """

    predictions: Predictions = Predictions(p_frontier=0.0)

    def predict(self, prefix: RunPrefix) -> Predictions:
        p = self.predictions
        if p.cache_reuse_tokens > prefix.new_prompt_tokens:
            return Predictions(
                p_frontier=p.p_frontier,
                cache_reuse_tokens=float(prefix.new_prompt_tokens),
                remaining_steps_p50=p.remaining_steps_p50,
                remaining_steps_p90=p.remaining_steps_p90,
                remaining_tokens_p50=p.remaining_tokens_p50,
                remaining_tokens_p90=p.remaining_tokens_p90,
            )
        return p
