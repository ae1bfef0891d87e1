"""The budget curve (PNG): success and cost per run against the realised frontier share.

:func:`plot_budget_curve` draws, for each domain (one column), two panels: success (top) and mean
cost per run in USD (bottom) against the realised frontier share of runs, for the budgeted policy,
per-step-threshold held to the same share and random mixing, each with its 95% task-bootstrap band
(:class:`training.eval.budget_eval.DomainBudgetResult`, one per budget on the grid).

Knobs: none (figure size and 110 dpi fixed so reports compare across runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from training.eval.budget_eval import DomainBudgetResult

__all__ = ["plot_budget_curve"]

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
