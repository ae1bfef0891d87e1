"""The `runroute` command line.

Each subcommand lives in its own module under ``runroute/commands/`` and exposes
``register(app: typer.Typer) -> None``. Modules are discovered at start-up, so adding a command is
adding one file. Command modules keep heavy imports (pandas, lightgbm, mlflow) inside the command
functions so that ``runroute --help`` stays fast.

Errors meant for a person (bad input files, bad config) are raised as :class:`CliError` or
:class:`ValueError` subclasses from the library and printed as one line, with exit code 2 for bad
input and 1 for other failures; no traceback unless ``RUNROUTE_DEBUG=1``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer

import runroute.commands as _commands
from runroute.errors import CliError

__all__ = ["app", "main", "CliError"]


_typer_app = typer.Typer(
    name="runroute",
    help="Workload-prediction routing for agent runs: import traces, train predictors, route, what-if.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@_typer_app.callback()
def _root() -> None:
    """runroute: learned, run-stable routing for agent runs (local vLLM replicas + a frontier API)."""


for _mod in sorted(m.name for m in pkgutil.iter_modules(_commands.__path__)):
    if not _mod.startswith("_"):
        importlib.import_module(f"runroute.commands.{_mod}").register(_typer_app)

# `runroute --help` lists each subcommand with one line: the first sentence of its help.
for _ci in _typer_app.registered_commands:
    if _ci.short_help is None:
        _doc = " ".join((_ci.help or (_ci.callback.__doc__ if _ci.callback else "") or "").split())
        _ci.short_help = _doc.split(". ")[0].rstrip(".")


def _user_error_types() -> tuple[type[BaseException], ...]:
    from features.runlog import RunLogError
    from features.schema import SchemaVersionError

    return (CliError, RunLogError, SchemaVersionError, FileNotFoundError)


def app() -> None:
    """Console-script entry point: run typer, turn known errors into one-line messages."""
    try:
        rc = _typer_app(standalone_mode=False)
    except SystemExit:  # typer/click exit codes pass through
        raise
    except Exception as e:  # noqa: BLE001 - the one place errors become exit codes
        import click

        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        if os.environ.get("RUNROUTE_DEBUG"):
            raise
        code = getattr(e, "exit_code", 2 if isinstance(e, _user_error_types()) else 1)
        print(f"runroute: error: {e}", file=sys.stderr)
        sys.exit(code)
    sys.exit(rc if isinstance(rc, int) else 0)


main = app

if __name__ == "__main__":
    app()
