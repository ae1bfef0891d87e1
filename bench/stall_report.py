"""The sidecar's event-loop stalls in a bench run: read each sidecar's stall-monitor JSON
(``runtime.stall_path``, :mod:`router.server.loopwatch`, written when the sidecar stops) and print
the totals, the sites that took the stalled time (with their shares) and the longest stalls.

Knobs: ``top`` (stalls listed per system), ``sites`` (sites listed per system).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["load", "show"]


def load(path: Path) -> dict[str, Any] | None:
    """One sidecar's report, or None when it wrote none (crashed, or an older tree)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pct(rep: dict[str, Any], key: str) -> str:
    if key not in rep or not rep["stalled_ms"]:
        return "?"
    return f"{100 * rep[key] / rep['stalled_ms']:.0f}%"


def show(reports: dict[str, dict[str, Any]], console: Console, top: int = 5, sites: int = 6) -> None:
    """Print every system's stall totals, sites and longest stalls."""
    for label, rep in reports.items():
        secs = max(rep.get("seconds") or 0.0, 1e-9)
        console.print(
            f"[bold]{label}[/] event-loop stalls >= {rep['threshold_ms']:g} ms: {rep['stalls']} in "
            f"{secs:.0f} s, {rep['stalled_ms']:.0f} ms stalled ({100 * rep['stalled_ms'] / 1000 / secs:.1f}% "
            f"of the time); loop lag p50 <= {rep['lag_p50_ms']} ms, p99 <= {rep['lag_p99_ms']} ms; during "
            f"the stalls the loop thread used {_pct(rep, 'stalled_loop_cpu_ms')} of the time on the CPU, the "
            f"process's other threads {_pct(rep, 'stalled_other_threads_cpu_ms')} (the rest: the core went to "
            "other processes)",
            soft_wrap=True,
        )
        t = Table(title=f"{label}: where the stalled time went (innermost project frame)")
        for c in ("site", "stalls", "ms", "share"):
            t.add_column(c)
        for s in rep["sites"][:sites]:
            t.add_row(s["site"], str(s["count"]), f"{s['ms']:.0f}", f"{100 * s['share']:.0f}%")
        console.print(t)
        t = Table(title=f"{label}: the {top} longest stalls")
        for c in ("ms", "samples", "stack (innermost 4 frames)"):
            t.add_column(c)
        for s in rep["top"][:top]:
            frames = [ln.splitlines()[0].strip() for ln in s["stack"][-4:]] or [s["site"]]
            t.add_row(f"{s['ms']:.0f}", str(s["samples"]), "\n".join(frames))
        console.print(t)
