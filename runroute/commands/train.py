"""`runroute train`: train the predictors on run logs, write a bundle and a report, log to MLflow.

Router logs whose every step carries a propensity (written with exploration logging) take the
log path instead (:mod:`training.retrain`): the benefit-of-escalation model from the logs
(inverse-propensity weighted) with ``--prior`` paired data, and ``--promote-if-better`` decided by
off-policy evaluation against the champion (``--bundle``'s learned policy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from router.policy.defaults import KV_CACHE_GB
from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for, given
from runroute.errors import CliError


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        ctx: typer.Context,
        runs: list[Path] = typer.Option(
            [], "--runs", help="run-log files/directories (.parquet/.jsonl); repeat (required)"
        ),
        out: Path | None = typer.Option(None, "-o", "--out", help="bundle directory to write (required)"),
        report_json: Path | None = typer.Option(None, "--report-json", help="write the report here"),
        benefit_report: Path | None = typer.Option(
            None, "--benefit-report", help="write the per-domain benefit tables (JSON, MD, PNG) here"
        ),
        pairs: list[str] = typer.Option([], "--pairs", help="WEAK=STRONG model pairing for labels; repeat"),
        promote_if_better: bool = typer.Option(
            False,
            "--promote-if-better",
            help="move the 'champion' alias to the new version if it beats the champion on the held-out "
            "tasks (without it the alias moves only for the first version)",
        ),
        target_frontier_share: float = typer.Option(
            0.3, "--target-frontier-share", help="share of runs sent to the frontier"
        ),
        holdout_share: float = typer.Option(
            0.2, "--holdout-share", help="share of tasks held out (stable hash)"
        ),
        folds: int = typer.Option(5, "--folds", help="grouped CV folds"),
        no_eval: bool = typer.Option(False, "--no-eval", help="skip the cross-validated evaluation"),
        cache_capacity_blocks: int | None = typer.Option(
            None,
            "--cache-capacity-blocks",
            help="LRU replay capacity per replica (default: the node profile's KV blocks at --kv-cache-gb)",
        ),
        node_gpu: str = typer.Option(
            "a100", "--node-gpu", help="node profile of the cache-label replay (with --config: node.gpu)"
        ),
        kv_cache_gb: float = typer.Option(
            KV_CACHE_GB, "--kv-cache-gb", help="KV cache per replica (GB; with --config: node.kv_cache_gb)"
        ),
        cache_replicas: int = typer.Option(
            2, "--cache-replicas", help="local replicas (one cache each; with --config: the file's)"
        ),
        n_estimators: int = typer.Option(200, "--n-estimators", help="trees of the regressors"),
        no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not log to MLflow"),
        tracking_uri: str | None = typer.Option(
            None,
            "--tracking-uri",
            help="MLflow URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
        ),
        experiment: str = typer.Option("runroute-train", "--experiment"),
        registered_model: str = typer.Option("runroute-bundle", "--registered-model"),
        seed: int = typer.Option(0, "--seed"),
        bundle: Path | None = typer.Option(
            None, "--bundle", help="router logs: the serving bundle (base predictions, the champion)"
        ),
        prior: list[Path] = typer.Option(
            [], "--prior", help="router logs: paired public run logs (prior); repeat"
        ),
        value_of_success: float = typer.Option(
            1.0, "--value-of-success", help="router logs: USD of a success (net value)"
        ),
        dask: str | None = typer.Option(
            None, "--dask", help="train on Dask (LightGBM's Dask estimators): 'local' or a scheduler address"
        ),
        workers: int | None = typer.Option(
            None,
            "--workers",
            min=1,
            help="--dask local: worker processes (default 2); an address: wait for N",
        ),
        partitions: int | None = typer.Option(
            None, "--partitions", min=1, help="--dask: partitions of the run logs (default: 4 per worker)"
        ),
        config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
        show_config: bool = typer.Option(False, "--show-config", help=SHOW_HELP),
    ) -> None:
        """Per-step datasets from whole runs, grouped CV against baselines, calibrated thresholds,
        a verified bundle (joblib + manifest) and MLflow tracking with a 'champion' alias."""
        from pydantic import ValidationError
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from training.retrain import LogTrainConfig, logs_have_propensities, train_from_logs
        from training.train import TrainConfig, run_training

        flags: dict[str, tuple[str, object]] = {}
        for param, key, flag, value in (
            ("node_gpu", "node.gpu", "--node-gpu", node_gpu),
            ("kv_cache_gb", "node.kv_cache_gb", "--kv-cache-gb", kv_cache_gb),
            ("cache_replicas", "replicas", "--cache-replicas", cache_replicas),
        ):
            if given(ctx, param):
                flags[key] = (flag, value)
        dep = deployment_for(config, show_config, flags).deployment
        node_gpu = dep.node.gpu
        kv_cache_gb = dep.node.kv_cache_gb if dep.node.kv_cache_gb is not None else kv_cache_gb
        cache_replicas = dep.replicas or cache_replicas
        if not runs or out is None:
            raise CliError("train needs --runs and --out")
        if logs_have_propensities(runs):  # reads two columns of a Parquet log, not the whole log
            if dask is not None:
                raise CliError("--dask trains on run logs; router logs with propensities train serially")
            lcfg = LogTrainConfig(
                runs=runs,
                out=out,
                bundle=bundle,
                prior=prior,
                value_of_success=value_of_success,
                promote_if_better=promote_if_better,
                mlflow=not no_mlflow,
                tracking_uri=tracking_uri,
                seed=seed,
            )
            try:
                rep = train_from_logs(lcfg, progress=lambda m: typer.echo(m, err=True))
            except ValueError as e:
                raise CliError(str(e)) from None
            typer.echo(f"benefit model from {rep['n_runs']} logged runs -> {out / 'benefit.joblib'}")
            if "decision" in rep:
                typer.echo(("promoted: " if rep["promoted"] else "not promoted: ") + rep["decision"])
            return
        try:
            cfg = TrainConfig(
                runs=runs,
                pairs=pairs,
                out=out,
                report_json=report_json,
                benefit_report_dir=benefit_report,
                target_frontier_share=target_frontier_share,
                holdout_share=holdout_share,
                n_folds=folds,
                evaluate=not no_eval,
                cache_capacity_blocks=cache_capacity_blocks,
                node_gpu=node_gpu,
                kv_cache_gb=kv_cache_gb,
                cache_replicas=cache_replicas,
                n_estimators=n_estimators,
                mlflow=not no_mlflow,
                tracking_uri=tracking_uri,
                experiment=experiment,
                registered_model=registered_model,
                promote_if_better=promote_if_better,
                random_state=seed,
            )
        except ValidationError as e:
            first = e.errors()[0]
            raise CliError(f"--{'-'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
        console = Console(stderr=True)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as prog:
            task = prog.add_task("training", total=None)

            def say(msg: str) -> None:
                prog.update(task, description=msg)
                console.log(msg)

            try:
                if dask is not None:
                    res = _train_dask(cfg, dask, workers, partitions, prog, task, say)
                else:
                    res = run_training(cfg, progress=say)
            except ValueError as e:
                raise CliError(str(e)) from None
        lines = summary_lines(res.report, res.bundle.version, res.bundle_dir)
        typer.echo("\n".join(lines))


def _train_dask(
    cfg: Any, dask: str, workers: int | None, partitions: int | None, prog: Any, task: Any, say: Any
) -> Any:
    """``--dask``: open the client, train with :func:`training.dask_train.train_on_dask`; the bar
    follows the feature partitions as the scheduler finishes them."""
    from runroute.dask_support import dask_client, parse_dask
    from training.dask_train import train_on_dask

    echo = lambda m: prog.console.print(m, soft_wrap=True)  # noqa: E731 - one line, not wrapped
    with dask_client(parse_dask(dask) or "local", workers, echo=echo) as client:

        def on_task(k: int, n: int) -> None:
            prog.update(task, completed=k, total=n, description=f"features: partition {k}/{n}")

        return train_on_dask(cfg, client, npartitions=partitions, progress=say, on_task=on_task)


def summary_lines(r: dict[str, Any], version: str, bundle_dir: Any) -> list[str]:
    """The summary ``runroute train`` prints. The same figures carry the same labels in serial and
    ``--dask`` runs: the held-out split's (both modes have it) and the frontier share of runs
    (target, where the thresholds were set: ``out-of-fold`` or, above the calibration cap, the
    ``calibration slice`` the final model never saw, held-out); the grouped CV's only where it ran
    (serial with evaluation),
    labelled ``CV``."""
    lines = [
        f"bundle {version} -> {bundle_dir}",
        f"runs {r['n_runs']}  steps {r['n_steps']}  spec {r['feature_spec_version']}",
    ]
    esc = r.get("escalation", {})
    if "n_folds" in r and "auc" in esc:
        base = esc.get("baselines", {})
        lines.append(
            "escalation CV ({} folds)  AUC {:.3f}  Brier {:.4f}  ECE {:.3f}  | ".format(
                r["n_folds"], esc["auc"], esc["brier"], esc["ece"]
            )
            + "  ".join(f"{b}: AUC {v['auc']:.3f} Brier {v['brier']:.4f}" for b, v in base.items())
        )
        if "cache_reuse" in r:
            lines.append(f"cache reuse CV MAE {r['cache_reuse']['mae_tokens']:.0f} tokens")
        if "remaining_steps" in r:
            lines.append(f"remaining steps CV pinball p50 {r['remaining_steps']['pinball_p50']:.3f}")
    held = r.get("holdout", {})
    if "auc" in held.get("escalation", {}):
        he = held["escalation"]
        lines.append(
            "escalation held-out  AUC {:.3f}  Brier {:.4f}  ECE {:.3f}".format(
                he["auc"], he["brier"], he["ece"]
            )
        )
    if "cache_reuse" in held:
        lines.append(f"cache reuse held-out MAE {held['cache_reuse']['mae_tokens']:.0f} tokens")
    if "remaining_steps" in held:
        lines.append(f"remaining steps held-out pinball p50 {held['remaining_steps']['pinball_p50']:.3f}")
    th = r["thresholds"]
    lines.append(f"thresholds up {th['p_frontier_up']:.3f} down {th['p_frontier_down']:.3f}")
    share = "frontier share of runs: target {:.1%}  {} {:.1%}".format(
        th["target_frontier_share"], th.get("source", "out-of-fold"), th["expected_frontier_share"]
    )
    if th.get("holdout_frontier_share") is not None:
        share += "  held-out {:.1%}".format(th["holdout_frontier_share"])
    lines.append(share)
    for dom, d in (r.get("benefit") or {}).get("domains", {}).items():
        lines.append(f"benefit {dom}: {d['mode']} ({d['reason']})")
    if "mlflow" in r:
        mf = r["mlflow"]
        lines.append(f"mlflow {mf['model_uri']}  champion v{mf['champion']} ({mf['promotion_reason']})")
    return lines
