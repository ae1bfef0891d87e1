"""OPE of a budgeted (stateful) policy on logs the simulator wrote under that budget: the replay
rebuilds the budget's windows in the logs' arrival order, so the logging policy reproduces every
decision of its non-exploring runs, its effective sample size is close to the number of runs its
exploration left matched, its estimate covers its own on-policy mean, and a budgeted candidate's
replayed decisions are reproducible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from features.extract import FEATURE_NAMES
from features.runlog import RunLog, read_runlog, records_to_frame
from models.predictor import FeaturePredictor
from router.policy import build_policy
from router.policy.types import Predictions
from training.eval.loop_world import Served, World, sim_backends, sim_config
from training.eval.ope_eval import evaluate_policies
from training.eval.ope_replay import load_logged, replay_candidate
from training.eval.outcome import Prices

ROOT = Path(__file__).resolve().parents[1]
CTX = FEATURE_NAMES.index("ctx_tokens")
BUDGET = {"share": 0.2, "min_window": 5, "window": 40}
LEARNED = {"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.0, "frontier_budget": BUDGET}


class ContextScore(FeaturePredictor):
    """P(needs frontier) varying with the run's context (so the budget's rank order matters)."""

    version = "ctx-score"

    def __init__(self, scale: float):
        self.scale = scale

    def predict_features(self, x: np.ndarray) -> Predictions:
        return Predictions(p_frontier=float((x[CTX] * self.scale) % 1.0))


@pytest.fixture(scope="module")
def budget_logs() -> tuple[RunLog, Served]:
    world = World.from_log(
        read_runlog(ROOT / "data" / "tau2bench_airline.parquet"), "gpt-oss-120b", "claude-sonnet-4-5"
    )
    runs, steps, starts = world.arrivals(list(world.tasks), 120, rate=0.05, seed=3, prefix="b")
    pol = build_policy({**LEARNED, "name": "champion", "explore": {"rate": 0.2, "seed": 3}})
    served = world.serve(runs, steps, starts, pol, ContextScore(0.00137), sim_config(seed=3))
    frame = pd.concat(
        [records_to_frame(served.records), records_to_frame(world.run_records(served, 3))],
        ignore_index=True,
    )
    return RunLog.from_frame(frame), served


def test_the_budgeted_logging_policy_reproduces_its_logs(budget_logs):
    log, served = budget_logs
    lg = load_logged(log, Prices())
    champion = build_policy({**LEARNED, "name": "champion"})
    rep = replay_candidate(lg, champion, ContextScore(0.00137), sim_backends(sim_config(seed=3)))
    explored = [bool(lg.explore[s:e].any()) for s, e in zip(lg.ptr[:-1], lg.ptr[1:], strict=True)]
    agree = [bool(rep.pi[s:e].all()) for s, e in zip(lg.ptr[:-1], lg.ptr[1:], strict=True)]
    # the budget decided: the champion escalated some runs and kept most local
    assert 0 < sum(a and lg.a[s:e].any() for a, s, e in zip(agree, lg.ptr[:-1], lg.ptr[1:], strict=True))
    # every run that did not explore is reproduced step for step; only exploration deviates
    assert all(a for a, x in zip(agree, explored, strict=True) if not x)
    assert rep.unsupported_runs == 0 and 0 < rep.deviated_runs <= sum(explored)

    res = evaluate_policies(
        log,
        {"champion": (champion, ContextScore(0.00137))},
        backends=sim_backends(sim_config(seed=3)),
        n_boot=200,
        seed=0,
        references=False,
    )
    c = res.candidates["champion"]
    n = lg.n_runs
    assert c.diagnostics["ess"] >= 0.95 * (n - sum(explored))  # ~ the runs exploration left matched
    # the champion's on-policy mean in the logging process: its non-exploring runs' expected success
    truth = float(served.success_p[~served.explored].mean())
    assert c.estimates["dr"]["success"].covers(truth)


def test_a_budgeted_candidates_replay_is_reproducible(budget_logs):
    log, _ = budget_logs
    lg = load_logged(log, Prices())
    cand = {**LEARNED, "name": "cand"}
    a, b = (
        replay_candidate(lg, build_policy(cand), ContextScore(0.00291), sim_backends(sim_config(seed=3)))
        for _ in range(2)
    )
    np.testing.assert_array_equal(a.pi, b.pi)
    np.testing.assert_array_equal(a.pf, b.pf)
    assert a.reasons == b.reasons and a.deviated_runs == b.deviated_runs
    # a different ordering of the same runs: it deviates from the log, but its budget holds roughly
    esc = [a.pf[s:e].any() for s, e in zip(lg.ptr[:-1], lg.ptr[1:], strict=True)]
    assert a.deviated_runs > 0 and 0.05 <= float(np.mean(esc)) <= 0.45
