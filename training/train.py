"""The training job: run logs -> per-step dataset -> grouped CV evaluation -> ModelBundle -> MLflow.

Algorithm (:func:`run_training`):

1. Read the run logs (validated; bad rows are reported, never silently dropped) and apply
   weak-vs-strong pairings (``pairs``: ``"WEAK=STRONG"`` model names,
   :func:`features.importers.pairing.label_weak_runs`).
2. Build the per-step dataset (:func:`training.dataset.build_dataset`: features through the serving
   code path, labels from the runs' ends).
3. Hold out ``holdout_share`` of the CV groups (tasks, else runs), chosen by a stable hash of the
   group id (crc32), so that the same data always gives the same held-out split: the split
   ``--promote-if-better`` compares the new model and the current champion on.
4. On the rest: grouped ``n_folds`` cross-validation of the three predictors against their
   baselines (:mod:`training.evaluate`), overall and at ``eval_steps``.
5. Fit the final estimators on the rest (and the per-domain benefit model, gated by its own
   task-grouped CV evidence: :mod:`training.benefit_job`); thresholds for ``target_frontier_share`` from the
   escalation model's out-of-fold calibrated probabilities (:func:`training.calibration.choose_thresholds`).
6. Score the bundle on the held-out groups, save it (joblib + manifest with the data hash and the
   metrics), write the report, and (``mlflow``) log and register it (:mod:`training.mlflow_log`).

Every knob is a field of :class:`TrainConfig`.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION
from models.bundle import ModelBundle
from training.config import TrainConfig, TrainResult
from training.dataset import Dataset, build_dataset
from training.evaluate import (
    assign_folds,
    bundle_scores,
    cache_cv,
    escalation_cv,
    escalation_report,
    mae_report,
    pinball_report,
    remaining_cv,
)

__all__ = [
    "TrainConfig",
    "TrainResult",
    "run_training",
    "train_on_log",
    "load_runs",
    "holdout_mask",
    "bundle_scores",
    "sized_config",
    "Fitted",
    "finish_training",
    "holdout_frontier_share",
]

if TYPE_CHECKING:
    import pandas as pd

    from features.runlog import RunLog
    from models.cache_reuse import CacheReuseRegressor
    from models.escalation import EscalationClassifier
    from models.remaining import RemainingWorkRegressor

Progress = Callable[[str], None]
#: one final fit: (name, estimator, positional arrays, keyword arrays)
FitJob = tuple[
    str,
    "EscalationClassifier | CacheReuseRegressor | RemainingWorkRegressor",
    tuple[np.ndarray, ...],
    dict[str, np.ndarray],
]


def load_runs(paths: list[Path], pairs: list[str]) -> Any:
    """Read run logs and apply the ``WEAK=STRONG`` pairings."""
    from features.runlog import read_runlog

    log = read_runlog([str(p) for p in paths])
    for p in pairs:
        from features.importers.pairing import label_weak_runs

        weak, strong = p.split("=")
        log.runs = label_weak_runs(log.runs, weak, strong)
    return log


def holdout_mask(groups: np.ndarray, share: float) -> np.ndarray:
    """Rows whose group's crc32 falls in the lowest ``share`` of the hash space (stable across runs)."""
    if share <= 0:
        return np.zeros(len(groups), dtype=bool)
    cut = int(share * 10_000)
    per = {g: zlib.crc32(str(g).encode()) % 10_000 < cut for g in set(groups.tolist())}
    return np.array([per[g] for g in groups.tolist()], dtype=bool)


def sized_config(cfg: TrainConfig, n_rows: int) -> TrainConfig:
    """``cfg`` with the large-data settings (TrainConfig.large_data_*) at or above large_data_rows rows."""
    if n_rows < cfg.large_data_rows:
        return cfg
    return cfg.model_copy(
        update={
            "max_bin": min(cfg.max_bin, 63),
            "calibration_cv": min(cfg.calibration_cv, 3),
            "subsample": min(cfg.subsample, cfg.large_data_subsample),
            "n_estimators": min(cfg.n_estimators, cfg.large_data_n_estimators),
            "learning_rate": max(cfg.learning_rate, cfg.large_data_learning_rate),
        }
    )


def _noop(_: str) -> None:
    return None


def _fit_one(
    name: str,
    est: EscalationClassifier | CacheReuseRegressor | RemainingWorkRegressor,
    args: tuple[np.ndarray, ...],
    kwargs: dict[str, np.ndarray],
) -> tuple[str, EscalationClassifier | CacheReuseRegressor | RemainingWorkRegressor, float, float]:
    t, c = time.perf_counter(), time.process_time()
    est.fit(*args, **kwargs)
    return name, est, round(time.perf_counter() - t, 3), round(time.process_time() - c, 3)


def _fit_all(jobs: list[FitJob], processes: int) -> dict[str, Any]:
    """Fit independent estimators, in ``processes`` worker processes when > 1 (joblib/loky; large
    arrays are memory-mapped, not copied). Returns {name: fitted, "_seconds": {name: fit seconds}}."""
    if processes > 1:
        from joblib import Parallel, delayed

        done = Parallel(n_jobs=processes, backend="loky")(delayed(_fit_one)(*j) for j in jobs)
    else:
        done = [_fit_one(*j) for j in jobs]
    out: dict[str, Any] = {name: est for name, est, _, _ in done}
    out["_seconds"] = {name: secs for name, _, secs, _ in done}
    out["_cpu_seconds"] = round(sum(cpu for *_, cpu in done), 3)
    return out


def run_training(cfg: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Run the job described in the module docstring; returns the bundle, report and data."""
    say = progress or _noop
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    say("reading run logs")
    log = load_runs(cfg.runs, cfg.pairs)
    return train_on_log(log, cfg, progress, t0=t0)


def train_on_log(
    log: RunLog, cfg: TrainConfig, progress: Progress | None = None, *, t0: float | None = None
) -> TrainResult:
    """:func:`run_training` after reading: train on an in-memory :class:`features.runlog.RunLog`."""
    say = progress or _noop
    t0 = time.perf_counter() if t0 is None else t0
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    t = lap("read_s", t0)
    say(f"building features ({len(log.steps)} steps)")
    ds = build_dataset(
        log,
        cache_capacity_blocks=cfg.cache_capacity_blocks,
        block_tokens=cfg.block_tokens,
        replicas=cfg.cache_replicas,
        node_gpu=cfg.node_gpu,
        kv_cache_gb=cfg.kv_cache_gb,
    )
    t = lap("features_s", t)
    large = len(ds) >= cfg.large_data_rows
    cfg = sized_config(cfg, len(ds))
    hold = holdout_mask(ds.meta["group"].to_numpy(dtype=object), cfg.holdout_share)
    train, held = ds.subset(~hold), ds.subset(hold)
    m = train.meta
    esc_rows = m["y_frontier"].notna().to_numpy()
    cache_rows = m["y_cache"].notna().to_numpy()
    y_esc = m["y_frontier"].to_numpy()[esc_rows].astype(np.int64)
    if esc_rows.sum() == 0 or len(np.unique(y_esc)) < 2:
        raise ValueError(
            "no run carries a needs-frontier label with both outcomes (need Run.needs_frontier, a "
            "pairing via --pairs WEAK=STRONG, or run outcomes)"
        )
    groups = m["group"].to_numpy(dtype=object)
    X_esc = train.escalation_X()  # features whose missingness tells the source are masked (dataset docs)
    report: dict[str, Any] = {
        "feature_spec_version": FEATURE_SPEC_VERSION,
        "n_runs": ds.n_runs,
        "n_steps": len(ds),
        "n_train_steps": len(train),
        "n_holdout_steps": len(held),
        "n_escalation_runs": int(ds.meta.loc[ds.meta["y_frontier"].notna(), "run_id"].nunique()),
        "n_groups": int(ds.meta["group"].nunique()),
        "sources": {k: int(v) for k, v in ds.meta["source"].value_counts().items()},
        "data_sha256": ds.sha256(),
        "escalation_masked_features": list(ds.escalation_masked),
        # which data the escalation figures rest on (synthetic alone is never evidence: issue 14)
        "escalation_rows_by_source": {k: int(v) for k, v in m.loc[esc_rows, "source"].value_counts().items()},
        "config": json.loads(cfg.model_dump_json()),
    }
    oof: dict[str, Any] = {}
    if cfg.evaluate:
        strat = np.where(m["y_frontier"].isna(), -1, m["y_frontier"].fillna(0)).astype(np.int64)
        fold = assign_folds(groups, strat, cfg.n_folds, cfg.random_state)
        report["n_folds"] = int(len(np.unique(fold)))
        say("cross-validating the escalation model")
        e = escalation_cv(
            X_esc[esc_rows],
            y_esc,
            groups[esc_rows],
            fold[esc_rows],
            cfg.make_escalation,
            on_fold=lambda f: say(f"escalation fold {f + 1} done"),
        )
        step = m["step"].to_numpy()[esc_rows]
        er = escalation_report(y_esc, step, e, cfg.eval_steps)
        oof["escalation"] = {"y": y_esc, "step": step, "run_id": m["run_id"].to_numpy()[esc_rows], **e}
        ov = er["overall"]
        report["escalation"] = {
            **{k: ov["model"][k] for k in ("auc", "pr_auc", "brier", "ece", "n", "pos_rate")},
            "baselines": {b: ov[b] for b in ov if b != "model"},
            "per_step": {str(k): er[f"step_{k}"] for k in cfg.eval_steps},
            "beats_all_baselines": bool(
                all(ov["model"]["auc"] > ov[b]["auc"] or np.isnan(ov[b]["auc"]) for b in ov if b != "model")
                and all(ov["model"]["brier"] < ov[b]["brier"] for b in ov if b != "model")
            ),
        }
        t = lap("cv_escalation_s", t)
        if cache_rows.sum() >= 2 * cfg.n_folds:
            say("cross-validating the cache-reuse model")
            yc = m["y_cache"].to_numpy()[cache_rows]
            c = cache_cv(train.X[cache_rows], yc, fold[cache_rows], cfg.make_cache)
            oof["cache"] = c
            src = m["source"].to_numpy(dtype=object)[cache_rows]
            cr: dict[str, Any] = {"mae_tokens": mae_report(yc, c)["model"], "n": int(cache_rows.sum())}
            cr["baselines"] = {k: v for k, v in mae_report(yc, c).items() if k != "model"}
            cr["by_source"] = {
                s: {
                    "n": int((src == s).sum()),
                    **mae_report(yc[src == s], {k: v[src == s] for k, v in c.items()}),
                }
                for s in sorted(set(src.tolist()))
            }
            report["cache_reuse"] = cr
            t = lap("cv_cache_s", t)
        say("cross-validating the remaining-work models")
        for name, col in (("remaining_steps", "y_rem_steps"), ("remaining_tokens", "y_rem_tokens")):
            y = m[col].to_numpy()
            r = remaining_cv(train.X, y, fold, cfg.make_remaining)
            pr = pinball_report(y, r, (0.5, 0.9))
            report[name] = {**pr["model"], "baselines": {k: v for k, v in pr.items() if k != "model"}}
        t = lap("cv_remaining_s", t)

    say("fitting the final models")
    # above calibration_max_rows: the escalation model is fit without a slice of the groups, and
    # the thresholds are set on its scores of that slice (training.calibration.threshold_slice)
    from training.calibration import threshold_slice

    g_esc = groups[esc_rows]
    cut = threshold_slice(
        g_esc, len(g_esc), cfg.calibration_max_rows, cfg.threshold_slice_share, cfg.random_state
    )
    in_slice = np.zeros(len(g_esc), dtype=bool) if cut is None else np.isin(g_esc, cut)
    fit_rows = np.flatnonzero(esc_rows)[~in_slice]  # rows of train the escalation model is fit on
    slice_rows = np.flatnonzero(esc_rows)[in_slice]
    jobs: list[FitJob] = [
        (
            "escalation",
            cfg.make_escalation(),
            (X_esc[fit_rows], y_esc[~in_slice]),
            {"groups": g_esc[~in_slice]},
        ),
        ("remaining_steps", cfg.make_remaining(), (train.X, m["y_rem_steps"].to_numpy()), {}),
        ("remaining_tokens", cfg.make_remaining(), (train.X, m["y_rem_tokens"].to_numpy()), {}),
    ]
    if cache_rows.sum() >= 2:
        jobs.append(
            ("cache", cfg.make_cache(), (train.X[cache_rows], m["y_cache"].to_numpy()[cache_rows]), {})
        )
    fitted = _fit_all(jobs, cfg.parallel_fits if large else 1)
    t = lap("fit_final_s", t)
    for name, secs in fitted.pop("_seconds").items():
        timings[f"fit_{name}_s"] = secs
    timings["fit_cpu_s"] = fitted.pop("_cpu_seconds")  # CPU seconds of the fits, all processes
    esc, rem_s, rem_t, cache = (
        fitted["escalation"],
        fitted["remaining_steps"],
        fitted["remaining_tokens"],
        fitted.get("cache"),
    )

    return finish_training(
        cfg,
        report,
        timings,
        t0,
        t,
        Fitted(esc, cache, rem_s, rem_t),
        m["run_id"].to_numpy()[fit_rows],
        m["step"].to_numpy()[fit_rows],
        lambda: esc.predict_proba(X_esc[fit_rows])[:, 1],
        train,
        held,
        oof,
        say,
        log.runs,
        threshold_rows=None
        if cut is None
        else (
            m["run_id"].to_numpy()[slice_rows],
            m["step"].to_numpy()[slice_rows],
            lambda: esc.predict_proba(X_esc[slice_rows])[:, 1],
        ),
    )


@dataclass
class Fitted:
    """The final estimators of a training job (the bundle's predictors)."""

    escalation: Any
    cache: Any
    remaining_steps: Any
    remaining_tokens: Any


def finish_training(
    cfg: TrainConfig,
    report: dict[str, Any],
    timings: dict[str, float],
    t0: float,
    t: float,
    fitted: Fitted,
    oof_run_ids: np.ndarray,
    oof_steps: np.ndarray,
    fallback_p: Callable[[], np.ndarray],
    train: Dataset,
    held: Dataset,
    oof: dict[str, Any],
    say: Progress,
    runs: pd.DataFrame,
    benefit_train: Dataset | None = None,
    threshold_rows: tuple[np.ndarray, np.ndarray, Callable[[], np.ndarray]] | None = None,
) -> TrainResult:
    """After the final fits (serial or Dask: :mod:`training.dask_train`): thresholds from the
    escalation model's out-of-fold calibrated probabilities (``oof_run_ids``/``oof_steps`` align with
    its ``oof_raw_``; ``fallback_p`` when it has none), the per-domain benefit model (from ``runs``,
    the run records, and ``benefit_train``: the training rows of the paired runs, ``train`` when
    None), held-out scores, the bundle saved with its manifest, the report, MLflow.

    ``threshold_rows`` (run ids, steps, the final model's calibrated p): the calibration slice the
    final escalation model was not fit on (:func:`training.calibration.threshold_slice`); when
    given, the thresholds are set on it, and the report keeps what the out-of-fold rule would have
    set (``oof_p_frontier_up``) and the share of the slice's runs that would have escalated at it
    (``slice_share_at_oof_up``: the out-of-fold scores' bias, on rows the final model never saw)."""

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    esc, cache, rem_s, rem_t = (
        fitted.escalation,
        fitted.cache,
        fitted.remaining_steps,
        fitted.remaining_tokens,
    )

    # thresholds from the final model's own out-of-fold calibrated probabilities
    raw = esc.oof_raw_
    ok = ~np.isnan(raw)
    p_oof = esc.calibrate(raw[ok]) if ok.any() else fallback_p()
    sel = ok if ok.any() else np.ones(len(raw), dtype=bool)
    from training.calibration import choose_thresholds, run_share_at

    th = choose_thresholds(
        oof_run_ids[sel],
        oof_steps[sel],
        p_oof,
        target_frontier_share=cfg.target_frontier_share,
        band=cfg.threshold_band,
    )
    th_report: dict[str, float | str | None] = {**th, "source": "out-of-fold"}
    if threshold_rows is not None:
        s_ids, s_steps, s_p = threshold_rows[0], threshold_rows[1], threshold_rows[2]()
        oof_up, oof_share = th["p_frontier_up"], th["expected_frontier_share"]
        th = choose_thresholds(
            s_ids, s_steps, s_p, target_frontier_share=cfg.target_frontier_share, band=cfg.threshold_band
        )
        th_report = {
            **th,
            "source": "calibration slice",
            "slice_runs": int(len(np.unique(np.asarray(s_ids).astype(str)))),
            "oof_p_frontier_up": oof_up,
            "oof_expected_frontier_share": oof_share,
            "slice_share_at_oof_up": run_share_at(s_ids, s_p, oof_up),
        }
    report["thresholds"] = th_report
    bundle = ModelBundle(
        escalation=esc,
        cache_reuse=cache,
        remaining_steps=rem_s,
        remaining_tokens=rem_t,
        thresholds={"p_frontier_up": th["p_frontier_up"], "p_frontier_down": th["p_frontier_down"]},
    )
    say("fitting the per-domain benefit model")
    from training.benefit_job import benefit_stage

    bundle.benefit, report["benefit"] = benefit_stage(
        runs,
        train if benefit_train is None else benefit_train,
        held,
        cfg.benefit,
        tables=cfg.evaluate,
        escalation=esc,
        thresholds=bundle.thresholds,
        oof_escalation=oof.get("escalation"),
    )
    t = lap("benefit_s", t)
    if len(held):
        report["holdout"] = bundle_scores(bundle, held)
        th_report["holdout_frontier_share"] = holdout_frontier_share(esc, held, th["p_frontier_up"])
    if "escalation" not in report:  # evaluate=False: headline from the held-out split, if any
        report["escalation"] = dict(report.get("holdout", {}).get("escalation", {}))
    gain = esc.booster_.feature_importance(importance_type="gain")
    report["feature_importance_gain"] = {
        n: float(g) for n, g in sorted(zip(FEATURE_NAMES, gain, strict=True), key=lambda x: -x[1]) if g > 0
    }
    headline = {
        "escalation.auc": report["escalation"].get("auc"),
        "escalation.brier": report["escalation"].get("brier"),
        "escalation.ece": report["escalation"].get("ece"),
        "cache_reuse.mae_tokens": report.get("cache_reuse", {}).get("mae_tokens"),
        "remaining_steps.pinball_p50": report.get("remaining_steps", {}).get("pinball_p50"),
    }
    say("saving the bundle")
    bundle.save(
        cfg.out,
        metrics={k: v for k, v in headline.items() if v is not None},
        training_data_sha256=report["data_sha256"],
        params={
            **cfg.estimator_params(),
            "escalation": cfg.make_escalation().get_params(),
            "remaining": cfg.make_remaining().get_params(),
            "calibration": cfg.calibration,
            "calibration_cv": cfg.calibration_cv,
            "cache_capacity_blocks": cfg.cache_capacity_blocks,
            "block_tokens": cfg.block_tokens,
        },
    )
    report["bundle_version"] = bundle.version
    report["bundle_dir"] = str(cfg.out)
    t = lap("save_s", t)
    timings["total_s"] = round(time.perf_counter() - t0, 3)
    report["timings"] = timings
    result = TrainResult(
        bundle=bundle, bundle_dir=Path(cfg.out), report=report, dataset=train, holdout=held, oof=oof
    )
    if cfg.mlflow:
        say("logging to MLflow")
        from training.mlflow_log import log_training

        result.mlflow = log_training(result, cfg)
        report["mlflow"] = result.mlflow
        report["timings"]["mlflow_s"] = round(time.perf_counter() - t, 3)
    if cfg.report_json is not None:
        write_report(report, cfg.report_json)
    if cfg.benefit_report_dir is not None and report["benefit"]:
        from training.benefit_report import write_benefit_report

        write_benefit_report(report["benefit"], cfg.benefit_report_dir)
    return result


def holdout_frontier_share(esc: EscalationClassifier, held: Dataset, up: float) -> float | None:
    """Share of the held-out runs a run-stable policy escalates at ``up``: runs whose maximum
    calibrated p over their steps reaches it (the rule :func:`training.calibration.choose_thresholds`
    sets ``up`` by, on out-of-fold scores; here the final model on rows it never saw). The same
    figure in serial and Dask training, so the two can be compared; None without held-out steps."""
    if not len(held):
        return None
    import pandas as pd

    p = esc.predict_proba(held.X)[:, 1]
    mx = pd.Series(p).groupby(held.meta["run_id"].astype(str).to_numpy()).max()
    return float((mx.to_numpy() >= up).mean())


def write_report(report: Mapping[str, object], path: Path) -> None:
    from training.jsonio import jsonable

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(report), indent=2, sort_keys=False, default=str) + "\n")
