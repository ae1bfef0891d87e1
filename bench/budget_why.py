"""Why the budgeted policy does not beat the best baseline at 20% on some held-out domains: is it the
ordering (which runs escalate) or the timing (when they escalate)?

Usage (from the repository root)::

    .venv/bin/python bench/budget_why.py [--share 0.2] [--seeds 5]

Same leave-one-domain-out scoring as ``bench/budget_lodo.py`` (:func:`training.eval.budget_eval.domain_scores`:
a model trained on the other domains scores every step of the held-out domain); nothing is fitted
or chosen on the held-out domain. Per held-out domain, over ``--seeds`` arrival orders:

- **ranking**: AUC of each run's maximum score against ``needs_frontier`` (the per-run pairing
  label) and against the run's gain (strong expected success > the weak run's own outcome), and
  AUC of the step-0 score alone (what is known when the run arrives).
- **budgeted** (as shipped: escalate at the first step whose running max passes the budget's
  threshold) and its mean escalation step.
- **same runs at step 0**: the runs the budgeted policy escalated, escalated at their first step
  instead: the gap to *budgeted* is what escalating mid-run costs under the outcome model
  (escalate-anytime weighs the strong side by how early it took over).
- **arrival-only budget**: the budget applied to the step-0 score alone (a run escalates at arrival
  or never): a design alternative that fixes the timing and gives up the later evidence.
- **random mixing** at the same share (escalated at step 0), and **per-step-threshold** with a
  hindsight threshold, as in ``bench/budget_lodo.py``.
Success means per run; paired differences to random mixing with their task-bootstrap SE.
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
    from rich.table import Table
    from sklearn.metrics import roc_auc_score

    from features.runlog import read_runlog
    from features.samples import sample_path
    from router.policy.budget import BudgetQuantile, FrontierBudget
    from training.eval.budget_eval import _tiers_from, budget_run, domain_scores, evaluate_budget
    from training.eval.outcome import run_success
    from training.eval.trials import paired_diff_ci

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=0.2)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trees", type=int, default=80)
    a = ap.parse_args()
    con = Console(width=180)
    t0 = time.perf_counter()
    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    scored = domain_scores(log, n_estimators=a.trees, seed=0)
    rank = Table(title="ranking on the held-out domain (model trained on the other domains)")
    for c in ("domain", "runs", "AUC run max vs needs_frontier", "AUC run max vs gain", "AUC step-0 vs gain"):
        rank.add_column(c)
    tab = Table(title=f"success per run at budget {a.share:g} (mean over {a.seeds} arrival orders)")
    for c in (
        "domain",
        "share",
        "budgeted",
        "esc. step (mean)",
        "same runs at step 0",
        "arrival-only budget (share)",
        "random mixing",
        "per-step-thr. (hindsight)",
        "budgeted - random (SE)",
        "same@0 - random (SE)",
        "arrival-only - random (SE)",
    ):
        tab.add_column(c)
    for d in scored:
        recs = d.records
        n = len(recs)
        tasks = [r.task_id or r.run_id for r in recs]
        sl = np.array([run_success(r, _tiers_from(None, r.n_steps)) or 0.0 for r in recs])
        sf = np.array([run_success(r, _tiers_from(0, r.n_steps)) or 0.0 for r in recs])
        gain = (sf > sl).astype(int)
        need = np.array([int(bool(r.needs_frontier)) for r in recs])
        rmax = np.array([max(d.step_scores[r.run_id]) for r in recs])
        s0 = np.array([d.step_scores[r.run_id][0] for r in recs])

        def auc(y: np.ndarray, s: np.ndarray) -> str:
            return f"{roc_auc_score(y, s):.3f}" if 0 < y.sum() < len(y) else "n/a"

        rank.add_row(d.domain, str(n), auc(need, rmax), auc(gain, rmax), auc(gain, s0))
        acc: dict[str, list[float]] = {}
        for seed in range(a.seeds):
            res = evaluate_budget(d, a.share, seed=seed)
            order = np.random.default_rng(seed).permutation(n)
            bq = BudgetQuantile(FrontierBudget(share=a.share), d.prior)
            ks: list[int | None] = [None] * n
            for i in order.tolist():  # the same arrival order and budget as evaluate_budget
                ks[i] = budget_run(np.asarray(d.step_scores[recs[i].run_id]), bq, d.domain, recs[i].run_id)
            esc = np.array([k is not None for k in ks])
            budg = np.array(
                [run_success(r, _tiers_from(k, r.n_steps)) or 0.0 for r, k in zip(recs, ks, strict=True)]
            )
            same0 = np.where(esc, sf, sl)
            bq0 = BudgetQuantile(FrontierBudget(share=a.share), d.prior)
            k0 = [None] * n
            for i in order.tolist():
                k0[i] = budget_run(
                    np.asarray(d.step_scores[recs[i].run_id][:1]), bq0, d.domain, recs[i].run_id
                )
            e0 = np.array([k is not None for k in k0])
            arr = np.where(e0, sf, sl)
            s_real = float(esc.mean())
            rnd = s_real * sf + (1 - s_real) * sl
            for name, v in (
                ("share", s_real),
                ("budgeted", float(budg.mean())),
                ("step", float(np.mean([k for k in ks if k is not None])) if esc.any() else float("nan")),
                ("same0", float(same0.mean())),
                ("arr", float(arr.mean())),
                ("arr_share", float(e0.mean())),
                ("random", float(rnd.mean())),
                ("pst", res.success["per-step-threshold"].mean),
            ):
                acc.setdefault(name, []).append(v)
            for name, x in (("d_b", budg), ("d_0", same0), ("d_a", arr)):
                iv = paired_diff_ci(x, rnd, tasks, seed=seed)
                assert iv is not None
                acc.setdefault(name, []).append(iv.mean)
                acc.setdefault(name + "_se", []).append(iv.se)
        m = {k: float(np.mean(v)) for k, v in acc.items()}
        tab.add_row(
            d.domain,
            f"{m['share']:.3f}",
            f"{m['budgeted']:.3f}",
            f"{m['step']:.1f}",
            f"{m['same0']:.3f}",
            f"{m['arr']:.3f} ({m['arr_share']:.3f})",
            f"{m['random']:.3f}",
            f"{m['pst']:.3f}",
            f"{m['d_b']:+.3f} ({m['d_b_se']:.3f})",
            f"{m['d_0']:+.3f} ({m['d_0_se']:.3f})",
            f"{m['d_a']:+.3f} ({m['d_a_se']:.3f})",
        )
    con.print(rank)
    con.print(tab)
    con.print(f"total {time.perf_counter() - t0:.1f}s (2-core machine shared with other work)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
