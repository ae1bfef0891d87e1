"""The outcome model and the quality/cost figures of the scorecard.

Runs with a known weak-model outcome and a known strong-model outcome on the same task (tau2
airline gpt-oss-120b runs paired with claude-sonnet-4-5, the synthetic generator's runs) let us ask
what a routing policy would have achieved: the policy's per-step tiers come from the simulator (or
any replay), and this module turns them into a success and a cost per run.

Outcome model (explicit and simple; :class:`OutcomeModel` variants say how sensitive it is):

1. A run whose steps all stay local gets the **weak** model's logged outcome (its own trial).
2. A run first sent to the frontier at step ``k`` (the *escalation step*; ``k = 0`` for a run that
   starts there) gets the **strong** model's *expected* success on the task (the mean over all the
   strong player's trials there, :mod:`training.eval.trials`; never a majority vote, so a 1-1 tie
   counts 0.5) with weight ``w`` and the weak one's with ``1 - w`` (an expected value, no random
   draw). ``w`` by variant (``kind``):

   - ``escalate-anytime`` (the base model): ``w = 1``: the strong model rescues the run whenever it
     takes over;
   - ``must-stay``: ``w = 1`` only if the run stays on the frontier from ``k`` to its last step, else
     0 (a run handed back to the weak model ends with the weak model's outcome);
   - ``decay``: ``w = 0.5 ** (k / half_life_steps)``: the later the hand-over, the less of the run is
     left to fix;
   - ``before-first-error``: ``w = 1`` only if ``k <=`` the first step whose prompt carries a failed
     tool result (no error: ``w = 1``); after the first error the damage is assumed done.
3. A run with a rejected step counts as a failure (nothing was delivered) and costs only what it
   spent before.
4. **Cost** (USD) is priced per step from the logged token counts (the weak run's trajectory: the
   strong model's own trajectory after ``k`` is not observed, so its remaining steps are assumed to
   be the same size). ``warm_j`` is the prefix of step ``j``'s prompt cached on its tier by the one
   warm-prefix rule (:class:`router.core.accounting.RunContext`): the context the run left on that
   tier at its last step there, as far as it is still a prefix of this prompt, where ``reuse_j`` is
   the prompt prefix step ``j`` repeats from step ``j-1`` (``prefix_reuse_tokens``, else the
   previous prompt + output, capped at the prompt). So ``warm_j = reuse_j`` after a step on the same
   tier, 0 on a tier the run never ran on, and a run back on a tier after a detour finds what it left
   there (``min`` of that step's prompt + output and every ``reuse`` since)::

       local    (prompt_j - warm_j) * local_in + completion_j * local_out     (cached prefix free)
       frontier (prompt_j - warm_j) * frontier_in + warm_j * frontier_cached_in + completion_j * frontier_out

   so an escalation at ``k`` pays the local steps already spent, the frontier prefill of the whole
   context at ``k``, and the frontier price of the remaining steps (their repeated prefix at the
   provider's cached-input price). Local prices per token derive from a GPU-hour price and a
   sustained throughput (:class:`Prices`).

Scorecard figures (:func:`policy_outcomes`): ``success_rate``: mean success over runs with both
outcomes known; ``success_se`` / ``success_ci_low`` / ``success_ci_high``: its task-bootstrap
standard error and 95% interval (:func:`training.eval.trials.bootstrap_mean_ci`); ``cost_usd``: total over all runs;
escalation rate, recall / precision of needs-frontier runs (a run is *flagged* when any of its steps
ran on the frontier); the definitions are :mod:`router.core.figures`'. The frontier-relative figures (cost at 95% of always-frontier success, AIQ)
are in :mod:`training.eval.curves`.

Knobs: :class:`Prices` (every price, one object) and the outcome variant (``kind`` and, for
``decay``, ``half_life_steps``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from router.core.accounting import gpu_usd, token_usd, warm_by_backend
from router.core.figures import escalation_quality, ratio, run_figures, switches
from router.policy.defaults import (
    FRONTIER_CACHED_IN_PER_M,
    FRONTIER_IN_PER_M,
    FRONTIER_OUT_PER_M,
    GPU_HOUR_USD,
)
from training.eval.trials import bootstrap_mean_ci, strong_expectation

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "Prices",
    "EscalateAnytime",
    "MustStay",
    "Decay",
    "BeforeFirstError",
    "OutcomeModel",
    "DEFAULT_VARIANTS",
    "parse_variant",
    "run_values",
    "RunRecord",
    "records_from_frames",
    "run_costs",
    "run_warm",
    "step_costs",
    "run_success",
    "policy_outcomes",
    "LOCAL",
    "FRONTIER",
    "REJECTED",
]

LOCAL, FRONTIER, REJECTED = 0, 1, -1


class Prices(BaseModel):
    """Every price the scorecard uses, in one place. Defaults are assumptions, not quotes.

    - Frontier: USD per 1M tokens, the deployment defaults of :mod:`router.policy.defaults` (the
      prices the sidecar serves with; set the strong model's list prices in config to price a pair).
    - Local: ``gpu_hour_usd`` (:mod:`router.policy.defaults`, USD per GPU-hour) spread over a
      sustained batched throughput of one GPU serving an 8B model with vLLM
      (``local_prefill_tokens_per_s`` of uncached prompt, ``local_decode_tokens_per_s`` of output);
      cached local prefix tokens are free.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    frontier_in_per_m: float = Field(
        default=FRONTIER_IN_PER_M, ge=0, description="frontier input, USD per 1M tokens"
    )
    frontier_cached_in_per_m: float = Field(
        default=FRONTIER_CACHED_IN_PER_M, ge=0, description="frontier cached input, USD per 1M"
    )
    frontier_out_per_m: float = Field(
        default=FRONTIER_OUT_PER_M, ge=0, description="frontier output, USD per 1M tokens"
    )
    gpu_hour_usd: float = Field(default=GPU_HOUR_USD, ge=0, description="local GPU price, USD per GPU-hour")
    local_prefill_tokens_per_s: float = Field(
        default=10000.0, gt=0, description="sustained uncached prompt tokens/s per GPU"
    )
    local_decode_tokens_per_s: float = Field(
        default=2000.0, gt=0, description="sustained output tokens/s per GPU"
    )

    @property
    def local_in_per_m(self) -> float:
        return gpu_usd(1e6 / self.local_prefill_tokens_per_s, self.gpu_hour_usd)

    @property
    def local_out_per_m(self) -> float:
        return gpu_usd(1e6 / self.local_decode_tokens_per_s, self.gpu_hour_usd)

    def table(self) -> dict[str, float]:
        """All prices in USD per 1M tokens (local ones derived) plus the GPU-hour price."""
        return {
            "frontier_in_per_m": self.frontier_in_per_m,
            "frontier_cached_in_per_m": self.frontier_cached_in_per_m,
            "frontier_out_per_m": self.frontier_out_per_m,
            "gpu_hour_usd": self.gpu_hour_usd,
            "local_prefill_tokens_per_s": self.local_prefill_tokens_per_s,
            "local_decode_tokens_per_s": self.local_decode_tokens_per_s,
            "local_in_per_m": round(self.local_in_per_m, 6),
            "local_out_per_m": round(self.local_out_per_m, 6),
        }


# ------------------------------------------------------------------------------------ variants


class _Variant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def weight(self, k: int, tiers: np.ndarray, rec: RunRecord) -> float:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover
        raise NotImplementedError


class EscalateAnytime(_Variant):
    kind: Literal["escalate-anytime"] = "escalate-anytime"

    def weight(self, k: int, tiers: np.ndarray, rec: RunRecord) -> float:
        return 1.0

    def describe(self) -> str:
        return "escalated at any step k: strong model's outcome"


class MustStay(_Variant):
    kind: Literal["must-stay"] = "must-stay"

    def weight(self, k: int, tiers: np.ndarray, rec: RunRecord) -> float:
        return 1.0 if bool(np.all(tiers[k:] == FRONTIER)) else 0.0

    def describe(self) -> str:
        return "strong outcome only if the run stays on the frontier from k to the end"


class Decay(_Variant):
    kind: Literal["decay"] = "decay"
    half_life_steps: float = Field(
        default=4.0, gt=0, description="steps after which a rescue is half as likely"
    )

    def weight(self, k: int, tiers: np.ndarray, rec: RunRecord) -> float:
        return float(0.5 ** (k / self.half_life_steps))

    def describe(self) -> str:
        return f"strong outcome with probability 0.5^(k/{self.half_life_steps:g})"


class BeforeFirstError(_Variant):
    kind: Literal["before-first-error"] = "before-first-error"

    def weight(self, k: int, tiers: np.ndarray, rec: RunRecord) -> float:
        return 1.0 if rec.first_error_step is None or k <= rec.first_error_step else 0.0

    def describe(self) -> str:
        return "strong outcome only if escalated no later than the first failed tool result"


OutcomeModel = Annotated[EscalateAnytime | MustStay | Decay | BeforeFirstError, Field(discriminator="kind")]
Variant = EscalateAnytime | MustStay | Decay | BeforeFirstError
#: what :func:`parse_variant` accepts: a kind, a dict with ``kind`` (and its knobs), or a variant
VariantLike = str | Mapping[str, object] | Variant
_VARIANT_ADAPTER: TypeAdapter[Variant] = TypeAdapter(OutcomeModel)

DEFAULT_VARIANTS: tuple[str, ...] = ("escalate-anytime", "must-stay", "decay", "before-first-error")


def parse_variant(v: VariantLike) -> Variant:
    """A variant object from a kind string, a dict with ``kind``, or a variant object."""
    if isinstance(v, EscalateAnytime | MustStay | Decay | BeforeFirstError):
        return v
    if isinstance(v, str):
        v = {"kind": v}
    return _VARIANT_ADAPTER.validate_python(v)


# ------------------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class RunRecord:
    """What the outcome model needs of one logged run (token counts per step, both outcomes)."""

    run_id: str
    prompt: np.ndarray  # int64 per step
    completion: np.ndarray  # int64 per step
    reuse: np.ndarray  # prompt tokens repeating step j-1's prompt+output (0 at step 0)
    weak_success: bool | None = None
    strong_success: bool | None = None
    needs_frontier: bool | None = None
    first_error_step: int | None = None
    task_id: str | None = None  # the group of the task bootstrap (None: the run is its own task)
    strong_p: float | None = None  # expected strong success over its trials (training.eval.trials)
    strong_trials: int = 0  # the strong trials behind strong_p (0: the one strong_outcome label)

    @property
    def strong_expected(self) -> float | None:
        """Expected strong success: ``strong_p`` when known, else the 0/1 ``strong_success`` label."""
        if self.strong_p is not None:
            return self.strong_p
        return None if self.strong_success is None else (1.0 if self.strong_success else 0.0)

    @property
    def n_steps(self) -> int:
        return len(self.prompt)

    @property
    def quality_known(self) -> bool:
        return self.weak_success is not None and self.strong_success is not None

    @classmethod
    def make(
        cls,
        run_id: str,
        prompt: Sequence[int],
        completion: Sequence[int],
        reuse: Sequence[int] | None = None,
        **kw: Any,
    ) -> RunRecord:
        p = np.asarray(prompt, dtype=np.int64)
        c = np.asarray(completion, dtype=np.int64)
        if p.shape != c.shape or p.ndim != 1:
            raise ValueError(f"run {run_id}: prompt and completion must be 1-d and the same length")
        if (p < 0).any() or (c < 0).any():
            raise ValueError(f"run {run_id}: negative token counts")
        if reuse is None:
            r = np.zeros_like(p)
            if len(p) > 1:
                r[1:] = np.minimum(p[:-1] + c[:-1], p[1:])
        else:
            r = np.minimum(np.asarray(reuse, dtype=np.int64), p)
            if len(r):
                r[0] = 0
        return cls(run_id=run_id, prompt=p, completion=c, reuse=r, **kw)


def _outcome(v: object) -> bool | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    s = str(v)
    if s == "success":
        return True
    if s == "failure":
        return False
    return None


def records_from_frames(runs: pd.DataFrame | None, steps: pd.DataFrame | None) -> dict[str, RunRecord]:
    """RunRecords for every run with steps (``runs``/``steps``: run-log frames, ``RunLog.runs/.steps``).

    weak outcome = ``outcome``; strong outcome = ``strong_outcome`` (None where not paired);
    ``first_error_step`` = first step whose ``tool_result_errors`` holds a True. Where ``runs``
    also holds the strong player's own runs, ``strong_p`` = its mean success over all its trials on
    the task (:func:`training.eval.trials.strong_expectation`; never a majority vote), and
    ``task_id`` groups the task bootstrap.
    """
    import pandas as pd

    if steps is None or len(steps) == 0:
        return {}
    st = steps.sort_values(["run_id", "step"], kind="stable")
    meta: dict[str, dict[str, Any]] = {}
    if runs is not None and len(runs):
        cols = {
            c: runs[c].tolist() if c in runs.columns else [None] * len(runs)
            for c in ("outcome", "strong_outcome", "needs_frontier", "task_id")
        }
        expect = strong_expectation(runs)
        for i, rid in enumerate(runs["run_id"].tolist()):
            nf = cols["needs_frontier"][i]
            tid = cols["task_id"][i]
            sp, sn = expect.get(str(rid), (None, 0))
            meta[rid] = {
                "task_id": None if tid is None or (isinstance(tid, float) and math.isnan(tid)) else str(tid),
                "strong_p": sp,
                "strong_trials": sn,
                "weak_success": _outcome(cols["outcome"][i]),
                "strong_success": _outcome(cols["strong_outcome"][i]),
                "needs_frontier": None
                if nf is None or nf is pd.NA or (isinstance(nf, float) and math.isnan(nf))
                else bool(nf),
            }
    out: dict[str, RunRecord] = {}
    reuse_col = "prefix_reuse_tokens" if "prefix_reuse_tokens" in st.columns else None
    err_col = "tool_result_errors" if "tool_result_errors" in st.columns else None
    for rid, g in st.groupby("run_id", sort=False):
        p = g["prompt_tokens"].to_numpy(dtype=np.int64)
        c = g["completion_tokens"].to_numpy(dtype=np.int64)
        reuse = None
        if reuse_col is not None:
            r = pd.to_numeric(g[reuse_col], errors="coerce").to_numpy(dtype=float)
            if not np.isnan(r[1:]).any():
                reuse = np.nan_to_num(r).astype(np.int64)
        first_err = None
        if err_col is not None:
            for j, errs in enumerate(g[err_col].tolist()):
                if errs is not None and not (isinstance(errs, float)) and any(bool(e) for e in errs):
                    first_err = j
                    break
        m = meta.get(str(rid), {})
        out[str(rid)] = RunRecord.make(str(rid), p, c, reuse, first_error_step=first_err, **m)
    return out


# ------------------------------------------------------------------------------------ arithmetic


def run_warm(rec: RunRecord, tiers: np.ndarray) -> np.ndarray:
    """Warm prefix tokens per step of one run served on ``tiers`` (module docstring, 4): the one
    warm-prefix rule (:func:`router.core.accounting.warm_by_backend`), a tier as the backend (a run
    is pinned to one replica of a tier); a rejected step caches nothing."""
    t = np.asarray(tiers)
    backends = [None if x == REJECTED else int(x) for x in t.tolist()]
    warm = warm_by_backend(backends, rec.prompt.tolist(), rec.completion.tolist(), rec.reuse.tolist())
    return np.asarray(warm, dtype=np.int64)


def step_costs(rec: RunRecord, tiers: np.ndarray, prices: Prices) -> np.ndarray:
    """USD per step of one run served on ``tiers`` (LOCAL / FRONTIER / REJECTED per step; module
    docstring, 4): a local step pays its cold prompt and output (its cached prefix is free), a
    frontier step its cold prompt, cached prefix and output; a rejected step costs nothing."""
    t = np.asarray(tiers)
    if t.shape != rec.prompt.shape:
        raise ValueError(f"run {rec.run_id}: {len(t)} tiers for {rec.n_steps} steps")
    warm = run_warm(rec, t).astype(float)
    prompt, completion = rec.prompt.astype(float), rec.completion.astype(float)
    local = token_usd(
        prompt - warm,
        np.zeros_like(prompt),
        completion,
        price_in_per_m=prices.local_in_per_m,
        price_cached_in_per_m=0.0,
        price_out_per_m=prices.local_out_per_m,
    )
    front = token_usd(
        prompt,
        warm,
        completion,
        price_in_per_m=prices.frontier_in_per_m,
        price_cached_in_per_m=prices.frontier_cached_in_per_m,
        price_out_per_m=prices.frontier_out_per_m,
    )
    return np.where(t == FRONTIER, front, np.where(t == LOCAL, local, 0.0))


def run_costs(rec: RunRecord, tiers: np.ndarray, prices: Prices) -> tuple[float, float, float]:
    """(total, local, frontier) USD of one run served on ``tiers``: what :func:`step_costs` sums to,
    priced on the run's token totals per tier."""
    t = np.asarray(tiers)
    if t.shape != rec.prompt.shape:
        raise ValueError(f"run {rec.run_id}: {len(t)} tiers for {rec.n_steps} steps")
    warm = run_warm(rec, t)
    loc, fr = t == LOCAL, t == FRONTIER
    local = float(
        token_usd(
            float((rec.prompt - warm)[loc].sum()),
            0.0,
            float(rec.completion[loc].sum()),
            price_in_per_m=prices.local_in_per_m,
            price_cached_in_per_m=0.0,
            price_out_per_m=prices.local_out_per_m,
        )
    )
    frontier = float(
        token_usd(
            float(rec.prompt[fr].sum()),
            float(warm[fr].sum()),
            float(rec.completion[fr].sum()),
            price_in_per_m=prices.frontier_in_per_m,
            price_cached_in_per_m=prices.frontier_cached_in_per_m,
            price_out_per_m=prices.frontier_out_per_m,
        )
    )
    return local + frontier, local, frontier


def escalation_step(tiers: np.ndarray) -> int | None:
    idx = np.flatnonzero(np.asarray(tiers) == FRONTIER)
    return int(idx[0]) if idx.size else None


def run_success(rec: RunRecord, tiers: np.ndarray, variant: VariantLike | None = None) -> float | None:
    """Expected success (0-1) of one run under the outcome model; None without both outcomes."""
    if not rec.quality_known:
        return None
    t = np.asarray(tiers)
    if (t == REJECTED).any():
        return 0.0
    v = parse_variant(variant if variant is not None else "escalate-anytime")
    k = escalation_step(t)
    weak = 1.0 if rec.weak_success else 0.0
    if k is None:
        return weak
    strong = rec.strong_expected or 0.0
    w = v.weight(k, t, rec)
    return w * strong + (1.0 - w) * weak


def run_values(
    records: Mapping[str, RunRecord],
    tiers: Mapping[str, np.ndarray],
    prices: Prices,
    variant: VariantLike | None = None,
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per run, in ``records`` order: its task (the bootstrap group), its expected success under
    ``variant`` (NaN when the outcome model cannot score it) and its cost (USD); the inputs of the
    task-bootstrap AIQ and of paired comparisons (:mod:`training.eval.compare`)."""
    tasks: list[str] = []
    succ, cost = np.empty(len(records)), np.empty(len(records))
    for i, (rid, rec) in enumerate(records.items()):
        t = np.asarray(tiers[rid])
        s = run_success(rec, t, variant)
        succ[i] = math.nan if s is None else s
        cost[i] = run_costs(rec, t, prices)[0]
        tasks.append(rec.task_id if rec.task_id is not None else rid)
    return tasks, succ, cost


def policy_outcomes(
    records: Mapping[str, RunRecord],
    tiers: Mapping[str, np.ndarray],
    prices: Prices,
    variants: Iterable[VariantLike] = DEFAULT_VARIANTS,
    spilled: Iterable[str] = (),
) -> dict[str, Any]:
    """Success and cost figures of one policy's tiers over ``records`` (every run must have tiers).

    The first variant is the headline (``success_rate``); all appear under ``success_by_variant``.
    ``spilled``: runs that admission control sent whole to the frontier at their first step. They
    are scored (quality, cost) like any frontier run but are not the policy's escalations: they are
    left out of ``escalation_rate``, the escalation step and needs-frontier recall/precision, and
    counted in ``spilled_runs``.
    """
    spilled_set = set(spilled)
    vs = [parse_variant(v) for v in variants]
    if not vs:
        raise ValueError("at least one outcome variant is needed")
    missing = [r for r in records if r not in tiers]
    if missing:
        raise ValueError(f"{len(missing)} run(s) have no tiers (first: {missing[0]})")
    succ: dict[str, list[float]] = {v.kind: [] for v in vs}
    head_tasks: list[str] = []
    cost = local = frontier = 0.0
    frontier_steps = steps = tier_switches = 0
    routed_escalated: list[int] = []  # per routed run (neither rejected nor spilled): 1 if escalated
    quality: list[tuple[bool, bool | None]] = []
    esc_steps: list[int] = []
    for rid, rec in records.items():
        t = np.asarray(tiers[rid])
        c, lc, fc = run_costs(rec, t, prices)
        cost, local, frontier = cost + c, local + lc, frontier + fc
        rejected = bool((t == REJECTED).any())
        k = escalation_step(t)
        if rid in spilled_set:
            k = None
        if not rejected and rid not in spilled_set:
            routed_escalated.append(int(k is not None))
        if k is not None:
            esc_steps.append(k)
        steps += len(t)
        frontier_steps += int((t == FRONTIER).sum())
        tier_switches += switches(x for x in t.tolist() if x != REJECTED)
        if rid not in spilled_set:
            quality.append((k is not None, rec.needs_frontier))
        for j, v in enumerate(vs):
            s = run_success(rec, t, v)
            if s is not None:
                succ[v.kind].append(s)
                if j == 0:
                    head_tasks.append(rec.task_id if rec.task_id is not None else rid)
    eq = escalation_quality(quality)
    n = len(records)
    head = succ[vs[0].kind]
    rate = float(np.mean(head)) if head else None
    ci = bootstrap_mean_ci(head, head_tasks) if head else None
    return {
        "runs": n,
        "quality_runs": len(head),
        "success_rate": rate,
        "success_se": None if ci is None else ci.se,
        "success_ci_low": None if ci is None else ci.low,
        "success_ci_high": None if ci is None else ci.high,
        "success_tasks": 0 if ci is None else ci.n_tasks,
        "success_by_variant": {k: (float(np.mean(v)) if v else None) for k, v in succ.items()},
        "cost_usd": cost,
        "local_cost_usd": local,
        "frontier_cost_usd": frontier,
        "cost_per_run_usd": ratio(cost, n),
        "cost_per_success_usd": ratio(cost, float(np.sum(head))) if head else None,
        "escalation_rate": run_figures(np.asarray(routed_escalated), np.zeros(len(routed_escalated)))[0],
        "frontier_step_share": ratio(frontier_steps, steps),
        "escalation_step_median": float(np.median(esc_steps)) if esc_steps else None,
        "tier_switches_per_run": ratio(tier_switches, n),
        "needs_frontier_recall": eq.recall,
        "needs_frontier_precision": eq.precision,
        "needs_frontier_runs": eq.needs_frontier_runs,
        "spilled_runs": len(spilled_set & set(records)),
    }
