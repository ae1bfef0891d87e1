"""`runroute label --outcomes FILE --runs DIR`: late outcome labels for logged runs (last label wins)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runroute.errors import CliError


def register(app: typer.Typer) -> None:
    @app.command("label")
    def label(
        outcomes: Annotated[
            Path, typer.Option("--outcomes", help="CSV / JSONL / Parquet with run_id, outcome[, reward]")
        ],
        runs: Annotated[
            Path, typer.Option("--runs", help="the run-log directory (labels are written there)")
        ],
        skip_bad: Annotated[
            bool, typer.Option("--skip-bad", help="write the good rows even when some rows are bad")
        ] = False,
    ) -> None:
        """Record outcomes of logged runs in a new labels file beside the logs (atomic; a later
        label of the same run replaces an earlier one when the log is read). Every bad row is
        reported with its row number; with any bad row nothing is written unless --skip-bad."""
        from features.labels import label_runs

        res = label_runs(outcomes, runs, skip_bad=skip_bad)
        for b in res.bad_rows:
            typer.echo(f"runroute: bad row: {b}", err=True)
        if res.path is None:
            n = len(res.bad_rows)
            hint = "" if skip_bad else " (fix them, or --skip-bad to write the good rows)"
            raise CliError(f"{n} bad row(s) in {outcomes}; nothing written{hint}")
        typer.echo(
            f"labelled {res.written} run(s) ({res.relabelled} had a label before; the new one wins) -> {res.path}"
        )
        if res.bad_rows:
            typer.echo(f"runroute: {len(res.bad_rows)} bad row(s) skipped (--skip-bad)", err=True)
