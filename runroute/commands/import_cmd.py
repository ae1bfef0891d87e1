"""`runroute import SOURCE PATH... -o OUT`: convert public traces into one run log and summarise it.

Each PATH is imported with the source's importer (features/importers/); the frames are concatenated,
optionally labelled by weak/strong pairing (``--weak``/``--strong``), written atomically, and
summarised. Bad source rows are quarantined to ``OUT.rejected.jsonl`` (the inputs may be read-only)
and counted; ``--strict`` fails on the first one instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SOURCE_NAMES = ("mooncake", "taubench", "tau2bench", "swebench-pro", "azure", "servegen")


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        source: Annotated[str, typer.Argument(help=f"one of: {', '.join(SOURCE_NAMES)}")],
        paths: Annotated[
            list[Path], typer.Argument(help="trace files or directories (see features/importers/)")
        ],
        out: Annotated[Path, typer.Option("-o", "--out", help="output run log (.parquet or .jsonl)")],
        strict: Annotated[bool, typer.Option("--strict", help="fail on the first bad source row")] = False,
        weak: Annotated[
            str | None, typer.Option("--weak", help="weak model: label its runs by pairing")
        ] = None,
        strong: Annotated[str | None, typer.Option("--strong", help="strong model for --weak")] = None,
        by_model: Annotated[bool, typer.Option("--by-model", help="one summary column per model")] = False,
        domain_roles: Annotated[
            bool,
            typer.Option(
                "--domain-roles",
                help="label every weak run by its own outcome against the best player of its domain "
                "(--weak: only that player is weak)",
            ),
        ] = False,
        embed: Annotated[
            bool, typer.Option("--embed", help="tau2bench: store each run's task embedding (C1)")
        ] = False,
    ) -> None:
        """Import traces (mooncake, taubench, tau2bench, swebench-pro, azure, servegen) into a run log."""
        import time

        import orjson
        import pandas as pd
        from rich.console import Console

        from features.importers import import_source
        from features.importers.summary import print_summary
        from features.runlog import BadRow, RunLogError, write_frame
        from runroute.errors import CliError

        if source not in SOURCE_NAMES:
            raise CliError(f"unknown source '{source}' (expected one of: {', '.join(SOURCE_NAMES)})")
        if embed and source != "tau2bench":
            raise CliError(f"--embed: only tau2bench runs carry a task text to embed (not {source})")
        if (weak is None) != (strong is None) and not domain_roles:
            raise CliError("--weak and --strong go together")
        if out.suffix not in (".parquet", ".jsonl"):
            raise CliError(f"{out}: output must end in .parquet or .jsonl")
        con = Console(width=None if Console().is_terminal else 120)
        bad: list[BadRow] = []
        t0 = time.perf_counter()
        frames = [import_source(source, p, strict=strict, bad_rows=bad, embed=embed) for p in paths]
        frames = [f for f in frames if len(f)]
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames[0] if frames else None)
        elapsed = time.perf_counter() - t0
        shown = " ".join(str(p) for p in paths)
        rejected = out.with_name(out.name + ".rejected.jsonl")
        if bad:
            out.parent.mkdir(parents=True, exist_ok=True)
            rejected.write_bytes(
                b"".join(
                    orjson.dumps(
                        {"file": b.path, "row": b.row, "reason": b.reason, "raw": b.raw}, default=str
                    )
                    + b"\n"
                    for b in bad
                )
            )
        elif rejected.exists():
            rejected.unlink()
        if df is None:
            raise RunLogError(
                f"{shown}: no good rows ({len(bad)} bad, quarantined to {rejected}; first: {bad[0] if bad else '-'})"
            )
        if domain_roles:
            from features.importers.pairing import label_domain_runs

            df = label_domain_runs(df, weak=(weak,) if weak else None)
        elif weak is not None and strong is not None:
            from features.importers.pairing import label_weak_runs

            df = label_weak_runs(df, weak, strong)
        write_frame(df, out)
        con.print(f"imported {source} from {shown} in {elapsed:.2f} s -> {out} ({len(df):,} records)")
        if bad:
            con.print(f"[yellow]{len(bad)} bad row(s) quarantined to {rejected}; first: {bad[0]}[/yellow]")
        print_summary(df, title=f"{source}: {shown}", by_model=by_model, console=con)
