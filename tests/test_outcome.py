"""The outcome model's arithmetic on hand-made runs, and the frontier-relative figures (cost @ 95%, AIQ)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from training.eval.curves import aiq, cost_at_quality, hull_curve
from training.eval.outcome import (
    FRONTIER,
    LOCAL,
    REJECTED,
    Prices,
    RunRecord,
    parse_variant,
    policy_outcomes,
    records_from_frames,
    run_costs,
    run_success,
)

# round prices so the expected costs are easy to write by hand (USD per 1M tokens)
P = Prices(
    frontier_in_per_m=10.0,
    frontier_cached_in_per_m=1.0,
    frontier_out_per_m=100.0,
    gpu_hour_usd=3.6,
    local_prefill_tokens_per_s=1000.0,  # -> local input $1 per 1M tokens
    local_decode_tokens_per_s=100.0,  # -> local output $10 per 1M tokens
)


def rec(**kw):
    # 3 steps: prompts 1000, 1200, 1500; outputs 100, 50, 20; step j repeats step j-1's prompt+output
    base = dict(prompt=[1000, 1200, 1500], completion=[100, 50, 20])
    base.update(kw)
    return RunRecord.make("r", base.pop("prompt"), base.pop("completion"), **base)


def test_local_prices_derive_from_gpu_hour():
    assert P.local_in_per_m == pytest.approx(1.0)
    assert P.local_out_per_m == pytest.approx(10.0)
    t = Prices().table()
    assert t["local_in_per_m"] < t["frontier_cached_in_per_m"] < t["frontier_in_per_m"]


def test_reuse_defaults_to_previous_prompt_plus_output_capped():
    r = rec()
    assert r.reuse.tolist() == [0, 1100, 1250]
    r2 = RunRecord.make("x", [100, 50], [500, 1])  # reuse capped at the prompt
    assert r2.reuse.tolist() == [0, 50]


def test_all_local_cost_pays_only_uncached_prompt_and_output():
    r = rec()
    total, local, frontier = run_costs(r, np.array([LOCAL] * 3), P)
    # uncached: 1000 + (1200-1100) + (1500-1250) = 1350 in; 170 out
    assert local == pytest.approx((1350 * 1 + 170 * 10) / 1e6)
    assert frontier == 0 and total == local


def test_escalation_at_k_pays_local_then_full_frontier_prefill_then_cached_frontier():
    r = rec()
    total, local, frontier = run_costs(r, np.array([LOCAL, FRONTIER, FRONTIER]), P)
    assert local == pytest.approx((1000 * 1 + 100 * 10) / 1e6)
    # step 1: whole context 1200 uncached on the frontier; step 2: 1250 cached + 250 new
    exp_f = (1200 * 10 + 50 * 100 + 250 * 10 + 1250 * 1 + 20 * 100) / 1e6
    assert frontier == pytest.approx(exp_f)
    assert total == pytest.approx(local + exp_f)


def test_rejected_steps_cost_nothing_and_fail_the_run():
    r = rec(weak_success=True, strong_success=True)
    total, _, _ = run_costs(r, np.array([LOCAL, REJECTED, REJECTED]), P)
    assert total == pytest.approx((1000 + 100 * 10) / 1e6)
    assert run_success(r, np.array([LOCAL, REJECTED, REJECTED])) == 0.0


def test_tier_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 steps"):
        run_costs(rec(), np.array([LOCAL]), P)


@pytest.mark.parametrize(
    "tiers, weak, strong, variant, expected",
    [
        ([LOCAL] * 3, False, True, "escalate-anytime", 0.0),  # kept local: weak outcome
        ([LOCAL] * 3, True, False, "escalate-anytime", 1.0),
        ([LOCAL, FRONTIER, FRONTIER], False, True, "escalate-anytime", 1.0),  # rescued
        ([LOCAL, FRONTIER, FRONTIER], True, False, "escalate-anytime", 0.0),  # escalation hurt
        ([LOCAL, FRONTIER, LOCAL], False, True, "escalate-anytime", 1.0),
        ([LOCAL, FRONTIER, LOCAL], False, True, "must-stay", 0.0),  # handed back: weak outcome
        ([FRONTIER] * 3, False, True, "must-stay", 1.0),
        ([LOCAL, LOCAL, FRONTIER], False, True, {"kind": "decay", "half_life_steps": 2}, 0.5),
        ([FRONTIER] * 3, False, True, {"kind": "decay", "half_life_steps": 2}, 1.0),
    ],
)
def test_success_by_variant(tiers, weak, strong, variant, expected):
    r = rec(weak_success=weak, strong_success=strong)
    assert run_success(r, np.array(tiers), variant) == pytest.approx(expected)


def test_before_first_error_variant():
    r = rec(weak_success=False, strong_success=True, first_error_step=1)
    assert run_success(r, np.array([LOCAL, FRONTIER, FRONTIER]), "before-first-error") == 1.0
    assert run_success(r, np.array([LOCAL, LOCAL, FRONTIER]), "before-first-error") == 0.0
    r2 = rec(weak_success=False, strong_success=True)  # no error: escalation always in time
    assert run_success(r2, np.array([LOCAL, LOCAL, FRONTIER]), "before-first-error") == 1.0


def test_unknown_outcomes_are_left_out_of_quality():
    r = rec(weak_success=True, strong_success=None)
    assert run_success(r, np.array([LOCAL] * 3)) is None


def test_bad_variant_is_refused():
    with pytest.raises(ValueError):
        parse_variant("coin-flip")


def _three_runs():
    return {
        "a": RunRecord.make(
            "a", [100, 200], [10, 10], weak_success=False, strong_success=True, needs_frontier=True
        ),
        "b": RunRecord.make(
            "b", [100, 200], [10, 10], weak_success=True, strong_success=True, needs_frontier=False
        ),
        "c": RunRecord.make("c", [100], [10], weak_success=False, strong_success=False, needs_frontier=False),
    }


def test_policy_outcomes_counts_recall_precision_and_switches():
    recs = _three_runs()
    tiers = {
        "a": np.array([LOCAL, FRONTIER]),  # true positive, escalated at 1
        "b": np.array([FRONTIER, LOCAL]),  # false positive, one tier switch
        "c": np.array([LOCAL]),
    }
    o = policy_outcomes(recs, tiers, P, ["escalate-anytime", "must-stay"])
    assert o["runs"] == 3 and o["quality_runs"] == 3
    assert o["success_rate"] == pytest.approx(2 / 3)  # a rescued, b stays ok (strong ok), c fails
    assert o["success_by_variant"]["must-stay"] == pytest.approx(2 / 3)  # b goes back local, weak ok
    # task-bootstrap SE (each run its own task here): close to the binomial one of 3 independent runs
    assert o["success_se"] == pytest.approx(math.sqrt((2 / 3) * (1 / 3) / 3), rel=0.1)
    assert o["success_ci_low"] <= o["success_rate"] <= o["success_ci_high"] and o["success_tasks"] == 3
    assert o["escalation_rate"] == pytest.approx(2 / 3)
    assert o["needs_frontier_recall"] == 1.0
    assert o["needs_frontier_precision"] == 0.5
    assert o["tier_switches_per_run"] == pytest.approx(2 / 3)
    assert o["frontier_step_share"] == pytest.approx(2 / 5)
    exp = sum(run_costs(recs[k], tiers[k], P)[0] for k in recs)
    assert o["cost_usd"] == pytest.approx(exp)


def test_policy_outcomes_needs_tiers_for_every_run():
    with pytest.raises(ValueError, match="no tiers"):
        policy_outcomes(_three_runs(), {"a": np.array([LOCAL, LOCAL])}, P)


def test_oracle_like_routing_beats_both_ends():
    recs = _three_runs()
    local = {k: np.full(r.n_steps, LOCAL) for k, r in recs.items()}
    front = {k: np.full(r.n_steps, FRONTIER) for k, r in recs.items()}
    oracle = dict(local, a=np.array([FRONTIER, FRONTIER]))
    ol, of, oo = (policy_outcomes(recs, t, P) for t in (local, front, oracle))
    assert ol["success_rate"] == pytest.approx(1 / 3)
    assert of["success_rate"] == oo["success_rate"] == pytest.approx(2 / 3)
    assert ol["cost_usd"] < oo["cost_usd"] < of["cost_usd"]


def test_cost_at_quality_picks_the_cheapest_point_reaching_the_target():
    pts = [(1.0, 0.5), (2.0, 0.9), (3.0, 0.95), (5.0, 1.0)]
    assert cost_at_quality(pts, 0.9) == 2.0
    assert cost_at_quality(pts, 0.99) == 5.0
    assert cost_at_quality(pts, 1.01) is None
    assert cost_at_quality(pts, None) is None


def test_aiq_endpoints_and_random_mixing_line():
    c_l, q_l, c_f, q_f = 1.0, 0.4, 11.0, 0.8
    # always-local alone: flat at its quality
    assert aiq([(c_l, q_l)], (c_l, q_l), c_l, c_f) == pytest.approx(q_l, abs=1e-6)
    # always-frontier: the mixing line from local to frontier -> mean of the two
    assert aiq([(c_f, q_f)], (c_l, q_l), c_l, c_f) == pytest.approx((q_l + q_f) / 2, abs=1e-3)
    # a point reaching frontier quality at 20% of the extra cost: 0.1*(0.4+0.8)... by hand
    a = aiq([(3.0, 0.8)], (c_l, q_l), c_l, c_f)
    assert a == pytest.approx(0.2 * (0.4 + 0.8) / 2 + 0.8 * 0.8, abs=1e-3)
    # adding a dominated point never lowers AIQ; the hull is non-decreasing
    assert aiq([(3.0, 0.8), (8.0, 0.5)], (c_l, q_l), c_l, c_f) == pytest.approx(a, abs=1e-9)
    x, r = hull_curve([(3.0, 0.8), (8.0, 0.5)], (c_l, q_l), c_l, c_f)
    assert np.all(np.diff(r) >= -1e-12) and x[0] == 0 and x[-1] == 1


def test_aiq_undefined_without_a_cost_range():
    assert aiq([(1.0, 0.5)], (1.0, 0.4), 1.0, 1.0) is None


def test_records_from_frames_reads_outcomes_reuse_and_first_error():
    runs = pd.DataFrame(
        {
            "record": ["run", "run"],
            "run_id": ["x", "y"],
            "outcome": ["failure", "success"],
            "strong_outcome": ["success", None],
            "needs_frontier": [True, None],
        }
    )
    steps = pd.DataFrame(
        {
            "record": ["step"] * 3,
            "run_id": ["x", "x", "y"],
            "step": [1, 0, 0],
            "prompt_tokens": [300, 100, 50],
            "completion_tokens": [5, 10, 5],
            "prefix_reuse_tokens": [90, 0, 0],
            "tool_result_errors": [[False, True], [], []],
        }
    )
    recs = records_from_frames(runs, steps)
    x, y = recs["x"], recs["y"]
    assert x.prompt.tolist() == [100, 300] and x.reuse.tolist() == [0, 90]  # sorted by step
    assert x.weak_success is False and x.strong_success is True and x.needs_frontier is True
    assert x.first_error_step == 1
    assert y.quality_known is False and y.needs_frontier is None and y.first_error_step is None
