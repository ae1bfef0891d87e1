"""Retraining on the deployment's own logs: ``runroute train --runs runroute-logs/`` when the logs
carry propensities (router logs written with exploration logging).

Algorithm of :func:`train_from_logs`:

1. Read the logs (validated; bad rows reported) and keep the runs with an outcome
   (:func:`training.eval.ope_replay.load_logged`: refuses logs without propensities).
2. Prior rows from public paired run logs (``prior``: weak runs with ``strong_outcome``, e.g. the
   shipped tau2 pairs or the synthetic generator's), weighted ``prior_weight`` each; none without.
3. The benefit model (:class:`training.logbenefit.IPWBenefitModel`) on the inverse-propensity weighted
   log rows plus the prior rows; candidates are the learned policy routing on its uplift at each of
   ``thresholds`` (no de-escalation), priced with ``value_of_success``.
4. With ``promote_if_better``: the champion (``champion`` policy config on the ``bundle``) and the
   candidates are compared by doubly robust OPE on the logs; each candidate is scored by its
   cross-fitted estimate (task-grouped folds, runs as their own group where no task id is logged:
   a candidate is never scored on runs its model was fitted on). The best candidate is promoted
   iff its DR net value beats the champion's, and every baseline's the logs can evaluate
   (:data:`BASELINE_KINDS`), by more than its CI half-width.
5. Output in ``out``: ``benefit.joblib`` (the fitted model, the chosen policy config, the base
   bundle's path) and ``report.json`` (rows, estimates, decision); with ``mlflow`` one run with the
   decision, both estimates and their intervals, and the artifacts (tag ``promoted``).

The router cannot load ``benefit.joblib`` as a serving bundle yet: the bundle format with a
benefit model is issue 14's (see the report for what to wire). Knobs: :class:`LogTrainConfig`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.eval.outcome import Prices

__all__ = ["LogTrainConfig", "train_from_logs", "logs_have_propensities", "BASELINE_KINDS"]

#: the baselines a promoted candidate must also beat (OPE on the same logs; one the logs cannot
#: evaluate, e.g. a policy that leaves the logged support, is named in the report)
BASELINE_KINDS = ("always-local", "always-frontier", "per-step-threshold", "stall-escalation")


class LogTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runs: list[Path] = Field(min_length=1, description="router run logs (with propensities)")
    out: Path = Field(description="output directory")
    bundle: Path | None = Field(
        default=None, description="base bundle: cache reuse, remaining work, champion's model"
    )
    prior: list[Path] = Field(default_factory=list, description="public paired run logs (the prior)")
    prior_weight: float = Field(default=0.5, ge=0)
    thresholds: list[float] = Field(default_factory=lambda: [0.05, 0.15, 0.3, 0.45])
    value_of_success: float = Field(default=1.0, ge=0)
    champion: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "learned"}, description="the champion's policy config"
    )
    promote_if_better: bool = False
    folds: int = Field(default=3, ge=2)
    n_boot: int = Field(default=400, ge=50)
    max_unsupported_share: float = Field(default=0.05, ge=0, le=1)
    mlflow: bool = True
    tracking_uri: str | None = None
    experiment: str = "runroute-train-logs"
    seed: int = 0


def logs_have_propensities(paths: list[Path]) -> bool:
    """True when every step record of the logs carries a propensity (router logs with exploration).
    Parquet logs are read for their ``record`` and ``propensity`` columns alone (a multi-GB log is
    not read into this process before training reads it); a JSONL log is read whole."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from features.runlog import read_runlog
    from features.runmerge import list_runlog_files

    def full_read() -> bool:  # JSONL, or a file pyarrow cannot open (the reader says why)
        steps = read_runlog([str(p) for p in paths], quarantine=False).steps
        return bool(len(steps)) and "propensity" in steps and bool(steps["propensity"].notna().all())

    files = list_runlog_files([str(p) for p in paths])
    if any(f.suffix != ".parquet" for f in files):
        return full_read()
    n = 0
    for f in files:
        try:
            names = pq.ParquetFile(f).schema_arrow.names
            cols = [c for c in ("record", "propensity") if c in names]
            t = pq.read_table(f, columns=cols) if "record" in names else None
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            return full_read()
        if t is None:
            continue
        is_step = pc.equal(t["record"], "step")
        k = int(pc.sum(is_step).as_py() or 0)
        if k and ("propensity" not in names or t.filter(is_step)["propensity"].null_count):
            return False
        n += k
    return n > 0


def train_from_logs(cfg: LogTrainConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """See the module docstring; returns the report."""
    import joblib

    from features.runlog import read_runlog
    from models.predictor import ConstantPredictor
    from router.policy.config import build_policy
    from training.eval.loop_promote import benefit_predictor, crossfit
    from training.eval.ope_eval import evaluate_policies
    from training.eval.ope_replay import load_logged
    from training.jsonio import jsonable
    from training.logbenefit import rows_from_pairs

    say = progress or (lambda _m: None)
    prices = Prices()
    log = read_runlog([str(p) for p in cfg.runs])
    logged = load_logged(log, prices)
    say(
        f"{logged.n_runs} logged runs with outcomes ({len(logged.a)} steps); left out: {logged.left_out or 'none'}"
    )
    base: Any = ConstantPredictor()
    if cfg.bundle is not None:
        from models.bundle import ModelBundle

        base = ModelBundle.load(cfg.bundle)
    prior_rows = None
    if cfg.prior:
        plog = read_runlog([str(p) for p in cfg.prior])
        prior_rows = rows_from_pairs(plog.runs, plog.steps, prior_weight=cfg.prior_weight)
        say(f"{len(prior_rows)} prior rows from {len(cfg.prior)} paired run log(s)")
    pred, model = benefit_predictor(log, prior_rows, base, prices=prices, seed=cfg.seed)
    v = cfg.value_of_success
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
    bundle = base if cfg.bundle is not None else None
    report: dict[str, Any] = {
        "n_runs": logged.n_runs,
        "n_steps": len(logged.a),
        "benefit_rows": model.n_rows_,
        "candidates": cands,
    }
    chosen = min(cfg.thresholds)
    promoted = None
    if cfg.promote_if_better:
        ope_kw = {
            "prices": prices,
            "value_of_success": v,
            "n_boot": cfg.n_boot,
            "seed": cfg.seed,
            "max_unsupported_share": cfg.max_unsupported_share,
            "skip_unsupported": True,
        }
        champ = {**{k: x for k, x in cfg.champion.items() if k != "explore"}, "name": "champion"}
        refs = {"champion": (build_policy(champ, bundle), base)}
        for kind in BASELINE_KINDS:
            if kind == "per-step-threshold" and bundle is None:
                continue  # its threshold comes from the bundle
            refs[kind] = (build_policy({"kind": kind, "name": kind}, bundle), base)
        say("off-policy evaluation of the champion and the baselines")
        rep = evaluate_policies(log, refs, **ope_kw)  # type: ignore[arg-type]
        if "champion" not in rep.candidates:
            raise ValueError(f"the champion cannot be evaluated on these logs: {rep.refused.get('champion')}")
        ch = rep.candidates["champion"].estimates["dr"]["net"]
        base_est = {
            k: rep.candidates[k].estimates["dr"]["net"]
            for k in refs
            if k != "champion" and k in rep.candidates
        }
        say("cross-fitted off-policy evaluation of the candidates")
        cross = crossfit(
            log, log, cands, prior_rows, base, folds=cfg.folds, seed=cfg.seed, prices=prices, ope_kw=ope_kw
        )
        report.update(
            champion=ch.as_dict(),
            baselines_dr_net={k: e.as_dict() for k, e in base_est.items()},
            baselines_not_evaluable=sorted(set(refs) - set(base_est) - {"champion"}),
        )
        if not cross:
            # not an error: "promote if better" with no candidate the logs can evaluate (every one
            # refused, e.g. below the minimum ESS on a fold) keeps the champion and says why
            report.update(
                candidates_dr_net={},
                best=None,
                margin=None,
                margin_over_baselines={},
                promoted=False,
                decision="no candidate can be evaluated on these logs (each was refused on a fold: "
                "too little support or ESS below the minimum); explore more",
            )
            say("kept the champion: " + report["decision"])
        else:
            best = max(cross, key=lambda k: cross[k].value if cross[k].value is not None else -1e9)
            b = cross[best]
            margin = (b.value or 0.0) - (ch.value or 0.0)
            # issue 14: beat the champion *and* every baseline the logs can evaluate by more than the CI
            beats = {k: (b.value or 0.0) - (e.value or 0.0) for k, e in base_est.items()}
            promoted = bool(
                b.half_width is not None
                and margin > b.half_width
                and all(m > b.half_width for m in beats.values())
            )
            chosen = float(str(cands[best]["p_frontier_up"]))
            report.update(
                candidates_dr_net={k: e.as_dict() for k, e in cross.items()},
                best=best,
                margin=margin,
                margin_over_baselines=beats,
                promoted=promoted,
                decision=f"{best}: DR net {b.value:.4f} vs champion {ch.value:.4f} (margin {margin:+.4f}, half-width {b.half_width:.4f}); "
                + ", ".join(f"vs {k} {m:+.4f}" for k, m in beats.items()),
            )
            say(("PROMOTED " if promoted else "kept the champion: ") + report["decision"])
    cfg.out.mkdir(parents=True, exist_ok=True)
    policy = {"kind": "learned", "p_frontier_up": chosen, "p_frontier_down": 0.0, "value_of_success_usd": v}
    joblib.dump(
        {"model": model, "policy": policy, "base_bundle": str(cfg.bundle) if cfg.bundle else None},
        cfg.out / "benefit.joblib",
    )
    report["policy"] = policy
    (cfg.out / "report.json").write_text(json.dumps(jsonable(report), indent=2) + "\n")
    if cfg.mlflow:
        report["mlflow_run_id"] = _log_mlflow(cfg, report)
    return report


def _log_mlflow(cfg: LogTrainConfig, report: dict[str, Any]) -> str:
    import mlflow

    from training.mlflow_log import ensure_experiment, quiet_mlflow, resolve_tracking_uri

    uri = resolve_tracking_uri(cfg.tracking_uri)
    with quiet_mlflow():
        ensure_experiment(uri, cfg.experiment, cfg.out / "mlruns")
        mlflow.set_experiment(cfg.experiment)
        with mlflow.start_run(run_name="train-from-logs") as run:
            mlflow.log_params(
                {
                    "n_runs": report["n_runs"],
                    "thresholds": ",".join(map(str, cfg.thresholds)),
                    "value_of_success": cfg.value_of_success,
                }
            )
            if "champion" in report:
                ch = report["champion"]
                best = report["candidates_dr_net"].get(report["best"], {}) if report["best"] else {}
                metrics = {"champion_dr_net": ch["value"], "champion_dr_net_half_width": ch["half_width"], "candidate_dr_net": best.get("value"), "candidate_dr_net_half_width": best.get("half_width"), "margin": report["margin"]}  # fmt: skip
                mlflow.log_metrics({k: float(x) for k, x in metrics.items() if x is not None})
                mlflow.set_tags({"promoted": str(report["promoted"]), "decision": report["decision"][:250]})
            mlflow.log_artifact(str(cfg.out / "report.json"))
            mlflow.log_artifact(str(cfg.out / "benefit.joblib"))
            return str(run.info.run_id)
