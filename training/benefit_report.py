"""The benefit model's report files: ``benefit.json``, ``benefit.md`` and two PNGs.

- ``benefit.json``: the stage's whole report (:func:`training.benefit_job.benefit_stage`);
- ``benefit.md``: the tables a person reads: per domain the mode and why, in-domain and
  leave-one-domain-out needs-frontier AUC with SE, Qini, AIQ (gated / best baseline / SE, safe?),
  the ablation and the held-out-task figures;
- ``benefit_auc.png``: in-domain vs leave-one-domain-out AUC per domain with 1-SE bars (0.5 = chance);
- ``benefit_learning_curve.png``: in-domain AUC vs labelled runs (25 / 50 / 100 / all) per domain.

Knobs: none (fixed sizes, 110 dpi).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_benefit_report", "benefit_markdown"]


def _f(v: Any, nd: int = 3) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if x != x else f"{x:.{nd}f}"


def benefit_markdown(rep: dict[str, Any]) -> str:
    lines = ["# Benefit of escalation (per domain, gated)", ""]
    lines += [
        f"Paired runs: {rep.get('n_runs')} (with a task embedding: {rep.get('embedding_runs')}); "
        f"prior P(ok|local) {_f(rep['prior']['p_local'])}, P(ok|frontier) {_f(rep['prior']['p_frontier'])}.",
        "",
        "| domain | runs | mode | CV AUC (needs-frontier) | SE | Qini | AIQ learned | AIQ failure-thr | "
        "AIQ random-mix | reason |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dom, d in rep.get("domains", {}).items():
        a = d.get("aiq", {})
        lines.append(
            f"| {dom} | {d.get('n_runs')} | {d.get('mode')} | {_f(d.get('auc'))} | {_f(d.get('auc_se'))} | "
            f"{_f(d.get('qini'))} | {_f(a.get('learned', {}).get('aiq'))} | "
            f"{_f(a.get('failure_threshold', {}).get('aiq'))} | {_f(a.get('random_mix', {}).get('aiq'))} | "
            f"{d.get('reason')} |"
        )
    cal = [(k, d) for k, d in rep.get("domains", {}).items() if "local" in d]
    if cal:
        lines += ["", "## Heads at the decision step (CV): AUC / Brier (base-rate Brier) / ECE", ""]
        lines += ["| domain | P(ok local) | P(ok frontier) |", "|---|---|---|"]
        for dom, d in cal:
            heads = [
                f"{_f(h['auc'])} / {_f(h['brier'])} ({_f(h['brier_base_rate'])}) / {_f(h['ece'])}"
                for h in (d["local"], d["frontier"])
            ]
            lines.append(f"| {dom} | {heads[0]} | {heads[1]} |")
    if rep.get("leave_one_domain_out"):
        lines += ["", "## Leave one domain out (heads fit on the other domains)", ""]
        lines += ["| held-out domain | runs | AUC | SE | Qini |", "|---|---|---|---|---|"]
        for dom, d in rep["leave_one_domain_out"].items():
            lines.append(
                f"| {dom} | {d.get('n_runs')} | {_f(d.get('auc'))} | {_f(d.get('auc_se'))} | {_f(d.get('qini'))} |"
            )
    if rep.get("safety"):
        lines += ["", "## Safety: gated AIQ >= best baseline - 1 SE", ""]
        lines += ["| where | domain | gated mode | gated AIQ | best baseline | its AIQ | SE | safe |"]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for where in ("in_domain", "held_out_domain"):
            for dom, s in rep["safety"].get(where, {}).items():
                lines.append(
                    f"| {where} | {dom} | {s['gated_mode']} | {_f(s['gated_aiq'])} | {s['best_baseline']} | "
                    f"{_f(s['best_baseline_aiq'])} | {_f(s['best_baseline_se'])} | {s['safe']} |"
                )
    if rep.get("ablation"):
        lines += ["", "## Ablation: CV AUC (SE) by head inputs", ""]
        lines += ["| domain | struct | embed | both |", "|---|---|---|---|"]
        for dom, d in rep["ablation"].items():
            cells = [
                f"{_f(d[k]['auc'])} ({_f(d[k]['auc_se'])})" if k in d else "-"
                for k in ("struct", "embed", "both")
            ]
            lines.append(f"| {dom} | " + " | ".join(cells) + " |")
    if rep.get("learning_curve"):
        lines += ["", "## Learning curve: in-domain CV AUC (SE) vs labelled runs", ""]
        for dom, pts in rep["learning_curve"].items():
            curve = ", ".join(f"{p['runs']}: {_f(p['auc'])} ({_f(p['auc_se'])})" for p in pts)
            lines.append(f"- {dom}: {curve}")
    if rep.get("permutation_importance"):
        lines += ["", "## Permutation importance (CV AUC drop when the input is shuffled)", ""]
        for dom, imp in rep["permutation_importance"].items():
            lines.append(f"- {dom}: " + ", ".join(f"{k} {_f(v)}" for k, v in imp.items()))
    if rep.get("holdout"):
        lines += ["", "## Held-out tasks (the gated bundle)", ""]
        lines += [
            "| domain | runs | mode | AUC | SE | AIQ learned - per-step-thr (SE) | - failure-thr (SE) | "
            "flaps/run per-step-thr | flaps/run learned |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for dom, d in rep["holdout"].items():
            lm = d["learned_minus"]
            cell = {
                k: f"{_f(lm[k]['diff'])} ({_f(lm[k]['se'])})" if k in lm else "-"
                for k in ("per_step_threshold", "failure_threshold")
            }
            fl = d.get("flaps_per_run", {})
            lines.append(
                f"| {dom} | {d['n_runs']} | {d['mode']} | {_f(d['auc'])} | {_f(d['auc_se'])} | "
                f"{cell['per_step_threshold']} | {cell['failure_threshold']} | "
                f"{_f(fl.get('per_step_threshold'), 2)} | {_f(fl.get('learned'), 2)} |"
            )
    return "\n".join(lines) + "\n"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_benefit_report(rep: dict[str, Any], out: Path) -> list[Path]:
    """Write the four files into ``out`` (created); returns their paths."""
    from training.jsonio import jsonable

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "benefit.json", out / "benefit.md"]
    paths[0].write_text(json.dumps(jsonable(rep), indent=2) + "\n")
    paths[1].write_text(benefit_markdown(rep))
    plt = _plt()
    doms = list(rep.get("domains", {}))
    if doms:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(doms))
        ind = [rep["domains"][d].get("auc", float("nan")) for d in doms]
        ind_se = [rep["domains"][d].get("auc_se", 0.0) for d in doms]
        lodo = rep.get("leave_one_domain_out", {})
        lo = [lodo.get(d, {}).get("auc", float("nan")) for d in doms]
        lo_se = [lodo.get(d, {}).get("auc_se", 0.0) for d in doms]
        ax.bar([x - 0.2 for x in xs], ind, 0.4, yerr=ind_se, label="in-domain (task-grouped CV)")
        ax.bar([x + 0.2 for x in xs], lo, 0.4, yerr=lo_se, label="leave-one-domain-out")
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set_xticks(list(xs), doms)
        ax.set_ylim(0.2, 0.9)
        ax.set_ylabel("needs-frontier AUC of the benefit score (1 SE)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "benefit_auc.png", dpi=110)
        plt.close(fig)
        paths.append(out / "benefit_auc.png")
    curve = rep.get("learning_curve", {})
    if curve:
        fig, ax = plt.subplots(figsize=(7, 4))
        for dom, pts in curve.items():
            if pts:
                ax.errorbar(
                    [p["runs"] for p in pts],
                    [p["auc"] for p in pts],
                    yerr=[p["auc_se"] for p in pts],
                    marker="o",
                    capsize=3,
                    label=dom,
                )
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("labelled runs (whole tasks)")
        ax.set_ylabel("in-domain CV AUC (1 SE)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "benefit_learning_curve.png", dpi=110)
        plt.close(fig)
        paths.append(out / "benefit_learning_curve.png")
    return paths
