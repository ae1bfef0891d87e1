"""`runroute generate --runs N --seed S -o OUT`: a seeded synthetic agent-run workload.

The runs come from :func:`features.generate.generate` (algorithm, calibration and every knob are in
its docstring); ``--param name=value`` overrides a knob (repeatable). The output format follows the
suffix of ``-o`` (``.parquet`` or ``.jsonl``); ``--jsonl`` also writes a JSONL copy beside a Parquet
output. Prints the elapsed time and the calibration statistics of what it generated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def _parse_params(items: list[str]) -> dict[str, Any]:
    """``name=value`` strings -> typed overrides (types from the GeneratorParams fields)."""
    import dataclasses

    from features.generate import GeneratorParams
    from runroute.errors import CliError

    types = {f.name: type(getattr(GeneratorParams(), f.name)) for f in dataclasses.fields(GeneratorParams)}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise CliError(f"--param expects name=value, got '{item}'")
        if name not in types:
            raise CliError(f"--param: unknown generator parameter '{name}' (see features/generate.py)")
        t = types[name]
        try:
            if t is bool:
                low = raw.strip().lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                out[name] = low in ("true", "1", "yes")
            else:
                out[name] = t(raw)
        except ValueError:
            raise CliError(f"--param {name}: '{raw}' is not a valid {t.__name__}") from None
    return out


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_(
        out: Annotated[Path, typer.Option("-o", "--out", help="output run log (.parquet or .jsonl)")],
        runs: Annotated[int, typer.Option("--runs", help="number of runs to generate")] = 1000,
        seed: Annotated[int, typer.Option("--seed", help="random seed (same seed, same workload)")] = 0,
        jsonl: Annotated[
            bool, typer.Option("--jsonl", help="also write a .jsonl copy beside a .parquet")
        ] = False,
        param: Annotated[
            list[str] | None,
            typer.Option("--param", help="override a generator knob, name=value (repeatable)"),
        ] = None,
    ) -> None:
        """Generate a seeded synthetic agent-run workload calibrated to the real traces."""
        import time

        from features.generate import generate, summary_stats
        from features.runlog import write_frame
        from runroute.errors import CliError

        if runs < 1:
            raise CliError(f"--runs must be >= 1, got {runs}")
        if out.suffix not in (".parquet", ".jsonl"):
            raise CliError(f"{out}: output must end in .parquet or .jsonl")
        overrides = _parse_params(param or [])
        t0 = time.perf_counter()
        try:
            df = generate(runs, seed, **overrides)
        except ValueError as e:
            raise CliError(str(e)) from None
        t_gen = time.perf_counter() - t0
        write_frame(df, out)
        written = [out]
        if jsonl and out.suffix == ".parquet":
            written.append(write_frame(df, out.with_suffix(".jsonl")))
        n_steps = int((df["record"] == "step").sum())
        typer.echo(
            f"generated {runs:,} runs / {n_steps:,} steps (seed {seed}) in {t_gen:.2f} s -> "
            + ", ".join(str(p) for p in written)
        )
        for k, v in summary_stats(df).items():
            typer.echo(f"  {k:28s} {v:,.4g}")
