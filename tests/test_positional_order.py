"""The per-step objects the step engine and the placement helpers build positionally (a class
called with keywords builds and unpacks a dict per call, about twice the cost): each equals the
keyword construction, field by field, so a field added or reordered in the class cannot shift a
value into the wrong field unseen. Every value below is distinct where the types allow."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from features.prefix import RunPrefix, StepView
from models.predictor import ConstantPredictor
from router.core.engine import StepEngine
from router.core.record import StepRequest, StepResult
from router.core.runs import CacheReading, RunTrack
from router.policy.filters import make_decision
from router.policy.snapshot import build_snapshot
from router.policy.types import BackendState, Decision, RunState, Snapshot


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    for f in fields(a):  # type: ignore[arg-type]
        va, vb = getattr(a, f.name), getattr(b, f.name)
        assert va is vb or va == vb, f"{type(a).__name__}.{f.name}: {va!r} != {vb!r}"


def _track() -> RunTrack:
    track = RunTrack.new("run-7", 3.0)
    track.last_end_s = 10.0
    track.domain = "airline"
    track.task_embedding = np.arange(3.0)
    track.signals = ("user_rejected",)
    track.cache_replica, track.cache_mark, track.cache_seen = "local-0", 100.0, 100.0
    return track


def _request() -> StepRequest:
    return StepRequest(
        prompt_tokens=901,
        tool_results_n=2,
        tool_result_errors=(False, True),
        tool_result_tokens=(11, 13),
        n_tools_offered=5,
        wants_json=True,
        signals=("tests_failed", "other"),
    )


def test_the_engine_builds_the_prefix_in_field_order():
    def reader(name: str) -> CacheReading:
        return CacheReading(300.0, 1000.0, 0, False)

    eng = StepEngine(cache_reader=reader)
    track, req = _track(), _request()
    got = eng.prefix(track, req, 12.5)
    want = RunPrefix(
        run_id="run-7",
        steps=track.base.steps,
        run_started_s=3.0,
        now_s=12.5,
        new_prompt_tokens=901,
        new_tool_results_n=2,
        new_tool_result_errors=(False, True),
        new_tool_result_tokens=(11, 13),
        new_tool_pause_s=2.5,
        new_n_tools_offered=5,
        new_wants_json=True,
        local_cache_pressure=0.2,
        domain="airline",
        task_embedding=track.task_embedding,
        signals=("user_rejected", "tests_failed", "other"),
        new_signals_n=2,
        aggregate=track.base.aggregate,
    )
    _same(got, want)


def test_the_engine_builds_the_finished_step_view_in_field_order():
    eng = StepEngine()
    track = RunTrack.new("run-7", 0.0)
    turn = eng.begin(RunState(run_id="run-7"), track)
    backends = [BackendState(name="local-0", tier="local", model="m")]
    turn.plan(_request(), backends, now=4.0, policy=_policy(), predictor=ConstantPredictor())
    turn.commit()
    res = StepResult(
        status=200,
        prompt_tokens=903,
        cached_tokens=512,
        completion_tokens=77,
        tool_calls=("search",),
        tool_call_keys=("k1",),
        ttft_s=0.25,
        latency_s=1.75,
        structured=False,
    )
    turn.finish(res, now=5.75, tier="local", replica="local-0", model="m", record=False)
    want = StepView(
        prompt_tokens=903,
        completion_tokens=77,
        cached_tokens=512,
        tool_calls=("search",),
        tool_call_keys=("k1",),
        tool_results_n=2,
        tool_result_errors=(False, True),
        tool_result_tokens=(11, 13),
        tool_pause_s=None,
        arrival_s=4.0,
        latency_s=1.75,
        structured=False,
        tier="local",
    )
    _same(track.base.steps[-1], want)


def _policy():
    from router.policy import build_policy

    return build_policy({"kind": "always-local"})


def test_the_snapshot_and_the_decision_are_built_in_field_order():
    run = RunState(run_id="run-7", tier="local", replica="local-1")
    prefix = RunPrefix(
        run_id="run-7",
        steps=[StepView(1, 2, tool_call_keys=("a", "a"))],
        new_prompt_tokens=901,
        new_tool_results_n=1,
        new_tool_result_errors=(True,),
    )
    preds = ConstantPredictor().predict(prefix)
    backends = [BackendState(name="local-0", tier="local", model="m0")]
    feats = {"x": 1.0}
    got = build_snapshot(
        run, prefix, preds, backends, label_needs_frontier=True, requested_model="m9", features=feats
    )
    want = Snapshot(
        run=run,
        step_index=1,
        features=feats,
        predictions=preds,
        backends=backends,
        context_tokens=901,
        at_tool_boundary=True,
        last_tool_repeated=True,
        last_tool_errored=True,
        label_needs_frontier=True,
        requested_model="m9",
    )
    _same(got, want)
    scores = {"s": 0.5}
    d = make_decision(got, backends[0], "why", scores)
    _same(
        d,
        Decision(tier="local", backend="local-0", model="m0", reason="why", scores=scores, switched=True),
    )
