"""Uplift and routing-quality measures for paired outcomes, with task-bootstrap standard errors.

Paired data observes both arms of a unit (a weak run's own outcome ``y_local`` and the strong
model's outcome on the same task ``y_frontier``), so the unit's uplift ``tau = y_frontier - y_local``
(-1, 0 or 1) is known and the measures need no treatment/control reweighting. (scikit-uplift 0.5.1
installs with our pins, but its ``qini_auc_score`` assumes one observed arm per unit; these are the
paired-data forms, tested on worked examples in ``tests/test_uplift.py``.)

- :func:`qini_curve`: sort units by score, descending (ties broken by the mean of the tied group's
  uplift, i.e. a tie is a random order in expectation); ``Q(k) = sum of tau over the top k``,
  ``Q(0) = 0``.
- :func:`auuc`: area under the uplift curve per unit, ``sum_k Q(k) / n^2`` for k = 1..n.
- :func:`qini_coefficient`: ``(A_model - A_random) / (A_perfect - A_random)`` with ``A = sum_k Q(k)``,
  the random curve ``k/n x Q(n)`` and the perfect curve the curve of ``tau`` sorted descending:
  1 = perfect ranking, 0 = random, negative = worse than random; NaN when perfect = random.
- :func:`aiq`: average quality of routing by the score: escalate the top share ``q`` of units
  (q on a grid of ``points`` values from 0 to 1), quality(q) = mean outcome (frontier outcome for
  the escalated, local for the rest); AIQ = the trapezoid mean over q. Random mixing gives the line
  between all-local and all-frontier quality.
- :func:`auc`, :func:`brier`, :func:`ece` (equal-width bins).
- :func:`bootstrap_se`: the SE of any of these over resamples of *tasks* (whole groups), seeded.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["qini_curve", "auuc", "qini_coefficient", "aiq", "auc", "brier", "ece", "bootstrap_se"]


def _order(score: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """tau in score order (descending), tied groups replaced by their mean (expected random order)."""
    s = np.asarray(score, dtype=np.float64)
    t = np.asarray(tau, dtype=np.float64)
    idx = np.argsort(-s, kind="stable")
    s, t = s[idx], t[idx]
    out = t.copy()
    _, start, counts = np.unique(-s, return_index=True, return_counts=True)
    for a, c in zip(start, counts, strict=True):
        if c > 1:
            out[a : a + c] = t[a : a + c].mean()
    return out


def qini_curve(score: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """``Q(0..n)``: cumulative uplift of the top-k units by score (module docstring)."""
    return np.concatenate([[0.0], np.cumsum(_order(score, tau))])


def auuc(score: np.ndarray, tau: np.ndarray) -> float:
    q = qini_curve(score, tau)
    n = len(q) - 1
    return float(q[1:].sum() / (n * n)) if n else float("nan")


def qini_coefficient(score: np.ndarray, tau: np.ndarray) -> float:
    t = np.asarray(tau, dtype=np.float64)
    n = len(t)
    if n == 0:
        return float("nan")
    model = qini_curve(score, t)[1:].sum()
    perfect = np.cumsum(np.sort(t)[::-1]).sum()
    rand = (np.arange(1, n + 1) / n * t.sum()).sum()
    if np.isclose(perfect, rand):
        return float("nan")
    return float((model - rand) / (perfect - rand))


def aiq(score: np.ndarray, y_local: np.ndarray, y_frontier: np.ndarray, points: int = 21) -> float:
    """Average routing quality over escalation shares 0..1 (module docstring)."""
    yl = np.asarray(y_local, dtype=np.float64)
    yf = np.asarray(y_frontier, dtype=np.float64)
    n = len(yl)
    if n == 0:
        return float("nan")
    gain = qini_curve(score, yf - yl)  # extra successes from escalating the top k
    ks = np.linspace(0.0, n, points)
    qual = (yl.sum() + np.interp(ks, np.arange(n + 1), gain)) / n
    return float(np.trapezoid(qual, ks / n))


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC (Mann-Whitney, ties count one half); NaN with one class."""
    y = np.asarray(y, dtype=np.float64)
    s = np.asarray(score, dtype=np.float64)
    n_pos = int((y == 1).sum())
    n_neg = int((y == 0).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1, dtype=np.float64)
    # average ranks of ties
    _, start, counts = np.unique(ss, return_index=True, return_counts=True)
    if len(start) < len(ss):
        avg = start + (counts + 1) / 2.0
        ranks[order] = np.repeat(avg, counts)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def brier(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean((np.asarray(p, dtype=np.float64) - np.asarray(y, dtype=np.float64)) ** 2))


def ece(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    b = np.minimum((p * bins).astype(int), bins - 1)
    tot = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            tot += m.sum() * abs(p[m].mean() - y[m].mean())
    return float(tot / max(len(y), 1))


def bootstrap_se(
    stat: Callable[[np.ndarray], float], groups: np.ndarray, n_boot: int = 200, seed: int = 0
) -> float:
    """SE of ``stat(rows)`` over resamples of whole groups (tasks) with replacement; NaN
    resamples (one class drawn) are skipped."""
    g = np.asarray(groups)
    uniq, inv = np.unique(g, return_inverse=True)
    members = [np.flatnonzero(inv == i) for i in range(len(uniq))]
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(uniq), len(uniq))
        rows = np.concatenate([members[i] for i in pick])
        v = stat(rows)
        if np.isfinite(v):
            vals.append(v)
    return float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")
