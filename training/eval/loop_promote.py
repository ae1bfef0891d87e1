"""The learning loop's retraining and promotion steps (:mod:`training.eval.loop`).

- :func:`benefit_predictor`: the benefit model (:class:`training.logbenefit.IPWBenefitModel`) on a log's
  inverse-propensity weighted rows plus the prior rows, wrapped as a predictor.
- :func:`crossfit`: the task-grouped cross-fitted DR net value of each candidate (fold f's model
  is trained on the logs of the other folds' tasks and scored by OPE on the window's runs of fold
  f's tasks; fold estimates averaged by run count, half-widths combined as independent errors), so
  a candidate is never scored on tasks its model has seen.
- :func:`mlflow_start` / :func:`mlflow_day`: one MLflow run per day with the promotion decision and
  both DR estimates (champion, best candidate) with their intervals.

Knobs: the loop config's ``folds``, ``seed`` and ``prices``; :func:`read_days` and :func:`subset`
are plain run-log helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["read_days", "benefit_predictor", "subset", "crossfit", "mlflow_start", "mlflow_day"]


def read_days(files: list[Path]) -> Any:
    import pandas as pd

    from features.runlog import RunLog, merge_runs

    return RunLog.from_frame(merge_runs(pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)))


def benefit_predictor(log: Any, prior_rows: Any, bundle: Any, *, prices: Any, seed: int) -> tuple[Any, Any]:
    """The benefit predictor trained on ``log`` (IPW rows) plus the prior rows."""
    from training.eval.ope_replay import load_logged
    from training.logbenefit import BenefitRows, IPWBenefitModel, IPWBenefitPredictor, rows_from_logs

    rows = BenefitRows.concat(
        [rows_from_logs(load_logged(log, prices))] + ([prior_rows] if prior_rows is not None else [])
    )
    model = IPWBenefitModel(seed=seed).fit(rows)
    return IPWBenefitPredictor(bundle, model), model


def subset(log: Any, run_ids: set[str]) -> Any:
    from features.runlog import RunLog

    return RunLog(
        runs=log.runs[log.runs["run_id"].isin(run_ids)].reset_index(drop=True),
        steps=log.steps[log.steps["run_id"].isin(run_ids)].reset_index(drop=True),
        arrivals=log.arrivals,
        rates=log.rates,
    )


def crossfit(
    all_log: Any,
    wlog: Any,
    cands: dict[str, Any],
    prior_rows: Any,
    bundle: Any,
    *,
    folds: int,
    seed: int,
    prices: Any,
    ope_kw: dict[str, Any],
    why: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Task-grouped cross-fitted DR net value of each candidate: fold f's model is trained on the
    logs of the other folds' tasks and evaluated on the window's runs of fold f's tasks; the fold
    estimates are averaged by run count, their half-widths combined as independent errors. A
    candidate refused on any fold is left out; ``why`` (when given) gets its first fold's reason."""
    from router.policy.config import build_policy
    from training.eval.ope import Estimate
    from training.eval.ope_eval import evaluate_policies

    runs = all_log.runs
    tid = (
        runs["task_id"].where(runs["task_id"].notna(), runs["run_id"])
        if "task_id" in runs
        else runs["run_id"]
    )
    task_of = dict(
        zip(runs["run_id"].astype(str), tid.astype(str), strict=True)
    )  # no task id: the run is its group
    tasks = sorted(set(task_of.values()))
    rng = np.random.default_rng(seed)
    fold_of = {t: int(f) for t, f in zip(tasks, rng.permutation(len(tasks)) % folds, strict=True)}
    w_ids = set(wlog.runs["run_id"].astype(str))
    parts: dict[str, list[tuple[int, float, float]]] = {k: [] for k in cands}
    refused: set[str] = set()
    for f in range(folds):
        train_ids = {r for r, t in task_of.items() if fold_of[t] != f}
        test_ids = {r for r in w_ids if fold_of.get(task_of.get(r, r), -1) == f}
        if not test_ids or not train_ids:
            continue
        pred, _ = benefit_predictor(subset(all_log, train_ids), prior_rows, bundle, prices=prices, seed=seed)
        rep = evaluate_policies(
            subset(wlog, test_ids),
            {k: (build_policy(c, bundle), pred) for k, c in cands.items()},
            references=False,
            **ope_kw,
        )
        for k in cands:
            if k not in rep.candidates:  # refused on this fold: not promotable
                refused.add(k)
                if why is not None:  # the first fold's reason, for the day's decision
                    why.setdefault(k, f"fold {f}: {rep.refused.get(k, 'refused')}")
                continue
            e = rep.candidates[k].estimates["dr"]["net"]
            parts[k].append((rep.n_runs, e.value or 0.0, e.half_width or 0.0))
    out = {}
    for k, ps in parts.items():
        if k in refused:
            continue
        n = sum(p[0] for p in ps)
        val = sum(p[0] * p[1] for p in ps) / n if n else None
        hw = float(np.sqrt(sum((p[0] / n) ** 2 * p[2] ** 2 for p in ps))) if n else None
        out[k] = Estimate(
            val,
            None if val is None or hw is None else val - hw,
            None if val is None or hw is None else val + hw,
        )
    return out


def mlflow_start(cfg: Any, out: Path) -> str | None:
    if not cfg.mlflow:
        return None
    from training.mlflow_log import ensure_experiment, quiet_mlflow

    uri = f"sqlite:///{out / 'mlflow.db'}"
    with quiet_mlflow():
        ensure_experiment(uri, "runroute-loop", out / "mlruns")
    return uri


def mlflow_day(uri: str | None, dom: str, d: int, day: dict[str, Any], champ: Any, best: Any) -> None:
    """One MLflow run per day: the promotion decision and both DR estimates with their intervals."""
    if uri is None:
        return
    import mlflow

    from training.mlflow_log import quiet_mlflow

    with quiet_mlflow():
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("runroute-loop")
        with mlflow.start_run(run_name=f"{dom}-day{d:02d}"):
            mlflow.log_params(
                {"domain": dom, "day": d, "candidate": day["best"], "champion": day["champion"]}
            )
            mlflow.log_metrics(
                {
                    "champion_dr_net": champ.value,
                    "champion_dr_net_lo": champ.lo,
                    "champion_dr_net_hi": champ.hi,
                    "candidate_dr_net": best.value,
                    "candidate_dr_net_lo": best.lo,
                    "candidate_dr_net_hi": best.hi,
                    "margin": day["margin"],
                    "half_width": day["half_width"],
                    "promoted": float(day["promoted"]),
                    "eval_net_champion": day["eval"]["net"],
                }  # fmt: skip
            )
            mlflow.set_tags({"promoted": str(day["promoted"]), "decision": day["decision"][:250]})
