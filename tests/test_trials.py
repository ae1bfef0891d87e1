"""The one outcome model (training.eval.trials): per-trial expectations, ties explicit, task-bootstrap
intervals, and every evaluation (bench, loop) scoring a policy the same."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from features.runlog import read_runlog
from features.samples import sample_path
from training.eval.outcome import FRONTIER, LOCAL, Prices, RunRecord, policy_outcomes, records_from_frames
from training.eval.trials import bootstrap_mean_ci, paired_diff_ci, strong_expectation, task_success


def _runs(rows: list[tuple[str, str, str, str, str | None]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run_id": r, "task_id": t, "agent": None, "model": m, "outcome": o, "strong_model": s}
            for r, t, m, o, s in rows
        ]
    )


def test_tie_counts_half_and_single_trial_is_its_own_outcome():
    runs = _runs(
        [
            ("s1", "a/1", "big", "success", None),
            ("s2", "a/1", "big", "failure", None),  # 1-1: a tie, never a failure by majority
            ("s3", "a/2", "big", "success", None),  # a single trial
            ("w1", "a/1", "small", "failure", "big"),
            ("w2", "a/2", "small", "failure", "big"),
            ("w3", "a/3", "small", "failure", "big"),  # the strong player never ran a/3
        ]
    )
    t = task_success(runs, "big")
    assert t.loc["a/1", "p"] == 0.5 and t.loc["a/1", "trials"] == 2
    assert t.loc["a/2", "p"] == 1.0 and t.loc["a/2", "trials"] == 1
    e = strong_expectation(runs)
    assert e == {"w1": (0.5, 2), "w2": (1.0, 1)}


def test_bootstrap_groups_by_task_and_pairs_differences():
    rng = np.random.default_rng(0)
    tasks = np.repeat(np.arange(40), 10)
    task_effect = rng.random(40)[tasks]
    a = (rng.random(400) < task_effect).astype(float)
    ci = bootstrap_mean_ci(a, tasks)
    assert ci is not None and ci.low < a.mean() < ci.high and ci.n_tasks == 40
    # ten correlated runs per task: the task bootstrap is wider than the binomial interval of 400 runs
    assert ci.se > np.sqrt(a.mean() * (1 - a.mean()) / 400) * 1.3
    b = a + 0.05
    d = paired_diff_ci(b, a, tasks)
    assert d is not None and d.mean == pytest.approx(0.05) and d.high - d.low < 1e-9
    assert bootstrap_mean_ci([], []) is None


@pytest.fixture(scope="module")
def paired() -> tuple[dict[str, RunRecord], pd.DataFrame]:
    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    return records_from_frames(log.runs, log.steps), log.runs


def test_always_frontier_is_the_strong_players_per_run_success(paired):
    records, runs = paired
    domain = runs["task_id"].astype(str).str.split("/", n=1).str[0]
    checked = 0
    for dom in sorted(domain.unique()):
        ids = set(runs.loc[domain == dom, "run_id"].astype(str))
        q = {k: r for k, r in records.items() if k in ids and r.quality_known}
        if not q:
            continue
        strong = {runs.loc[runs["run_id"] == k, "strong_model"].iloc[0] for k in q}
        assert len(strong) == 1
        per_run = task_success(runs[domain == dom], strong.pop())
        truth = float((per_run["p"] * per_run["trials"]).sum() / per_run["trials"].sum())
        out = policy_outcomes(q, {k: np.full(r.n_steps, FRONTIER) for k, r in q.items()}, Prices())
        assert out["success_ci_low"] <= truth <= out["success_ci_high"], (dom, truth, out["success_rate"])
        loc = policy_outcomes(q, {k: np.full(r.n_steps, LOCAL) for k, r in q.items()}, Prices())
        weak = np.mean([1.0 if r.weak_success else 0.0 for r in q.values()])
        assert loc["success_rate"] == pytest.approx(weak)
        checked += 1
    assert checked == 3


def test_bench_and_loop_score_every_policy_the_same():
    """The bench (compare_policies on the logged runs) and the loop's world (each task served once)
    read one outcome model: every policy's loop success lies in the bench's task-bootstrap interval."""
    from router.policy.config import build_policy
    from training.eval.compare import compare_policies
    from training.eval.config import SimSettings
    from training.eval.loop_world import World, sim_config

    log = read_runlog(sample_path("tau2bench_airline.parquet"))
    weak, strong = "gpt-oss-120b", "claude-sonnet-4-5"
    keep = log.runs["model"].isin([weak, strong])
    runs = log.runs[keep]
    steps = log.steps[log.steps["run_id"].isin(set(runs["run_id"]))]
    pols = {
        "always-local": {"kind": "always-local"},
        "always-frontier": {"kind": "always-frontier"},
        "stall-escalation": {"kind": "stall-escalation"},
        "oracle": {"kind": "oracle"},
    }
    res = compare_policies(runs, steps, bundle=None, prices=Prices(), sim=SimSettings(), policies=pols)
    bench = {r.policy: r for r in res.policies}
    world = World.from_log(log, weak, strong)
    ids = sorted(world.tasks)
    r2, s2, starts = world.arrivals(ids, None, rate=0.05, seed=0, prefix="t")
    cfg = sim_config(seed=0)
    for label, pcfg in pols.items():
        served = world.serve(r2, s2, starts, build_policy(pcfg), None, cfg)
        loop_success = float(served.success_p.mean())
        row = bench[label]
        assert row.success_ci_low <= loop_success <= row.success_ci_high, (label, loop_success, row)
    assert bench["always-frontier"].success_rate > bench["always-local"].success_rate
