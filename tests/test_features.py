"""Feature extraction: layout, semantics, stable hashing, and train/serve parity."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from features.extract import (
    FEATURE_NAMES,
    FEATURE_SPEC_VERSION,
    N_FEATURES,
    extract,
    extract_dict,
    iter_frame_prefixes,
    iter_prefixes,
)
from features.prefix import RunPrefix, StepView
from features.runlog import read_runlog, records_to_frame, write_frame
from features.schema import Run, Step


def _steps() -> list[Step]:
    """A logged 4-step run: tool calls, a repeated call, errors, tiers, cached tokens, timings."""
    return [
        Step(
            run_id="r1",
            step=0,
            arrival_s=100.0,
            prompt_tokens=1000,
            completion_tokens=20,
            cached_tokens=0,
            tool_calls=["get_user"],
            tool_call_keys=["k1"],
            structured=True,
            tier="local",
            latency_s=0.5,
        ),
        Step(
            run_id="r1",
            step=1,
            arrival_s=103.0,
            tool_pause_s=2.5,
            prompt_tokens=1300,
            completion_tokens=30,
            cached_tokens=1000,
            tool_calls=["search", "get_user"],
            tool_call_keys=["k2", "k1"],
            tool_results_n=1,
            tool_result_errors=[False],
            tool_result_tokens=[250],
            structured=True,
            tier="local",
        ),
        Step(
            run_id="r1",
            step=2,
            arrival_s=110.0,
            tool_pause_s=6.0,
            prompt_tokens=1800,
            completion_tokens=200,
            cached_tokens=None,
            tool_results_n=2,
            tool_result_errors=[True, True],
            tool_result_tokens=[100, 300],
            structured=False,
            tier="frontier",
        ),
        Step(
            run_id="r1",
            step=3,
            arrival_s=120.0,
            tool_pause_s=1.0,
            prompt_tokens=2100,
            completion_tokens=10,
            tool_results_n=1,
            tool_result_errors=[True],
            tool_result_tokens=[40],
            tier="frontier",
        ),
    ]


def _router_prefix(k: int) -> RunPrefix:
    """The prefix for step k built by hand, the way the router builds it from its own run state."""
    logged = _steps()
    views = [
        StepView(
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.completion_tokens,
            cached_tokens=s.cached_tokens,
            tool_calls=tuple(s.tool_calls),
            tool_call_keys=tuple(s.tool_call_keys),
            tool_results_n=s.tool_results_n,
            tool_result_errors=tuple(s.tool_result_errors),
            tool_result_tokens=tuple(s.tool_result_tokens),
            tool_pause_s=s.tool_pause_s,
            arrival_s=s.arrival_s,
            latency_s=s.latency_s,
            structured=s.structured,
            tier=s.tier,
        )
        for s in logged[:k]
    ]
    new = logged[k]
    return RunPrefix(
        run_id="r1",
        steps=views,
        run_started_s=100.0,
        now_s=new.arrival_s,
        new_prompt_tokens=new.prompt_tokens,
        new_tool_results_n=new.tool_results_n,
        new_tool_result_errors=tuple(new.tool_result_errors),
        new_tool_result_tokens=tuple(new.tool_result_tokens),
        new_tool_pause_s=new.tool_pause_s,
    )


def test_layout_is_versioned_and_fixed():
    assert FEATURE_SPEC_VERSION == "fs-2"
    assert len(FEATURE_NAMES) == len(set(FEATURE_NAMES)) == N_FEATURES
    x = extract(_router_prefix(2))
    assert x.dtype == np.float64 and x.shape == (N_FEATURES,)
    assert list(extract_dict(_router_prefix(2))) == list(FEATURE_NAMES)


def test_feature_semantics_at_step_3():
    f = extract_dict(_router_prefix(3))
    assert f["step_index"] == 3
    assert f["ctx_tokens"] == 2100
    assert f["ctx_growth_last"] == 2100 - 1800
    assert f["ctx_growth_mean"] == pytest.approx((2100 - 1000) / 3)
    assert f["tokens_so_far"] == 1020 + 1330 + 2000
    assert f["time_since_start_s"] == 20.0
    assert f["tool_pause_s"] == 1.0
    assert f["tool_pause_mean_s"] == pytest.approx((2.5 + 6.0) / 2)
    assert f["n_tool_calls"] == 3 and f["tool_calls_last"] == 0
    # errors: [F], [T, T] earlier, [T] new -> 3 errors, streak 3 (ends at the newest result)
    assert f["tool_errors"] == 3 and f["tool_error_streak"] == 3 and f["new_tool_errors"] == 1
    assert f["repeated_tool_calls"] == 1 and f["max_key_repeats"] == 1
    assert f["last_call_repeated"] == 0  # step 2 made no call; step 1 repeated k1
    assert f["last_call_repeated"] != extract_dict(_router_prefix(2))["last_call_repeated"]
    assert f["out_tokens_last"] == 200 and f["out_tokens_max"] == 200
    assert f["out_tokens_mean"] == pytest.approx(250 / 3)
    assert f["structured_share"] == pytest.approx(2 / 3)
    assert f["cache_hit_ratio"] == pytest.approx(1000 / (1000 + 1300))  # step 2 has no counter
    assert f["tier_switches"] == 1 and f["frontier_step_share"] == pytest.approx(1 / 3)
    assert f["new_tool_results_n"] == 1 and f["new_tool_result_tokens"] == 40
    assert math.isnan(f["local_cache_pressure"])
    # get_user, search, get_user: three read-class calls, none written
    assert f["verb_read_calls"] == 3 and f["verb_write_calls"] == 0 and f["verb_other_calls"] == 0
    assert f["verb_read_share"] == pytest.approx(1.0) and f["verb_write_last"] == 0
    assert f["first_prompt_tokens"] == 1000
    assert not any(n.startswith("tool_bucket") for n in FEATURE_NAMES)  # fs-2 dropped the hash buckets


def test_first_step_and_unknowns_are_defined():
    p = RunPrefix(run_id="x", new_prompt_tokens=500)
    f = extract_dict(p)
    assert f["step_index"] == 0 and f["ctx_growth_last"] == 0 and f["structured_share"] == 0
    assert math.isnan(f["time_since_start_s"]) and math.isnan(f["tool_pause_s"])
    assert math.isnan(f["cache_hit_ratio"])
    assert f["first_prompt_tokens"] == 500  # the first prompt is the new one
    assert all(f[n] == 0 for n in FEATURE_NAMES if "sig_" in n)
    # unseen tool names still land in a verb class ("other" when no verb is known)
    p2 = RunPrefix(
        run_id="x",
        steps=[StepView(10, 5, tool_calls=("never-seen-tool-ü", "bookFlight"))],
        new_prompt_tokens=20,
    )
    f2 = extract_dict(p2)
    assert f2["verb_other_calls"] == 1 and f2["verb_write_calls"] == 1 and f2["verb_write_last"] == 1


def test_extract_fills_a_preallocated_buffer():
    buf = np.full(N_FEATURES, -7.0)
    out = extract(_router_prefix(1), out=buf)
    assert out is buf and not np.any(buf == -7.0)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("get_user_details", "read"),
        ("search_direct_flight", "read"),
        ("findUserIdByEmail", "read"),
        ("list_all_airports", "read"),
        ("book_reservation", "write"),
        ("cancel_pending_order", "write"),
        ("transfer_to_human_agents", "write"),
        ("user_update", "write"),  # no verb first: a later write token decides
        ("order_details_get", "read"),
        ("think", "other"),
        ("calculate", "other"),
        ("settings", "other"),  # "set" + 5 letters is not the verb "set"
        ("", "other"),
    ],
)
def test_verb_classes_from_tool_names(name, cls):
    from features.verbs import VERB_CLASSES, verb_class

    assert VERB_CLASSES[verb_class(name)] == cls
    if "_" in name or not name:  # case-insensitive (camelCase boundaries need the case)
        assert VERB_CLASSES[verb_class(name.upper())] == cls


def test_signal_counts_so_far_and_since_the_previous_step():
    p = RunPrefix(
        run_id="x",
        steps=[StepView(10, 5), StepView(20, 5)],
        new_prompt_tokens=30,
        signals=("verifier_failed", "tests_failed", "verifier_failed", "something-else"),
        new_signals_n=2,
    )
    f = extract_dict(p)
    assert f["sig_verifier_failed"] == 2 and f["sig_tests_failed"] == 1 and f["sig_other"] == 1
    assert f["sig_user_rejected"] == 0
    assert f["new_sig_verifier_failed"] == 1 and f["new_sig_other"] == 1 and f["new_sig_tests_failed"] == 0


def test_logged_signals_replay_as_the_same_prefix_signals(tmp_path):
    """Step.signals (new at that step) accumulate into RunPrefix.signals on the training path."""
    steps = [
        Step(run_id="r", step=0, prompt_tokens=10, completion_tokens=1),
        Step(run_id="r", step=1, prompt_tokens=20, completion_tokens=1, signals=["verifier_failed"]),
        Step(run_id="r", step=2, prompt_tokens=30, completion_tokens=1),
        Step(run_id="r", step=3, prompt_tokens=40, completion_tokens=1, signals=["other", "tests_failed"]),
    ]
    path = write_frame(
        records_to_frame([Run(run_id="r", source="t", domain="airline"), *steps]), tmp_path / "l.parquet"
    )
    got = list(iter_prefixes(read_runlog(path).steps, domain="airline"))
    assert [p.signals for p in got] == [
        (),
        ("verifier_failed",),
        ("verifier_failed",),
        ("verifier_failed", "other", "tests_failed"),
    ]
    assert [p.new_signals_n for p in got] == [0, 1, 0, 2]
    assert {p.domain for p in got} == {"airline"}


def test_training_path_equals_serving_path(tmp_path):
    """Logged rows -> Parquet -> read back -> iter_prefixes gives the router's vectors exactly."""
    path = write_frame(records_to_frame([Run(run_id="r1", source="t"), *_steps()]), tmp_path / "log.parquet")
    steps = read_runlog(path).steps
    got = [extract(p) for p in iter_prefixes(steps)]
    assert len(got) == 4
    for k, x in enumerate(got):
        np.testing.assert_array_equal(x, extract(_router_prefix(k)))
    # JSONL round trip too, and the frame-wide iterator over several runs
    jpath = write_frame(records_to_frame(_steps()), tmp_path / "log.jsonl")
    jsteps = read_runlog(jpath).steps
    for k, p in enumerate(iter_prefixes(jsteps)):
        np.testing.assert_array_equal(extract(p), extract(_router_prefix(k)))
    other = steps.assign(run_id="r0")
    both = pd.concat([other, steps]).sort_values(["run_id", "step"]).reset_index(drop=True)
    rows = list(iter_frame_prefixes(both))
    assert [i for i, _ in rows] == list(range(8))
    for (_, p), k in zip(rows[4:], range(4), strict=True):
        assert p.run_id == "r1"
        np.testing.assert_array_equal(extract(p), extract(_router_prefix(k)))


def test_iter_prefixes_sorts_and_rejects_mixed_runs():
    df = records_to_frame(_steps()).iloc[::-1]
    assert [p.step_index for p in iter_prefixes(df)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="one run"):
        list(iter_prefixes(pd.concat([df, df.assign(run_id="other")])))
    assert list(iter_prefixes(df.iloc[:0])) == []


def test_domain_stats_z_scores_within_each_domain():
    from features.domain_norm import NORMALISED, DomainStats, z_names

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, size=(200, N_FEATURES))
    X[:100] *= 100.0  # domain "a" runs at 100x the scale of "b"
    doms = ["a"] * 100 + ["b"] * 100
    Z = DomainStats().fit(X, doms).transform(X, doms)
    assert Z.shape == (200, len(NORMALISED)) == (200, len(z_names()))
    for rows in (slice(0, 100), slice(100, 200)):  # each domain centred and scaled on its own
        assert np.allclose(Z[rows].mean(axis=0), 0.0, atol=1e-9)
        assert np.allclose(Z[rows].std(axis=0), 1.0, atol=1e-6)
    st = DomainStats().fit(X, doms)
    assert np.allclose(st.transform(X[0], ["a"]), Z[0])  # one row
    assert np.isfinite(st.transform(X[:3], ["never-seen"] * 3)).all()  # unknown domain: all rows' stats
