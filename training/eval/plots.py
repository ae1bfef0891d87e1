"""The PNG plots of a scorecard set (matplotlib, Agg backend: no display needed).

- :func:`plot_frontier`: the cost-quality plane: every policy's operating point (mean cost per run,
  USD, vs success under the base outcome model, with its standard error), the threshold sweeps of
  the swept policies as lines, the learned policy's AIQ hull (dashed, :func:`training.eval.curves.hull_curve`)
  and the random-mixing line between always-local and always-frontier (dotted);
- :func:`plot_bars`: per-policy success (with its standard error) and mean cost per run;
- :func:`plot_latency`: per-policy p95 step latency of short vs long steps in the simulator, and
  beside it the live sidecar's measurement where the live segment ran.

Knobs: none (figure sizes and 110 dpi are fixed so reports compare across runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.eval.format import COLORS, fnum, isnum, rows_by_policy

__all__ = ["plot_frontier", "plot_bars", "plot_latency"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_frontier(s: dict[str, Any], title: str, path: Path) -> None:
    """Cost-quality plane of one set: points, sweeps and the learned policy's AIQ hull."""
    from training.eval.curves import hull_curve

    plt = _plt()
    rows = rows_by_policy(s)
    n = max(1, s.get("n_runs", 1))
    fig, ax = plt.subplots(figsize=(8.5, 6))
    for label, pts in (s.get("sweeps") or {}).items():
        xs = [p["cost_usd"] / n for p in pts if isnum(p.get("success_rate"))]
        ys = [p["success_rate"] for p in pts if isnum(p.get("success_rate"))]
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        ax.plot(
            [xs[i] for i in order],
            [ys[i] for i in order],
            "-",
            marker=".",
            color=COLORS.get(label, "k"),
            alpha=0.55,
            label=f"{label}: threshold sweep",
        )
    al, af, le = rows.get("always-local"), rows.get("always-frontier"), rows.get("learned")
    if al and af and le and isnum(al.get("success_rate")):
        pts = [(le["cost_usd"], le["success_rate"])] + [
            (p["cost_usd"], p["success_rate"]) for p in (s.get("sweeps") or {}).get("learned", [])
        ]
        h = hull_curve(pts, (al["cost_usd"], al["success_rate"]), al["cost_usd"], af["cost_usd"])
        if h is not None:
            hx, hr = h
            cost = (al["cost_usd"] + hx * (af["cost_usd"] - al["cost_usd"])) / n
            ax.plot(
                cost,
                hr,
                "--",
                color=COLORS["learned"],
                lw=1.2,
                label=f"learned: AIQ hull ({fnum(le.get('aiq'))})",
            )
        ax.plot(
            [al["cost_usd"] / n, af["cost_usd"] / n],
            [al["success_rate"], af["success_rate"]],
            ":",
            color="0.5",
            lw=1,
            label="random mix of local and frontier",
        )
    markers = "osD^vPX*"
    for i, (name, r) in enumerate(rows.items()):
        if not isnum(r.get("success_rate")):
            continue
        ax.errorbar(
            r["cost_usd"] / n,
            r["success_rate"],
            yerr=r.get("success_se") or 0,
            fmt=markers[i % len(markers)],
            ms=10 - i % 3 * 2,
            mfc="none" if i % 2 else None,
            mew=2,
            color=COLORS.get(name, "k"),
            capsize=3,
            label=name,
            zorder=5,
        )
    ax.set_xlabel("mean cost per run (USD, outcome model)")
    ax.set_xlim(left=0)
    ax.set_ylabel("success rate (base outcome model)")
    ax.set_title(f"{title}: cost vs quality ({s.get('n_quality_runs', 0)} runs with both outcomes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(s: dict[str, Any], title: str, path: Path) -> None:
    """Per-policy success rate (with SE) and mean cost per run."""
    plt = _plt()
    rows = [r for r in s.get("policies", [])]
    names = [r["policy"] for r in rows]
    n = max(1, s.get("n_runs", 1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    cols = [COLORS.get(p, "k") for p in names]
    succ = [r.get("success_rate") or 0.0 for r in rows]
    a1.bar(names, succ, color=cols, yerr=[r.get("success_se") or 0 for r in rows], capsize=3)
    a1.set_ylabel("success rate (base outcome model)")
    a1.set_ylim(0, 1)
    a1.set_title(f"{title}: success")
    for i, (v, r) in enumerate(zip(succ, rows, strict=True)):
        a1.text(i + 0.08, v + (r.get("success_se") or 0) + 0.015, f"{v:.2f}", ha="left", fontsize=8)
    cost = [(r.get("cost_usd") or 0.0) / n for r in rows]
    a2.bar(names, cost, color=cols)
    a2.set_ylabel("mean cost per run (USD, outcome model)")
    a2.set_title(f"{title}: cost")
    for i, v in enumerate(cost):
        a2.text(i, v, f"${v:.4f}", ha="center", va="bottom", fontsize=8)
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=30)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(s: dict[str, Any], live: dict[str, Any] | None, title: str, path: Path) -> None:
    """p95 step latency, short vs long steps, per policy (simulator; live sidecar where measured)."""
    import numpy as np

    plt = _plt()
    rows = s.get("policies", [])
    names = [r["policy"] for r in rows]
    x = np.arange(len(names))
    lp = (live or {}).get("policies") or {}
    has_live = any(isnum((lp.get(n) or {}).get("short_step_latency_s_p95")) for n in names)
    fig, axes = plt.subplots(1, 2 if has_live else 1, figsize=(13 if has_live else 8, 4.8), squeeze=False)
    w = 0.38
    ax = axes[0][0]
    short = [r.get("short_step_latency_s_p95") or 0 for r in rows]
    long_ = [r.get("long_step_latency_s_p95") or 0 for r in rows]
    ax.bar(x - w / 2, short, w, label="short steps (<= 64 output tokens or a tool call)", color="#4c72b0")
    ax.bar(x + w / 2, long_, w, label="long steps", color="#dd8452")
    ax.set_xticks(x, names, rotation=30)
    ax.set_ylabel("p95 step latency (s)")
    ax.set_title(f"{title}: simulator")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if has_live:
        ax2 = axes[0][1]
        ls = [(lp.get(n) or {}).get("short_step_latency_s_p95") or 0 for n in names]
        ll = [(lp.get(n) or {}).get("long_step_latency_s_p95") or 0 for n in names]
        ax2.bar(x - w / 2, ls, w, label="short steps", color="#4c72b0")
        ax2.bar(x + w / 2, ll, w, label="long steps", color="#dd8452")
        ax2.set_xticks(x, names, rotation=30)
        ax2.set_ylabel("p95 step latency (s)")
        ax2.set_title("live sidecar + fake backends (a few runs; oracle not run live)")
        ax2.legend(fontsize=8)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
