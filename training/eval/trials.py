"""Per-trial outcomes and task-bootstrap intervals: the one outcome model every evaluation reads.

Algorithm:

- **Expected success per (task, player)** (:func:`task_success`): the mean of the player's trial
  outcomes on the task (success = 1, failure = 0; runs with an unknown outcome are left out), with
  the number of trials beside it. Never a majority vote: two trials that split 1-1 give 0.5 (a tie
  is explicit), a single trial gives its own outcome (``trials == 1`` says so). A *player* is a
  name that matches a run's ``agent``, its ``model`` or ``agent/model`` (the roles written by
  :mod:`features.importers.pairing`, which name the strong side ``strong_model``).
- **Strong side of a weak run** (:func:`strong_expectation`): for every weak run that names its
  ``strong_model``, the strong player's expected success on the run's task over all the strong
  player's trials present in the frame; where the frame holds none of the strong player's runs
  (a log written without them), the run's own ``strong_outcome`` label stands (one trial).
- **Task bootstrap** (:func:`bootstrap_mean_ci`): per-run values grouped by task; ``n_boot``
  resamples of the *tasks* with replacement (seeded), each resample's mean over the runs of the drawn
  tasks; the interval is the ``(alpha/2, 1-alpha/2)`` percentiles. Runs of one task are correlated
  (same task, same strong expectation), so resampling runs would understate the width.
- **Paired differences** (:func:`paired_diff_ci`): two policies scored on the same runs; the
  per-run difference is bootstrapped over tasks the same way, so the comparison's interval carries
  the pairing (it is much narrower than the two marginal intervals).

Knobs: ``n_boot`` (resamples, default 1000), ``alpha`` (0.05: a 95% interval), ``seed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Interval",
    "task_success",
    "strong_expectation",
    "bootstrap_mean_ci",
    "paired_diff_ci",
]

N_BOOT = 1000
ALPHA = 0.05


@dataclass(frozen=True)
class Interval:
    """A mean with its task-bootstrap interval and standard error (``n_tasks`` groups)."""

    mean: float
    low: float
    high: float
    se: float
    n_tasks: int

    def covers(self, x: float) -> bool:
        return self.low - 1e-12 <= x <= self.high + 1e-12


def _player_mask(runs: Any, name: str) -> Any:
    agent = runs["agent"].fillna("?").astype(str) if "agent" in runs.columns else None
    model = runs["model"].fillna("?").astype(str)
    m = model == name
    if agent is not None:
        m = m | (agent == name) | ((agent + "/" + model) == name)
    return m


def task_success(runs: Any, player: str) -> Any:
    """Frame indexed by task_id: ``p`` (mean trial success of ``player``) and ``trials`` (count)."""
    import pandas as pd

    r = runs[runs["task_id"].notna() & runs["outcome"].isin(["success", "failure"])]
    r = r[_player_mask(r, player)]
    ok = (r["outcome"] == "success").astype(float)
    g = ok.groupby(r["task_id"].astype(str))
    return pd.DataFrame({"p": g.mean(), "trials": g.size()})


def strong_expectation(runs: Any) -> dict[str, tuple[float, int]]:
    """run_id -> (expected strong success on the run's task, strong trials) for every run naming a
    ``strong_model`` whose task the strong player ran in ``runs`` (the module docstring)."""
    if runs is None or len(runs) == 0 or "strong_model" not in runs.columns:
        return {}
    named = runs[runs["strong_model"].notna() & runs["task_id"].notna()]
    out: dict[str, tuple[float, int]] = {}
    for player, g in named.groupby(named["strong_model"].astype(str)):
        table = task_success(runs, str(player))
        if table.empty:
            continue
        p = table["p"].to_dict()
        n = table["trials"].to_dict()
        for rid, tid in zip(g["run_id"].astype(str), g["task_id"].astype(str), strict=True):
            if tid in p:
                out[rid] = (float(p[tid]), int(n[tid]))
    return out


def _boot_means(
    values: np.ndarray, groups: Sequence[Any], n_boot: int, seed: int
) -> tuple[float, np.ndarray, int]:
    v = np.asarray(values, dtype=float)
    _, inv = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    t = int(inv.max()) + 1 if len(inv) else 0
    sums = np.bincount(inv, weights=v, minlength=t)
    counts = np.bincount(inv, minlength=t).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(t, np.full(t, 1.0 / t), size=n_boot).astype(float) if t else np.zeros((0, 0))
    means = (draws @ sums) / np.maximum(draws @ counts, 1e-12)
    return float(v.mean()) if len(v) else math.nan, means, t


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray,
    groups: Sequence[Any],
    *,
    n_boot: int = N_BOOT,
    alpha: float = ALPHA,
    seed: int = 0,
) -> Interval | None:
    """Mean of ``values`` with its task-bootstrap interval (``groups``: the task of each value)."""
    if len(values) == 0:
        return None
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values for {len(groups)} groups")
    mean, means, t = _boot_means(np.asarray(values, dtype=float), groups, n_boot, seed)
    if t < 2:
        return Interval(mean, mean, mean, 0.0, t)
    lo, hi = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return Interval(mean, float(lo), float(hi), float(np.std(means, ddof=1)), t)


def paired_diff_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    groups: Sequence[Any],
    *,
    n_boot: int = N_BOOT,
    alpha: float = ALPHA,
    seed: int = 0,
) -> Interval | None:
    """``mean(a - b)`` over the same runs with its task-bootstrap interval (a paired comparison)."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape:
        raise ValueError(f"paired difference needs the same runs ({a_.shape} vs {b_.shape})")
    return bootstrap_mean_ci(a_ - b_, groups, n_boot=n_boot, alpha=alpha, seed=seed)
