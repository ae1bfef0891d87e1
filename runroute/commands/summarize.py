"""`runroute summarize FILE...`: the import summary table for any run-log files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("summarize")
    def summarize(
        files: Annotated[list[Path], typer.Argument(help="run-log files or directories (.parquet/.jsonl)")],
        strict: Annotated[bool, typer.Option("--strict", help="fail on the first bad row")] = False,
        by_model: Annotated[bool, typer.Option("--by-model", help="one summary column per model")] = False,
    ) -> None:
        """Print runs, steps, token, tool-call, success and prefix-reuse figures of run-log files."""
        from features.importers.summary import summarize_files

        summarize_files(files, strict=strict, by_model=by_model)
