"""The learning loop's figures, plots and printed tables (the report of :func:`training.eval.loop.run_loop`).

Per domain (:func:`summarise`), on the evaluation tasks (never in training), with standard errors
over tasks of the *paired* per-task differences (every policy serves the same evaluation runs):

- ``final_vs_baselines``: the final champion's net value per run minus each baseline's, its SE,
  ``not_below`` (difference >= -SE) and ``above`` (difference > SE);
- ``oracle_savings_share``: (always-frontier's cost - the champion's) / (always-frontier's cost -
  the oracle's), reported when the champion's success is >= always-frontier's (else None, with
  the success gap);
- ``exploration``: the net value per run exploration cost (champion without exploration minus with
  it, same arrivals) summed over days in USD, and the frontier USD spent by exploring runs;
- ``ope_coverage``: over every (day, candidate), how often the simulated truth lies inside the DR
  interval.

Plots (:func:`plot_domain`): ``loop_<domain>.png`` (success, cost and net value per day: the
champion with its SE band, every baseline and the oracle as lines; promotions marked) and
``ope_vs_truth_<domain>.png`` (DR estimate with its 95% interval against the simulated truth, per
candidate and day, and the diagonal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["summarise", "plot_domain", "print_loop"]


def _paired(a: dict[str, Any], b: dict[str, Any], key: str = "per_run_net") -> tuple[float, float]:
    import pandas as pd

    d = np.asarray(a[key]) - np.asarray(b[key])
    g = pd.Series(d).groupby(np.asarray(a["tasks"])).mean().to_numpy()
    se = float(np.std(g, ddof=1) / np.sqrt(len(g))) if len(g) > 1 else 0.0
    return float(d.mean()), se


def summarise(dom: dict[str, Any], runs_per_day: int) -> dict[str, Any]:
    final, base = dom["final"], dom["baselines"]
    vs = {}
    for name, b in base.items():
        diff, se = _paired(final, b)
        vs[name] = {"diff": diff, "se": se, "not_below": diff >= -se, "above": diff > se}
    af, orc = base["always-frontier"], base["oracle"]
    oracle_sav = af["cost"] - orc["cost"]
    share = None
    gap = final["success"] - af["success"]
    if gap >= -1e-12 and oracle_sav > 0:
        share = (af["cost"] - final["cost"]) / oracle_sav
    days = dom["days"]
    cov = [
        (day["day"], k, est["estimates"]["dr"]["net"], day["truth"][k])
        for day in days
        if "truth" in day
        for k, est in day["ope"].items()
    ]
    inside = [lo <= t <= hi for _, _, e, t in cov for lo, hi in [(e["lo"], e["hi"])] if lo is not None]
    return {
        "final_vs_baselines": vs,
        "not_below_every_baseline": all(v["not_below"] for k, v in vs.items() if k != "oracle"),
        "oracle_savings_share": share,
        "success_gap_vs_always_frontier": gap,
        "exploration": {
            "net_cost_usd": float(sum(d["exploration_cost_net_per_run"] for d in days) * runs_per_day),
            "net_cost_per_run": float(np.mean([d["exploration_cost_net_per_run"] for d in days]))
            if days
            else 0.0,
            "frontier_usd_of_exploring_runs": float(sum(d["exploration_frontier_usd"] for d in days)),
            "explored_runs": int(sum(d["explored_runs"] for d in days)),
        },
        "ope_coverage": {"inside": int(sum(inside)), "of": len(inside)},
        "promotions": [d["day"] for d in days if d.get("promoted")],
    }


def plot_domain(name: str, dom: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = dom["days"]
    x = [d["day"] for d in days] + [len(days)]
    evals = [d["eval"] for d in days] + [dom["final"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in zip(
        axes,
        ("success", "cost", "net"),
        ("success rate", "cost per run (USD)", "net value per run (USD)"),
        strict=True,
    ):
        y = np.array([e[key] for e in evals])
        se = np.array([e[f"{key}_se"] for e in evals])
        ax.plot(x, y, "o-", color="black", lw=2, label="learned (champion)")
        ax.fill_between(x, y - se, y + se, color="black", alpha=0.12)
        for i, (b, fig_b) in enumerate(dom["baselines"].items()):
            style = ":" if b == "oracle" else "--"
            ax.axhline(fig_b[key], ls=style, lw=1.4, color=f"C{i}", label=b)
        for d in days:
            if d.get("promoted"):
                ax.axvline(d["day"] + 1, color="green", alpha=0.25)
        ax.set_xlabel("day (after day d's retraining: d + 1)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7, loc="best")
    fig.suptitle(f"{name}: the learning loop on evaluation tasks never seen in training (green: promotion)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    p1 = out / f"loop_{name}.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 6))
    pts = [
        (k, d["truth"][k], e["estimates"]["dr"]["net"])
        for d in days
        if "truth" in d
        for k, e in d["ope"].items()
    ]
    for k in sorted({p[0] for p in pts}):
        sel = [p for p in pts if p[0] == k]
        t = [p[1] for p in sel]
        v = [p[2]["value"] for p in sel]
        err = [[p[2]["value"] - p[2]["lo"] for p in sel], [p[2]["hi"] - p[2]["value"] for p in sel]]
        ax.errorbar(t, v, yerr=err, fmt="o", capsize=3, label=k, alpha=0.8)
    if pts:
        lo = min(min(p[1] for p in pts), min(p[2]["lo"] for p in pts))
        hi = max(max(p[1] for p in pts), max(p[2]["hi"] for p in pts))
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel("simulated truth: net value per run (USD)")
    ax.set_ylabel("DR estimate from the logs, 95% CI")
    ax.set_title(f"{name}: off-policy estimates vs truth (every day, every candidate)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p2 = out / f"ope_vs_truth_{name}.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _sgn(v: float | None) -> str:
    return "n/a" if v is None or v != v else f"{v:+.3f}"


def print_loop(report: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=None if Console().is_terminal else 160)
    for name, dom in report["domains"].items():
        s = dom["summary"]
        t = Table(
            title=f"{name}: evaluation tasks ({len(dom['tasks']['eval'])} never in training); final champion {dom['final_champion']}"
        )
        for c in ("policy", "success", "cost / run", "net / run", "final - policy (SE)"):
            t.add_column(c)
        f = dom["final"]
        t.add_row(
            "learned (final)",
            f"{f['success']:.3f}",
            f"{f['cost']:.4f}",
            f"{f['net']:.4f} ± {f['net_se']:.4f}",
            "",
        )
        for b, fig_b in dom["baselines"].items():
            v = s["final_vs_baselines"][b]
            mark = "above" if v["above"] else ("not below" if v["not_below"] else "BELOW")
            t.add_row(
                b,
                f"{fig_b['success']:.3f}",
                f"{fig_b['cost']:.4f}",
                f"{fig_b['net']:.4f} ± {fig_b['net_se']:.4f}",
                f"{v['diff']:+.4f} ({v['se']:.4f}) {mark}",
            )
        con.print(t)
        d = Table(title=f"{name}: day by day")
        for c in (
            "day",
            "champion",
            "eval net",
            "frontier share (champion alone)",
            "explored",
            "exploration cost / run",
            "decision",
        ):
            d.add_column(c)
        for day in dom["days"]:
            d.add_row(
                str(day["day"]), day["champion"], f"{day['eval']['net']:.4f}",
                f"{day.get('realised_share', float('nan')):.3f} ({day.get('champion_share', float('nan')):.3f})",
                str(day["explored_runs"]),
                f"{day['exploration_cost_net_per_run']:+.4f}", ("PROMOTED " if day.get("promoted") else "") + str(day.get("decision")),
            )  # fmt: skip
        con.print(d)
        a = dom.get("at_share")
        if a:
            ci = a.get("success_diff_ci") or [float("nan")] * 2
            aci = a.get("aiq_diff_ci") or [float("nan")] * 2
            held = "" if a.get("pst_matched") else ": NOT held to the share"
            verdict = {True: "not below", False: "BELOW", None: "n/a"}[a.get("aiq_not_below")]
            thr = a.get("pst_thresholds") or [a["pst_threshold"]] * 2
            con.print(
                f"{name}: under the frontier budget {a['budget']:g} the final champion escalated "
                f"{a['final_share']:.3f} of the evaluation runs: success {a['final_success']:.3f}, AIQ "
                f"{_num(a['final_aiq'])}; per-step-threshold held to that share (thresholds {thr[0]:.3f} / "
                f"{thr[1]:.3f} in hindsight, mixed {a.get('pst_mix_weight', 1.0):.2f} per run: share "
                f"{a['pst_share']:.3f}{held}): success {a['pst_success']:.3f}, AIQ {_num(a['pst_aiq'])}; "
                f"paired success difference {a['success_diff']:+.3f} [95% CI {ci[0]:+.3f}, {ci[1]:+.3f}]; "
                f"AIQ difference {_sgn(a.get('aiq_diff'))} (SE {_num(a.get('aiq_diff_se'))}, 95% CI "
                f"{_sgn(aci[0])}, {_sgn(aci[1])}): {verdict}"
            )
        share = s["oracle_savings_share"]
        ex = s["exploration"]
        con.print(
            f"{name}: oracle's savings over always-frontier captured: "
            + (
                f"{share:.0%}"
                if share is not None
                else f"n/a (success {s['success_gap_vs_always_frontier']:+.3f} vs always-frontier)"
            )
            + f"; exploration cost {ex['net_cost_usd']:+.2f} USD net ({ex['net_cost_per_run']:+.4f} per run), "
            f"{ex['frontier_usd_of_exploring_runs']:.2f} USD frontier spend of {ex['explored_runs']} exploring runs; "
            f"OPE: truth inside the DR 95% CI {s['ope_coverage']['inside']}/{s['ope_coverage']['of']}"
        )
