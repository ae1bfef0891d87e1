"""Incremental feature extraction (RunPrefix.append + StepAggregate) is bit-identical to the full scan."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from features.extract import StepAggregate, extract, iter_prefixes
from features.prefix import RunPrefix, StepView

NAMES = ("read", "write", "grep", "bash", "edit")


@st.composite
def step_views(draw: st.DrawFn) -> StepView:
    n_calls = draw(st.integers(0, 3))
    calls = tuple(draw(st.sampled_from(NAMES)) for _ in range(n_calls))
    keys = tuple(f"{c}:{draw(st.integers(0, 3))}" for c in calls)
    n_res = draw(st.integers(0, 3))
    prompt = draw(st.integers(0, 200_000))
    return StepView(
        prompt_tokens=prompt,
        completion_tokens=draw(st.integers(0, 5000)),
        cached_tokens=draw(st.none() | st.integers(0, prompt)),
        tool_calls=calls,
        tool_call_keys=keys,
        tool_results_n=n_res,
        tool_result_errors=tuple(draw(st.booleans()) for _ in range(n_res)),
        tool_result_tokens=tuple(draw(st.integers(0, 4000)) for _ in range(n_res)),
        tool_pause_s=draw(st.none() | st.floats(0, 1e4, allow_nan=False)),
        arrival_s=None,
        latency_s=None,
        structured=draw(st.none() | st.booleans()),
        tier=draw(st.none() | st.sampled_from(("local", "frontier"))),
    )


def _set_request(p: RunPrefix, i: int, errs: tuple[bool, ...]) -> None:
    p.now_s = 10.0 * i
    p.run_started_s = 0.0
    p.new_prompt_tokens = 1000 + 7 * i
    p.new_tool_result_errors = errs
    p.new_tool_results_n = len(errs)
    p.new_tool_result_tokens = tuple(range(len(errs)))
    p.new_tool_pause_s = None if i == 0 else 0.5 * i
    p.local_cache_pressure = None if i % 3 == 0 else 1.0 / (i + 1)


def _full(p: RunPrefix) -> np.ndarray:
    """The full scan: the same prefix, with a copy of its steps and no aggregate."""
    q = RunPrefix(
        run_id=p.run_id,
        steps=list(p.steps),
        run_started_s=p.run_started_s,
        now_s=p.now_s,
        new_prompt_tokens=p.new_prompt_tokens,
        new_tool_results_n=p.new_tool_results_n,
        new_tool_result_errors=p.new_tool_result_errors,
        new_tool_result_tokens=p.new_tool_result_tokens,
        new_tool_pause_s=p.new_tool_pause_s,
        new_n_tools_offered=p.new_n_tools_offered,
        new_wants_json=p.new_wants_json,
        local_cache_pressure=p.local_cache_pressure,
    )
    assert q.aggregate is None
    return extract(q)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(step_views(), max_size=40),
    errs=st.lists(st.lists(st.booleans(), max_size=3).map(tuple), min_size=41, max_size=41),
)
def test_appended_prefix_extracts_bit_identically_to_the_full_scan(
    steps: list[StepView], errs: list[tuple[bool, ...]]
) -> None:
    p = RunPrefix(run_id="r")
    for i in range(len(steps) + 1):
        _set_request(p, i, errs[i])
        agg_before = p.aggregate
        got = extract(p)
        assert got.tobytes() == _full(p).tobytes(), i  # bit for bit, NaNs included
        assert p.aggregate is not None and (i == 0 or p.aggregate is agg_before)  # no rebuild
        if i < len(steps):
            p.append(steps[i])
    assert p.aggregate is not None and p.aggregate.n == len(steps)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(step_views(), min_size=2, max_size=20), cut=st.integers(0, 19))
def test_a_stale_aggregate_is_never_used(steps: list[StepView], cut: int) -> None:
    p = RunPrefix(run_id="r")
    for s in steps:
        p.append(s)
    extract(p)
    agg = p.aggregate
    p.steps.append(steps[0])  # grown behind the aggregate's back
    assert not p.aggregate_valid()
    assert extract(p).tobytes() == _full(p).tobytes()
    assert p.aggregate is not agg  # rebuilt and attached
    p.steps = p.steps[: cut % len(p.steps)]  # replaced by a shorter list
    assert extract(p).tobytes() == _full(p).tobytes()
    p.steps = list(steps[:-1]) + [steps[0]]  # same length as an earlier list, another last step
    p.aggregate = StepAggregate.of(steps)
    assert not p.aggregate_valid()
    assert extract(p).tobytes() == _full(p).tobytes()
    p.aggregate = StepAggregate.of(steps)  # stale again (the extraction above rebuilt it)
    p.append(steps[1])  # append onto a stale aggregate: dropped, not corrupted
    assert p.aggregate is None and p.steps[-1] is steps[1]
    assert extract(p).tobytes() == _full(p).tobytes()


def test_training_prefixes_share_one_aggregate_and_stay_correct_out_of_order() -> None:
    import pandas as pd

    rows = []
    for k in range(12):
        rows.append(
            {
                "run_id": "r",
                "step": k,
                "prompt_tokens": 100 * (k + 1),
                "completion_tokens": 10 + k,
                "cached_tokens": None if k % 4 == 0 else 50 * k,
                "tool_calls": ["read"] if k % 2 else ["grep", "read"],
                "tool_call_keys": [f"k{k % 3}"],
                "tool_results_n": 1,
                "tool_result_errors": [k % 5 == 0],
                "tool_result_tokens": [20],
                "tool_pause_s": None if k == 0 else 0.25 * k,
                "arrival_s": 5.0 * k,
                "latency_s": 1.0,
                "structured": None,
                "tier": "local" if k % 3 else "frontier",
            }
        )
    df = pd.DataFrame(rows)
    in_order = []
    kept = []
    for p in iter_prefixes(df):
        in_order.append(extract(p).tobytes())  # O(1): the shared aggregate is current
        assert p.aggregate is not None and p.aggregate.n == p.step_index
        kept.append(p)
    # extracted later, the kept prefixes find the shared aggregate moved on and scan instead
    later = [extract(p).tobytes() for p in reversed(kept)][::-1]
    assert later == in_order
    assert all(_full(p).tobytes() == v for p, v in zip(kept, in_order, strict=True))
