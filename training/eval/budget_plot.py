"""The budget curve (PNG): success and cost per run against the realised frontier share.

:func:`plot_budget_curve` draws, for each domain (one column), two panels: success (top) and mean
cost per run in USD (bottom) against the realised frontier share of runs, for the budgeted policy,
per-step-threshold held to the same share and random mixing, each with its 95% task-bootstrap band
(:class:`training.eval.budget_eval.DomainBudgetResult`, one per budget on the grid).

:func:`budget_stage` (the demo's stage) prints the leave-one-domain-out table at one budget and
draws the curve. Knobs: ``share``, ``grid``, ``n_estimators``, ``seed`` (figure size and 110 dpi
fixed so reports compare across runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from training.eval.budget_eval import DomainBudgetResult

__all__ = ["plot_budget_curve", "budget_stage"]

_SHOWN = (("budgeted", "tab:blue"), ("per-step-threshold", "tab:orange"), ("random-mixing", "tab:gray"))


def plot_budget_curve(curves: Mapping[str, Sequence[DomainBudgetResult]], path: Path) -> Path:
    """Write the budget curve of every domain in ``curves`` to ``path``; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doms = list(curves)
    fig, axes = plt.subplots(2, max(1, len(doms)), figsize=(4.5 * max(1, len(doms)), 7), squeeze=False)
    for j, dom in enumerate(doms):
        pts = sorted(curves[dom], key=lambda r: r.realised_share)
        x = [r.realised_share for r in pts]
        for k, color in _SHOWN:
            for row, get in ((0, lambda r, k=k: r.success[k]), (1, lambda r, k=k: r.cost_ci[k])):
                ax = axes[row][j]
                ci = [get(r) for r in pts]
                ax.plot(x, [c.mean for c in ci], "-o", ms=3, color=color, label=k)
                ax.fill_between(x, [c.low for c in ci], [c.high for c in ci], color=color, alpha=0.15)
        n = pts[0].runs if pts else 0
        axes[0][j].set_title(f"{dom} (held out, {n} runs)")
        axes[0][j].set_ylabel("success (95% task bootstrap)")
        axes[1][j].set_ylabel("cost per run, USD")
        axes[1][j].set_xlabel("realised frontier share of runs")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("frontier budget: success and cost against frontier share (leave-one-domain-out)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def budget_stage(
    out: Path,
    *,
    share: float = 0.2,
    grid: Sequence[float] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
    n_estimators: int = 80,
    seed: int = 0,
    console: object = None,
) -> dict[str, object]:
    """The demo's budget stage: leave-one-domain-out on the shipped paired sample
    (:func:`training.eval.budget_eval.domain_scores`), the per-domain table at ``share`` printed,
    the budget curve over ``grid`` drawn to ``out/budget_curve.png``; returns the figures (JSON)."""
    from rich.console import Console
    from rich.table import Table

    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.budget_eval import domain_scores, evaluate_budget

    con = console if isinstance(console, Console) else Console(width=160)
    scored = domain_scores(
        read_runlog(sample_path("paired/tau2bench_all.parquet")), n_estimators=n_estimators, seed=seed
    )
    tab = Table(title=f"frontier budget {share:.0%} of runs, leave-one-domain-out (shipped tau2 pairs)")
    for c in ("domain", "runs", "realised share", "budgeted", "per-step-thr.", "random mix", "vs best (SE)"):
        tab.add_column(c)
    rows: dict[str, object] = {}
    curves = {}
    for d in scored:
        r = evaluate_budget(d, share, seed=seed)
        best = r.best_baseline
        diff = r.diff_vs[best]
        tab.add_row(
            d.domain,
            str(r.runs),
            f"{r.realised_share:.3f}",
            *(f"{r.success[k].mean:.3f} [{r.success[k].low:.3f}, {r.success[k].high:.3f}]" for k in _KEYS),
            f"{best}: {diff.mean:+.3f} ({diff.se:.3f})",
        )
        rows[d.domain] = {
            "runs": r.runs,
            "realised_share": r.realised_share,
            "success": {k: r.success[k].mean for k in _KEYS},
            "best_baseline": best,
            "diff": diff.mean,
            "diff_se": diff.se,
        }
        curves[d.domain] = [evaluate_budget(d, b, seed=seed) for b in grid]
    con.print(tab)
    png = plot_budget_curve(curves, out / "budget_curve.png")
    con.print(f"budget curve: {png}")
    return {"share": share, "domains": rows, "png": str(png)}


_KEYS = ("budgeted", "per-step-threshold", "random-mixing")
