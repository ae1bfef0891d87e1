"""`runroute loop`: the learning loop on a simulated deployment (explore, log, retrain, promote by OPE).

Tasks arrive from paired run logs (default: the shipped tau2 pairs), the router serves them in the
what-if simulator with exploration, outcomes are drawn from the tasks' recorded outcomes, and every
simulated day the benefit model is retrained on the logs and a candidate is promoted only when its
off-policy (DR) estimate beats the champion's by more than its interval's half-width
(:mod:`training.eval.loop`). Writes ``loop.json``, ``loop_<domain>.png``, ``ope_vs_truth_<domain>.png``,
the logs (``logs/<domain>/day-NN.parquet``) and MLflow runs (``mlflow.db``) under ``--out``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for


def register(app: typer.Typer) -> None:
    @app.command("loop")
    def loop(
        out: Annotated[Path, typer.Option("-o", "--out", help="output directory")] = Path("runroute-loop"),
        data: Annotated[
            list[Path], typer.Option("--data", help="paired run logs (default: shipped tau2)")
        ] = [],  # noqa: B006
        days: Annotated[int, typer.Option("--days", min=1, help="simulated days")] = 6,
        runs_per_day: Annotated[int, typer.Option("--runs-per-day", min=10)] = 300,
        domain: Annotated[
            list[str], typer.Option("--domain", help="task_id prefix; repeat (default: all)")
        ] = [],  # noqa: B006
        weak: Annotated[str, typer.Option("--weak-model", help="the local tier's model")] = "gpt-oss-120b",
        strong: Annotated[
            str, typer.Option("--strong-model", help="the frontier tier's model")
        ] = "claude-sonnet-4-5",
        explore_rate: Annotated[float, typer.Option("--explore-rate", min=0.0, max=1.0)] = 0.2,
        value_of_success: Annotated[float, typer.Option("--value-of-success", help="USD of a success")] = 1.0,
        no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="no MLflow logging")] = False,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        config: Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)] = None,
        show_config: Annotated[bool, typer.Option("--show-config", help=SHOW_HELP)] = False,
    ) -> None:
        """Simulated deployment that learns from its own traffic: exploration, logging, daily
        retraining, promotion by off-policy evaluation; plots per domain."""
        import time

        from rich.console import Console

        from training.eval.config import prices_for
        from training.eval.loop import LoopConfig, run_loop
        from training.eval.loop_report import print_loop

        dep = deployment_for(config, show_config).deployment  # its prices and replica count
        cfg = LoopConfig(
            prices=prices_for(dep),
            out=out,
            data=data,
            days=days,
            runs_per_day=runs_per_day,
            domains=domain or None,
            weak_model=weak,
            strong_model=strong,
            value_of_success=value_of_success,
            mlflow=not no_mlflow,
            seed=seed,
        )
        if dep.replicas:  # the deployment's local replicas (else the loop's own default)
            cfg = cfg.model_copy(update={"replicas": dep.replicas})
        cfg = cfg.model_copy(update={"explore": cfg.explore.model_copy(update={"rate": explore_rate})})
        con = Console(stderr=True)
        t0 = time.perf_counter()
        with con.status("learning loop") as status:

            def say(msg: str) -> None:
                status.update(msg)
                con.log(msg)

            try:
                rep = run_loop(cfg, say=say)
            except ValueError as e:
                from runroute.errors import CliError

                raise CliError(str(e)) from None
        print_loop(rep)
        typer.echo(
            f"wrote {out / 'loop.json'} and {', '.join(rep['plots'])} in {time.perf_counter() - t0:.0f} s"
        )
