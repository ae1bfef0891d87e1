"""Bad input on the Messages and Responses protocols (issue 25, N5): every field the sidecar reads is
type-checked, so a body of the wrong shape is a 4xx in the protocol's own error JSON (Anthropic's on
``/v1/messages`` and ``count_tokens``, OpenAI's on ``/v1/responses``), never a 500, and nothing is
admitted or left behind."""

from __future__ import annotations

import pytest
from test_sidecar_errors import Harness

USER = {"role": "user", "content": "hi"}


def msgs_body(*messages, **extra):
    return {"model": "auto", "max_tokens": 16, "messages": list(messages), **extra}


def block(**b):
    return {"role": "user", "content": [b]}


BAD_MESSAGES = [
    msgs_body(block(type=[])),
    msgs_body(block(type={})),
    msgs_body(block(type="text", text=5)),
    msgs_body(USER, {"role": "assistant", "content": [{"type": "text", "text": None}]}),
    msgs_body(
        USER, {"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": "f", "input": {}}]}
    ),
    msgs_body(block(type="tool_result", tool_use_id="t", content=[{"type": []}])),
    msgs_body(block(type="tool_result", tool_use_id="t", content=[{"type": "text", "text": 7}])),
    msgs_body(block(type="tool_result", tool_use_id="t", is_error="yes")),
    msgs_body(block(type="tool_result", tool_use_id=["t"])),
    msgs_body(block(type="image", source="nope")),
    msgs_body(USER, tools=[{"name": "f", "input_schema": []}]),
    msgs_body(USER, tool_choice={"type": []}),
    msgs_body(USER, tool_choice="auto"),
    msgs_body(USER, stop_sequences=[1]),
    msgs_body(USER, temperature="hot"),
    msgs_body({"role": [], "content": "x"}),
]

BAD_COUNT = [
    {"messages": [block(type=[])]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    {"messages": [USER], "tools": [{"name": 5}]},
]


def item(**it):
    return {"model": "auto", "input": [it]}


BAD_RESPONSES = [
    item(type=[], role="user", content="x"),
    item(type={}, role="user", content="x"),
    item(role=[], content="x"),
    item(role={}, content="x"),
    item(type="message", role="user", content=[{"type": "input_text", "text": 5}]),
    item(type="function_call", call_id="c", name="f", arguments={"a": 1}),
    {"model": "auto", "input": "x", "tools": [{"type": "function"}]},
    {"model": "auto", "input": "x", "tools": [{"type": []}]},
    {"model": "auto", "input": "x", "tool_choice": 5},
    {"model": "auto", "input": "x", "text": {"format": "json"}},
    {"model": "auto", "input": "x", "max_output_tokens": "many"},
    {"model": "auto", "input": "x", "temperature": [1]},
]


def anthropic_err(r) -> tuple[int, str]:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}, body
    assert body["error"]["type"] == "invalid_request_error"
    return r.status_code, body["error"]["code"]


def openai_err(r) -> tuple[int, str]:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "code"}, body
    return r.status_code, body["error"]["code"]


@pytest.fixture
async def client(tmp_path):
    h = Harness(tmp_path)
    async with h as c:
        yield c, h


async def _settled(c) -> None:
    """Nothing was admitted or left in flight by the refused requests."""
    text = (await c.get("/metrics")).text
    active = [ln for ln in text.splitlines() if ln.startswith("runroute_admission_active")]
    assert active and all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in active), active
    assert (await c.get("/v1/capacity")).status_code == 200


@pytest.mark.parametrize("body", BAD_MESSAGES)
async def test_bad_messages_are_400_in_anthropic_shape(client, body):
    c, h = client
    r = await c.post("/v1/messages", json=body)
    status, code = anthropic_err(r)
    assert 400 <= status < 500 and code, r.text
    assert not h.up.calls  # never forwarded
    await _settled(c)


@pytest.mark.parametrize("body", BAD_COUNT)
async def test_bad_count_tokens_are_400_in_anthropic_shape(client, body):
    c, _ = client
    status, code = anthropic_err(await c.post("/v1/messages/count_tokens", json=body))
    assert status == 400 and code


@pytest.mark.parametrize("body", BAD_RESPONSES)
async def test_bad_responses_are_4xx_in_openai_shape(client, body):
    c, h = client
    r = await c.post("/v1/responses", json=body)
    status, code = openai_err(r)
    assert 400 <= status < 500 and code, r.text
    assert not h.up.calls
    await _settled(c)
