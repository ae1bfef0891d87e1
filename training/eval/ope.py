"""Off-policy estimators over logged runs: per-decision IPS, self-normalised IPS, doubly robust.

The data is a table of logged steps grouped by run (:class:`StepTable`): the logged action ``a_k``
(1 = frontier, 0 = local), the logging policy's propensity ``mu_k = mu(a_k | h_k)``, the candidate
policy's probability of that action ``pi_k = pi(a_k | h_k)`` and of the frontier ``pf_k`` (a
deterministic candidate: 0 or 1, known up to and including its first deviation from the log;
nothing after it is needed), the per-step rewards of each metric and, for DR, a model's
``Q(s_k, a)`` for both actions. With the cumulative weight ``w_k = prod_{j<=k} pi_j / mu_j``
(``w_-1 = 1``) and ``W = w_{T-1}`` per run, each run contributes:

- **IPS** (per-decision importance sampling): ``sum_k w_k r_k``;
- **SNIPS** (self-normalised, trajectory-wise): ``W * G`` over ``W`` (``G = sum_k r_k``); the
  estimate is ``sum_i W_i G_i / sum_i W_i``;
- **DR** (per-decision doubly robust, Jiang & Li 2016):
  ``sum_k [ w_k (r_k - Q(s_k, a_k)) + w_{k-1} V(s_k) ]`` with ``V(s_k) = pf_k Q(s_k, F) + (1 -
  pf_k) Q(s_k, L)``: unbiased whenever the propensities are right, whatever the model; a good model
  lowers the variance. Without a model (``Q = 0``) DR is IPS.

IPS and DR are means of the runs' contributions; confidence intervals are percentile bootstrap
intervals over runs (Poisson(1) resampling weights, ``n_boot`` replicates, seeded, drawn in blocks
so memory stays O(block x runs)). The effective sample size is ``(sum W)^2 / sum W^2``.

Metrics (:func:`estimate`): any set of per-step reward arrays (``success``: 1 at a successful
run's last step; ``cost``: USD per step; ``escalated``: 1 at a run's first frontier step) plus
linear combinations of them computed on the same bootstrap replicates (``net = v * success -
cost``). **Feasible range**: ``bounds`` (metric -> (lo, hi), either side may be infinite) clips the
point and every bootstrap replicate to what the metric can be (a success rate in [0, 1], a net
value at most ``v``): IPS and DR are unbiased but not bounded, and a weight of 30 on one run can put
an estimate of success at 1.2; ``diagnostics["clipped"]`` counts the (estimator, metric) points
that were clipped. Knobs: ``n_boot``, ``alpha`` (0.05: 95% intervals), ``seed``, ``block``,
``bounds``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["StepTable", "Estimate", "run_weights", "contributions", "estimate", "bootstrap", "ESTIMATORS"]

ESTIMATORS = ("ips", "snips", "dr")


@dataclass
class StepTable:
    """Logged steps of ``n`` runs, concatenated; run ``i`` is ``[ptr[i], ptr[i+1])``."""

    ptr: np.ndarray  # int64, n + 1
    a: np.ndarray  # int8, logged action (1 = frontier)
    mu: np.ndarray  # logging propensity of a
    pi: np.ndarray  # candidate's probability of a
    pf: np.ndarray  # candidate's probability of the frontier
    rewards: dict[str, np.ndarray] = field(default_factory=dict)
    q: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # metric -> (Q_L, Q_F)

    @property
    def n_runs(self) -> int:
        return len(self.ptr) - 1

    def run_of_step(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_runs), np.diff(self.ptr))


def run_weights(t: StepTable) -> tuple[np.ndarray, np.ndarray]:
    """``(w_k per step, w_{k-1} per step)``: cumulative importance weights within each run."""
    if np.any(t.mu <= 0):
        raise ValueError("a logged propensity is 0: the logged action could not have been taken")
    rho = t.pi / t.mu
    if len(rho) == 0:
        return rho, rho.copy()
    # segment-wise cumulative products in log space; exact zeros counted apart
    zero = rho <= 0.0
    lg = np.log(np.where(zero, 1.0, rho))
    run = t.run_of_step()
    starts = t.ptr[:-1][run]
    cl = np.cumsum(lg)
    cz = np.cumsum(zero)
    base_l = np.where(starts > 0, cl[np.maximum(starts - 1, 0)], 0.0)
    base_z = np.where(starts > 0, cz[np.maximum(starts - 1, 0)], 0)
    w = np.exp(cl - base_l) * ((cz - base_z) == 0)
    prev = np.ones_like(w)
    first = np.zeros(len(w), dtype=bool)
    first[t.ptr[:-1][np.diff(t.ptr) > 0]] = True
    prev[~first] = w[np.flatnonzero(~first) - 1]
    return w, prev


def contributions(t: StepTable, metric: str) -> dict[str, np.ndarray]:
    """Per-run contributions of ``metric``: ``ips``, ``dr`` (means are the estimates), and for SNIPS
    the numerator ``snips_num`` (W * G) and denominator ``snips_den`` (W)."""
    w, prev = run_weights(t)
    r = t.rewards[metric]
    idx = t.ptr[:-1]
    nonempty = np.diff(t.ptr) > 0

    def per_run(x: np.ndarray) -> np.ndarray:
        out = np.zeros(t.n_runs)
        if len(x):
            out[nonempty] = np.add.reduceat(x, idx[nonempty])
        return out

    last = t.ptr[1:] - 1
    W = np.where(nonempty, w[np.maximum(last, 0)] if len(w) else 0.0, 1.0)
    G = per_run(r)
    out = {"ips": per_run(w * r), "snips_num": W * G, "snips_den": W}
    if metric in t.q:
        q_l, q_f = t.q[metric]
        q_a = np.where(t.a == 1, q_f, q_l)
        v = t.pf * q_f + (1.0 - t.pf) * q_l
        out["dr"] = per_run(w * (r - q_a) + prev * v)
    else:
        out["dr"] = out["ips"]
    return out


@dataclass
class Estimate:
    """One metric by one estimator: point, bootstrap interval, half-width."""

    value: float | None
    lo: float | None
    hi: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.lo is None or self.hi is None else (self.hi - self.lo) / 2.0

    def covers(self, x: float) -> bool:
        return self.lo is not None and self.hi is not None and self.lo <= x <= self.hi

    def as_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "half_width": self.half_width}


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def bootstrap(
    parts: Mapping[str, np.ndarray], n_runs: int, *, n_boot: int, seed: int, block: int = 64
) -> dict[str, np.ndarray]:
    """Replicates of the *sums* of each per-run vector in ``parts`` (Poisson(1) run weights), plus
    ``__n`` (the replicate's run count). Every caller with the same seed and run count gets the
    same replicates, so estimates of several candidates (and their differences) are paired."""
    rng = np.random.default_rng(seed)
    out = {k: np.empty(n_boot) for k in parts}
    out["__n"] = np.empty(n_boot)
    mat = (
        np.vstack([np.asarray(v, dtype=np.float64) for v in parts.values()])
        if parts
        else np.zeros((0, n_runs))
    )
    done = 0
    while done < n_boot:
        b = min(block, n_boot - done)
        m = rng.poisson(1.0, size=(b, n_runs)).astype(np.float64)
        sums = m @ mat.T  # b x parts
        for j, k in enumerate(parts):
            out[k][done : done + b] = sums[:, j]
        out["__n"][done : done + b] = m.sum(axis=1)
        done += b
    return out


def estimate(
    t: StepTable,
    metrics: tuple[str, ...],
    combos: Mapping[str, Mapping[str, float]] | None = None,
    *,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[dict[str, dict[str, Estimate]], dict[str, np.ndarray], dict[str, float]]:
    """Every estimator of every metric (and linear ``combos``: name -> {metric: coefficient}).

    Returns ``(estimates[estimator][metric], replicates["<estimator>:<metric>"], diagnostics)``;
    diagnostics: ``ess``, ``matched_runs`` (runs with W > 0), ``n_runs``, ``max_weight``,
    ``clipped`` (points moved into ``bounds``)."""
    n = t.n_runs
    if n == 0:
        raise ValueError("no logged runs to evaluate on")
    per: dict[str, dict[str, np.ndarray]] = {m: contributions(t, m) for m in metrics}
    combos = dict(combos or {})
    for name, coefs in combos.items():
        combo: dict[str, np.ndarray] = {"snips_den": per[next(iter(coefs))]["snips_den"]}
        for k in ("ips", "dr", "snips_num"):
            acc = np.zeros(n)
            for m, coef in coefs.items():
                acc = acc + coef * per[m][k]
            combo[k] = acc
        per[name] = combo
    parts: dict[str, np.ndarray] = {}
    for m, c in per.items():
        parts[f"ips:{m}"] = c["ips"]
        parts[f"dr:{m}"] = c["dr"]
        parts[f"snips_num:{m}"] = c["snips_num"]
    first = next(iter(per.values()))
    parts["snips_den"] = first["snips_den"]
    reps = bootstrap(parts, n, n_boot=n_boot, seed=seed)
    q = (100 * alpha / 2, 100 * (1 - alpha / 2))
    est: dict[str, dict[str, Estimate]] = {e: {} for e in ESTIMATORS}
    replicates: dict[str, np.ndarray] = {}
    den_sum = float(first["snips_den"].sum())
    clipped = 0
    for m, c in per.items():
        b_lo, b_hi = (bounds or {}).get(m, (-np.inf, np.inf))
        for e in ESTIMATORS:
            if e == "snips":
                point = float(c["snips_num"].sum() / den_sum) if den_sum > 0 else None
                rep = _ratio(reps[f"snips_num:{m}"], reps["snips_den"])
            else:
                point = float(c[e].mean())
                rep = reps[f"{e}:{m}"] / np.maximum(reps["__n"], 1.0)
            if point is not None and not b_lo <= point <= b_hi:
                clipped += 1
                point = float(min(max(point, b_lo), b_hi))
            rep = np.clip(rep, b_lo, b_hi)
            ok = rep[np.isfinite(rep)]
            lo, hi = (
                (float(np.percentile(ok, q[0])), float(np.percentile(ok, q[1]))) if ok.size else (None, None)
            )
            est[e][m] = Estimate(point, lo, hi)
            replicates[f"{e}:{m}"] = rep
    W = first["snips_den"]
    diag = {
        "n_runs": float(n),
        "ess": float(W.sum() ** 2 / np.sum(W**2)) if np.sum(W**2) > 0 else 0.0,
        "matched_runs": float(np.sum(W > 0)),
        "max_weight": float(W.max()) if len(W) else 0.0,
        "clipped": float(clipped),
    }
    return est, replicates, diag
