"""The CLI lists every subcommand with a one-line help and turns errors into one-line messages."""

import subprocess
import sys

from typer.testing import CliRunner

from runroute.cli import _typer_app


def test_help_lists_every_command_with_a_line():
    result = CliRunner().invoke(_typer_app, ["--help"])
    assert result.exit_code == 0
    group = _typer_app_command()
    assert group.commands, "no subcommands registered"
    for name, cmd in group.commands.items():
        assert name in result.output
        assert (cmd.help or "").strip(), f"command {name} has no help line"


def _typer_app_command():
    import typer.main

    return typer.main.get_command(_typer_app)


def test_unknown_command_is_a_one_line_error():
    proc = subprocess.run(
        [sys.executable, "-m", "runroute", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "no-such-command" in proc.stderr
