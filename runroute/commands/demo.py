"""`runroute demo`: the main job on embedded defaults (what `make demo` runs); the pipeline is
:mod:`runroute.demo`, the evaluation :mod:`training.eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for
from runroute.errors import CliError


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Annotated[Path, typer.Option("--out", help="report directory")] = Path("runroute-report"),
        no_live: Annotated[
            bool, typer.Option("--no-live", help="skip the live sidecar segment (simulator only)")
        ] = False,
        seed: Annotated[int, typer.Option("--seed", help="seed of the task split and the simulator")] = 0,
        synthetic_holdout_runs: Annotated[
            int, typer.Option("--synthetic-holdout-runs", help="runs in the synthetic held-out set")
        ] = 400,
        synthetic_train_runs: Annotated[
            int, typer.Option("--synthetic-train-runs", help="synthetic runs added to training")
        ] = 800,
        no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="train without MLflow tracking")] = False,
        config: Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)] = None,
        show_config: Annotated[bool, typer.Option("--show-config", help=SHOW_HELP)] = False,
    ) -> None:
        """Import the shipped samples, train a bundle on tasks that are not held out, compare every routing
        policy on held-out tasks (what-if simulator + live sidecar with fake backends), write
        runroute-report/ (report.md, scorecard.json, PNG plots) and print the scorecard."""
        from pydantic import ValidationError

        from runroute.demo import DemoConfig, LiveSettings, SimSettings, run_demo
        from training.eval.config import prices_for

        dep = deployment_for(config, show_config).deployment  # prices, node, SLOs, admission
        try:
            cfg = DemoConfig(
                out=out,
                seed=seed,
                synthetic_holdout_runs=synthetic_holdout_runs,
                synthetic_train_runs=synthetic_train_runs,
                mlflow=not no_mlflow,
                live=LiveSettings(enabled=not no_live),
                prices=prices_for(dep),
                sim=SimSettings.from_deployment(dep, seed=seed),
            )
        except ValidationError as e:
            err = e.errors()[0]
            raise CliError(f"demo: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        run_demo(cfg)
