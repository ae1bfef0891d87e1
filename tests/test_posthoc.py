"""Post-hoc signals (router.server.hotpath.posthoc): the sidecar reads a local step's own answer and records
what it finds as run signals the next step sees.

The scan's rules directly; then over real HTTP (uvicorn on loopback, a fake vLLM whose tool calls
lose their closing brace, the fake frontier): a malformed tool call is stored on the run, counted
in the metric, reaches the next step's ``Step.signals`` and ``sig_*`` features (chat JSON, chat
SSE, Responses; a Messages answer that used its token cap is ``answer_truncated``), and with ``trouble_boost`` escalates the run's next step; a clean local answer and
a frontier answer record nothing.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from signal_support import make_settings, read_log
from test_signals import FlatPredictor

from features.extract import FEATURE_NAMES
from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.hotpath.posthoc import offered_tools, scan, token_cap

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_flight",
            "parameters": {
                "type": "object",
                "properties": {"dest": {"type": "string"}, "seats": {"type": "integer"}},
                "required": ["dest", "seats"],
            },
        },
    }
]


def _scan(**kw):
    base = dict(
        names=("a",),
        keys=("k1",),
        args=('{"x": 1}',),
        prompt_tokens=10,
        completion_tokens=5,
        offered=frozenset({"a"}),
        cap=None,
        previous_keys=(),
    )
    return scan(**{**base, **kw})


def test_scan_finds_each_kind_and_nothing_on_a_clean_answer():
    assert _scan() == ()
    assert _scan(args=('{"x": 1',)) == ("tool_call_malformed",)
    assert _scan(args=("[1, 2]",)) == ("tool_call_malformed",)  # not an object
    assert _scan(args=("",)) == ()  # no arguments = {}
    assert _scan(names=("b",)) == ("tool_not_offered",)
    assert _scan(offered=None, names=("b",)) == ()  # the request offered no tools: not judged
    assert _scan(names=(), keys=(), args=(), completion_tokens=0) == ("answer_empty",)
    assert _scan(names=(), keys=(), args=(), completion_tokens=0, prompt_tokens=None) == ()  # no usage
    assert _scan(cap=5) == ("answer_truncated",) and _scan(cap=6) == ()
    assert _scan(previous_keys=("k0", "k1")) == ("tool_call_repeated",)
    assert _scan(previous_keys=("k0",)) == ()
    assert offered_tools({"tools": _TOOLS}) == frozenset({"book_flight"})
    assert offered_tools({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}) == {"f"}
    assert offered_tools({}) is None
    assert token_cap({"max_output_tokens": 7}) == 7 and token_cap({"max_tokens": True}) is None


@pytest.fixture(scope="module")
def bad_fakes():
    """A fake vLLM whose every tool call is malformed, and the fake frontier (clean)."""
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.1)
    with (
        fake_in_thread("vllm", name="v0", malformed_tool_call_rate=1.0, **knobs) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-front") as fr,
    ):
        yield v0, fr


def _chat(
    c: httpx.Client, run_id: str, k: int, *, tools: bool = True, stream: bool = False
) -> httpx.Response:
    msgs = [{"role": "user", "content": "Book me a flight to Las Vegas."}]
    for i in range(k):
        msgs += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "go on"}]
    body: dict = {"model": "auto", "messages": msgs, "stream": stream}
    if tools:
        body |= {"tools": _TOOLS, "tool_choice": "required"}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = c.post("/v1/chat/completions", json=body, headers={"x-run-id": run_id})
    assert r.status_code == 200, r.text
    return r


def test_malformed_local_tool_call_is_a_signal_the_next_step_sees(tmp_path, bad_fakes):
    """Chat JSON and chat SSE: step 0's malformed call is on the run before step 1, in step 1's
    Step.signals and features, counted in the metric; a Responses run too; a step without tools
    records nothing."""
    app = create_app(make_settings(tmp_path, bad_fakes), bundle=FlatPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        for rid, stream in (("r-json", False), ("r-sse", True)):
            _chat(c, rid, 0, stream=stream)
            assert c.get(f"/v1/runs/{rid}").json()["signals"] == ["tool_call_malformed"], rid
            _chat(c, rid, 1, tools=False, stream=stream)  # a text answer: nothing new
            assert c.get(f"/v1/runs/{rid}").json()["signals"] == ["tool_call_malformed"], rid
        r = c.post(
            "/v1/responses",
            json={
                "model": "auto",
                "input": "Book me a flight.",
                "tools": [{"type": "function", **_TOOLS[0]["function"]}],
                "tool_choice": "required",
            },
            headers={"x-run-id": "r-resp"},
        )
        assert r.status_code == 200, r.text
        assert c.get("/v1/runs/r-resp").json()["signals"] == ["tool_call_malformed"]
        _chat(c, "r-plain", 0, tools=False)
        assert c.get("/v1/runs/r-plain").json()["signals"] == []
        # Messages: an answer that used its whole token cap (the fake writes exactly max_tokens)
        r = c.post(
            "/v1/messages",
            json={
                "model": "auto",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "Tell me more."}],
            },
            headers={"x-run-id": "r-msg"},
        )
        assert r.status_code == 200, r.text
        assert c.get("/v1/runs/r-msg").json()["signals"] == ["answer_truncated"]
        metrics = c.get("/metrics").text
        assert 'runroute_run_signals_total{kind="tool_call_malformed"} 3.0' in metrics
        for rid in ("r-json", "r-sse", "r-resp", "r-plain", "r-msg"):
            assert c.post(f"/v1/runs/{rid}/end", json={"outcome": "failure"}).status_code == 200
    log = read_log(tmp_path)
    steps = log.steps[log.steps["run_id"] == "r-json"].sort_values("step")
    assert [list(s) if s is not None else None for s in steps["signals"].tolist()] == [
        None,
        ["tool_call_malformed"],
    ]
    X = np.array(steps["features"].tolist())
    assert X[:, FEATURE_NAMES.index("sig_other")].tolist() == [0, 1]  # the vector's column for it
    assert X[:, FEATURE_NAMES.index("new_sig_other")].tolist() == [0, 1]


def test_trouble_boost_on_a_malformed_call_escalates_the_next_step(tmp_path, bad_fakes):
    """``trouble_boost: {tool_call_malformed: 0.5}`` lifts a flat P = 0.1 past the 0.5 threshold at
    the step after the malformed call; the frontier's (clean) answer records nothing; without the
    boost the run stays local."""
    pol = {"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.3, "value_of_success_usd": 5.0}
    tiers = {}
    for name, boost in (("off", {}), ("on", {"tool_call_malformed": 0.5})):
        s = make_settings(tmp_path / name, bad_fakes, policy={**pol, "trouble_boost": boost})
        app = create_app(s, bundle=FlatPredictor())
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
            tiers[name] = [_chat(c, "r-tb", k).headers["x-runroute-tier"] for k in range(3)]
            sig = c.get("/v1/runs/r-tb").json()["signals"]
        # every local step's call is malformed: one signal per local step, none from the frontier
        assert sig == ["tool_call_malformed"] * tiers[name].count("local"), (name, sig)
    assert tiers == {"off": ["local"] * 3, "on": ["local", "frontier", "frontier"]}
