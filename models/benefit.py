"""The benefit-of-escalation model: P(success | stay local) and P(success | escalate now), per domain.

Target (issue 14): for a run still on the local tier at step k, ``benefit = (P(success | escalate at
k) - P(success | stay local)) x value_of_success - extra cost``. Both probabilities are learned from
paired runs: a weak run's prefix with the weak run's own outcome (stay local) and the strong
model's outcome on the same task (escalate now). Assumption, stated: the strong outcome of the task
stands in for "escalate now" at any step (a mid-run switch inherits the weak prefix; the paired data
cannot show what that costs). Plain failure is never the target; ``1 - p_success_local`` is only an
auxiliary input of baselines.

Structure: one :class:`LogitHead` per arm and domain: a logistic regression on ``[structural
features at the step, the task embedding reduced by PCA]`` (standardised), stored as plain arrays,
so serving is a few dot products in numpy (no scikit-learn at request time). :class:`BenefitModel`
holds

- a **prior**: per-domain base rates (``p_local``, ``p_frontier``) of the training runs, and the
  pooled rates; the benefit it gives is one constant per domain, so
  the prior policy is the best simple baseline for the cost/quality knob ``value_of_success_usd``
  (all-local below the break-even value, all-frontier above);
- a :class:`DomainBenefit` per domain with at least ``min_runs`` labelled runs; its ``mode`` is
  ``"model"`` only when its task-grouped CV evidence beat the prior by more than its confidence
  interval (``training.benefit``), else ``"prior"``; ``reason`` says why, in one line. A domain in
  prior mode runs its ``prior`` policy: the base rates above, or the escalation classifier where
  that measured better on the training runs (:func:`training.benefit_job.choose_priors`). A domain
  the bundle never saw (or a run without one) runs the global prior: the escalation classifier with
  the thresholds calibrated to the target frontier share, so a new deployment's traffic (its domain
  is a system-prompt hash) is not sent wholesale to one tier by pooled base rates.

:meth:`BenefitModel.predict` answers for one step: ``(p_local, p_frontier, mode, reason)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["LogitHead", "DomainBenefit", "BenefitModel", "UNSEEN_REASON"]

UNSEEN_REASON = "domain not in the training data: the global prior (the escalation classifier)"


@dataclass
class LogitHead:
    """``sigmoid(w . z + b)`` with ``z = ((x_struct, (e - e_mean) @ components.T) - mean) / scale``.

    ``struct_idx``: positions of the structural features in the feature vector; ``components``:
    PCA rows (k, embed_dim) or None (no embedding input); ``e_mean`` the embedding mean."""

    struct_idx: tuple[int, ...]
    coef: np.ndarray
    intercept: float
    mean: np.ndarray
    scale: np.ndarray
    components: np.ndarray | None = None
    e_mean: np.ndarray | None = None

    def design(self, X: np.ndarray, E: np.ndarray | None) -> np.ndarray:
        """Standardised inputs for rows ``X`` (n, n_features) and embeddings ``E`` (n, d) or None
        (a missing embedding is the training mean: its PCA terms are 0)."""
        parts = [np.nan_to_num(np.asarray(X, dtype=np.float64)[:, list(self.struct_idx)])]
        if self.components is not None and self.e_mean is not None:
            k = self.components.shape[0]
            if E is None:
                parts.append(np.zeros((len(X), k)))
            else:
                C = np.asarray(E, dtype=np.float64) - self.e_mean
                parts.append(np.nan_to_num(C) @ self.components.T)  # a missing row = the mean
        Z: np.ndarray = np.hstack(parts) if parts else np.zeros((len(X), 0))
        out: np.ndarray = (Z - self.mean) / self.scale
        return out

    def predict(self, X: np.ndarray, E: np.ndarray | None) -> np.ndarray:
        z: np.ndarray = self.design(X, E) @ self.coef + self.intercept
        p: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))
        return p


@dataclass
class DomainBenefit:
    """One domain's heads and gate: ``mode`` ``"model"`` | ``"prior"``, ``reason``, ``evidence``
    (the CV figures the gate read), the domain's base rates and its labelled-run count."""

    domain: str
    mode: str
    reason: str
    p_local: float
    p_frontier: float
    n_runs: int
    local: LogitHead | None = None
    frontier: LogitHead | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    #: the prior policy of a domain in ``prior`` mode: ``base-rates`` (the domain's constant uplift:
    #: all-local or all-frontier by the value-of-success knob) or ``escalation`` (the bundle's
    #: escalation classifier, P(needs frontier) with the learned policy's thresholds), whichever
    #: had the better AIQ on the training runs by more than its SE
    prior: str = "base-rates"


@dataclass
class BenefitModel:
    """Global prior + per-domain models; see the module docstring."""

    p_local: float
    p_frontier: float
    domains: dict[str, DomainBenefit] = field(default_factory=dict)
    embed_dim: int = 384

    def mode(self, domain: str | None) -> tuple[str, str]:
        """``(mode, reason)`` a run of ``domain`` is served in."""
        d = self.domains.get(domain) if domain is not None else None
        if d is None:
            return "prior", UNSEEN_REASON if domain is not None else "no domain on the run: the prior"
        return d.mode, d.reason

    def predict(
        self, x: np.ndarray, embedding: np.ndarray | None, domain: str | None
    ) -> tuple[float, float, str, str]:
        """``(p_success_local, p_success_frontier, mode, reason)`` for one feature vector ``x``."""
        d = self.domains.get(domain) if domain is not None else None
        if d is None:
            mode, reason = self.mode(domain)
            return self.p_local, self.p_frontier, mode, reason
        if d.mode != "model" or d.local is None or d.frontier is None:
            return d.p_local, d.p_frontier, d.mode, d.reason
        X = np.asarray(x, dtype=np.float64).reshape(1, -1)
        E = None if embedding is None else np.asarray(embedding, dtype=np.float64).reshape(1, -1)
        if E is not None and E.shape[1] != self.embed_dim:
            E = None
        return float(d.local.predict(X, E)[0]), float(d.frontier.predict(X, E)[0]), d.mode, d.reason

    def uses_uplift(self, domain: str | None) -> bool:
        """False when the domain's prior policy is the escalation classifier (the router then
        routes on ``p_frontier`` alone)."""
        d = self.domains.get(domain) if domain is not None else None
        if d is None:  # no domain, or one never trained on: the classifier and its calibrated share
            return False
        return d.mode == "model" or d.prior != "escalation"

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{domain: {mode, reason, n_runs, p_local, p_frontier}}`` (manifest, ``GET /v1/runs``)."""
        return {
            k: {
                "mode": d.mode,
                "reason": d.reason,
                "prior": d.prior,
                "n_runs": d.n_runs,
                "p_local": d.p_local,
                "p_frontier": d.p_frontier,
            }
            for k, d in sorted(self.domains.items())
        }
