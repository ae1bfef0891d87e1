"""Domain-normalised features: each size/time/count feature as a z-score within its run's domain.

A 3,000-token prompt is long for one agent and short for another; a model trained on raw sizes
learns one domain's scale. :class:`DomainStats` learns, per domain, the mean and standard deviation
of ``log1p(max(x, 0))`` of each feature in :data:`NORMALISED` from that domain's own step rows (no
labels: any traffic of the domain will do, e.g. a day of router logs before any outcome is known)
and :meth:`DomainStats.transform` gives ``z = (log1p(max(x, 0)) - mean_d) / std_d`` (NaN stays NaN;
a domain or feature without spread has std 1; an unknown domain uses the statistics of all rows).

This module only provides the transform (fit on rows, apply to a row or a matrix). Whether a model
uses it is the training job's choice, measured by ``bench/feature_ablation.py --tau2`` (the table in
the report of issue 14, helper "trouble"): keep what helps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from features.extract import FEATURE_NAMES

__all__ = ["NORMALISED", "DomainStats", "z_names"]

#: the features normalised per domain (sizes, times, counts: their scale is the domain's)
NORMALISED: tuple[str, ...] = (
    "ctx_tokens",
    "first_prompt_tokens",
    "ctx_growth_mean",
    "tokens_so_far",
    "time_since_start_s",
    "tool_pause_s",
    "tool_pause_mean_s",
    "n_tool_calls",
    "out_tokens_last",
    "out_tokens_mean",
    "out_tokens_max",
    "new_tool_result_tokens",
    "new_n_tools_offered",
)
_IDX = np.array([FEATURE_NAMES.index(n) for n in NORMALISED])


def z_names() -> tuple[str, ...]:
    """Column names of :meth:`DomainStats.transform`'s output."""
    return tuple(f"z_{n}" for n in NORMALISED)


def _log(X: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(X[..., _IDX], 0.0))


@dataclass
class DomainStats:
    """Per-domain mean / std of the :data:`NORMALISED` features (module docstring)."""

    mean_: dict[str, np.ndarray] = field(default_factory=dict)
    std_: dict[str, np.ndarray] = field(default_factory=dict)

    def fit(self, X: np.ndarray, domains: Sequence[str | None]) -> DomainStats:
        L = _log(np.asarray(X, dtype=np.float64))
        dom = np.array([d if d is not None else "" for d in domains], dtype=object)
        for d in [*sorted(set(dom.tolist())), None]:
            rows = L if d is None else L[dom == d]
            key = "*" if d is None else str(d)
            with np.errstate(invalid="ignore"):
                mu = np.nanmean(rows, axis=0) if len(rows) else np.zeros(len(_IDX))
                sd = np.nanstd(rows, axis=0) if len(rows) else np.ones(len(_IDX))
            self.mean_[key] = np.nan_to_num(mu, nan=0.0)
            self.std_[key] = np.where(np.isfinite(sd) & (sd > 1e-9), sd, 1.0)
        return self

    def transform(self, X: np.ndarray, domains: Sequence[str | None]) -> np.ndarray:
        """``(n, len(NORMALISED))`` z-scores of the rows of ``X`` (or one row), each in its domain."""
        X = np.asarray(X, dtype=np.float64)
        one = X.ndim == 1
        L = _log(X[None, :] if one else X)
        out = np.empty_like(L)
        dom = [d if d is not None else "" for d in domains]
        for key in set(dom):
            rows = np.array([x == key for x in dom])
            k = key if key in self.mean_ else "*"
            out[rows] = (L[rows] - self.mean_[k]) / self.std_[k]
        return out[0] if one else out
