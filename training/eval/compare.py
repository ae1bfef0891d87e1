"""Every routing policy on one workload, through the what-if simulator, scored with the outcome model.

Algorithm of :func:`compare_policies`:

1. Build the simulator workload (``router.sim.whatif.Workload``) and the outcome records
   (:func:`training.eval.outcome.records_from_frames`) from the run-log frames; draw the run starts
   once (Poisson at ``sim.arrival_rate``, seeded), so every policy sees the same arrivals.
2. For each policy of ``policies`` (default :data:`POLICIES`; the same ``build_policy`` objects the
   router runs), simulate the workload on the deployment of :class:`SimSettings` (node profile,
   replicas, KV cache, frontier prices, optional admission control at each run's first step). The
   per-step outcome of the simulation gives each run's tiers (local / frontier / rejected) and the
   runs spilled whole by admission; :func:`training.eval.outcome.policy_outcomes` turns the tiers
   into success and cost.
3. The swept policies (:data:`SWEPT`) are simulated again at each of ``sweep_thresholds`` (learned:
   ``p_frontier_up`` = threshold, ``p_frontier_down`` = threshold - the bundle's band).
4. Frontier-relative figures per outcome variant (:mod:`training.eval.curves`): the cheapest point
   reaching 95% of always-frontier's success, and AIQ against always-local / always-frontier.
5. Intervals (:func:`_bootstrap_aiq`, headline variant): the tasks are resampled with replacement
   (:data:`AIQ_BOOT` resamples, seed 0), one draw shared by every policy and sweep point; in each
   resample every run counts as often as its task was drawn, and success, cost, the always-local /
   always-frontier anchors and so AIQ are recomputed. AIQ's interval is the 2.5-97.5 percentiles;
   each policy's paired difference to ``per-step-threshold`` (success and AIQ) takes the same
   percentiles of the per-resample differences (paired: the same tasks in both).

The result is a typed :class:`training.eval.scorecard.SetResult`. Helpers beside it score the
bundle on a held-out set (:func:`model_scores`), give the bounds of paired runs without steps
(:func:`run_level_pairs`) and the training quantiles added to the sweep (:func:`train_quantiles`).

Knobs: :class:`SimSettings` (the deployment), ``prices`` (:class:`training.eval.outcome.Prices`),
``policies``, ``sweep_thresholds``, ``variants`` (outcome-model variants; the first is the headline),
``map`` (how the simulations are mapped: the builtin, or one Dask task each).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.figures import percentile
from training.eval.config import SimSettings
from training.eval.outcome import DEFAULT_VARIANTS, FRONTIER, LOCAL, REJECTED, Prices, run_values
from training.eval.scorecard import (
    ModelScores,
    PolicyRow,
    RunLevelPair,
    SetResult,
    SimInfo,
    Skipped,
    SweepPoint,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import RunLog
    from models.bundle import ModelBundle
    from router.sim.scorecard import SimResult
    from router.sim.workload import Workload
    from training.dataset import Dataset

__all__ = [
    "POLICIES",
    "SWEPT",
    "Progress",
    "compare_policies",
    "sim_figures",
    "model_scores",
    "run_level_pairs",
    "train_quantiles",
]

Progress = Callable[[str], None]
#: a policy config (:mod:`router.policy.config`): its ``kind``, ``name`` and thresholds
PolicyCfg = dict[str, str | float]
#: one simulation job (label, policy config) and what it returns: the simulator's figures of the
#: row, each run's tiers, the runs spilled whole, steps simulated, wall seconds
Job = tuple[str, PolicyCfg]
JobOut = tuple[dict[str, float | int | None], dict[str, np.ndarray], set[str], int, float]

# label -> policy config (router.policy.config); the order is the order of every table
POLICIES: dict[str, PolicyCfg] = {
    "always-local": {"kind": "always-local"},
    "always-frontier": {"kind": "always-frontier"},
    "per-step-threshold": {"kind": "per-step-threshold"},
    "session-sticky": {"kind": "session-sticky"},
    "stall-escalation": {"kind": "stall-escalation"},
    "learned": {"kind": "learned"},
    "oracle": {"kind": "oracle"},
}
SWEPT = ("learned", "per-step-threshold")
#: task-bootstrap resamples behind the AIQ intervals and the paired differences
AIQ_BOOT = 400
#: the baseline every policy's paired difference is taken against
PAIRED_REF = "per-step-threshold"


def _noop(_: str) -> None:
    return None


def _per_run(res: SimResult, workload: Workload) -> tuple[dict[str, np.ndarray], set[str]]:
    """Each run's per-step tiers (LOCAL / FRONTIER / REJECTED) and the runs admission spilled whole
    (their first step's outcome is SPILLED)."""
    from router.sim.whatif import REJECTED as S_REJ
    from router.sim.whatif import SERVED_LOCAL, SPILLED

    code = np.where(res.outcome == SERVED_LOCAL, LOCAL, np.where(res.outcome == S_REJ, REJECTED, FRONTIER))
    tiers: dict[str, np.ndarray] = {}
    spilled: set[str] = set()
    g = 0
    for spec in workload.runs:
        n = len(spec.steps)
        tiers[spec.run_id] = code[g : g + n].astype(np.int64)
        if n and res.outcome[g] == SPILLED:
            spilled.add(spec.run_id)
        g += n
    return tiers, spilled


def sim_figures(res: SimResult) -> dict[str, float | int | None]:
    """The simulator part of a policy row (``router.sim.whatif.scorecard`` plus long-step p95)."""
    from router.sim.whatif import REJECTED as S_REJ
    from router.sim.whatif import scorecard

    card = scorecard(res)
    served = res.outcome != S_REJ
    lat = res.latency[served]
    short = res.short[served]
    keep = (
        "runs_completed",
        "runs_rejected",
        "runs_spilled",
        "run_completion_s_p50",
        "run_completion_s_p95",
        "step_latency_s_p95",
        "short_step_latency_s_p95",
    )
    out = {k: card[k] for k in keep}
    out["long_step_latency_s_p95"] = percentile(lat[~short], 95)
    for k in ("ttft_s_p95", "cache_hit_rate", "cache_hit_upper_bound", "flaps_per_run", "slo_attainment"):
        out[k] = card[k]
    out["sim_cost_usd"] = card["cost_usd"]
    return out


def _policy_cfg(label: str, base: PolicyCfg, threshold: float | None, band: float) -> PolicyCfg:
    cfg = dict(base, name=label)
    if threshold is None:
        return cfg
    if base["kind"] == "learned":
        cfg.update(p_frontier_up=threshold, p_frontier_down=max(0.0, threshold - band))
    elif base["kind"] == "per-step-threshold":
        cfg.update(threshold=threshold)
    return cfg


def _frontier_relative(
    rows: list[dict[str, Any]], sweeps: dict[str, list[dict[str, Any]]], variants: Sequence[str]
) -> None:
    """Add cost @ 95% of always-frontier success and AIQ (per variant; headline = the first) to ``rows``."""
    from training.eval.curves import aiq, cost_at_quality

    by = {r["policy"]: r for r in rows}
    al, af = by.get("always-local"), by.get("always-frontier")
    for r in rows:
        r["aiq_by_variant"] = {}
        r["cost_at_95pct_frontier_success_by_variant"] = {}
    for v in variants:
        if al is None or af is None:
            break
        q_l, q_f = al["success_by_variant"][v], af["success_by_variant"][v]
        c_l, c_f = al["cost_usd"], af["cost_usd"]
        target = None if q_f is None else 0.95 * q_f
        for r in rows:
            cq = [(r["cost_usd"], r["success_by_variant"][v])]
            cq += [(p["cost_usd"], p["success_by_variant"][v]) for p in sweeps.get(r["policy"], [])]
            r["cost_at_95pct_frontier_success_by_variant"][v] = cost_at_quality(cq, target)
            r["aiq_by_variant"][v] = None if q_l is None else aiq(cq, (c_l, q_l), c_l, c_f)
    head = variants[0] if variants else None
    for r in rows:
        r["cost_at_95pct_frontier_success_usd"] = r["cost_at_95pct_frontier_success_by_variant"].get(head)
        r["aiq"] = r["aiq_by_variant"].get(head)


RunValues = tuple[list[str], np.ndarray, np.ndarray]


def _boot_points(vals: RunValues, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per resample (rows of the run weights ``w``): mean success over scored runs, total cost."""
    _, s, c = vals
    ok = ~np.isnan(s)
    den = w[:, ok].sum(axis=1)
    succ = (w[:, ok] @ s[ok]) / np.maximum(den, 1e-12)
    return succ, w @ c


def _bootstrap_aiq(
    rows: list[dict[str, Any]],
    sweeps: dict[str, list[dict[str, Any]]],
    vals: dict[str, RunValues],
    sweep_vals: dict[str, list[RunValues]],
    *,
    n_boot: int = AIQ_BOOT,
    alpha: float = 0.05,
    seed: int = 0,
) -> None:
    """AIQ intervals and paired differences to :data:`PAIRED_REF` (module docstring, step 5)."""
    from training.eval.curves import aiq

    by = {r["policy"]: r for r in rows}
    if "always-local" not in vals or "always-frontier" not in vals:
        return
    tasks = vals["always-local"][0]
    _, inv = np.unique(np.asarray(tasks, dtype=object).astype(str), return_inverse=True)
    t = int(inv.max()) + 1 if len(inv) else 0
    if t < 2:
        return
    rng = np.random.default_rng(seed)
    w = rng.multinomial(t, np.full(t, 1.0 / t), size=n_boot).astype(float)[:, inv]
    pts = {p: _boot_points(v, w) for p, v in vals.items()}
    spts = {p: [_boot_points(v, w) for v in vs] for p, vs in sweep_vals.items()}
    (q_l, c_l), (_, c_f) = pts["always-local"], pts["always-frontier"]
    boot_aiq: dict[str, np.ndarray] = {}
    for p, (q, c) in pts.items():
        out = np.full(n_boot, np.nan)
        for b in range(n_boot):
            cq = [(c[b], q[b])] + [(sc[b], sq[b]) for sq, sc in spts.get(p, [])]
            a = aiq(cq, (c_l[b], q_l[b]), c_l[b], c_f[b])
            out[b] = np.nan if a is None else a
        boot_aiq[p] = out
    lo_p, hi_p = 100 * alpha / 2, 100 * (1 - alpha / 2)

    def ci(x: np.ndarray) -> tuple[float | None, float | None, float | None]:
        x = x[~np.isnan(x)]
        if len(x) < 2:
            return None, None, None
        lo, hi = np.percentile(x, [lo_p, hi_p])
        return float(lo), float(hi), float(np.std(x, ddof=1))

    ref = by.get(PAIRED_REF)
    for p, r in by.items():
        if p not in boot_aiq:
            continue
        r["aiq_ci_low"], r["aiq_ci_high"], r["aiq_se"] = ci(boot_aiq[p])
        if ref is None or PAIRED_REF not in pts:
            continue
        ds = pts[p][0] - pts[PAIRED_REF][0]
        r["success_diff_vs_ref"] = (
            None
            if r.get("success_rate") is None or ref.get("success_rate") is None
            else r["success_rate"] - ref["success_rate"]
        )
        r["success_diff_vs_ref_ci_low"], r["success_diff_vs_ref_ci_high"], _ = ci(ds)
        r["aiq_diff_vs_ref"] = (
            None if r.get("aiq") is None or ref.get("aiq") is None else r["aiq"] - ref["aiq"]
        )
        da = boot_aiq[p] - boot_aiq[PAIRED_REF]
        r["aiq_diff_vs_ref_ci_low"], r["aiq_diff_vs_ref_ci_high"], _ = ci(da)


def compare_policies(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    bundle: ModelBundle | None,
    prices: Prices,
    sim: SimSettings,
    policies: dict[str, PolicyCfg] | None = None,
    sweep_thresholds: Sequence[float] = (),
    variants: Sequence[str] = DEFAULT_VARIANTS,
    progress: Progress | None = None,
    map: Callable[[Callable[[Job], JobOut], Iterable[Job]], Iterable[JobOut]] = builtins.map,  # noqa: A002
) -> SetResult:
    """Every policy on one workload (the module docstring); ``bundle=None`` skips the model policies.

    Every simulation (each policy, each sweep threshold) is one call of a pure function through
    ``map``: the builtin, or a Dask map (``runroute bench --dask``) that runs them as tasks."""
    from router.policy.admission import AdmissionController
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.calibrate import admission_config_for_profile
    from router.sim.frontier import FrontierConfig
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload
    from training.eval.outcome import policy_outcomes, records_from_frames

    say = progress or _noop
    pols = dict(policies or POLICIES)
    workload = Workload.from_frames(steps, runs)
    records = records_from_frames(runs, steps)
    starts = run_starts(
        f"rate={sim.arrival_rate}",
        len(workload.runs),
        seed=sim.seed,
        mean_steps_per_run=workload.mean_steps_per_run(),
    )
    frontier = FrontierConfig(
        price_in_per_m=prices.frontier_in_per_m,
        price_cached_in_per_m=prices.frontier_cached_in_per_m,
        price_out_per_m=prices.frontier_out_per_m,
    )
    base = SimConfig(
        profile=load_profile(sim.profile, sim.gpu),
        replicas=sim.replicas,
        kv_cache_gb=sim.kv_cache_gb,
        frontier=frontier,
        gpu_hour_usd=prices.gpu_hour_usd,
        slo_short_s=sim.slo_short_s,
        slo_ttft_s=sim.slo_ttft_s,
        seed=sim.seed,
    )
    band = 0.0
    if bundle is not None and getattr(bundle, "thresholds", None):
        band = max(
            0.0, float(bundle.thresholds["p_frontier_up"]) - float(bundle.thresholds["p_frontier_down"])
        )

    def simulate(job: Job) -> JobOut:
        label, cfg = job
        policy = build_policy(cfg, bundle)
        hook = None
        if sim.admission:
            acfg = admission_config_for_profile(base.profile, sim.kv_cache_gb, sim.slo_short_s)
            hook = AdmissionController(acfg)
        res = Simulator(workload, policy, base, starts, predictor=bundle, admission=hook).run()
        res.policy = label
        return (sim_figures(res), *_per_run(res, workload), len(res.outcome), res.wall_s)

    # every simulation (each policy, each sweep threshold) is one job of one ``map``
    labels = []
    jobs: list[Job] = []
    for label, pcfg in pols.items():
        if pcfg["kind"] in ("learned", "per-step-threshold") and bundle is None:
            say(f"{label}: skipped (needs a model bundle)")
            continue
        labels.append(label)
        jobs.append((label, _policy_cfg(label, pcfg, None, band)))
        if label in SWEPT and sweep_thresholds:
            jobs += [(label, _policy_cfg(label, pcfg, float(th), band)) for th in sweep_thresholds]
    out_iter = iter(map(simulate, jobs))
    rows: list[dict[str, Any]] = []
    sweeps: dict[str, list[dict[str, Any]]] = {}
    head = variants[0] if variants else None
    vals: dict[str, RunValues] = {}
    sweep_vals: dict[str, list[RunValues]] = {}
    for label in labels:
        pcfg = pols[label]
        figs, tiers, spilled, n_out, wall_s = next(out_iter)
        out = policy_outcomes(records, tiers, prices, variants, spilled)
        vals[label] = run_values(records, tiers, prices, head)
        row = {"policy": label, "kind": pcfg["kind"], **figs, **out}
        if pcfg["kind"] == "learned" and bundle is not None:
            row["thresholds"] = {
                "p_frontier_up": float(bundle.thresholds["p_frontier_up"]),
                "p_frontier_down": float(bundle.thresholds["p_frontier_down"]),
            }
        elif pcfg["kind"] == "per-step-threshold" and bundle is not None:
            row["thresholds"] = {"threshold": float(bundle.thresholds["p_frontier_up"])}
        rows.append(row)
        say(f"{label}: {n_out} steps simulated in {wall_s:.1f}s")
        if label in SWEPT and sweep_thresholds:
            pts = []
            for th in sweep_thresholds:
                f2, t2, sp2, _, _ = next(out_iter)
                o2 = policy_outcomes(records, t2, prices, variants, sp2)
                sweep_vals.setdefault(label, []).append(run_values(records, t2, prices, head))
                pts.append(
                    {
                        "threshold": float(th),
                        "success_rate": o2["success_rate"],
                        "success_by_variant": o2["success_by_variant"],
                        "cost_usd": o2["cost_usd"],
                        "escalation_rate": o2["escalation_rate"],
                        "flaps_per_run": f2["flaps_per_run"],
                    }
                )
            sweeps[label] = pts
            say(f"{label}: swept {len(pts)} thresholds")
    _frontier_relative(rows, sweeps, variants)
    _bootstrap_aiq(rows, sweeps, vals, sweep_vals)
    return SetResult(
        n_runs=len(workload.runs),
        n_steps=int(sum(len(s.steps) for s in workload.runs)),
        n_quality_runs=int(sum(1 for r in records.values() if r.quality_known)),
        n_needs_frontier=int(sum(1 for r in records.values() if r.needs_frontier)),
        policies=[PolicyRow.model_validate(r) for r in rows],
        sweeps={k: [SweepPoint.model_validate(p) for p in v] for k, v in sweeps.items()},
        sim=SimInfo(
            **sim.model_dump(),
            node_profile=base.profile.name,
            arrivals=f"Poisson, {sim.arrival_rate:g} run starts/s (seed {sim.seed})",
        ),
    )


def model_scores(bundle: ModelBundle, log: RunLog) -> ModelScores | Skipped:
    """The bundle's predictors scored on a held-out run log (escalation AUC/Brier/ECE, cache MAE,
    remaining-steps pinball); ``Skipped`` with the reason when the set cannot be scored."""
    from training.dataset import build_dataset
    from training.evaluate import bundle_scores

    try:
        return ModelScores.model_validate(bundle_scores(bundle, build_dataset(log)))
    except ValueError as e:  # e.g. no step records or no labels: say so in the report
        return Skipped(skipped=str(e))


def run_level_pairs(runs: pd.DataFrame, steps: pd.DataFrame) -> dict[str, RunLevelPair]:
    """Paired runs without step records (SWE-bench Pro): the only policies they can score are the two
    ends and the oracle (nothing to predict from), so report those bounds per (source, weak, strong)."""
    with_steps = set(steps["run_id"].tolist()) if len(steps) else set()
    step_sources = set(runs.loc[runs["run_id"].isin(with_steps), "source"].tolist())
    pr = runs[runs["strong_outcome"].notna() & ~runs["source"].isin(step_sources)]
    out: dict[str, RunLevelPair] = {}
    for (src, weak, strong), g in pr.groupby(["source", "model", "strong_model"], dropna=True):
        w = (g["outcome"] == "success").to_numpy()
        st = (g["strong_outcome"] == "success").to_numpy()
        out[f"{src}: {weak} vs {strong}"] = RunLevelPair(
            runs=int(len(g)),
            always_local_success=float(w.mean()),
            always_frontier_success=float(st.mean()),
            oracle_success=float((w | st).mean()),
            oracle_escalation_rate=float((~w & st).mean()),
        )
    return out


def train_quantiles(bundle: ModelBundle, ds: Dataset | None, n: int) -> list[float]:
    """``n`` quantiles (evenly spaced, exclusive of 0 and 1) of each *training* run's maximum
    P(frontier), and a point just above each (never computed on held-out data)."""
    if n <= 0 or ds is None or len(ds) == 0:
        return []
    import pandas as pd

    p = bundle.escalation.predict_proba(ds.X)[:, 1]
    mx = pd.Series(p).groupby(ds.meta["run_id"].to_numpy()).max().to_numpy()
    qs = np.unique(np.round(np.quantile(mx, np.linspace(0, 1, n + 2)[1:-1]), 4))
    # both sides of each quantile: calibrated probabilities bunch on steps, and a threshold at a step
    # (p >= q escalates the whole mass) behaves unlike one just above it
    return sorted({float(q) for q in qs} | {min(1.0, round(float(q) + 1e-4, 4)) for q in qs})
