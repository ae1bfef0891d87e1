"""OPE stays inside the truth: estimates and intervals clipped to the feasible range, low-ESS
candidates refused (training.eval.ope / ope_eval)."""

from __future__ import annotations

import numpy as np

from training.eval.ope import StepTable, estimate


def _heavy(n: int, seed: int) -> StepTable:
    """One-step runs logged at a 5% frontier propensity; the candidate always escalates, so the few
    logged frontier runs carry weight 20 and IPS of success lands far above 1."""
    rng = np.random.default_rng(seed)
    a = (rng.random(n) < 0.05).astype(np.int8)
    a[0] = 1
    mu = np.where(a == 1, 0.05, 0.95)
    pi = a.astype(float)  # the candidate takes the frontier with probability 1
    return StepTable(
        ptr=np.arange(n + 1, dtype=np.int64),
        a=a,
        mu=mu,
        pi=pi,
        pf=np.ones(n),
        rewards={"success": np.where(a == 1, 1.0, 0.0), "cost": np.full(n, 0.01)},
    )


def test_no_estimate_outside_the_feasible_range():
    outside_unclipped = 0
    for seed in range(20):
        t = _heavy(60, seed)
        combos = {"net": {"success": 1.0, "cost": -1.0}}
        raw, _, _ = estimate(t, ("success", "cost"), combos, n_boot=100, seed=seed)
        outside_unclipped += any(raw[e]["success"].value > 1.0 for e in ("ips", "dr"))
        bounds = {"success": (0.0, 1.0), "cost": (0.0, np.inf), "net": (-np.inf, 1.0)}
        est, reps, diag = estimate(t, ("success", "cost"), combos, n_boot=100, seed=seed, bounds=bounds)
        for e, ms in est.items():
            for m, x in ms.items():
                lo_b, hi_b = bounds[m]
                for v in (x.value, x.lo, x.hi):
                    assert v is None or lo_b <= v <= hi_b, (seed, e, m, v)
                r = reps[f"{e}:{m}"]
                assert np.all((r[np.isfinite(r)] >= lo_b) & (r[np.isfinite(r)] <= hi_b))
        assert diag["clipped"] >= 1 or not any(raw[e]["success"].value > 1.0 for e in ("ips", "dr"))
    assert outside_unclipped >= 10  # the unclipped estimators do leave the range on these logs


def test_low_ess_candidates_are_refused_and_estimates_stay_feasible():
    """Logs of the tau2 airline world explored at 30%: always-frontier matches few logged runs
    (a low ESS); with the bar above its ESS it is refused with the figure, below it every estimate
    lies in the feasible range."""
    import pandas as pd
    import pytest

    from features.runlog import RunLog, read_runlog, records_to_frame
    from features.samples import sample_path
    from models.predictor import ConstantPredictor
    from router.policy.config import build_policy
    from training.eval.loop_world import World, sim_config
    from training.eval.ope_eval import OPEError, evaluate_policies

    world = World.from_log(
        read_runlog(sample_path("tau2bench_airline.parquet")), "gpt-oss-120b", "claude-sonnet-4-5"
    )
    runs, steps, starts = world.arrivals(list(world.tasks), 80, rate=0.05, seed=3, prefix="t")
    cfg = {"kind": "always-local", "explore": {"rate": 0.3}}
    served = world.serve(runs, steps, starts, build_policy(cfg), ConstantPredictor(), sim_config(seed=3))
    frame = pd.concat(
        [records_to_frame(served.records), records_to_frame(world.run_records(served, 3))], ignore_index=True
    )
    log = RunLog.from_frame(frame)
    cand = {"always-frontier": (build_policy({"kind": "always-frontier"}), ConstantPredictor())}
    rep = evaluate_policies(log, cand, n_boot=100, min_ess=0, references=False)
    res = rep.candidates["always-frontier"]
    ess = res.diagnostics["ess"]
    assert 0 < ess < 80
    for e, ms in res.estimates.items():
        for m in ("success", "escalated"):
            for v in (ms[m].value, ms[m].lo, ms[m].hi):
                assert v is None or 0.0 <= v <= 1.0, (e, m, v)
        for v in (ms["net"].value, ms["net"].hi):
            assert v is None or v <= rep.value_of_success, (e, v)
    with pytest.raises(OPEError, match=r"effective sample size [0-9.]+ of 80 runs is below"):
        evaluate_policies(log, cand, n_boot=100, min_ess=ess + 1, references=False)
