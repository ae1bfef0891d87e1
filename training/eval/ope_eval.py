"""Off-policy evaluation of candidate policies on logged runs: the job behind ``runroute evaluate``.

Algorithm of :func:`evaluate_policies`:

1. :func:`training.eval.ope_replay.load_logged` (refuses logs without propensities; leaves out
   runs without an outcome) and, for DR, the cross-fitted outcome model
   (:func:`training.eval.ope_model.fit_q`), once per log.
2. Each candidate, and the two reference policies ``always-local`` / ``always-frontier``, is
   replayed on the logged prefixes (:func:`training.eval.ope_replay.replay_candidate`). A
   candidate that deviates from the log where the logged propensity was 1 on more than
   ``max_unsupported_share`` of the runs is refused (:class:`OPEError`, one line: the logs never
   explored what it does there); below that share its unsupported runs weigh 0 (a bias the report
   states with the share).
3. Estimates (:mod:`training.eval.ope`): success rate, cost per run (USD), escalation rate and net
   value per run ``value_of_success x success - cost`` by IPS, SNIPS and DR, each with a bootstrap
   interval (the same replicates for every candidate: differences are paired), the effective
   sample size and the matched runs. AIQ per estimator from the candidate's (cost, success) with
   always-local / always-frontier as the ends (:func:`training.eval.curves.aiq`), its interval from
   the same replicates.

4. **Inside the truth**: every estimate and interval is clipped to its metric's feasible range
   (:data:`METRIC_BOUNDS`; net value at most ``value_of_success``); a candidate whose effective
   sample size is below ``min_ess`` is refused (:class:`OPEError` naming the ESS: a handful of
   matched runs carry the whole estimate and its bootstrap interval is not to be trusted).

Knobs: ``prices``, ``value_of_success``, ``backends``, ``n_boot``, ``alpha``, ``seed``, ``min_ess``, ``dm``
(fit the DR model; False: DR = IPS), ``max_unsupported_share``, ``skip_unsupported`` (leave a refused candidate out, with the reason
in ``OPEReport.refused``, instead of raising), ``references`` (False: skip the
reference policies and AIQ).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.eval.ope import ESTIMATORS, Estimate, StepTable, estimate
from training.eval.ope_replay import CachedPredictor, LoggedRuns, OPEError, load_logged, replay_candidate
from training.eval.outcome import Prices

__all__ = ["CandidateResult", "OPEReport", "evaluate_policies", "OPEError", "METRICS", "step_table"]

METRICS = ("success", "cost", "escalated", "net")
# feasible range of each metric per run (net's upper end is value_of_success, set per call)
METRIC_BOUNDS: dict[str, tuple[float, float]] = {
    "success": (0.0, 1.0),
    "escalated": (0.0, 1.0),
    "cost": (0.0, float("inf")),
    "net": (float("-inf"), float("inf")),
}
MIN_ESS = 10.0
REFS = ("always-local", "always-frontier")


@dataclass
class CandidateResult:
    name: str
    estimates: dict[str, dict[str, Estimate]]  # estimator -> metric -> estimate
    diagnostics: dict[str, float]
    replicates: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    def value(self, estimator: str, metric: str) -> float | None:
        return self.estimates[estimator][metric].value

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "estimates": {e: {m: x.as_dict() for m, x in ms.items()} for e, ms in self.estimates.items()},
            "diagnostics": self.diagnostics,
        }


@dataclass
class OPEReport:
    n_runs: int
    n_steps: int
    explored_runs: int
    left_out: dict[str, int]
    value_of_success: float
    candidates: dict[str, CandidateResult]
    references: dict[str, CandidateResult]
    wall_s: float = 0.0
    refused: dict[str, str] = field(default_factory=dict)  # candidate -> why (skip_unsupported)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_runs": self.n_runs,
            "n_steps": self.n_steps,
            "explored_runs": self.explored_runs,
            "left_out": self.left_out,
            "value_of_success_usd": self.value_of_success,
            "wall_s": self.wall_s,
            "runs_per_s": self.n_runs * (len(self.candidates) + len(self.references)) / self.wall_s
            if self.wall_s > 0
            else None,
            "candidates": {k: v.to_json() for k, v in self.candidates.items()},
            "refused": self.refused,
            "references": {k: v.to_json() for k, v in self.references.items()},
        }


def step_table(logged: LoggedRuns, pi: np.ndarray, pf: np.ndarray, q: Mapping[str, Any] | None) -> StepTable:
    """The estimators' input for one candidate: rewards ``success`` (at a run's last step),
    ``cost`` (per step) and ``escalated`` (at a run's first frontier step)."""
    n = len(logged.a)
    succ = np.zeros(n)
    last = logged.ptr[1:] - 1
    succ[last] = logged.success
    a = logged.a.astype(np.int64)
    lens = np.diff(logged.ptr)
    csum = np.cumsum(a)
    start = np.repeat(logged.ptr[:-1], lens)
    upto = csum - np.where(start > 0, csum[np.maximum(start - 1, 0)], 0)
    first_f = (a == 1) & (upto == 1)
    return StepTable(
        ptr=logged.ptr,
        a=logged.a,
        mu=logged.mu,
        pi=pi,
        pf=pf,
        rewards={"success": succ, "cost": logged.cost, "escalated": first_f.astype(np.float64)},
        q=dict(q or {}),
    )


def _noop(_: str) -> None:
    return None


def evaluate_policies(
    log: Any,
    candidates: Mapping[str, tuple[Any, Any]],
    *,
    prices: Prices | None = None,
    value_of_success: float = 1.0,
    backends: list[Any] | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    dm: bool = True,
    max_unsupported_share: float = 0.02,
    min_ess: float = MIN_ESS,
    references: bool = True,
    skip_unsupported: bool = False,
    progress: Callable[[str], None] | None = None,
    epochs: Mapping[str, int] | None = None,
) -> OPEReport:
    """See the module docstring. ``candidates``: name -> (deterministic policy, predictor);
    ``log``: a :class:`features.runlog.RunLog`."""
    import time

    from models.predictor import ConstantPredictor
    from router.policy.config import build_policy
    from training.eval.curves import aiq
    from training.eval.ope_model import fit_q

    say = progress or _noop
    t0 = time.perf_counter()
    logged = load_logged(log, prices or Prices())
    q = None
    if dm:
        say(f"fitting the DR outcome model on {len(logged.a)} logged steps")
        q = fit_q(logged, seed=seed)
    combos = {"net": {"success": value_of_success, "cost": -1.0}}

    def one(name: str, policy: Any, predictor: Any) -> CandidateResult:
        rep = replay_candidate(logged, policy, CachedPredictor(predictor, logged.X), backends, epochs)
        share = rep.unsupported_runs / logged.n_runs
        if share > max_unsupported_share:
            r, k = rep.first_unsupported or ("?", -1)
            raise OPEError(
                f"candidate {name!r} needs actions the logs never explored: on {rep.unsupported_runs} of "
                f"{logged.n_runs} runs ({share:.1%}, limit {max_unsupported_share:.1%}) it deviates where the "
                f"logged decision had propensity 1 (first: run {r} step {k}); explore more (policy.explore) "
                "or evaluate a closer candidate"
            )
        est, reps, diag = estimate(
            step_table(logged, rep.pi, rep.pf, q),
            ("success", "cost", "escalated"),
            combos,
            n_boot=n_boot,
            alpha=alpha,
            seed=seed,
            bounds={**METRIC_BOUNDS, "net": (float("-inf"), value_of_success)},
        )
        if diag["ess"] < min_ess:
            raise OPEError(
                f"candidate {name!r}: effective sample size {diag['ess']:.1f} of {logged.n_runs} runs is "
                f"below {min_ess:g}; its estimate rests on too few matched runs to be trusted (explore more, "
                "or evaluate a closer candidate)"
            )
        diag.update(
            deviated_runs=float(rep.deviated_runs),
            unsupported_runs=float(rep.unsupported_runs),
            unsupported_share=share,
        )
        say(f"{name}: ESS {diag['ess']:.0f} of {logged.n_runs} runs, DR net {est['dr']['net'].value:.4f}")
        return CandidateResult(name, est, diag, reps)

    refs: dict[str, CandidateResult] = {}
    for r in REFS if references else ():
        try:
            refs[r] = one(r, build_policy({"kind": r}), ConstantPredictor())
        except OPEError as e:
            say(f"reference {r} not evaluable ({e}); AIQ left out")
    out: dict[str, CandidateResult] = {}
    refused: dict[str, str] = {}
    for name, (policy, predictor) in candidates.items():
        try:
            reuse = name in refs and getattr(policy, "name", None) == name
            res = refs[name] if reuse else one(name, policy, predictor)
        except OPEError as e:
            if not skip_unsupported:
                raise
            refused[name] = str(e)
            say(f"{name}: refused ({e})")
            continue
        if set(REFS) <= set(refs):
            _add_aiq(res, refs, aiq, alpha)
        out[name] = res
    return OPEReport(
        n_runs=logged.n_runs,
        n_steps=len(logged.a),
        explored_runs=int(
            sum(logged.explore[s:e].any() for s, e in zip(logged.ptr[:-1], logged.ptr[1:], strict=True))
        ),
        left_out=logged.left_out,
        value_of_success=value_of_success,
        candidates=out,
        references=refs,
        wall_s=time.perf_counter() - t0,
        refused=refused,
    )


def _add_aiq(res: CandidateResult, refs: dict[str, CandidateResult], aiq: Any, alpha: float) -> None:
    lo_q, hi_q = 100 * alpha / 2, 100 * (1 - alpha / 2)
    L, F = refs["always-local"], refs["always-frontier"]
    for e in ESTIMATORS:

        def point(c: CandidateResult, m: str, e: str = e) -> float | None:
            return c.estimates[e][m].value

        vals = [
            point(res, "cost"),
            point(res, "success"),
            point(L, "cost"),
            point(L, "success"),
            point(F, "cost"),
        ]
        v = (
            None
            if any(x is None for x in vals)
            else aiq([(vals[0], vals[1])], (vals[2], vals[3]), vals[2], vals[4])
        )
        reps = [res.replicates[f"{e}:cost"], res.replicates[f"{e}:success"]]
        reps += [L.replicates[f"{e}:cost"], L.replicates[f"{e}:success"], F.replicates[f"{e}:cost"]]
        samples = []
        for c, s, cl, sl, cf in zip(*reps, strict=True):
            if np.all(np.isfinite([c, s, cl, sl, cf])):
                x = aiq([(c, s)], (cl, sl), cl, cf)
                if x is not None:
                    samples.append(x)
        lo = float(np.percentile(samples, lo_q)) if samples else None
        hi = float(np.percentile(samples, hi_q)) if samples else None
        res.estimates[e]["aiq"] = Estimate(v, lo, hi)
