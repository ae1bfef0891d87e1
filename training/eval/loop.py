"""The learning loop, simulated: a deployment that explores, logs, retrains on its own traffic every
"day" and promotes a candidate only when off-policy evaluation says it beats the champion.

Algorithm of :func:`run_loop`, per domain of the paired data (:class:`~training.eval.loop_world.World`):

1. **Split by task, seeded**: ``eval_share`` of the domain's tasks are evaluation tasks; they never
   arrive in the deployment and never enter training. The rest arrive day by day.
2. **Prior**: a public-data bundle that has never seen this deployment's data (trained on the
   synthetic generator's paired runs, :func:`prior_bundle`; remaining work, cache reuse and a
   needs-frontier model), and the same paired runs as prior rows of the benefit model. The day-0
   champion is the learned policy on that bundle (its calibrated thresholds).
3. **Each day**: ``runs_per_day`` runs of the training tasks arrive and are served by the champion
   with exploration (``explore``: the same :class:`router.policy.explore.ExplorePolicy` the sidecar
   runs; its budget ``budget_usd`` per day); the step engine logs every step (propensity, explore
   flag), outcomes are drawn, the day's log is written (``logs/<domain>/day-NN.parquet``).
   The exploration cost paid that day = the champion's expected net value per run without
   exploration minus with it, on the same arrivals.
4. **Retrain**: the benefit model (:class:`training.logbenefit.IPWBenefitModel`) on every logged run so
   far (inverse-propensity weighted) plus the prior rows; candidates = the learned policy routing
   on that model's uplift at each of ``thresholds`` (never de-escalating: ``p_frontier_down`` 0).
5. **Promote by OPE**: every candidate and the champion are evaluated on the last
   ``ope_window_days`` days of logs (:func:`training.eval.ope_eval.evaluate_policies`). With
   ``promotion = "crossfit"`` (default) each candidate is scored by its task-grouped cross-fitted
   DR net value (:func:`training.eval.loop_promote.crossfit`: never on tasks its model was trained
   on; the deployment's future traffic brings new tasks), else by its in-sample DR estimate. The
   best candidate is promoted iff its DR net beats the champion's by more than the candidate's CI
   half-width; otherwise the day records by how much the margin fell short of it (``shortfall``).
   Each day also records the realised frontier share of its runs (``realised_share``: the logging
   policy, exploration included; ``champion_share``: the champion alone on the same arrivals).
   Decision and both estimates go to MLflow (one run per day). The
   simulated truth of every candidate (its expected net on the training tasks) is recorded beside
   its estimates.
6. **Evaluate** every day on the evaluation tasks (each served ``eval_reps`` times, no
   exploration): the champion, and once (they do not learn) every baseline and the oracle:
   success, cost and net value per run with standard errors over tasks.

7. **Under a budget** (``frontier_budget``, a share of runs): the champion and the candidate run
   with ``policy.frontier_budget`` (:mod:`router.policy.budget`: the threshold is the online
   conformal quantile of the policy's own scores, so the fixed thresholds no longer decide how many
   escalate); the candidates collapse to one, ``benefit@budget`` (the benefit model's uplift
   orders the runs instead of the prior's P), and promotion asks which *ordering* earns more at
   the same share. At the end the final champion's share, success and AIQ on the evaluation tasks
   (anchored at always-local / always-frontier there, :func:`training.eval.curves.aiq`) are set
   against per-step-threshold held to the same share: its threshold found by bisection
   (``match_iters`` serves, on the threshold's logit; hindsight the budgeted policy does not have),
   then the two served thresholds whose shares bracket the champion's are mixed per run with the
   weight that puts the expected share on it (a randomised threshold: a tie in the bundle's P
   escalates all or none of its runs, so no single threshold may land on the share); the paired
   success and AIQ differences (final - per-step-threshold) have task-bootstrap intervals and SEs
   (:func:`training.eval.budget_eval.aiq_intervals`: anchors recomputed in every resample), and
   ``aiq_not_below`` says whether the AIQ difference is >= -1 SE. Each serve of the
   evaluation set starts the budget's windows afresh (warm start from the bundle's calibration
   scores until ``min_window`` of the domain's own), so on a small evaluation set the share is
   mostly the warm start's. ``pst_matched`` says whether the mixed per-step-threshold came within 5
   points of the share (it cannot only when no served threshold reaches past it on one side).
The report and plots are :mod:`training.eval.loop_report`. Every knob is a field of :class:`LoopConfig`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from router.policy.explore import ExploreConfig
from training.eval.loop_promote import benefit_predictor, crossfit, mlflow_day, mlflow_start, read_days
from training.eval.outcome import Prices

__all__ = ["LoopConfig", "LoopStage", "run_loop", "loop_demo", "prior_bundle", "BASELINES"]

BASELINES: dict[str, dict[str, Any]] = {
    "always-local": {"kind": "always-local"},
    "always-frontier": {"kind": "always-frontier"},
    "per-step-threshold": {"kind": "per-step-threshold"},
    "session-sticky": {"kind": "session-sticky"},
    "stall-escalation": {"kind": "stall-escalation"},
    "oracle": {"kind": "oracle"},
}


def _default_explore() -> ExploreConfig:
    # tau2 runs are long (median ~15 steps, up to 100): a small hazard over many steps keeps late
    # escalations explorable
    return ExploreConfig(
        rate=0.2,
        start_frontier_share=0.5,
        escalate_hazard=0.08,
        max_step=80,
        budget_usd=30.0,
        budget_window_s=86400.0,
    )


class LoopConfig(BaseModel):
    """Every knob of the simulated learning loop (defaults: the demo-sized loop)."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(default=Path("runroute-loop"), description="report, logs, plots, MLflow")
    data: list[Path] = Field(default_factory=list, description="paired run logs (default: shipped tau2)")
    weak_model: str = Field(default="gpt-oss-120b", description="the local tier's model in the pairs")
    strong_model: str = Field(default="claude-sonnet-4-5", description="the frontier tier's model")
    domains: list[str] | None = Field(default=None, description="task_id prefixes (None: every domain)")
    eval_share: float = Field(default=0.4, gt=0, lt=1, description="share of tasks kept for evaluation")
    days: int = Field(default=6, ge=1, description="simulated days (retrain + OPE each day)")
    runs_per_day: int = Field(default=300, ge=10, description="runs arriving per day")
    arrival_rate: float = Field(default=0.05, gt=0, description="run starts per second")
    explore: ExploreConfig = Field(
        default_factory=_default_explore, description="the logging policy's exploration"
    )
    value_of_success: float = Field(default=1.0, ge=0, description="USD of a successful run (net value)")
    thresholds: list[float] = Field(
        default_factory=lambda: [0.05, 0.15, 0.3, 0.45], description="uplift thresholds of the candidates"
    )
    prior_runs: int = Field(
        default=600, ge=0, description="synthetic paired runs of the prior (0: no prior rows)"
    )
    prior_weight: float = Field(default=0.5, ge=0, description="weight of a prior row against a mean log row")
    eval_reps: int = Field(default=3, ge=1, description="times each evaluation task is served")
    ope_window_days: int = Field(default=3, ge=1, description="days of logs the OPE promotion uses")
    n_boot: int = Field(default=400, ge=50, description="bootstrap replicates of the OPE intervals")
    replicas: int = Field(default=4, ge=1, description="local replicas of the simulated deployment")
    prices: Prices = Field(default_factory=Prices, description="the outcome model's prices")
    variant: str = Field(default="escalate-anytime", description="outcome variant for mid-run escalation")
    promotion: str = Field(
        default="crossfit",
        pattern="^(crossfit|in-sample)$",
        description="crossfit: score each candidate by OPE on tasks its model was not trained on (task-grouped "
        "folds); in-sample: on the window, with the model trained on every log",
    )
    folds: int = Field(default=3, ge=2, description="task-grouped folds of the cross-fitted promotion")
    mlflow: bool = Field(
        default=True, description="log each day's promotion decision to MLflow (sqlite under out/)"
    )
    seed: int = Field(default=0, description="seed of the split, arrivals, outcomes and models")
    frontier_budget: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="share of runs the champion and the candidate may escalate (policy.frontier_budget); "
        "None: the candidates' fixed thresholds",
    )
    match_iters: int = Field(
        default=7, ge=1, description="bisection serves that hold per-step-threshold to the final share"
    )


Say = Callable[[str], None]


class LoopStage(BaseModel):
    """The demo's learning-loop stage: a small loop with exploration on."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="run the learning-loop stage")
    days: int = Field(default=4, ge=1, description="simulated days")
    runs_per_day: int = Field(default=200, ge=10, description="runs arriving per day")
    explore_rate: float = Field(default=0.2, ge=0, le=1, description="share of runs that explore")
    mlflow: bool = Field(default=True, description="log the promotion decisions to MLflow")
    frontier_budget: float | None = Field(
        default=0.2, gt=0, lt=1, description="the loop's frontier budget (share of runs; None: off)"
    )


def loop_demo(stage: LoopStage, out: Path, seed: int, say: Say, console: Any = None) -> dict[str, Any]:
    """The demo's loop stage: :func:`run_loop` on the shipped tau2 pairs, printed."""
    from training.eval.loop_report import print_loop

    cfg = LoopConfig(
        out=out,
        days=stage.days,
        runs_per_day=stage.runs_per_day,
        mlflow=stage.mlflow,
        seed=seed,
        frontier_budget=stage.frontier_budget,
    )
    cfg = cfg.model_copy(update={"explore": cfg.explore.model_copy(update={"rate": stage.explore_rate})})
    rep = run_loop(cfg, say)
    print_loop(rep, console)
    return rep


def prior_bundle(out: Path, n_runs: int, seed: int, say: Say) -> tuple[Any, Any]:
    """A bundle trained on synthetic paired runs only (never this deployment's tasks), and those
    runs' frames (the benefit model's prior rows)."""
    from features.generate import generate
    from features.runlog import RunLog, write_frame
    from models.bundle import ModelBundle
    from training.train import TrainConfig, run_training

    df = generate(max(n_runs, 200), seed=seed + 101)
    path = write_frame(df, out / "prior" / "synthetic.parquet")
    bdir = out / "prior" / "bundle"
    if not (bdir / "manifest.json").exists():
        say(f"training the prior bundle on {max(n_runs, 200)} synthetic paired runs")
        run_training(
            TrainConfig(
                runs=[path],
                out=bdir,
                evaluate=False,
                mlflow=False,
                n_estimators=60,
                calibration_cv=3,
                random_state=seed,
            )
        )
    return ModelBundle.load(bdir), RunLog.from_frame(df)


def _mean_se(x: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Mean over runs and its standard error over groups (tasks)."""
    import pandas as pd

    g = pd.Series(x).groupby(groups).mean().to_numpy()
    return float(np.mean(x)), float(np.std(g, ddof=1) / np.sqrt(len(g))) if len(g) > 1 else 0.0


def _held_to_share(
    cfg: LoopConfig,
    world: Any,
    ev: Any,
    final: Any,
    baselines: dict[str, dict[str, Any]],
    bundle: Any,
    scfg: Any,
    say: Say,
    dom: str,
) -> dict[str, Any]:
    """The final champion against per-step-threshold held to its share (module docstring, 7)."""
    from router.policy.config import build_policy
    from training.eval.budget_eval import aiq_intervals
    from training.eval.trials import bootstrap_mean_ci, paired_diff_ci

    target = float(final.escalated().mean())
    lo, hi = -12.0, 12.0  # bisection on the threshold's logit: P values crowd near 0 or 1
    tried: list[tuple[float, float, Any]] = []
    for _ in range(cfg.match_iters):  # share falls as the threshold rises
        t = 1.0 / (1.0 + math.exp(-(lo + hi) / 2))
        s = world.serve(
            *ev, build_policy({"kind": "per-step-threshold", "threshold": t}, bundle), bundle, scfg
        )
        share = float(s.escalated().mean())
        tried.append((t, share, s))
        x = (lo + hi) / 2
        lo, hi = (x, hi) if share > target else (lo, x)
    # the randomised threshold: the two served thresholds whose shares bracket the target, mixed per
    # run with the weight that puts the expected share on it (a tie in P escalates all or none of its
    # runs, so a deterministic threshold cannot always land there)
    above = [x for x in tried if x[1] >= target]
    below = [x for x in tried if x[1] <= target]
    a = min(above, key=lambda x: x[1]) if above else max(tried, key=lambda x: x[1])
    b = max(below, key=lambda x: x[1]) if below else min(tried, key=lambda x: x[1])
    w = 1.0 if a[1] == b[1] else (target - b[1]) / (a[1] - b[1])
    w = min(1.0, max(0.0, w))
    pst_success = w * a[2].success_p + (1 - w) * b[2].success_p
    pst_cost = w * a[2].cost + (1 - w) * b[2].cost
    share = w * a[1] + (1 - w) * b[1]
    closest = min(tried, key=lambda x: abs(x[1] - target))
    tasks = [final.task_of[r] for r in final.run_ids]
    al, af = baselines["always-local"], baselines["always-frontier"]
    succ = {
        "final": np.asarray(final.success_p, dtype=float),
        "per-step-threshold": pst_success,
        "always-local": np.asarray(al["success_per_run"], dtype=float),
        "always-frontier": np.asarray(af["success_per_run"], dtype=float),
    }
    cost = {
        "final": np.asarray(final.cost, dtype=float),
        "per-step-threshold": pst_cost,
        "always-local": np.asarray(al["cost_per_run"], dtype=float),
        "always-frontier": np.asarray(af["cost_per_run"], dtype=float),
    }
    aiq, aiq_diff = aiq_intervals(
        succ, cost, tasks, ["per-step-threshold"], cfg.n_boot, cfg.seed, ref="final"
    )
    ci = bootstrap_mean_ci(final.success_p, tasks, seed=cfg.seed)
    diff = paired_diff_ci(final.success_p, pst_success, tasks, seed=cfg.seed)
    ad = aiq_diff.get("per-step-threshold")
    out: dict[str, Any] = {
        "budget": cfg.frontier_budget,
        "final_share": target,
        "final_success": float(final.success_p.mean()),
        "final_success_ci": None if ci is None else [ci.low, ci.high],
        "final_aiq": None if "final" not in aiq else aiq["final"].mean,
        "pst_threshold": closest[0],
        "pst_thresholds": [b[0], a[0]],
        "pst_mix_weight": w,
        "pst_share": share,
        "pst_closest_share": closest[1],
        "pst_matched": abs(share - target) <= 0.05,
        "pst_bracketed": bool(above and below),  # served thresholds on both sides: the mix is exact
        "pst_success": float(pst_success.mean()),
        "pst_aiq": None if "per-step-threshold" not in aiq else aiq["per-step-threshold"].mean,
        "success_diff": None if diff is None else diff.mean,
        "success_diff_ci": None if diff is None else [diff.low, diff.high],
        "success_diff_se": None if diff is None else diff.se,
        "aiq_diff": None if ad is None else ad.mean,
        "aiq_diff_ci": None if ad is None else [ad.low, ad.high],
        "aiq_diff_se": None if ad is None else ad.se,
        "aiq_not_below": None if ad is None else bool(ad.mean >= -ad.se),
    }
    say(
        f"{dom}: final champion at budget {cfg.frontier_budget:g}: share {target:.3f}, success "
        f"{out['final_success']:.3f}, AIQ {_fmt(out['final_aiq'])}; per-step-threshold held to share "
        f"{share:.3f} (thresholds {b[0]:.3f}/{a[0]:.3f} mixed {w:.2f}): success {out['pst_success']:.3f}, "
        f"AIQ {_fmt(out['pst_aiq'])}; AIQ difference {_fmt(out['aiq_diff'])} (SE {_fmt(out['aiq_diff_se'])})"
    )
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _figures(served: Any, v: float) -> dict[str, Any]:
    groups = np.array([served.task_of[r] for r in served.run_ids])
    out: dict[str, Any] = {}
    for name, x in (
        ("success", served.success_p),
        ("cost", served.cost),
        ("net", served.net(v)),
        ("escalation", served.escalated()),
    ):
        m, se = _mean_se(x, groups)
        out[name], out[f"{name}_se"] = m, se
    out["per_run_net"] = served.net(v).tolist()
    out["tasks"] = groups.tolist()
    out["success_per_run"] = served.success_p.tolist()
    out["cost_per_run"] = served.cost.tolist()
    return out


def run_loop(cfg: LoopConfig, say: Say | None = None) -> dict[str, Any]:
    """Run the loop of every domain (module docstring); returns the report dict (JSON-ready)."""
    from features.runlog import read_runlog
    from features.samples import samples_dir

    say = say or (lambda _m: None)
    t0 = time.perf_counter()
    out = cfg.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = [Path(p) for p in cfg.data] or [samples_dir() / "tau2bench_airline.parquet"]
    log = read_runlog([str(f) for f in files])
    bundle, prior_log = prior_bundle(out, cfg.prior_runs, cfg.seed, say)
    tids = log.runs["task_id"].dropna().astype(str)
    domains = cfg.domains or sorted({t.split("/", 1)[0] for t in tids if "/" in t})
    report: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "domains": {}}
    from training.eval.loop_report import plot_domain, summarise
    from training.jsonio import jsonable

    plots: list[str] = []
    for dom in domains:
        res = _run_domain(cfg, out, log, dom, bundle, prior_log, say)
        res["summary"] = summarise(res, cfg.runs_per_day)
        plots += [str(p) for p in plot_domain(dom, res, out)]
        report["domains"][dom] = res
    report["plots"] = plots
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    import json

    (out / "loop.json").write_text(json.dumps(jsonable(report), indent=1, default=str) + "\n")
    return report


def _run_domain(
    cfg: LoopConfig, out: Path, log: Any, dom: str, bundle: Any, prior_log: Any, say: Say
) -> dict[str, Any]:
    import pandas as pd

    from features.runlog import records_to_frame, write_frame
    from router.policy.config import build_policy
    from training.eval.loop_world import World, sim_backends, sim_config
    from training.eval.ope_eval import OPEError, evaluate_policies
    from training.logbenefit import rows_from_pairs

    t_dom = time.perf_counter()
    world = World.from_log(
        log,
        cfg.weak_model,
        cfg.strong_model,
        dom,
        prices=cfg.prices,
        variant=cfg.variant,
        value_of_success=cfg.value_of_success,
    )
    tasks = list(world.tasks)
    rng = np.random.default_rng(cfg.seed)
    perm = [tasks[i] for i in rng.permutation(len(tasks))]
    n_eval = max(2, int(round(cfg.eval_share * len(tasks))))
    eval_tasks, train_tasks = sorted(perm[:n_eval]), sorted(perm[n_eval:])
    say(
        f"{dom}: {len(tasks)} paired tasks: {len(train_tasks)} arrive in the deployment, {len(eval_tasks)} kept for evaluation"
    )
    scfg = sim_config(seed=cfg.seed, replicas=cfg.replicas, prices=cfg.prices)
    backends = sim_backends(scfg)
    v = cfg.value_of_success
    # evaluation arrivals: every evaluation task eval_reps times; a fixed truth sample of the training tasks
    ev = world.arrivals(
        eval_tasks * cfg.eval_reps, rate=cfg.arrival_rate, seed=cfg.seed + 7, prefix=f"{dom}-eval"
    )
    truth_set = world.arrivals(
        train_tasks * 2, rate=cfg.arrival_rate, seed=cfg.seed + 8, prefix=f"{dom}-truth"
    )
    baselines = {}
    for name, pc in BASELINES.items():
        baselines[name] = _figures(world.serve(*ev, build_policy(pc, bundle), bundle, scfg), v)
    prior_rows = (
        rows_from_pairs(prior_log.runs, prior_log.steps, cfg.variant, cfg.prior_weight)
        if cfg.prior_runs
        else None
    )
    champ_cfg: dict[str, Any] = {"kind": "learned", "name": "champion"}
    champ_pred: Any = bundle
    champ_label = "prior (learned on the public bundle)"
    days: list[dict[str, Any]] = []
    logdir = out / "logs" / dom
    logdir.mkdir(parents=True, exist_ok=True)
    for f in logdir.glob("day-*.parquet"):
        f.unlink()
    tracking = mlflow_start(cfg, out)
    cands = {
        f"benefit@{t:g}": {
            "kind": "learned",
            "name": f"benefit@{t:g}",
            "p_frontier_up": t,
            "p_frontier_down": 0.0,
            "value_of_success_usd": v,
        }
        for t in cfg.thresholds
    }
    if cfg.frontier_budget is not None:
        fb = {"share": cfg.frontier_budget}
        champ_cfg["frontier_budget"] = fb
        cands = {
            "benefit@budget": {
                "kind": "learned",
                "name": "benefit@budget",
                "p_frontier_down": 0.0,
                "value_of_success_usd": v,
                "frontier_budget": fb,
            }
        }
    # each day is served by a fresh simulator (a router process whose budget windows start afresh):
    # the OPE replay restarts a budgeted candidate's windows at each day too
    epochs: dict[str, int] = {}
    for d in range(cfg.days):
        td = time.perf_counter()
        runs, steps, starts = world.arrivals(
            train_tasks,
            cfg.runs_per_day,
            rate=cfg.arrival_rate,
            seed=cfg.seed * 1000 + d,
            prefix=f"{dom}-d{d:02d}",
        )
        epochs.update(dict.fromkeys(runs["run_id"].astype(str), d))
        explore = cfg.explore.model_copy(update={"seed": cfg.seed * 1000 + d})
        logging_pol = build_policy({**champ_cfg, "explore": explore.model_dump()}, bundle)
        served = world.serve(runs, steps, starts, logging_pol, champ_pred, scfg)
        plain = world.serve(runs, steps, starts, build_policy(champ_cfg, bundle), champ_pred, scfg)
        frame = pd.concat(
            [
                records_to_frame(served.records),
                records_to_frame(world.run_records(served, seed=cfg.seed * 7919 + d)),
            ],
            ignore_index=True,
        )
        write_frame(frame, logdir / f"day-{d:02d}.parquet")
        day: dict[str, Any] = {
            "day": d,
            "champion": champ_label,
            "champion_config": dict(champ_cfg),
            "eval": _figures(world.serve(*ev, build_policy(champ_cfg, bundle), champ_pred, scfg), v),
            "explored_runs": int(served.explored.sum()),
            "exploration_cost_net_per_run": float(plain.net(v).mean() - served.net(v).mean()),
            "exploration_frontier_usd": float(
                sum(c for c, e in zip(served.cost, served.explored, strict=True) if e)
            ),
            "logged_net_per_run": float(served.net(v).mean()),
            # realised frontier share of the day's runs: the logging policy (exploration included)
            # and the champion alone on the same arrivals
            "realised_share": float(served.escalated().mean()),
            "champion_share": float(plain.escalated().mean()),
        }
        # retrain on every log so far; OPE on the recent window (estimates vs truth); promote by the
        # task-grouped cross-fitted OPE (a candidate is never scored on tasks its model saw)
        all_log = read_days(sorted(logdir.glob("day-*.parquet")))
        wlog = read_days(sorted(logdir.glob("day-*.parquet"))[-cfg.ope_window_days :])
        pred, model = benefit_predictor(all_log, prior_rows, bundle, prices=cfg.prices, seed=cfg.seed + d)
        pols = {"champion": (build_policy(champ_cfg, bundle), champ_pred)}
        pols.update({k: (build_policy(c, bundle), pred) for k, c in cands.items()})
        ope_kw = {
            "prices": cfg.prices,
            "value_of_success": v,
            "backends": backends,
            "n_boot": cfg.n_boot,
            "seed": cfg.seed + d,
            "max_unsupported_share": 0.05,
            "skip_unsupported": True,
            "epochs": epochs,
        }
        fold_refused: dict[str, str] = {}
        try:
            rep = evaluate_policies(wlog, pols, **ope_kw)  # type: ignore[arg-type]
            cross = (
                crossfit(
                    all_log,
                    wlog,
                    cands,
                    prior_rows,
                    bundle,
                    folds=cfg.folds,
                    seed=cfg.seed * 31 + d,
                    prices=cfg.prices,
                    ope_kw=ope_kw,
                    why=fold_refused,
                )
                if cfg.promotion == "crossfit"
                else None
            )
        except OPEError as e:
            say(f"{dom} day {d}: OPE refused ({e}); champion kept")
            day.update(promoted=False, decision=f"OPE refused: {e}")
            days.append(day)
            continue
        ope = {k: r.to_json() for k, r in rep.candidates.items()}
        truth = {k: _figures(world.serve(*truth_set, p, pr, scfg), v)["net"] for k, (p, pr) in pols.items()}
        scored = (
            cross
            if cross is not None
            else {k: rep.candidates[k].estimates["dr"]["net"] for k in cands if k in rep.candidates}
        )
        scored = {k: e for k, e in scored.items() if e.value is not None}
        if "champion" not in rep.candidates or not scored:
            why = {**rep.refused, **fold_refused}
            say(f"{dom} day {d}: nothing to compare ({why}); champion kept")
            day.update(promoted=False, decision=f"no comparable candidate: {why}", ope=ope)
            days.append(day)
            continue
        ch = rep.candidates["champion"].estimates["dr"]["net"]
        best = max(scored, key=lambda k: scored[k].value)  # type: ignore[arg-type,return-value]
        b = scored[best]
        margin = (b.value or 0.0) - (ch.value or 0.0)
        promote = b.half_width is not None and margin > b.half_width
        # not promoted: by how much the margin fell short of the half-width it had to beat
        shortfall = None if promote or b.half_width is None else float(b.half_width - margin)
        day.update(shortfall=shortfall)
        day.update(
            ope=ope, truth=truth, best=best, margin=margin, half_width=b.half_width, promoted=bool(promote),
            crossfit={k: x.as_dict() for k, x in cross.items()} if cross is not None else None,
            decision=f"{best}: DR net {b.value:.4f} ({cfg.promotion}) vs champion {ch.value:.4f} (margin {margin:+.4f}, half-width {b.half_width:.4f})"
            + (f"; the margin fell short of the half-width by {shortfall:.4f}" if shortfall is not None else ""),
            ope_wall_s=rep.wall_s, ope_runs=rep.n_runs, benefit_rows=model.n_rows_, refused=rep.refused,
        )  # fmt: skip
        mlflow_day(tracking, dom, d, day, ch, b)
        if promote:
            champ_cfg, champ_pred, champ_label = dict(cands[best], name="champion"), pred, f"{best} (day {d})"
        day["wall_s"] = round(time.perf_counter() - td, 1)
        say(
            f"{dom} day {d}: eval net {day['eval']['net']:.4f}; frontier share {day['realised_share']:.3f} "
            f"(champion alone {day['champion_share']:.3f}); {'PROMOTED' if promote else 'kept'} — {day['decision']} ({day['wall_s']}s)"
        )
        days.append(day)
    final_served = world.serve(*ev, build_policy(champ_cfg, bundle), champ_pred, scfg)
    final = _figures(final_served, v)
    at_share = (
        _held_to_share(cfg, world, ev, final_served, baselines, bundle, scfg, say, dom)
        if cfg.frontier_budget is not None
        else None
    )
    return {
        "at_share": at_share,
        "tasks": {"train": train_tasks, "eval": eval_tasks},
        "baselines": baselines,
        "days": days,
        "final": final,
        "final_champion": champ_label,
        "wall_s": round(time.perf_counter() - t_dom, 1),
    }
