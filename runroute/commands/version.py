"""`runroute version`: print the package, feature-spec and run-log schema versions."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version() -> None:
        """Print runroute, run-log schema and library versions."""
        import runroute
        from features.schema import SCHEMA_VERSION

        typer.echo(f"runroute {runroute.__version__} (run-log schema v{SCHEMA_VERSION})")
