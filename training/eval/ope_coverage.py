"""Coverage of the off-policy intervals in worlds built from the real tau2 trajectories.

A *world* is a population of real weak runs whose every quantity the study needs comes from the
shipped paired data (:func:`training.eval.outcome.records_from_frames`): each run's step count,
token counts and prefix reuse (so its per-step cost on either tier,
:func:`training.eval.outcome.step_costs`, the one warm-prefix rule), the weak
run's own outcome, the strong player's expected success on its task (the one outcome model,
:mod:`training.eval.trials`) and the step of its first failed tool result. Algorithm of
:func:`coverage_study`:

1. **Worlds**: per domain, ``runs`` runs drawn with replacement from the domain's weak runs
   (seeded; ``worlds_per_domain`` draws with different seeds).
2. **Logging policy (known)**: a run starts on the frontier with probability ``start_frontier``;
   while it is local, each later step escalates with probability ``hazard``; once on the frontier it
   stays (propensity 1). Each step logs its action and that propensity.
3. **Outcomes** (escalate-anytime): an escalated run succeeds with probability ``strong_p`` (drawn),
   a local one keeps the weak run's own outcome; ``success`` is rewarded at the last step, ``cost``
   (USD) per step on the tier it ran.
4. **Candidates** (deterministic, reading only what a run has shown so far): always-local,
   always-frontier, escalate at step 0 when the first prompt is longer than the world's median
   first prompt, escalate at the first failed tool result, escalate when the run reaches step
   ``late_step``. Their **truth** in a world is exact: the mean over its runs of the outcome model's
   expected success and cost under the candidate's tiers (no draw).
5. **Estimates**: :func:`training.eval.ope.estimate` (IPS, SNIPS, DR; ``n_boot`` bootstrap
   replicates, 95% intervals, the feasible range as bounds: success in [0, 1], cost >= 0, net <= 1);
   DR's model is the logs' mean success of runs that ended on each tier (a constant per action, fitted
   on the logs; DR stays unbiased whatever the model). A candidate whose effective sample size is
   below ``min_ess`` is refused (counted apart, as :func:`training.eval.ope_eval.evaluate_policies`
   does). Coverage = share of (candidate, world) pairs whose DR 95% interval of ``net`` (success -
   cost) holds the truth; a candidate whose decisions in a world equal an earlier one's (e.g. the
   first tool error where no tool ever fails) is marked ``same_as`` and is not a distinct pair.

Knobs: ``runs``, ``worlds_per_domain``, ``start_frontier``, ``hazard``, ``late_step``, ``n_boot``,
``min_ess``, ``seed``, ``prices``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.eval.ope import StepTable, estimate
from training.eval.outcome import FRONTIER, LOCAL, Prices, RunRecord, run_costs, run_success, step_costs

__all__ = ["CoveragePair", "coverage_study", "step_costs", "CANDIDATES"]

Candidate = Callable[[RunRecord, dict[str, float]], int | None]  # -> escalation step (None: local)


def _first_prompt_long(rec: RunRecord, ctx: dict[str, float]) -> int | None:
    return 0 if rec.prompt[0] > ctx["median_first_prompt"] else None


def _first_error(rec: RunRecord, ctx: dict[str, float]) -> int | None:
    return rec.first_error_step


def _late(rec: RunRecord, ctx: dict[str, float]) -> int | None:
    k = int(ctx["late_step"])
    return k if rec.n_steps > k else None


CANDIDATES: dict[str, Candidate] = {
    "always-local": lambda rec, ctx: None,
    "always-frontier": lambda rec, ctx: 0,
    "long-first-prompt": _first_prompt_long,
    "first-tool-error": _first_error,
    "late-step": _late,
}


@dataclass
class CoveragePair:
    world: str
    candidate: str
    truth: dict[str, float]
    estimates: dict[str, dict[str, Any]]  # estimator -> metric -> Estimate
    ess: float
    refused: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def covered(self, estimator: str = "dr", metric: str = "net") -> bool:
        return bool(self.estimates[estimator][metric].covers(self.truth[metric]))


def _tiers(k: int | None, n: int) -> np.ndarray:
    t = np.full(n, LOCAL, dtype=np.int64)
    if k is not None:
        t[k:] = FRONTIER
    return t


def _log_world(
    runs: Sequence[RunRecord], rng: np.random.Generator, start_frontier: float, hazard: float, prices: Prices
) -> tuple[list[int | None], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Step 2-3: the logged escalation step of every run, per-step action and propensity, rewards."""
    ks: list[int | None] = []
    acts, props, succ, cost = [], [], [], []
    for rec in runs:
        n = rec.n_steps
        k: int | None = None
        mu = np.ones(n)
        for j in range(n):
            p = start_frontier if j == 0 else hazard
            if rng.random() < p:
                k = j
                mu[j] = p
                break
            mu[j] = 1.0 - p
        t = _tiers(k, n)
        ks.append(k)
        acts.append(t.astype(np.int8))
        props.append(mu)
        s = np.zeros(n)
        strong = rec.strong_expected or 0.0
        s[-1] = float(rng.random() < strong) if k is not None else (1.0 if rec.weak_success else 0.0)
        succ.append(s)
        cost.append(step_costs(rec, t, prices))
    return (
        ks,
        np.concatenate(acts),
        np.concatenate(props),
        {"success": np.concatenate(succ), "cost": np.concatenate(cost)},
    )


def _candidate_probs(
    runs: Sequence[RunRecord], kc: list[int | None], a: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """pi (the candidate's probability of the logged action) and pf per logged step."""
    pf = np.concatenate([_tiers(k, r.n_steps).astype(float) for r, k in zip(runs, kc, strict=True)])
    pi = np.where(a == 1, pf, 1.0 - pf)
    return pi, pf


def coverage_study(
    records: dict[str, RunRecord],
    *,
    runs: int = 400,
    worlds_per_domain: int = 2,
    start_frontier: float = 0.3,
    hazard: float = 0.12,
    late_step: int = 3,
    n_boot: int = 400,
    min_ess: float = 10.0,
    seed: int = 0,
    prices: Prices | None = None,
) -> list[CoveragePair]:
    """Every (candidate, world) pair of the module docstring's study."""
    pr = prices or Prices()
    by_dom: dict[str, list[RunRecord]] = {}
    for rec in records.values():
        if rec.quality_known and rec.task_id and "/" in rec.task_id:
            by_dom.setdefault(rec.task_id.split("/", 1)[0], []).append(rec)
    bounds = {"success": (0.0, 1.0), "cost": (0.0, np.inf), "net": (-np.inf, 1.0)}
    out: list[CoveragePair] = []
    for di, dom in enumerate(sorted(by_dom)):
        pool = sorted(by_dom[dom], key=lambda r: r.run_id)
        for wi in range(worlds_per_domain):
            rng = np.random.default_rng([seed, di, wi])
            world = [pool[i] for i in rng.integers(0, len(pool), runs)]
            name = f"{dom}#{wi}"
            ks, a, mu, rewards = _log_world(world, rng, start_frontier, hazard, pr)
            ptr = np.concatenate([[0], np.cumsum([r.n_steps for r in world])]).astype(np.int64)
            last = ptr[1:] - 1
            ended_f = np.array([k is not None for k in ks])
            s_end = rewards["success"][last]
            q_f = float(s_end[ended_f].mean()) if ended_f.any() else 0.0
            q_l = float(s_end[~ended_f].mean()) if (~ended_f).any() else 0.0
            n_steps = len(a)
            ctx = {
                "median_first_prompt": float(np.median([r.prompt[0] for r in world])),
                "late_step": float(late_step),
            }
            seen: dict[tuple[int, ...], str] = {}
            for cname, cand in CANDIDATES.items():
                kc = [cand(r, ctx) for r in world]
                key = tuple(-1 if k is None else k for k in kc)
                same_as = seen.setdefault(key, cname)
                pi, pf = _candidate_probs(world, kc, a)
                table = StepTable(
                    ptr=ptr,
                    a=a,
                    mu=mu,
                    pi=pi,
                    pf=pf,
                    rewards=rewards,
                    q={"success": (np.full(n_steps, q_l), np.full(n_steps, q_f))},
                )
                est, _, diag = estimate(
                    table,
                    ("success", "cost"),
                    {"net": {"success": 1.0, "cost": -1.0}},
                    n_boot=n_boot,
                    seed=seed * 1000 + di * 10 + wi,
                    bounds=bounds,
                )
                succ = np.array(
                    [run_success(r, _tiers(k, r.n_steps)) or 0.0 for r, k in zip(world, kc, strict=True)]
                )
                cst = np.array(
                    [run_costs(r, _tiers(k, r.n_steps), pr)[0] for r, k in zip(world, kc, strict=True)]
                )
                truth = {
                    "success": float(succ.mean()),
                    "cost": float(cst.mean()),
                    "net": float((succ - cst).mean()),
                }
                out.append(
                    CoveragePair(
                        world=name,
                        candidate=cname,
                        truth=truth,
                        estimates=est,
                        ess=float(diag["ess"]),
                        refused=float(diag["ess"]) < min_ess,
                        extra={
                            "escalated": float(np.mean([k is not None for k in kc])),
                            # the same decisions as an earlier candidate in this world (not a distinct pair)
                            "same_as": None if same_as == cname else same_as,
                        },
                    )
                )
    return out
