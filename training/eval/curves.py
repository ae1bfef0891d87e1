"""Frontier-relative figures of a policy's cost-quality points: cost at a quality target, and AIQ.

A policy has one or more (cost, quality) operating points (its own, plus its threshold sweep for
swept policies); always-local and always-frontier give the two ends.

- :func:`cost_at_quality` (**cost at 95% of always-frontier success** in the scorecard): the
  cheapest point whose quality is at least the target (``0.95 x`` always-frontier's success); None if
  no point reaches it.
- :func:`hull_curve` / :func:`aiq` (**AIQ**, average improvement in quality, after RouterBench): the
  area under the policy's non-decreasing concave cost-quality hull on a *normalised cost axis*
  ``x = (cost - c_local) / (c_frontier - c_local)`` (0 = always-local's cost, 1 = always-frontier's),
  over ``x in [0, 1]``. The hull is built from the policy's points plus the always-local point, i.e.
  what can be reached by randomly mixing the policy's operating points with always-local per run; the
  curve is flat beyond the policy's most expensive useful point. Always-local scores its success
  rate; always-frontier scores the mean of the two endpoints (the random-mixing line); a policy
  above that line routes better than chance.

Knobs: the quality ``target`` of :func:`cost_at_quality` (the caller passes 0.95 x always-frontier's
success) and the ``grid`` resolution of :func:`hull_curve` (1001 points on [0, 1]).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["cost_at_quality", "hull_curve", "aiq"]


def cost_at_quality(points: Iterable[tuple[float, float]], target: float | None) -> float | None:
    """Cheapest cost among (cost, quality) points with quality >= target (None if none, or no target)."""
    if target is None:
        return None
    ok = [c for c, q in points if q is not None and q >= target - 1e-12]
    return min(ok) if ok else None


def _normalise(points: Iterable[tuple[float, float]], c_lo: float, c_hi: float) -> list[tuple[float, float]]:
    span = c_hi - c_lo
    return [((c - c_lo) / span, q) for c, q in points if q is not None]


def hull_curve(
    points: Iterable[tuple[float, float]],
    anchor: tuple[float, float],
    c_lo: float,
    c_hi: float,
    grid: int = 1001,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The non-decreasing concave hull R(x) on x in [0, 1] (normalised cost), or None if c_hi <= c_lo.

    R(x) = the best quality reachable with normalised cost <= x by mixing at most two points
    (a budget-constrained mixture's optimum uses at most two), ``anchor`` (always-local) included.
    """
    if not c_hi > c_lo:
        return None
    pts = _normalise([anchor, *points], c_lo, c_hi)
    xs = np.array([p[0] for p in pts], dtype=float)
    qs = np.array([p[1] for p in pts], dtype=float)
    x = np.linspace(0.0, 1.0, grid)
    best = np.full(grid, np.nan)
    # single points
    for xi, qi in zip(xs, qs, strict=True):
        m = x >= xi - 1e-12
        best[m] = np.fmax(best[m], qi)
    # pairs (i cheaper than j): the mixing line between them, for x in [x_i, x_j]
    for i in range(len(xs)):
        for j in range(len(xs)):
            if xs[j] <= xs[i] + 1e-12 or qs[j] <= qs[i]:
                continue
            m = (x >= xs[i]) & (x <= xs[j])
            line = qs[i] + (qs[j] - qs[i]) * (x[m] - xs[i]) / (xs[j] - xs[i])
            best[m] = np.fmax(best[m], line)
    best = np.fmax.accumulate(np.where(np.isnan(best), -np.inf, best))
    best[np.isinf(best)] = np.nan
    return x, best


def aiq(
    points: Iterable[tuple[float, float]], anchor: tuple[float, float], c_lo: float, c_hi: float
) -> float | None:
    """Area under :func:`hull_curve` over x in [0, 1] (undefined stretches count 0); None if c_hi <= c_lo."""
    h = hull_curve(points, anchor, c_lo, c_hi)
    if h is None:
        return None
    x, r = h
    y = np.nan_to_num(r, nan=0.0)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0)
