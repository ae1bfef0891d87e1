"""The agent driver (router.fakes.agent) against a real fake-vLLM server over loopback HTTP."""

from __future__ import annotations

import itertools

import pytest

from router.fakes import fake_in_thread
from router.fakes.agent import DriveLimits, RunShape, StepShape, drive_run, words

SHAPE = RunShape(
    run_id="r1",
    steps=(
        StepShape(prompt=200, completion=20),
        StepShape(prompt=260, completion=20),
        StepShape(prompt=340, completion=20),
    ),
)
TOOLS = RunShape(
    run_id="r2",
    steps=tuple(StepShape(prompt=200 + 80 * k, completion=20, tool=True, error=k == 2) for k in range(4)),
)


@pytest.fixture(scope="module")
def vllm():
    with fake_in_thread("vllm", name="fake-vllm-a", model="m", base_ms=0.0, max_model_len=4096) as v:
        yield v


def test_words_are_one_token_and_four_bytes_each():
    w = words(50, "tag")
    assert len(w.split(" ")) == 50 and len(w) == 50 * 4 - 1
    assert words(50, "tag") == w and words(50, "other") != w  # deterministic, tag-dependent


def test_replays_the_logged_shape_and_hits_the_prefix_cache(vllm):
    got = drive_run(vllm.url, SHAPE, limits=DriveLimits(max_completion_tokens=16), tag="-t", model="m")
    assert [s.step for s in got] == [0, 1, 2] and all(s.status == 200 for s in got)
    for s, logged in zip(got, SHAPE.steps, strict=True):
        # the prompt follows the logged growth (chat template and the cap on completions aside)
        assert abs(s.prompt_tokens - logged.prompt) <= 0.25 * logged.prompt, (s.prompt_tokens, logged.prompt)
        assert 1 <= s.completion_tokens <= 16
    assert got[0].prompt_tokens < got[1].prompt_tokens < got[2].prompt_tokens
    # the history repeats, so the fake's prefix cache serves most of steps 2 and 3
    assert got[0].cached_tokens == 0 and got[1].cached_tokens > 0.5 * got[0].prompt_tokens
    assert got[2].cached_tokens > got[1].cached_tokens
    assert all(s.tier is None for s in got)  # no sidecar in front: no routing headers


def test_tool_steps_offer_tools_and_feed_results_back(vllm):
    got = drive_run(vllm.url, TOOLS, tag="-tools", model="m")
    assert len(got) == 4 and all(s.status == 200 for s in got)
    assert all(a.prompt_tokens < b.prompt_tokens for a, b in zip(got, got[1:], strict=False))
    assert got[-1].cached_tokens > 0.5 * got[-2].prompt_tokens  # same tools every step: the prefix repeats


def test_stops_at_max_steps_and_at_the_deadline(vllm):
    assert len(drive_run(vllm.url, SHAPE, limits=DriveLimits(max_steps=2), tag="-m", model="m")) == 2
    ticks = itertools.count()  # injected clock: 0 at the first step, 1 at the second, ...
    got = drive_run(vllm.url, SHAPE, deadline=0.5, tag="-d", model="m", clock=lambda: float(next(ticks)))
    assert len(got) == 1


def test_a_refused_step_is_recorded_and_ends_the_run(vllm):
    unknown = drive_run(vllm.url, SHAPE, tag="-u", model="no-such-model")
    assert [(s.step, s.status) for s in unknown] == [(0, 404)]
    with fake_in_thread("vllm", name="fake-vllm-b", model="m", base_ms=0.0, max_model_len=256) as v:
        got = drive_run(v.url, SHAPE, tag="-x", model="m")
    assert len(got) == 2 and got[0].status == 200
    assert got[1].status == 400 and got[1].tier is None and got[1].prompt_tokens == 0


def test_refuses_a_url_it_cannot_speak_to():
    with pytest.raises(ValueError, match="http://host:port"):
        drive_run("unix:///tmp/sock", SHAPE)
