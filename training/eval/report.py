"""The scorecard report: ``report.md``, ``scorecard.json`` and PNG plots, plus the printed table.

:func:`write_report` takes the scorecard built by ``runroute demo`` / ``runroute bench``
(a :class:`training.eval.scorecard.Scorecard`, or the JSON dict it dumps to) and writes, each file
atomically (:func:`training.jsonio.atomic_write`), into the report directory:

- ``scorecard.json``: the scorecard (keys: :mod:`training.eval.scorecard`, listed in docs/scorecard.md);
- ``frontier_<set>.png``, ``bars_<set>.png``, ``latency_<set>.png`` per set
  (:mod:`training.eval.plots`; the latency plot of ``synthetic-heldout`` carries the live segment);
- ``report.md`` (:mod:`training.eval.markdown`).

:func:`print_scorecard` prints one rich table per held-out set, the live segment's table and the
generated comparison sentences. Nothing here changes a number: every figure comes from the
scorecard. No knobs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.eval.analysis import comparison_lines
from training.eval.format import fnum, fpct, fusd
from training.eval.markdown import render_markdown
from training.eval.plots import plot_bars, plot_frontier, plot_latency
from training.eval.scorecard import Scorecard
from training.jsonio import atomic_write, jsonable

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["write_report", "print_scorecard", "card_dict"]


def card_dict(card: Scorecard | dict[str, object]) -> dict[str, Any]:
    """The JSON object of a scorecard (a typed one is dumped, a dict is made JSON-safe)."""
    if isinstance(card, Scorecard):
        return card.to_json_dict()
    out = jsonable(card)
    assert isinstance(out, dict)
    return out


def write_report(card: Scorecard | dict[str, Any], out: Path) -> dict[str, Path]:
    """Write scorecard.json, the PNGs and report.md into ``out``; returns the written paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    card = card_dict(card)
    written: dict[str, Path] = {}
    plots: dict[str, dict[str, str]] = {}
    for name, s in (card.get("sets") or {}).items():
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60]
        p: dict[str, str] = {}
        if s.get("policies"):
            plot_frontier(s, name, out / f"frontier_{safe}.png")
            plot_bars(s, name, out / f"bars_{safe}.png")
            plot_latency(
                s,
                card.get("live") if name == "synthetic-heldout" else None,
                name,
                out / f"latency_{safe}.png",
            )
            p = {
                "frontier": f"frontier_{safe}.png",
                "bars": f"bars_{safe}.png",
                "latency": f"latency_{safe}.png",
            }
            for k, v in p.items():
                written[f"{k}_{safe}"] = out / v
        plots[name] = p
    atomic_write(out / "scorecard.json", (json.dumps(card, indent=2) + "\n").encode())
    written["scorecard"] = out / "scorecard.json"
    atomic_write(out / "report.md", render_markdown(card, plots).encode())
    written["report"] = out / "report.md"
    return written


def _paired(r: dict[str, Any]) -> str:
    """Success and AIQ differences to per-step-threshold with their paired intervals."""
    d = r.get("success_diff_vs_ref")
    if d is None or r.get("policy") == "per-step-threshold":
        return "-"
    a = r.get("aiq_diff_vs_ref")
    out = f"{d:+.3f} [{r.get('success_diff_vs_ref_ci_low') or 0:+.3f}, {r.get('success_diff_vs_ref_ci_high') or 0:+.3f}]"
    if a is not None and r.get("aiq_diff_vs_ref_ci_low") is not None:
        out += f" / {a:+.3f} [{r['aiq_diff_vs_ref_ci_low']:+.3f}, {r['aiq_diff_vs_ref_ci_high']:+.3f}]"
    return out


def print_scorecard(card: Scorecard | dict[str, Any], console: Console | None = None) -> None:
    """One rich table per set: the headline figures of every policy."""
    from rich.console import Console
    from rich.table import Table

    card = card_dict(card)
    con = console or Console()
    for name, s in (card.get("sets") or {}).items():
        tab = Table(
            title=f"scorecard: {name} ({s.get('n_runs')} runs, {s.get('n_quality_runs')} with both outcomes)"
        )
        for col in (
            "policy",
            "success",
            "cost $",
            "cost@95%AF $",
            "AIQ [95% CI]",
            "vs per-step-thr. (paired): d success / d AIQ [95% CI]",
            "escal.",
            "recall",
            "prec.",
            "cache hit (max)",
            "flaps/run",
            "short p95 s",
            "run p95 s",
            "rej/spill",
        ):
            tab.add_column(col, justify="left" if col == "policy" else "right")
        for r in s.get("policies", []):
            tab.add_row(
                r["policy"],
                f"{fnum(r.get('success_rate'))}±{fnum(r.get('success_se'), 2)}",
                fusd(r.get("cost_usd")),
                fusd(r.get("cost_at_95pct_frontier_success_usd")),
                fnum(r.get("aiq"))
                + (
                    f" [{fnum(r.get('aiq_ci_low'))}, {fnum(r.get('aiq_ci_high'))}]"
                    if r.get("aiq_ci_low") is not None
                    else ""
                ),
                _paired(r),
                fpct(r.get("escalation_rate")),
                fpct(r.get("needs_frontier_recall")),
                fpct(r.get("needs_frontier_precision")),
                f"{fpct(r.get('cache_hit_rate'))} ({fpct(r.get('cache_hit_upper_bound'))})",
                fnum(r.get("flaps_per_run"), 2),
                fnum(r.get("short_step_latency_s_p95"), 2),
                fnum(r.get("run_completion_s_p95"), 1),
                f"{r.get('runs_rejected', '-')}/{r.get('runs_spilled', '-')}",
            )
        con.print(tab)
    live = card.get("live") or {}
    if "skipped" in live:
        con.print(f"live sidecar segment skipped: {live['skipped']}")
    elif live.get("policies"):
        tab = Table(
            title=f"live sidecar + fake backends ({len(live.get('runs', []))} runs per policy, {live.get('wall_s')} s)"
        )
        for col in (
            "policy",
            "steps",
            "p95 s",
            "short p95 s",
            "cache hit (max)",
            "escal.",
            "flaps/run",
            "errors",
        ):
            tab.add_column(col, justify="left" if col == "policy" else "right")
        for name, f in live["policies"].items():
            if "skipped" in f:
                tab.add_row(name, "skipped", "", "", "", "", "", "")
                continue
            tab.add_row(
                name,
                str(f.get("steps")),
                fnum(f.get("step_latency_s_p95")),
                fnum(f.get("short_step_latency_s_p95")),
                f"{fpct(f.get('cache_hit_rate'))} ({fpct(f.get('cache_hit_upper_bound'))})",
                fpct(f.get("escalation_rate")),
                fnum(f.get("flaps_per_run"), 2),
                str(f.get("errors")),
            )
        con.print(tab)
    for name, s in (card.get("sets") or {}).items():
        con.print(f"[bold]{name}: learned vs baselines[/bold]")
        for line in comparison_lines(s):
            con.print("  " + line.replace("**", ""))
