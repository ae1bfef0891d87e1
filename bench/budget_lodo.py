"""The frontier budget, leave-one-domain-out on the shipped paired tau2 sample: share and quality.

Usage (from the repository root)::

    .venv/bin/python bench/budget_lodo.py [--share 0.2] [--seeds 5] [--out runroute-report/budget]

For each shipped domain (airline, retail, telecom) an escalation model trained on the *other*
domains scores the held-out domain's weak runs; the budget (:mod:`router.policy.budget`, share of
runs, conformal quantile over a sliding window, warm start from the training runs' scores) decides
which escalate as they arrive (:mod:`training.eval.budget_eval`). Prints, per domain: the realised
frontier share (for ``--seeds`` arrival orders: mean, min and max), success with its 95%
task-bootstrap interval for the budgeted policy and the baselines held to the same share
(per-step-threshold with a hindsight threshold, random mixing), the paired difference to the best
baseline with its SE, and whether the two "Done when" checks hold (share within +-5 points; success
>= best baseline - 1 SE). Draws ``budget_curve.png``: success and cost per run against the realised
frontier share for budgets 5%..60%, with 95% bands, per domain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import numpy as np
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.budget_eval import domain_scores, evaluate_budget
    from training.eval.budget_plot import plot_budget_curve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=0.2, help="the frontier budget (share of runs)")
    ap.add_argument("--seeds", type=int, default=5, help="arrival orders tried for the share figure")
    ap.add_argument("--out", type=Path, default=Path("runroute-report/budget"))
    args = ap.parse_args()
    console = Console(width=220)
    t0 = time.perf_counter()
    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    scored = domain_scores(log)
    console.print(f"scored {len(scored)} held-out domains in {time.perf_counter() - t0:.1f}s")

    tab = Table(title=f"frontier budget {args.share:.0%} of runs, leave-one-domain-out (shipped tau2 pairs)")
    for c in (
        "domain",
        "runs",
        "tasks",
        "share mean [min, max]",
        "budgeted",
        "per-step-thr.",
        "random mix",
        "vs best: diff (SE)",
        "share ok",
        "quality ok",
    ):
        tab.add_column(c)
    curves = {}
    shares_grid = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    for d in track(scored, description="domains", console=console):
        res = [evaluate_budget(d, args.share, seed=s) for s in range(args.seeds)]
        sh = np.array([r.realised_share for r in res])
        r0 = res[0]
        best = r0.best_baseline
        diff = r0.diff_vs[best]

        def fmt(k: str, r=r0) -> str:
            ci = r.success[k]
            return f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]"

        share_ok = bool(np.all(np.abs(sh - args.share) <= 0.05))
        tab.add_row(
            d.domain,
            str(r0.runs),
            str(r0.tasks),
            f"{sh.mean():.3f} [{sh.min():.3f}, {sh.max():.3f}]",
            fmt("budgeted"),
            fmt("per-step-threshold"),
            fmt("random-mixing"),
            f"{best}: {diff.mean:+.3f} ({diff.se:.3f})",
            "yes" if share_ok else "NO",
            "yes" if r0.passes else "NO",
        )
        curves[d.domain] = [evaluate_budget(d, b, seed=0) for b in shares_grid]
    console.print(tab)
    console.print(
        "budgeted: the model of the other domains orders runs, the online conformal quantile decides how "
        "many escalate; per-step-threshold: the same scores, a threshold picked on the held-out runs to the "
        "same share (hindsight); random mixing: the same share escalated at random. Success: escalate-anytime "
        "outcome model, strong side = the domain's strong player's mean over its trials."
    )
    png = plot_budget_curve(curves, args.out / "budget_curve.png")
    console.print(
        f"wrote {png}; total {time.perf_counter() - t0:.1f}s (2-core machine shared with other work)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
