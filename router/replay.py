"""Decision replay: walk logged runs step by step through one or more policies, without timing.

Algorithm: for every run of a run log (steps sorted by run and step), for every logged step k:

1. rebuild the prefixes the router would have seen (:func:`features.extract.iter_frame_prefixes`,
   the same code path as training and serving), extract each step's features once and predict
   once per step; predictions do not depend on the policy, so all policies share them. The
   predictor is asked once per run when it offers ``predict_batch(X) -> list[Predictions]`` (one
   vectorised model call per run), else ``predict_features(x)`` per step (a ``ModelBundle``), else
   ``predict(prefix)``;
2. for each policy: set each synthetic backend's ``warm_prefix_tokens`` to what this policy's
   earlier choices left cached for the run, build the snapshot (:func:`build_snapshot`, with the
   run's ``needs_frontier`` label for the oracle), ``decide``, ``apply_decision`` to the policy's own
   :class:`RunState`, and account the step.

Backends are synthetic and static (no load, never unhealthy): ``n_local`` local replicas serving
the weak model plus one frontier, priced with the router's config defaults
(:func:`default_backends`). The replay answers "which decisions would this policy make on these
runs", not "how fast": the what-if simulator adds load and time.

Prefix-cache accounting (per step, on the chosen backend; no eviction, an upper bound)::

    reusable    = the step's prefix_reuse_tokens (prompt tokens repeating the run's earlier context),
                  or its whole prompt after step 0 when the log lacks it
    warm        = min(reusable, context the run left cached on that backend when it last ran there)
    re-prefill  = reusable - warm   (avoidable work caused by moving the run)
    new prefill = prompt - reusable

after which the backend holds prompt + completion tokens of the run.

Report per policy (``replay(...)["policies"][name]``): ``runs``, ``steps``, ``escalation_rate``
(share of runs that ever ran on the frontier), ``frontier_step_share``, ``escalation_step`` (first
frontier step of each needs-frontier run, None if never) with its median, ``recall`` / ``precision``
of needs-frontier runs (labelled runs only; a run counts as flagged when it ever ran on the
frontier), ``switches_per_run`` (mean, incl. replica moves), ``tier_switches_per_run``,
``max_switches``, ``runs_with_flaps`` (two or more tier switches), token accounting (``warm_tokens``,
``reprefill_tokens``, ``new_prefill_tokens``, ``warm_share`` = warm / (warm + re-prefill), split by
tier), ``frontier_tokens`` and ``frontier_cost_usd`` (warm tokens at the cached price), and
``reasons`` (decision reason counts).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from features.prefix import RunPrefix
from features.runlog import RunLog
from models.types import Predictions
from router.policy.snapshot import build_snapshot
from router.policy.types import BackendState, Policy, RunState, apply_decision

__all__ = ["default_backends", "replay", "PolicyTally"]


def default_backends(
    local_model: str = "local-model", frontier_model: str = "frontier-model", n_local: int = 2
) -> list[BackendState]:
    """``n_local`` local replicas + one frontier, priced from the router's config defaults.

    Local: context, prefill and TTFT terms from ``router.server.settings.LocalTier``; ``price_in_per_m`` holds
    the GPU price in USD per GPU-hour (0 here: the policy's ``local_gpu_usd_per_hour`` applies).
    Frontier: context, prices and TTFT from ``router.server.settings.FrontierTier``.
    """
    from router.server.settings import FrontierTier, LocalTier

    lf, ff = LocalTier.model_fields, FrontierTier.model_fields
    if n_local < 0:
        raise ValueError("n_local must be >= 0")
    locals_ = [
        BackendState(
            name=f"local-{i}",
            tier="local",
            model=local_model,
            max_context=int(lf["max_context"].default),
            prefill_s_per_token=float(lf["prefill_s_per_token"].default),
            ttft_base_s=float(lf["ttft_base_s"].default),
        )
        for i in range(n_local)
    ]
    frontier = BackendState(
        name=str(ff["name"].default),
        tier="frontier",
        model=frontier_model,
        max_context=int(ff["max_context"].default),
        price_in_per_m=float(ff["price_in_per_m"].default),
        price_cached_in_per_m=float(ff["price_cached_in_per_m"].default),
        price_out_per_m=float(ff["price_out_per_m"].default),
        ttft_base_s=float(ff["ttft_base_s"].default),
    )
    return [*locals_, frontier]


@dataclass
class PolicyTally:
    """Running totals of one policy over a replay (see the module docstring for each figure)."""

    name: str
    runs: int = 0
    steps: int = 0
    frontier_steps: int = 0
    escalated_runs: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    switches: list[int] = field(default_factory=list)
    tier_switches: list[int] = field(default_factory=list)
    escalation_step: dict[str, int | None] = field(default_factory=dict)
    warm: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    reprefill: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    new_prefill: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    frontier_tokens: int = 0
    frontier_cost_usd: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)

    def report(self) -> dict[str, Any]:
        warm, rep = sum(self.warm.values()), sum(self.reprefill.values())
        esc_steps = [s for s in self.escalation_step.values() if s is not None]
        tier_sw = self.tier_switches
        return {
            "runs": self.runs,
            "steps": self.steps,
            "escalation_rate": _div(self.escalated_runs, self.runs),
            "frontier_step_share": _div(self.frontier_steps, self.steps),
            "recall": _div(self.tp, self.tp + self.fn),
            "precision": _div(self.tp, self.tp + self.fp),
            "needs_frontier_runs": self.tp + self.fn,
            "true_positive_runs": self.tp,
            "false_positive_runs": self.fp,
            "escalation_step": dict(self.escalation_step),
            "escalation_step_median": float(np.median(esc_steps)) if esc_steps else None,
            "switches_per_run": _div(sum(self.switches), self.runs),
            "tier_switches_per_run": _div(sum(tier_sw), self.runs),
            "max_switches": max(self.switches, default=0),
            "runs_with_flaps": sum(1 for s in tier_sw if s >= 2),
            "warm_tokens": warm,
            "reprefill_tokens": rep,
            "new_prefill_tokens": sum(self.new_prefill.values()),
            "warm_share": _div(warm, warm + rep),
            "by_tier": {
                t: {
                    "warm_tokens": self.warm[t],
                    "reprefill_tokens": self.reprefill[t],
                    "new_prefill_tokens": self.new_prefill[t],
                }
                for t in ("local", "frontier")
            },
            "frontier_tokens": self.frontier_tokens,
            "frontier_cost_usd": self.frontier_cost_usd,
            "reasons": dict(sorted(self.reasons.items())),
        }


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def _labels(runlog: RunLog) -> tuple[dict[str, bool | None], dict[str, float], dict[str, str]]:
    """Per run id: the ``needs_frontier`` label (None if unknown), start time and model."""
    import pandas as pd  # already loaded by features.runlog

    runs = runlog.runs
    labels: dict[str, bool | None] = {}
    started: dict[str, float] = {}
    models: dict[str, str] = {}
    n = len(runs)
    cols = {
        c: runs[c].tolist() if c in runs.columns else [None] * n
        for c in ("run_id", "needs_frontier", "started_at", "model")
    }
    for rid, lab, st, model in zip(
        cols["run_id"], cols["needs_frontier"], cols["started_at"], cols["model"], strict=True
    ):
        key = str(rid)
        labels[key] = None if pd.isna(lab) else bool(lab)
        if not pd.isna(st):
            started[key] = float(st)
        if isinstance(model, str):
            models[key] = model
    return labels, started, models


def replay(
    runlog: RunLog,
    policies: Sequence[Policy],
    predictor: Any,
    *,
    backends: list[BackendState] | None = None,
    weak_model: str | None = None,
) -> dict[str, Any]:
    """Replay ``runlog`` through ``policies``; returns the report dict (module docstring).

    ``predictor``: anything with ``predict(prefix) -> Predictions`` (a ``ModelBundle``, a
    ``ConstantPredictor``). ``weak_model``: replay only runs whose ``model`` is this (the local
    model, e.g. ``gpt-oss-120b`` in the tau2 pairs); it also names the local backends' model.
    ``backends``: the synthetic backend list (default :func:`default_backends`).
    """
    from features.extract import FEATURE_NAMES, extract, iter_frame_prefixes

    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(
            f"policy names must be unique in one replay (got {names}); set `name` in their configs"
        )
    labels, started, models = _labels(runlog)
    steps = runlog.steps
    if weak_model is not None and len(steps):
        keep = [rid for rid, m in models.items() if m == weak_model]
        if not keep and "model" in steps.columns:
            keep = sorted(set(steps.loc[steps["model"] == weak_model, "run_id"].astype(str)))
        steps = steps[steps["run_id"].astype(str).isin(set(keep))].reset_index(drop=True)
    template = backends if backends is not None else default_backends(local_model=weak_model or "local-model")
    if not template:
        raise ValueError("replay needs at least one backend")
    n = len(steps)
    completion = steps["completion_tokens"].to_numpy(dtype=np.int64) if n else np.zeros(0, np.int64)
    reuse_col = (
        steps["prefix_reuse_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
        if n and "prefix_reuse_tokens" in steps.columns
        else np.full(n, np.nan)
    )
    tallies = [PolicyTally(name=p.name) for p in policies]
    # per policy: its own backend copies (their warm tokens differ between policies)
    pbackends = [[replace(b) for b in template] for _ in policies]
    frontier_prices = {b.name: b for b in template if b.tier == "frontier"}
    for chunk in _run_chunks(iter_frame_prefixes(steps, started)):
        run_id = chunk[0][1].run_id
        label = labels.get(run_id)
        x = np.stack([extract(prefix) for _, prefix in chunk])
        preds = _predict_run(predictor, chunk, x)
        feats = [dict(zip(FEATURE_NAMES, row_x, strict=True)) for row_x in x.tolist()]
        for i, policy in enumerate(policies):
            _replay_run(
                policy, tallies[i], pbackends[i], frontier_prices, chunk, preds, feats, label,
                completion, reuse_col,
            )  # fmt: skip
    present = set(steps["run_id"].astype(str)) if n else set()
    labelled = [v for rid, v in labels.items() if v is not None and rid in present]
    return {
        "runs": tallies[0].runs if tallies else 0,
        "steps": n,
        "labelled_runs": len(labelled),
        "needs_frontier_runs": sum(1 for v in labelled if v),
        "weak_model": weak_model,
        "backends": [b.name for b in template],
        "policies": {t.name: t.report() for t in tallies},
    }


def _run_chunks(it: Iterator[tuple[int, RunPrefix]]) -> Iterator[list[tuple[int, RunPrefix]]]:
    """Group ``(row, prefix)`` pairs of consecutive rows into one list per run."""
    chunk: list[tuple[int, RunPrefix]] = []
    for row, prefix in it:
        if chunk and prefix.run_id != chunk[0][1].run_id:
            yield chunk
            chunk = []
        chunk.append((row, prefix))
    if chunk:
        yield chunk


def _predict_run(predictor: Any, chunk: list[tuple[int, RunPrefix]], x: np.ndarray) -> list[Predictions]:
    """Predictions for every step of one run: one batched call when the predictor offers
    ``predict_batch(X)``, else ``predict_features`` per row, else ``predict(prefix)``."""
    batch = getattr(predictor, "predict_batch", None)
    if batch is not None:
        return list(batch(x))
    fast = getattr(predictor, "predict_features", None)
    if fast is not None:
        return [fast(x[j]) for j in range(len(chunk))]
    return [predictor.predict(prefix) for _, prefix in chunk]


def _replay_run(
    policy: Policy,
    t: PolicyTally,
    bks: list[BackendState],
    frontier_prices: dict[str, BackendState],
    chunk: list[tuple[int, RunPrefix]],
    preds: list[Predictions],
    feats: list[dict[str, float]],
    label: bool | None,
    completion: np.ndarray,
    reuse_col: np.ndarray,
) -> None:
    """Decide every step of one run with ``policy``; add the run's figures to ``t``."""
    run_id = chunk[0][1].run_id
    st = RunState(run_id=run_id)
    wm: dict[str, int] = {}  # backend -> tokens of this run's context left cached there
    esc_step: int | None = None
    tier_sw = 0
    last_tier: str | None = None
    for j, (row, prefix) in enumerate(chunk):
        k = len(prefix.steps)
        prompt = int(prefix.new_prompt_tokens)
        ru = reuse_col[row]
        reusable = (prompt if k > 0 else 0) if math.isnan(ru) else min(int(ru), prompt)
        done = prompt + int(completion[row])
        for b in bks:
            b.warm_prefix_tokens = wm.get(b.name, 0)
        snap = build_snapshot(st, prefix, preds[j], bks, label_needs_frontier=label, features=feats[j])
        d = policy.decide(snap)
        apply_decision(st, d, k)
        t.steps += 1
        t.reasons[d.reason] += 1
        warm = min(wm.get(d.backend, 0), reusable)
        tier = d.tier
        t.warm[tier] += warm
        t.reprefill[tier] += reusable - warm
        t.new_prefill[tier] += prompt - reusable
        if tier == "frontier":
            t.frontier_steps += 1
            t.frontier_tokens += done
            fb = frontier_prices.get(d.backend)
            if fb is not None:
                t.frontier_cost_usd += (
                    warm * fb.price_cached_in_per_m
                    + (prompt - warm) * fb.price_in_per_m
                    + (done - prompt) * fb.price_out_per_m
                ) * 1e-6
            if esc_step is None:
                esc_step = k
        if last_tier is not None and last_tier != tier:
            tier_sw += 1
        last_tier = tier
        wm[d.backend] = done
    t.runs += 1
    t.switches.append(st.switches)
    t.tier_switches.append(tier_sw)
    escalated = esc_step is not None
    t.escalated_runs += escalated
    if label is True:
        t.escalation_step[run_id] = esc_step
        if escalated:
            t.tp += 1
        else:
            t.fn += 1
    elif label is False and escalated:
        t.fp += 1
