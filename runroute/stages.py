"""Stage progress for long CLI jobs: one rich progress bar over named stages, timed.

:class:`Stages` wraps a ``rich.progress.Progress``: ``start(name)`` names the running stage,
``done()`` advances the bar and records the stage's wall seconds in ``timings``; ``say`` prints a
dim line under the bar. No knobs.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Stages"]


class Stages:
    """A rich progress bar over the named stages, with the wall seconds of each in ``timings``."""

    def __init__(self, bar: Any, names: list[str], timings: dict[str, float]) -> None:
        self.bar, self.timings, self.console = bar, timings, bar.console
        self.task = bar.add_task("demo", total=len(names))
        self.name, self.t = "", time.perf_counter()

    def start(self, name: str) -> None:
        self.name, self.t = name, time.perf_counter()
        self.bar.update(self.task, description=f"demo: {name}")

    def done(self) -> None:
        self.timings[self.name] = round(time.perf_counter() - self.t, 2)
        self.bar.advance(self.task)

    def say(self, msg: str) -> None:
        self.console.print(f"  [dim]{msg}[/dim]")
