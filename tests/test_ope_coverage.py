"""OPE coverage in worlds built from the real tau2 trajectories (training.eval.ope_coverage): the DR
95% interval holds the exact truth for >= 90% of >= 20 distinct (candidate, world) pairs, and no
estimate of any estimator leaves the feasible range."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval.outcome import Prices, run_costs


@pytest.fixture(scope="module")
def records():
    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.outcome import records_from_frames

    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    return records_from_frames(log.runs, log.steps)


def test_step_costs_sum_to_the_run_cost(records):
    from training.eval.ope_coverage import _tiers, step_costs

    for rec in list(records.values())[:50]:
        for k in (None, 0, rec.n_steps // 2):
            t = _tiers(k, rec.n_steps)
            assert step_costs(rec, t, Prices()).sum() == pytest.approx(
                run_costs(rec, t, Prices())[0], rel=1e-9
            )


def test_dr_intervals_cover_the_truth_in_worlds_of_real_trajectories(records):
    from training.eval.ope_coverage import coverage_study

    pairs = coverage_study(records, runs=400, worlds_per_domain=2, n_boot=400, seed=0)
    assert {p.world.split("#")[0] for p in pairs} == {"airline", "retail", "telecom"}
    distinct = [p for p in pairs if not p.refused and p.extra["same_as"] is None]
    assert len(distinct) >= 20, len(distinct)
    covered = sum(p.covered("dr", "net") for p in distinct)
    assert covered / len(distinct) >= 0.9, [
        (p.world, p.candidate, p.truth["net"], p.estimates["dr"]["net"]) for p in distinct if not p.covered()
    ]
    bounds = {"success": (0.0, 1.0), "cost": (0.0, np.inf), "net": (-np.inf, 1.0)}
    for p in pairs:
        for est, metrics in p.estimates.items():
            for m, x in metrics.items():
                lo, hi = bounds[m]
                for v in (x.value, x.lo, x.hi):
                    assert v is None or lo <= v <= hi, (p.world, p.candidate, est, m, v)
    # the study is not trivial: candidates differ in what they escalate, and the truth moves with them
    assert len({round(p.truth["net"], 4) for p in distinct}) >= 15
