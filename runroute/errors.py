"""Errors the CLI reports as one line (kept apart from runroute.cli so commands can import it freely)."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A failure to report as one line; ``exit_code`` defaults to 2 (bad input)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
