"""Predictors with scikit-learn conventions and the `ModelBundle` that ships them to the router.

Public names are imported lazily so that ``import models`` stays cheap (no LightGBM/scikit-learn
until a predictor is used).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Predictions",
    "Predictor",
    "ConstantPredictor",
    "ModelBundle",
    "BundleError",
    "EscalationClassifier",
    "CacheReuseRegressor",
    "RemainingWorkRegressor",
]

_WHERE = {
    "Predictions": "models.types",
    "Predictor": "models.predictor",
    "ConstantPredictor": "models.predictor",
    "ModelBundle": "models.bundle",
    "BundleError": "models.bundle",
    "EscalationClassifier": "models.escalation",
    "CacheReuseRegressor": "models.cache_reuse",
    "RemainingWorkRegressor": "models.remaining",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
