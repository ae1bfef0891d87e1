"""Off-policy evaluation check and throughput: estimates against the simulated truth.

What it does (``python bench/bench_ope.py [--runs 2000] [--repeats 1]``):

1. A simulated deployment of the shipped tau2 airline pairs (:class:`training.eval.loop_world.World`)
   logs ``--runs`` runs served by an exploring logging policy: the learned policy on a public-data
   bundle that never saw these tasks (:func:`training.eval.loop.prior_bundle`) wrapped in
   :class:`router.policy.explore.ExplorePolicy` (``--explore-rate``); outcomes are drawn from the
   tasks' recorded outcomes (the demo's outcome model).
2. Candidates (deterministic): always-local, always-frontier, oracle, the logging policy's own base
   (learned), and the learned policy without de-escalation at the 20% and 50% quantiles of the
   logged runs' maximum P(frontier). Each one's
   *truth* is its expected net value per run (value of success x success - cost), success and cost
   on the same arrivals, served by the simulator.
3. :func:`training.eval.ope_eval.evaluate_policies` estimates each from the logs (IPS, SNIPS, DR,
   95% bootstrap intervals, clipped to the feasible range; a candidate below the minimum ESS is
   refused and listed apart); the bench prints, per candidate, truth, estimates, whether the truth
   lies inside each interval and the DR half-width, then the count of candidates whose DR interval
   holds the truth (and the share of all (candidate, world) pairs: each draw is one world built from
   the real tau2 trajectories), the estimates outside the feasible range, and the OPE throughput (runs evaluated per second: logged runs x policies
   replayed / wall seconds of the evaluation, the DR model fit included). ``--repeats`` redraws
   the logs (new arrivals and outcomes) to count coverage over more draws. A PNG of estimates vs
   truth goes to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000, help="logged runs")
    ap.add_argument("--repeats", type=int, default=1, help="independent log draws")
    ap.add_argument("--explore-rate", type=float, default=0.3)
    ap.add_argument("--boot", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runroute-report/bench-ope"))
    a = ap.parse_args()

    import numpy as np
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from features.runlog import RunLog, read_runlog, records_to_frame
    from features.samples import samples_dir
    from router.policy import build_policy
    from training.eval.loop import prior_bundle
    from training.eval.loop_world import World, sim_backends, sim_config
    from training.eval.ope_eval import evaluate_policies

    con = Console(width=None if Console().is_terminal else 160)
    a.out.mkdir(parents=True, exist_ok=True)
    world = World.from_log(
        read_runlog(samples_dir() / "tau2bench_airline.parquet"), "gpt-oss-120b", "claude-sonnet-4-5"
    )
    bundle, _ = prior_bundle(a.out, 600, a.seed, lambda m: con.print(f"[dim]{m}[/dim]"))
    base = {"kind": "learned", "name": "learned"}
    fixed = {
        "always-local": {"kind": "always-local"},
        "always-frontier": {"kind": "always-frontier"},
        "oracle": {"kind": "oracle"},
        "learned": base,
    }
    scfg = sim_config(seed=a.seed)
    v = world.value_of_success
    rows, points, rates = [], [], []
    hits_total = n_total = 0
    refused: list[tuple[int, str, str]] = []
    outside = clipped = 0
    for rep_i in range(a.repeats):
        seed = a.seed * 100 + rep_i
        runs, steps, starts = world.arrivals(
            list(world.tasks), a.runs, rate=0.05, seed=seed, prefix=f"b{rep_i}"
        )
        explore = {
            "rate": a.explore_rate,
            "start_frontier_share": 0.5,
            "escalate_hazard": 0.2,
            "max_step": 30,
            "seed": seed,
        }
        t = time.perf_counter()
        served = world.serve(
            runs, steps, starts, build_policy({**base, "explore": explore}, bundle), bundle, scfg
        )
        frame = pd.concat(
            [records_to_frame(served.records), records_to_frame(world.run_records(served, seed))],
            ignore_index=True,
        )
        con.print(
            f"draw {rep_i}: logged {a.runs} runs ({int(served.explored.sum())} exploring) in {time.perf_counter() - t:.0f} s"
        )
        # two more learned candidates, never de-escalating, at quantiles of the logged runs' maximum
        # P(frontier) (so they differ from the logging policy and from each other)
        recs = served.records
        mx = pd.Series([r.predictions["p_frontier"] for r in recs]).groupby([r.run_id for r in recs]).max()
        cands = dict(fixed)
        for q in (0.2, 0.5):
            name = f"learned@q{int(q * 100)}"
            th = round(float(mx.quantile(q)), 4)
            cands[name] = {"kind": "learned", "name": name, "p_frontier_up": th, "p_frontier_down": 0.0}
        truth = {}
        for k, c in cands.items():
            s = world.serve(runs, steps, starts, build_policy(c, bundle), bundle, scfg)
            truth[k] = {
                "net": float(s.net(v).mean()),
                "success": float(s.success_p.mean()),
                "cost": float(s.cost.mean()),
            }
        pols = {k: (build_policy(c, bundle), bundle) for k, c in cands.items()}
        t = time.perf_counter()
        rep = evaluate_policies(
            RunLog.from_frame(frame),
            pols,
            value_of_success=v,
            backends=sim_backends(scfg),
            n_boot=a.boot,
            seed=seed,
            skip_unsupported=True,  # a candidate below the minimum ESS is refused, counted apart
        )
        wall = time.perf_counter() - t
        for k, why in rep.refused.items():
            refused.append((rep_i, k, why))
        n_pol = len(rep.candidates) + len([r for r in rep.references if r not in rep.candidates])
        rates.append(rep.n_runs * n_pol / wall)
        for k, r in rep.candidates.items():
            tr = truth[k]["net"]
            cov = {e: r.estimates[e]["net"].covers(tr) for e in ("ips", "snips", "dr")}
            dr = r.estimates["dr"]["net"]
            hits_total += cov["dr"]
            n_total += 1
            clipped += int(r.diagnostics.get("clipped", 0))
            for e in ("ips", "snips", "dr"):
                for m, (lo_b, hi_b) in (("success", (0.0, 1.0)), ("net", (-np.inf, v))):
                    x = r.estimates[e][m]
                    outside += any(y is not None and not lo_b <= y <= hi_b for y in (x.value, x.lo, x.hi))
            rows.append(
                (
                    rep_i,
                    k,
                    tr,
                    r.estimates["ips"]["net"],
                    r.estimates["snips"]["net"],
                    dr,
                    cov,
                    r.diagnostics["ess"],
                )
            )
            points.append((k, tr, dr))
    tab = Table(
        title=f"OPE vs simulated truth: net value per run (USD), {a.runs} logged runs, explore rate {a.explore_rate:g}"
    )
    for c in (
        "draw",
        "candidate",
        "truth",
        "IPS [95% CI]",
        "SNIPS [95% CI]",
        "DR [95% CI]",
        "DR half-width",
        "ESS",
        "truth in CI (IPS/SNIPS/DR)",
    ):
        tab.add_column(c)

    def cell(e: object) -> str:
        return f"{e.value:.4f} [{e.lo:.4f}, {e.hi:.4f}]"  # type: ignore[attr-defined]

    for rep_i, k, tr, ips, sn, dr, cov, ess in rows:
        tab.add_row(
            str(rep_i),
            k,
            f"{tr:.4f}",
            cell(ips),
            cell(sn),
            cell(dr),
            f"{dr.half_width:.4f}",
            f"{ess:.0f}",
            "/".join("yes" if cov[e] else "NO" for e in ("ips", "snips", "dr")),
        )
    con.print(tab)
    hw = [r[5].half_width for r in rows]
    con.print(
        f"DR interval holds the truth for {hits_total} of {n_total} (candidate, world) pairs "
        f"({hits_total / max(n_total, 1):.0%}; target >= 90% over >= 20 pairs); "
        f"{len(refused)} pair(s) refused below the minimum ESS"
    )
    for rep_i, k, why in refused:
        con.print(f"  refused: draw {rep_i} {k}: {why}")
    con.print(
        f"estimates outside the feasible range (success in [0, 1], net <= {v:g}): {outside}; "
        f"points clipped into it: {clipped}"
    )
    con.print(
        f"DR 95% CI half-width at {a.runs} logged runs: median {np.median(hw):.4f}, range {min(hw):.4f}-{max(hw):.4f} USD per run"
    )
    con.print(
        f"OPE throughput: {np.mean(rates):.0f} runs evaluated per second (logged runs x policies / wall, DR model fit included)"
    )
    _plot(points, a.out / "ope_check.png", a.runs)
    con.print(f"wrote {a.out / 'ope_check.png'}")
    return 0


def _plot(points: list, path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for k in dict.fromkeys(p[0] for p in points):
        sel = [p for p in points if p[0] == k]
        ax.errorbar(
            [p[1] for p in sel], [p[2].value for p in sel],
            yerr=[[p[2].value - p[2].lo for p in sel], [p[2].hi - p[2].value for p in sel]], fmt="o", capsize=4, label=k,
        )  # fmt: skip
    lo = min(min(p[1] for p in points), min(p[2].lo for p in points))
    hi = max(max(p[1] for p in points), max(p[2].hi for p in points))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel("simulated truth: net value per run (USD)")
    ax.set_ylabel("DR estimate from the logs, 95% CI")
    ax.set_title(f"off-policy evaluation check ({n} logged runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
