"""The figures of a set of step records, written once for every scorecard, the metrics and OPE.

The what-if scorecard (:mod:`router.sim.scorecard`), policy comparison and the outcome model
(:mod:`training.eval.compare`, :mod:`training.eval.outcome`), decision replay
(:class:`router.replay.PolicyTally`), OPE's logged figures
(:meth:`training.eval.ope_replay.LoggedRuns.figures`), the live segment (:mod:`training.eval.live`
and the fake agent's short-step flag), the simulator's workload, calibration and SLO floors, and the
sidecar's metrics (:mod:`router.server.metrics.registry`, per step: the same definitions, summed by
Prometheus) read these definitions; a second copy of one of these formulas anywhere in the tree is a bug
(``tests/test_figures.py`` greps for one). The step price and the warm prefix are
:mod:`router.core.accounting`'s.

Definitions:

- **Ratio** (:func:`ratio`): ``num / den``, None when ``den`` is 0 (no figure rather than 0).
- **Percentile** (:func:`percentile`): numpy's linear interpolation over the finite values; None
  when there are none. Step latency p50 / p95 / p99, TTFT p95, run completion p50 / p95.
- **Short step** (:func:`is_short`): at most ``short_tokens`` (64) output tokens, a tool call or a
  structured (JSON) answer; every other served step is long.
- **Cross-turn cache** (:func:`cache_figures`): over the *cross-turn* local steps (served locally,
  step index >= 1), hit rate = cached prompt tokens / prompt tokens, upper bound = reusable prompt
  tokens / prompt tokens, where a step's reusable tokens (:func:`upper_bound_tokens`) are those
  repeating the run's earlier context, at most ``prompt - 1`` (the last prompt token is always
  computed).
- **Switches** (:func:`switches`): changes between consecutive served steps of one run of what is
  compared (the backend, tier and replica, for flaps; the tier for tier switches). A run's flaps
  are its switches; ``flaps_per_run`` = mean over the policy-routed runs; ``runs_with_flaps`` =
  runs with two or more tier switches.
- **Runs** (:func:`run_figures`): over the policy-routed runs (neither rejected nor spilled whole
  by admission), escalation rate = runs with at least one frontier step / runs; flaps per run.
- **Escalation quality** (:func:`escalation_quality`): over the labelled runs the policy routed
  (a run spilled whole by admission is not the policy's escalation), a run is flagged when any
  step ran on the frontier; recall = flagged needs-frontier runs / needs-frontier
  runs, precision = flagged needs-frontier runs / flagged runs.
- **SLO attainment** (:func:`slo_met`): a served short step meets the SLO when its end-to-end
  latency <= ``slo_short_s``, a long one when its TTFT <= ``slo_ttft_s``; attainment = share of
  served steps that meet it.
- **Step figures** (:func:`step_figures`): all the step-level figures above of one policy's
  columnar step records, under the scorecard's key names.

Knobs: ``short_tokens`` of :func:`is_short` (:data:`SHORT_STEP_TOKENS`), the SLO thresholds of
:func:`slo_met`; nothing else. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from router.policy.defaults import SHORT_STEP_TOKENS  # output tokens at or under which a step is short

__all__ = [
    "SHORT_STEP_TOKENS",
    "ratio",
    "percentile",
    "is_short",
    "upper_bound_tokens",
    "switches",
    "switches_by_run",
    "cache_figures",
    "run_figures",
    "escalation_quality",
    "EscalationQuality",
    "slo_met",
    "step_figures",
]


def ratio(num: float, den: float) -> float | None:
    """``num / den``; None when ``den`` is 0."""
    return num / den if den else None


def percentile(x: np.ndarray | Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation) of the finite values of ``x``; None if none."""
    a = np.asarray(x, dtype=float)
    a = a[np.isfinite(a)]
    return None if a.size == 0 else float(np.percentile(a, q))


def is_short(
    completion: int, tool_call: bool, structured: bool = False, short_tokens: int = SHORT_STEP_TOKENS
) -> bool:
    """A short step: at most ``short_tokens`` output tokens, a tool call or a structured answer."""
    return tool_call or structured or completion <= short_tokens


def upper_bound_tokens(repeated: int, prompt: int) -> int:
    """The cross-turn upper bound of one step: ``repeated`` prompt tokens (those repeating the run's
    earlier context), at most ``prompt - 1`` (the last prompt token is always computed)."""
    return max(0, min(repeated, prompt - 1))


def switches(seq: Iterable[Hashable]) -> int:
    """Changes between consecutive items of one run's served steps (backends: flaps; tiers: tier switches)."""
    n = 0
    prev: Hashable = None
    first = True
    for x in seq:
        if not first and x != prev:
            n += 1
        prev, first = x, False
    return n


def switches_by_run(run: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """:func:`switches` of every run at once: ``run`` and ``seq`` per step, rows grouped by run in
    step order; returns each run's count in the order of ``np.unique(run)``."""
    r, x = np.asarray(run), np.asarray(seq)
    if r.size == 0:
        return np.zeros(0)
    change = (r[1:] == r[:-1]) & (x[1:] != x[:-1])
    _, inv = np.unique(r, return_inverse=True)
    return np.bincount(inv[1:], weights=change.astype(float), minlength=int(inv.max()) + 1)


def cache_figures(
    local: np.ndarray,
    step: np.ndarray,
    prompt: np.ndarray,
    cached: np.ndarray,
    upper: np.ndarray | None = None,
) -> tuple[float | None, float | None]:
    """(cross-turn hit rate, its upper bound) over the steps with ``local`` and ``step >= 1``."""
    m = np.asarray(local, dtype=bool) & (np.asarray(step) >= 1)
    ptok = float(np.asarray(prompt)[m].sum())
    hit = ratio(float(np.asarray(cached)[m].sum()), ptok)
    bound = None if upper is None else ratio(float(np.asarray(upper)[m].sum()), ptok)
    return hit, bound


def run_figures(frontier_steps: np.ndarray, run_switches: np.ndarray) -> tuple[float | None, float | None]:
    """(escalation rate, flaps per run) of the policy-routed runs: each run's frontier steps and switches."""
    f = np.asarray(frontier_steps)
    s = np.asarray(run_switches, dtype=float)
    if f.size == 0:
        return None, None
    return float((f > 0).mean()), float(s.mean())


@dataclass(frozen=True)
class EscalationQuality:
    """Recall and precision of needs-frontier runs (None where undefined) and the run counts."""

    recall: float | None
    precision: float | None
    needs_frontier_runs: int
    true_positive_runs: int
    false_positive_runs: int


def escalation_quality(pairs: Iterable[tuple[bool, bool | None]]) -> EscalationQuality:
    """From ``(flagged, needs_frontier label)`` per routed run (label None: unlabelled, skipped)."""
    tp = fp = fn = 0
    for flagged, label in pairs:
        if label is None:
            continue
        if flagged:
            tp += label
            fp += not label
        else:
            fn += label
    pos = tp + fn
    return EscalationQuality(ratio(tp, pos), ratio(tp, tp + fp), pos, tp, fp)


def slo_met(
    short: np.ndarray, latency: np.ndarray, ttft: np.ndarray, slo_short_s: float, slo_ttft_s: float
) -> np.ndarray:
    """Per served step, whether it met the per-step SLO (short: latency; long: TTFT)."""
    return np.where(
        np.asarray(short, dtype=bool), np.asarray(latency) <= slo_short_s, np.asarray(ttft) <= slo_ttft_s
    )


def step_figures(
    *,
    served: np.ndarray,
    local: np.ndarray,
    step: np.ndarray,
    prompt: np.ndarray,
    cached: np.ndarray,
    latency: np.ndarray,
    short: np.ndarray,
    upper: np.ndarray | None = None,
    ttft: np.ndarray | None = None,
    slo_s: tuple[float, float] | None = None,
) -> dict[str, float | None]:
    """The step-level figures of one policy's step records (one entry per step, all arrays aligned).

    ``served``: the step got an answer (latency figures count only those); ``local``: served by a
    local replica; ``step``: index in its run; ``short``: :func:`is_short`; ``upper``: each step's
    :func:`upper_bound_tokens`; ``ttft`` (NaN where unknown); ``slo_s``: ``(slo_short_s,
    slo_ttft_s)`` for ``slo_attainment`` (needs ``ttft``)."""
    sv = np.asarray(served, dtype=bool)
    lat = np.asarray(latency, dtype=float)[sv]
    sh = np.asarray(short, dtype=bool)[sv]
    hit, bound = cache_figures(sv & np.asarray(local, dtype=bool), step, prompt, cached, upper)
    out: dict[str, float | None] = {
        "step_latency_s_p50": percentile(lat, 50),
        "step_latency_s_p95": percentile(lat, 95),
        "step_latency_s_p99": percentile(lat, 99),
        "short_step_latency_s_p95": percentile(lat[sh], 95),
        "long_step_latency_s_p95": percentile(lat[~sh], 95),
        "ttft_s_p95": None if ttft is None else percentile(np.asarray(ttft, dtype=float)[sv], 95),
        "cache_hit_rate": hit,
        "cache_hit_upper_bound": bound,
    }
    if slo_s is not None and ttft is not None:
        ok = slo_met(sh, lat, np.asarray(ttft, dtype=float)[sv], *slo_s)
        out["slo_attainment"] = float(ok.mean()) if ok.size else None
    return out
