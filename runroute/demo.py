"""The main job: ``runroute demo``, a short pipeline over :mod:`training.eval`.

Algorithm of :func:`run_demo` (every knob is a field of :class:`DemoConfig`, all defaults embedded):

1. **Import**: read the shipped samples (:func:`features.samples.sample_files`, validated) and print
   the per-source summary table (:mod:`features.importers.summary`).
2. **Split by task, seeded** (never by row; :func:`training.eval.split.split_by_task`):
   ``tau2_holdout_share`` of the tau2 airline tasks are held out with every run of those task ids of
   any source; a synthetic held-out workload has its own seed; training = the rest + synthetic runs.
3. **Train** the bundle (:func:`training.train.run_training`) with MLflow tracking in
   ``<out>/mlflow.db`` (artifacts in ``<out>/mlruns``); the threshold sweep = ``sweep_thresholds`` +
   quantiles of the *training* runs' max P(frontier) (:func:`training.eval.compare.train_quantiles`).
4. **Compare** every policy on each held-out set through the what-if simulator
   (:func:`training.eval.compare.compare_policies`): tau2, synthetic at ``sim.arrival_rate`` and at
   ``busy_arrival_rate`` (the local replicas near saturation); the bundle's predictors are scored on
   each set; paired runs without steps give run-level bounds.
5. **Live**: a short segment through the real HTTP sidecar with fake backends
   (:func:`training.eval.live.live_segment`), bounded by ``live.budget_s``; while its first policy
   runs, a headless Chromium screenshots the sidecar's ``/ui`` into ``ui.png`` (skipped with the
   reason printed when chromium or selenium is missing).
6. **Loop** (``loop.enabled``): the learning loop on a simulated deployment of the tau2 pairs
   (:func:`training.eval.loop.run_loop`, demo-sized: ``loop.days`` x ``loop.runs_per_day``, with
   exploration on), written with its plots under ``<out>/loop/`` and printed.
7. **Budget** (``budget_share``): the frontier budget leave-one-domain-out on the shipped paired
   sample (:func:`training.eval.budget_plot.budget_stage`): per held-out domain the realised share
   and success against per-step-threshold and random mixing at the same share; the budget curve
   ``budget_curve.png`` (success and cost against frontier share, 95% bands) and ``budget.json``.
8. **Report**: the typed scorecard (:class:`training.eval.scorecard.Scorecard`) is written with
   ``report.md`` and the PNG plots (:func:`training.eval.report.write_report`) and printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from features.samples import samples_dir
from runroute.stages import Stages
from training.eval.config import LiveSettings, SimSettings
from training.eval.loop import LoopStage, loop_demo
from training.eval.outcome import DEFAULT_VARIANTS, Prices

__all__ = ["DemoConfig", "SimSettings", "LiveSettings", "run_demo"]


class DemoConfig(BaseModel):
    """Every knob of the demo; the defaults are what ``make demo`` runs."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(default=Path("runroute-report"), description="report directory")
    data_dir: Path = Field(default_factory=samples_dir, description="shipped samples (package runroute.data)")
    seed: int = Field(default=0, description="seed of the task split")
    tau2_holdout_share: float = Field(default=0.4, gt=0, lt=1, description="share of tau2 tasks held out")
    synthetic_train_runs: int = Field(default=800, ge=0, description="synthetic runs added to training")
    synthetic_holdout_runs: int = Field(default=400, ge=1, description="runs of the synthetic held-out set")
    synthetic_train_seed: int = Field(default=101, description="generator seed of the training runs")
    synthetic_holdout_seed: int = Field(default=202, description="generator seed of the held-out runs")
    target_frontier_share: float = Field(default=0.3, ge=0, le=1, description="training's threshold target")
    train_evaluate: bool = Field(default=False, description="run training's grouped CV (slow on 2 cores)")
    n_estimators: int = Field(default=80, ge=1, description="trees of training's regressors")
    mlflow: bool = Field(default=True, description="track training in MLflow (sqlite under out/)")
    sweep_thresholds: list[float] = Field(
        default_factory=lambda: [round(x, 2) for x in np.linspace(0.0, 1.0, 11)],
        description="p_frontier thresholds swept for learned / per-step-threshold",
    )
    sweep_train_quantiles: int = Field(
        default=10,
        ge=0,
        description="add this many quantiles of the per-run max P(frontier) on the *training* runs to the sweep "
        "(resolution where the calibrated probabilities bunch up; never computed on held-out data)",
    )
    prices: Prices = Field(default_factory=Prices, description="every price of the outcome model")
    variants: list[str] = Field(
        default_factory=lambda: list(DEFAULT_VARIANTS), description="outcome variants"
    )
    sim: SimSettings = Field(default_factory=SimSettings, description="the simulated deployment")
    busy_arrival_rate: float | None = Field(
        default=1.0,
        gt=0,
        description="also replay the synthetic held-out set at this run-start rate (None: skip)",
    )
    live: LiveSettings = Field(default_factory=LiveSettings, description="the live sidecar segment")
    loop: LoopStage = Field(default_factory=lambda: LoopStage(), description="the learning-loop stage")
    budget_share: float | None = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="the budget stage: leave-one-domain-out on the shipped paired sample at this frontier "
        "share, and the budget curve (budget_curve.png); None: skip",
    )
    budget_trees: int = Field(default=80, ge=1, description="trees of the budget stage's escalation models")
    limit_tau2_tasks: int | None = Field(default=None, description="tests: use only this many tau2 tasks")
    limit_taubench_runs: int | None = Field(default=None, description="tests: cap the tau-bench runs")


def _train(cfg: DemoConfig, out: Path, data: Path, say: Any) -> Any:
    from training.train import TrainConfig, run_training

    tcfg = TrainConfig(
        runs=[data],
        out=out / "bundle",
        report_json=out / "train_report.json",
        target_frontier_share=cfg.target_frontier_share,
        holdout_share=0.0,
        evaluate=cfg.train_evaluate,
        n_folds=3,
        calibration_cv=3,
        n_estimators=cfg.n_estimators,
        random_state=cfg.seed,
        mlflow=cfg.mlflow,
        tracking_uri=f"sqlite:///{out / 'mlflow.db'}" if cfg.mlflow else None,
        experiment="runroute-demo",
        registered_model="runroute-demo-bundle",
        node_gpu=cfg.sim.gpu,  # cache labels from the simulated deployment's cache
        kv_cache_gb=cfg.sim.kv_cache_gb,
        cache_replicas=cfg.sim.replicas,
    )
    if not cfg.mlflow:  # mlflow is not even imported
        return tcfg, run_training(tcfg, progress=say)
    from training.mlflow_log import ensure_experiment, quiet_mlflow

    with quiet_mlflow():
        ensure_experiment(str(tcfg.tracking_uri), tcfg.experiment, out / "mlruns")
        return tcfg, run_training(tcfg, progress=say)


def _training_info(cfg: DemoConfig, out: Path, tcfg: Any, tres: Any) -> Any:
    from training.eval.compare import train_quantiles
    from training.eval.scorecard import TrainingInfo

    b, rep = tres.bundle, tres.report
    sweep = set(cfg.sweep_thresholds) | set(train_quantiles(b, tres.dataset, cfg.sweep_train_quantiles))
    return TrainingInfo(
        bundle_dir=str(out / "bundle"),
        bundle_version=b.version,
        thresholds=dict(b.thresholds),
        thresholds_report=rep.get("thresholds"),
        timings=rep.get("timings"),
        mlflow={k: str(v) for k, v in (tres.mlflow or {}).items()},
        tracking_uri=tcfg.tracking_uri,
        n_steps=rep.get("n_steps"),
        n_escalation_runs=rep.get("n_escalation_runs"),
        escalation={k: v for k, v in (rep.get("escalation") or {}).items() if k != "baselines"},
        sweep_thresholds=sorted(sweep),
    )


def _screenshot_ui(url: str, out: Path, say: Any) -> None:
    """The live page of the live segment's sidecar, under its load, as ``out`` (a PNG); skipped
    with the reason printed where no headless Chromium can run (:mod:`runroute.ui_shot`)."""
    from runroute.ui_shot import screenshot_ui, unavailable

    why = unavailable()
    if why is not None:
        say(f"ui screenshot skipped: {why}")
        return
    try:
        screenshot_ui(url, out)
        say(f"ui screenshot: {out}")
    except Exception as e:  # noqa: BLE001 - a screenshot never fails the demo; the reason is printed
        say(f"ui screenshot failed: {type(e).__name__}: {e}")


def run_demo(cfg: DemoConfig, console: Any = None) -> dict[str, Any]:
    """Run the whole demo (module docstring); returns the scorecard JSON object that was written."""
    import pandas as pd
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from features.importers.summary import print_summary
    from features.runlog import read_runlog
    from training.eval.compare import POLICIES, compare_policies, model_scores, run_level_pairs
    from training.eval.live import live_segment
    from training.eval.report import print_scorecard, write_report
    from training.eval.scorecard import PriceTable, Scorecard, Skipped
    from training.eval.split import split_by_task

    con = console or Console(width=None if Console().is_terminal else 160)  # 80 wraps table cells
    t0, out, timings = time.perf_counter(), cfg.out.resolve(), dict[str, float]()
    out.mkdir(parents=True, exist_ok=True)
    names = [
        "import",
        "split + synthetic",
        "train",
        "simulate tau2",
        "simulate synthetic",
        "live",
        "loop",
        "budget",
        "report",
    ]
    if cfg.busy_arrival_rate is not None:
        names.insert(5, "simulate synthetic (busy)")
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=con, transient=False) as bar:
        st = Stages(bar, names, timings)

        st.start("import")
        files = sorted(cfg.data_dir.glob("*.parquet"))
        if not files:
            from runroute.errors import CliError

            raise CliError(f"no shipped samples in {cfg.data_dir} (*.parquet)")
        log = read_runlog([str(f) for f in files])
        frames = [f for f in (log.runs, log.steps, log.arrivals, log.rates) if len(f)]
        st.console.print(f"[bold]1. Import[/bold]: {len(files)} shipped samples in {cfg.data_dir}")
        summary = print_summary(
            pd.concat(frames, ignore_index=True), title="shipped samples (data/*.parquet)", console=st.console
        )
        st.done()

        st.start("split + synthetic")
        runs, steps = log.runs, log.steps
        sets_in = split_by_task(
            runs,
            steps,
            data_dir=out / "data",
            holdout_share=cfg.tau2_holdout_share,
            seed=cfg.seed,
            synthetic_train_runs=cfg.synthetic_train_runs,
            synthetic_train_seed=cfg.synthetic_train_seed,
            synthetic_holdout_runs=cfg.synthetic_holdout_runs,
            synthetic_holdout_seed=cfg.synthetic_holdout_seed,
            limit_tau2_tasks=cfg.limit_tau2_tasks,
            limit_taubench_runs=cfg.limit_taubench_runs,
        )
        sp = sets_in.split
        st.console.print(
            f"[bold]2. Split[/bold]: held out {len(sp.tau2_heldout_tasks)} tau2 tasks ({sp.tau2_heldout_runs} "
            f"paired gpt-oss-120b runs) + {cfg.synthetic_holdout_runs} synthetic runs (seed "
            f"{cfg.synthetic_holdout_seed}); training on {sp.training_runs} runs ({sp.training_steps} steps); "
            f"{sp.excluded_from_training_runs} runs of held-out task ids kept out of training"
        )
        st.done()

        st.start("train")
        tcfg, tres = _train(cfg, out, out / "data" / "train.parquet", st.say)
        bundle = tres.bundle
        training = _training_info(cfg, out, tcfg, tres)
        st.console.print(
            f"[bold]   Trained[/bold] bundle {bundle.version} on {training.n_steps} steps; thresholds "
            f"up {bundle.thresholds['p_frontier_up']:.3f} / down {bundle.thresholds['p_frontier_down']:.3f}"
        )
        st.done()

        sets: dict[str, Any] = {}
        scores: dict[int, Any] = {}
        plan: list[tuple[str, Any, str, SimSettings]] = [
            ("tau2-airline-heldout", sets_in.tau2_holdout, "simulate tau2", cfg.sim),
            ("synthetic-heldout", sets_in.synthetic_holdout, "simulate synthetic", cfg.sim),
        ]
        if cfg.busy_arrival_rate is not None:
            busy = cfg.sim.model_copy(update={"arrival_rate": cfg.busy_arrival_rate})
            plan.append(
                ("synthetic-heldout-busy", sets_in.synthetic_holdout, "simulate synthetic (busy)", busy)
            )
        for name, sl, stage, simset in plan:
            st.start(stage)
            res = compare_policies(
                sl.runs,
                sl.steps,
                bundle=bundle,
                prices=cfg.prices,
                sim=simset,
                sweep_thresholds=training.sweep_thresholds or [],
                variants=cfg.variants,
                progress=st.say,
            )
            if id(sl) not in scores:
                scores[id(sl)] = model_scores(bundle, sl)
            sets[name] = res.model_copy(update={"model_scores": scores[id(sl)]})
            st.done()

        st.start("live")
        live: Any = Skipped(skipped="disabled (--no-live)")
        if cfg.live.enabled:
            try:
                live = live_segment(
                    sets_in.synthetic_holdout.runs,
                    sets_in.synthetic_holdout.steps,
                    bundle_dir=out / "bundle",
                    prices=cfg.prices,
                    live=cfg.live,
                    log_dir=out / "live-logs",
                    policies=list(POLICIES),
                    progress=st.say,
                    on_serving=lambda _label, url: _screenshot_ui(url, out / "ui.png", st.say),
                )
            except Exception as e:  # noqa: BLE001 - the report says why the segment is missing
                live = Skipped(skipped=f"live segment failed: {type(e).__name__}: {e}")
        st.done()

        st.start("loop")
        if cfg.loop.enabled:
            loop_demo(cfg.loop, out / "loop", cfg.seed, st.say, con)
        st.done()

        st.start("budget")
        if cfg.budget_share is not None:
            from training.eval.budget_plot import budget_stage

            budget = budget_stage(
                out, share=cfg.budget_share, n_estimators=cfg.budget_trees, seed=cfg.seed, console=st.console
            )
            (out / "budget.json").write_text(json.dumps(budget, indent=1))
        st.done()

        st.start("report")
        card = Scorecard(
            generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command="runroute demo",
            prices=PriceTable(**cfg.prices.table()),
            outcome_variants=cfg.variants,
            split=sp,
            training=training,
            sets=sets,
            live=live,
            run_level_pairs=run_level_pairs(runs, steps),
            import_summary=summary,
            config=json.loads(cfg.model_dump_json()),
            timings=timings,
        )
        timings["total_before_report_s"] = round(time.perf_counter() - t0, 2)
        write_report(card.model_copy(update={"timings": dict(timings)}), out)
        st.done()
    timings["total_s"] = round(time.perf_counter() - t0, 2)
    card = card.model_copy(update={"timings": dict(timings)})
    write_report(card, out)  # again, with the final wall time (cheap: plots are re-drawn)
    print_scorecard(card, con)
    con.print(f"wrote {out / 'report.md'}, {out / 'scorecard.json'} and plots in {timings['total_s']:.0f} s")
    return card.to_json_dict()
