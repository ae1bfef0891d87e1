"""Summary figures of a run-log frame, per source (or per source and model), and their rich table.

Algorithm: steps get their source (and model) from their run record via ``run_id``; then per group:

- runs: count, steps (count, p50 per run, p50 for successful / failed runs), success rate over runs
  with a known outcome, pairing labels (``pair_label`` counts) where present;
- steps: prompt-token p50/p95, completion p50, tool-call mix (top ``top_tools`` names with their share
  of all calls), share of consumed tool results flagged as errors;
- prefix reuse upper bound = sum(prefix_reuse_tokens) / sum(prompt_tokens) over steps that have it;
  continuation share p50 = median prefix_reuse/prompt over steps >= 1 (how much of a later prompt
  repeats an earlier prefix); cached share = sum(cached)/sum(prompt) where logged;
- timing: inter-turn gap p50 (arrival_s difference between consecutive steps of a run) and tool
  pause p50 (steps >= 1);
- arrivals: count, span, mean rate, peak 1-s count / mean per second (burstiness);
- rate windows: windows, clients, span in days, mean rate and cv.

Every figure is computed from the frame; nothing is looked up. Missing figures are left out (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

__all__ = ["summarize", "summary_table", "print_summary", "summarize_files"]


def _q(s: pd.Series, q: float) -> float | None:
    s = s.dropna()
    return float(s.quantile(q)) if len(s) else None


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def _run_metrics(runs: pd.DataFrame, steps: pd.DataFrame, top_tools: int) -> dict[str, Any]:
    import numpy as np
    import pandas as pd

    m: dict[str, Any] = {}
    if len(runs):
        m["runs"] = len(runs)
        m["models"] = int(runs["model"].nunique()) or None
        known = runs[runs["outcome"].isin(["success", "failure"])]
        m["outcomes_known"] = len(known)
        m["success_rate"] = float((known["outcome"] == "success").mean()) if len(known) else None
        labels = runs["pair_label"].dropna()
        if len(labels):
            m["pair_labels"] = {k: int(v) for k, v in labels.value_counts().items()}
    if len(steps):
        m["steps"] = len(steps)
        per_run = steps.groupby("run_id").size()
        m["steps_per_run_p50"] = float(per_run.median())
        if len(runs):
            out = runs.set_index("run_id")["outcome"]
            oc = per_run.index.map(out)
            for o in ("success", "failure"):
                sel = per_run[np.asarray(oc == o)]
                m[f"steps_p50_{o}"] = float(sel.median()) if len(sel) else None
        pt = pd.to_numeric(steps["prompt_tokens"], errors="coerce")
        m["prompt_p50"], m["prompt_p95"] = _q(pt, 0.5), _q(pt, 0.95)
        m["completion_p50"] = _q(pd.to_numeric(steps["completion_tokens"], errors="coerce"), 0.5)
        calls = [c for lst in steps["tool_calls"] if lst is not None for c in lst]
        m["tool_calls"] = len(calls)
        if calls:
            vc = pd.Series(calls).value_counts()
            m["tool_mix"] = [(str(k), float(v) / len(calls)) for k, v in vc.head(top_tools).items()]
        errs = [bool(e) for lst in steps["tool_result_errors"] if lst is not None for e in lst]
        if errs:
            m["tool_error_share"] = float(np.mean(errs))
        reuse = pd.to_numeric(steps["prefix_reuse_tokens"], errors="coerce")
        has = reuse.notna()
        if has.any():
            m["prefix_reuse_ub"] = _ratio(reuse[has].sum(), pt[has].sum())
            later = has & (pd.to_numeric(steps["step"], errors="coerce") >= 1) & (pt > 0)
            if later.any():
                m["continuation_share_p50"] = float((reuse[later] / pt[later]).median())
        cached = pd.to_numeric(steps["cached_tokens"], errors="coerce")
        if cached.notna().any():
            m["cached_share"] = _ratio(cached.dropna().sum(), pt[cached.notna()].sum())
        arr = pd.to_numeric(steps["arrival_s"], errors="coerce")
        if arr.notna().any():
            order = steps.assign(_a=arr).sort_values(["run_id", "step"])
            gap = order.groupby("run_id")["_a"].diff()
            m["gap_p50_s"] = _q(gap, 0.5)
        pause = pd.to_numeric(steps["tool_pause_s"], errors="coerce")
        m["tool_pause_p50_s"] = _q(pause, 0.5)
    return m


def _arrival_metrics(arr: pd.DataFrame) -> dict[str, Any]:
    import numpy as np
    import pandas as pd

    t = pd.to_numeric(arr["arrival_s"], errors="coerce").dropna().to_numpy()
    m: dict[str, Any] = {"arrivals": len(arr)}
    if len(t):
        span = float(t.max() - t.min())
        m["span_s"] = span
        m["rate_mean"] = len(t) / span if span > 0 else None
        per_s = np.bincount((t - t.min()).astype(np.int64))
        m["peak_to_mean_1s"] = float(per_s.max() / per_s.mean()) if per_s.mean() > 0 else None
    pt = pd.to_numeric(arr["prompt_tokens"], errors="coerce")
    m["prompt_p50"], m["prompt_p95"] = _q(pt, 0.5), _q(pt, 0.95)
    m["completion_p50"] = _q(pd.to_numeric(arr["completion_tokens"], errors="coerce"), 0.5)
    return m


def _rate_metrics(rates: pd.DataFrame) -> dict[str, Any]:
    import pandas as pd

    start = pd.to_numeric(rates["start_s"], errors="coerce")
    dur = pd.to_numeric(rates["duration_s"], errors="coerce")
    return {
        "windows": len(rates),
        "clients": int(rates["client"].nunique()),
        "span_days": float(((start + dur).max() - start.min()) / 86400.0) if len(rates) else None,
        "rate_mean": float(pd.to_numeric(rates["rate"], errors="coerce").mean()),
        "cv_mean": float(pd.to_numeric(rates["cv"], errors="coerce").mean()),
    }


def summarize(df: pd.DataFrame, *, by_model: bool = False, top_tools: int = 5) -> dict[str, dict[str, Any]]:
    """Figures per group (``source`` or ``source / model``); see the module docstring."""
    import pandas as pd

    def key(source: Any, model: Any) -> str:
        s = str(source) if source is not None and not pd.isna(source) else "unknown"
        if by_model and model is not None and not pd.isna(model):
            return f"{s} / {model}"
        return s

    out: dict[str, dict[str, Any]] = {}
    runs = df[df["record"] == "run"]
    steps = df[df["record"] == "step"]
    if len(runs) or len(steps):
        run_key = pd.Series(
            [key(s, m) for s, m in zip(runs["source"], runs["model"], strict=True)],
            index=runs["run_id"].to_numpy(),
        )
        run_key = run_key[~run_key.index.duplicated()]
        step_key = steps["run_id"].map(run_key).fillna("unknown (no run record)")
        rk = pd.Series(run_key.to_numpy(), index=runs.index)
        for k in sorted(set(rk) | set(step_key)):
            out[k] = _run_metrics(runs[rk == k], steps[step_key == k], top_tools)
    arr = df[df["record"] == "arrival"]
    for s, g in arr.groupby("source", sort=True):
        out.setdefault(str(s), {}).update(_arrival_metrics(g))
    rates = df[df["record"] == "rate"]
    for s, g in rates.groupby("source", sort=True):
        out.setdefault(str(s), {}).update(_rate_metrics(g))
    return out


def _fmt_int(v: Any) -> str:
    return f"{int(round(v)):,}"


def _fmt_pct(v: Any) -> str:
    return f"{100 * v:.1f}%"


def _fmt_num(v: Any) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("runs", "runs", _fmt_int),
    ("models", "models", _fmt_int),
    ("steps", "steps", _fmt_int),
    ("steps_per_run_p50", "steps/run p50", _fmt_num),
    ("steps_p50_success", "steps p50 (success)", _fmt_num),
    ("steps_p50_failure", "steps p50 (failure)", _fmt_num),
    ("success_rate", "success rate", _fmt_pct),
    ("outcomes_known", "runs with outcome", _fmt_int),
    ("pair_labels", "pair labels", lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items()))),
    ("arrivals", "arrivals", _fmt_int),
    ("span_s", "span (s)", _fmt_num),
    ("rate_mean", "mean rate (req/s)", lambda v: f"{v:.3g}"),
    ("peak_to_mean_1s", "peak/mean per second", lambda v: f"{v:.3g}"),
    ("windows", "rate windows", _fmt_int),
    ("clients", "clients", _fmt_int),
    ("span_days", "span (days)", lambda v: f"{v:.3g}"),
    ("cv_mean", "mean cv", lambda v: f"{v:.3g}"),
    ("prompt_p50", "prompt tokens p50", _fmt_int),
    ("prompt_p95", "prompt tokens p95", _fmt_int),
    ("completion_p50", "completion tokens p50", _fmt_int),
    ("tool_calls", "tool calls", _fmt_int),
    ("tool_mix", "tool-call mix (top)", lambda lst: "\n".join(f"{n} {100 * s:.0f}%" for n, s in lst)),
    ("tool_error_share", "tool results errored", _fmt_pct),
    ("prefix_reuse_ub", "prefix-reuse upper bound", _fmt_pct),
    ("continuation_share_p50", "continuation share p50", _fmt_pct),
    ("cached_share", "cached tokens (logged)", _fmt_pct),
    ("gap_p50_s", "inter-turn gap p50 (s)", lambda v: f"{v:.3g}"),
    ("tool_pause_p50_s", "tool pause p50 (s)", lambda v: f"{v:.3g}"),
)


def summary_table(summaries: dict[str, dict[str, Any]], title: str | None = None) -> Table:
    """A rich table: one row per figure, one column per group; '-' where a figure does not apply."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    table.add_column("figure", style="bold")
    groups = list(summaries)
    for g in groups:
        table.add_column(g, justify="right")
    for key, label, fmt in _ROWS:
        vals = [summaries[g].get(key) for g in groups]
        if all(v is None for v in vals):
            continue
        table.add_row(label, *("-" if v is None else fmt(v) for v in vals))
    return table


def print_summary(
    df: pd.DataFrame, *, title: str | None = None, by_model: bool = False, console: Console | None = None
) -> dict[str, dict[str, Any]]:
    """Summarise ``df``, print the table (to ``console`` or stdout) and return the figures."""

    s = summarize(df, by_model=by_model)
    (console or _console()).print(summary_table(s, title=title))
    return s


def summarize_files(
    paths: Iterable[str | Path] | Sequence[str | Path],
    *,
    strict: bool = False,
    by_model: bool = False,
    console: Console | None = None,
) -> dict[str, dict[str, Any]]:
    """Read run-log files (validated; bad rows quarantined unless ``strict``) and print their summary."""
    import pandas as pd

    from features.runlog import read_runlog

    con = console or _console()
    paths = list(paths)
    log = read_runlog(paths, strict=strict)
    if log.bad_rows:
        files = sorted({b.path for b in log.bad_rows})
        con.print(
            f"[yellow]{len(log.bad_rows)} bad row(s) quarantined to "
            + ", ".join(f"{f}.rejected.jsonl" for f in files)
            + f"; first: {log.bad_rows[0]}[/yellow]"
        )
        dups = sum(1 for b in log.bad_rows if b.reason.startswith("duplicate (run_id, step)"))
        if dups:
            con.print(f"[red]{dups} duplicate (run_id, step) row(s): steps numbered twice[/red]")
    parts = [f for f in (log.runs, log.steps, log.arrivals, log.rates) if len(f)]
    if not parts:
        from features.runlog import RunLogError

        raise RunLogError(f"{title_of(paths)}: no valid records")
    df = pd.concat(parts, ignore_index=True)
    title = title_of(paths)
    return print_summary(df, title=title, by_model=by_model, console=con)


def _console() -> Console:
    """stdout console; 120 columns when not a terminal (pipes, CI logs) instead of rich's 80."""
    from rich.console import Console

    return Console(width=None if Console().is_terminal else 120)


def title_of(paths: Sequence[str | Path]) -> str:
    return ", ".join(str(p) for p in paths)
