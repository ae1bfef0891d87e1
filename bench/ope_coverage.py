"""OPE interval coverage in worlds resampled from the real tau2 trajectories (no simulator).

Usage (from the repository root)::

    .venv/bin/python bench/ope_coverage.py [--runs 400] [--worlds 2] [--boot 400] [--seed 0]

:func:`training.eval.ope_coverage.coverage_study`: per shipped domain, ``--worlds`` worlds of
``--runs`` real weak runs drawn with replacement, logged by a known exploring policy, outcomes drawn
from the one outcome model; five deterministic candidates per world with their exact truth. Prints
every (candidate, world) pair (truth, IPS / SNIPS / DR net value with 95% intervals, ESS, covered),
then the DR coverage over the distinct, non-refused pairs and the count of estimates outside the
feasible range. ``tests/test_ope_coverage.py`` asserts the same study at its defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.ope_coverage import coverage_study
    from training.eval.outcome import records_from_frames

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--worlds", type=int, default=2)
    ap.add_argument("--boot", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    pairs = coverage_study(
        records_from_frames(log.runs, log.steps),
        runs=a.runs,
        worlds_per_domain=a.worlds,
        n_boot=a.boot,
        seed=a.seed,
    )
    tab = Table(title="OPE in worlds of real tau2 trajectories: net value per run (success - USD)")
    for c in (
        "world",
        "candidate",
        "truth",
        "IPS [95% CI]",
        "SNIPS [95% CI]",
        "DR [95% CI]",
        "ESS",
        "DR covers",
    ):
        tab.add_column(c)
    bounds = {"success": (0.0, 1.0), "cost": (0.0, float("inf")), "net": (float("-inf"), 1.0)}
    outside = 0
    for p in pairs:
        cells = []
        for e in ("ips", "snips", "dr"):
            x = p.estimates[e]["net"]
            cells.append(f"{x.value:.4f} [{x.lo:.4f}, {x.hi:.4f}]")
        for ms in p.estimates.values():
            for m, x in ms.items():
                lo, hi = bounds[m]
                outside += any(v is not None and not lo <= v <= hi for v in (x.value, x.lo, x.hi))
        note = " (refused)" if p.refused else (f" (= {p.extra['same_as']})" if p.extra["same_as"] else "")
        tab.add_row(
            p.world, p.candidate + note, f"{p.truth['net']:.4f}", *cells, f"{p.ess:.0f}", str(p.covered())
        )
    con = Console(width=200)
    con.print(tab)
    distinct = [p for p in pairs if not p.refused and p.extra["same_as"] is None]
    hit = sum(p.covered() for p in distinct)
    con.print(
        f"DR 95% interval holds the truth for {hit} of {len(distinct)} distinct (candidate, world) pairs "
        f"({hit / max(len(distinct), 1):.0%}; target >= 90% over >= 20); {sum(p.refused for p in pairs)} refused "
        f"(ESS < 10); estimates outside the feasible range: {outside}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
