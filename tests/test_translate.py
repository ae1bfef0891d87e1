"""Translation between protocols, field by field against the real SDKs' types (openai, anthropic),
and end to end: each SDK through the sidecar to a backend that does not speak its protocol."""

from __future__ import annotations

import anthropic
import orjson
import pytest
from anthropic.types import Message, MessageCreateParams, RawMessageStreamEvent
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.server.protocols.base import ClientRequest
from router.server.protocols.sse import parse_event
from router.server.protocols.translate import chat_to_messages, messages_to_chat, responses_to_chat
from router.server.protocols.translate_answers import (
    chat_to_messages_json,
    chat_to_responses_json,
    messages_to_chat_json,
)
from router.server.protocols.translate_stream import translating_capture

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
CHAT_PARAMS = TypeAdapter(CompletionCreateParamsNonStreaming)
MSG_PARAMS = TypeAdapter(MessageCreateParams)
RESP_EVENT = TypeAdapter(ResponseStreamEvent)
MSG_EVENT = TypeAdapter(RawMessageStreamEvent)

CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": "let me look",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q":"x"}'},
                    }
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "total_tokens": 107,
        "prompt_tokens_details": {"cached_tokens": 64},
    },
}


def test_responses_request_to_chat_is_a_valid_chat_request():
    body = {
        "model": "auto",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "find x"}]},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q":"x"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        "tools": [
            {"type": "function", "name": "search", "description": "d", "parameters": SCHEMA, "strict": True}
        ],
        "tool_choice": {"type": "function", "name": "search"},
        "text": {"format": {"type": "json_schema", "name": "A", "schema": SCHEMA, "strict": True}},
        "max_output_tokens": 50,
        "temperature": 0.2,
    }
    out = responses_to_chat(body, "local-model")
    CHAT_PARAMS.validate_python(out)
    m = out["messages"]
    assert m[0] == {"role": "system", "content": "be brief"}
    assert m[1] == {"role": "user", "content": "find x"}
    assert m[2]["role"] == "assistant" and m[2]["tool_calls"][0]["id"] == "c1"
    assert m[3] == {"role": "tool", "tool_call_id": "c1", "content": "found"}
    assert out["tools"][0]["function"] == {
        "name": "search",
        "description": "d",
        "parameters": SCHEMA,
        "strict": True,
    }
    assert out["tool_choice"] == {"type": "function", "function": {"name": "search"}}
    assert out["response_format"]["json_schema"]["schema"] == SCHEMA and out["max_tokens"] == 50


def test_messages_request_to_chat_and_chat_request_to_messages():
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "tool_use", "id": "tu1", "name": "search", "input": {"q": "x"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tu1", "content": "boom", "is_error": True}
                ],
            },
        ],
        "tools": [{"name": "search", "description": "d", "input_schema": SCHEMA}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
    }
    MSG_PARAMS.validate_python(body)
    chat = messages_to_chat(body, "local-model")
    CHAT_PARAMS.validate_python(chat)
    assert chat["messages"][0] == {"role": "system", "content": "sys"}
    assert chat["messages"][1]["content"][1]["image_url"]["url"] == "data:image/png;base64,AAA"
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q":"x"}'}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "tu1", "content": "Error: boom"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["user"] == "u-1" and chat["max_tokens"] == 64
    back = chat_to_messages(chat, "claude-x")
    MSG_PARAMS.validate_python(back)
    assert back["system"][0]["text"] == "sys" and back["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert [t["role"] for t in back["messages"]] == ["user", "assistant", "user"]
    assert back["messages"][1]["content"] == [
        {"type": "tool_use", "id": "tu1", "name": "search", "input": {"q": "x"}}
    ]
    assert back["messages"][2]["content"][-1]["cache_control"] == {
        "type": "ephemeral"
    }  # the prefix is cached
    assert back["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert back["metadata"] == {"user_id": "u-1"} and back["stop_sequences"] == ["END"]


def test_untranslatable_parts_are_a_400():
    from router.server.errors import ProxyError

    with pytest.raises(ProxyError) as e:
        responses_to_chat({"input": "x", "tools": [{"type": "web_search"}]}, "m")
    assert e.value.status == 400 and e.value.code == "untranslatable"
    with pytest.raises(ProxyError):
        messages_to_chat(
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "m"
        )


def test_answers_translate_to_valid_sdk_objects_with_usage():
    r = Response.model_validate(chat_to_responses_json(CHAT_ANSWER, {"input": "x", "store": True}))
    assert r.output[0].type == "message" and r.output[0].content[0].text == "let me look"  # type: ignore[union-attr]
    call = r.output[1]
    assert call.type == "function_call" and call.call_id == "call_1" and call.arguments == '{"q":"x"}'
    assert r.usage.input_tokens == 100 and r.usage.input_tokens_details.cached_tokens == 64  # type: ignore[union-attr]
    m = Message.model_validate(chat_to_messages_json(CHAT_ANSWER))
    assert (
        m.stop_reason == "tool_use" and m.content[1].type == "tool_use" and m.content[1].input == {"q": "x"}
    )  # type: ignore[union-attr]
    assert (m.usage.input_tokens, m.usage.cache_read_input_tokens, m.usage.output_tokens) == (36, 64, 7)
    c = ChatCompletion.model_validate(messages_to_chat_json(m.model_dump()))
    assert (
        c.choices[0].finish_reason == "tool_calls" and c.choices[0].message.tool_calls[0].id == call.call_id
    )  # type: ignore[index]
    assert c.usage.prompt_tokens == 100 and c.usage.prompt_tokens_details.cached_tokens == 64  # type: ignore[union-attr]


def _chat_stream() -> list[bytes]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def ch(delta, finish=None):
        return b"data: " + orjson.dumps(
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    return [
        ch({"role": "assistant", "content": ""}),
        ch({"content": "hel"}),
        ch({"content": "lo"}),
        ch(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "search", "arguments": ""},
                    }
                ]
            }
        ),
        ch({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
        ch({"tool_calls": [{"index": 0, "function": {"arguments": '"y"}'}}]}),
        ch({}, "tool_calls"),
        b"data: " + orjson.dumps({**base, "choices": [], "usage": CHAT_ANSWER["usage"]}),
        b"data: [DONE]",
    ]


def _run(capture, events: list[bytes]) -> list[tuple[str | None, dict]]:
    out = b"".join(capture.event(e) or b"" for e in events) + capture.finish_stream()
    return [parse_event(e) for e in out.split(b"\n\n") if e.strip() and b"[DONE]" not in e]


def test_chat_stream_to_responses_events_are_valid_and_complete():
    req = ClientRequest("responses", b"", {"input": "x", "stream": True}, None, True)
    cap = translating_capture(req, "chat")
    evs = _run(cap, _chat_stream())
    for name, obj in evs:
        assert name == obj["type"]
        RESP_EVENT.validate_python(obj)
    kinds = [o["type"] for _, o in evs]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [o["sequence_number"] for _, o in evs] == list(range(len(evs)))
    final = Response.model_validate(evs[-1][1]["response"])
    assert final.output_text == "hello" and final.output[1].arguments == '{"q":"y"}'  # type: ignore[union-attr]
    assert final.usage.input_tokens_details.cached_tokens == 64  # type: ignore[union-attr]
    assert cap.counts() == (100, 64, 7) and cap.tools()[0] == ("search",)
    assert cap.response_id() == final.id


def test_chat_stream_to_messages_events_accumulate_in_the_anthropic_sdk():
    req = ClientRequest("messages", b"", {"max_tokens": 5, "messages": [], "stream": True}, None, True)
    evs = _run(translating_capture(req, "chat"), _chat_stream())
    parsed = [MSG_EVENT.validate_python(o) for _, o in evs]
    kinds = [e.type for e in parsed]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(
        e.delta.text for e in parsed if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    args = "".join(
        e.delta.partial_json
        for e in parsed
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    starts = [e.content_block for e in parsed if e.type == "content_block_start"]
    assert text == "hello" and orjson.loads(args) == {"q": "y"}
    assert [b.type for b in starts] == ["text", "tool_use"] and starts[1].id == "call_9"
    delta = parsed[-2]
    assert delta.delta.stop_reason == "tool_use" and delta.usage.cache_read_input_tokens == 64  # type: ignore[union-attr]
    assert delta.usage.input_tokens == 36 and delta.usage.output_tokens == 7  # type: ignore[union-attr]


def test_messages_stream_to_chat_chunks_are_valid():
    evs = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "c",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 10,
                    "cache_read_input_tokens": 90,
                    "cache_creation_input_tokens": 5,
                    "output_tokens": 1,
                },
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "tu", "name": "search", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"q": "z"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 12},
        },
        {"type": "message_stop"},
    ]
    raw = [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) for e in evs]
    req = ClientRequest(
        "chat", b"", {"messages": [], "stream": True, "stream_options": {"include_usage": True}}, None, True
    )
    cap = translating_capture(req, "messages")
    out = b"".join(cap.event(e) or b"" for e in raw) + cap.finish_stream()
    assert out.endswith(b"data: [DONE]\n\n")
    chunks = [
        ChatCompletionChunk.model_validate(o) for _, o in (parse_event(e) for e in out.split(b"\n\n")) if o
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    assert (
        chunks[-1].usage.prompt_tokens == 105 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 90
    )  # type: ignore[union-attr]
    assert cap.counts() == (105, 90, 12)


# ------------------------------------------------------------------ end to end through the sidecar
def test_responses_and_messages_clients_on_a_chat_only_local_tier(tmp_path, sidecar, proto_fakes):
    before = dict(proto_fakes["v0"].server.stats.protocols), dict(proto_fakes["v1"].server.stats.protocols)
    with sidecar(
        local={
            "urls": [proto_fakes["v0"].url, proto_fakes["v1"].url],
            "model": "local-model",
            "protocols": ["chat"],
        }
    ) as (url, app):
        oa = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        prev, items, n = None, [{"role": "user", "content": "go " * 50}], 0
        for _ in range(5):
            with oa.responses.stream(
                model="auto",
                input=items,
                previous_response_id=prev,
                tools=[{"type": "function", "name": "search", "parameters": SCHEMA}],
            ) as st:  # type: ignore[arg-type]
                for _ev in st:
                    pass
                r = st.get_final_response()
            n += 1
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:
                break
            prev, items = (
                r.id,
                [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"}],
            )
        assert n == 4 and r.output_text and r.usage.input_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
        an = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        m = an.messages.create(
            model="claude-x",
            max_tokens=500,
            messages=[{"role": "user", "content": "hi " * 40}],
            tools=[{"name": "search", "input_schema": SCHEMA}],
        )
        assert m.stop_reason == "tool_use" and m.content[0].type == "tool_use"
        with an.messages.stream(
            model="claude-x", max_tokens=500, messages=[{"role": "user", "content": "yo " * 40}]
        ) as ms:
            final = ms.get_final_message()  # the SDK's own accumulation of the translated stream
        assert final.content[0].type == "text" and final.content[0].text and final.usage.output_tokens > 0  # type: ignore[union-attr]
    after = proto_fakes["v0"].server.stats.protocols, proto_fakes["v1"].server.stats.protocols
    assert sum(a.get("chat", 0) - b.get("chat", 0) for a, b in zip(after, before, strict=True)) == 6
    assert all(a.get("responses", 0) == b.get("responses", 0) for a, b in zip(after, before, strict=True))


def test_chat_and_responses_clients_on_the_anthropic_frontier(tmp_path, sidecar, proto_fakes):
    with sidecar(policy={"kind": "always-frontier"}) as (url, app):
        oa = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        raw = oa.chat.completions.with_raw_response.create(
            model="claude-x",
            messages=[{"role": "system", "content": "s " * 800}, {"role": "user", "content": "go"}],
            tools=[{"type": "function", "function": {"name": "search", "parameters": SCHEMA}}],
        )
        c = raw.parse()
        assert raw.headers["x-runroute-replica"] == "claude" and c.choices[0].message.tool_calls
        stream = oa.chat.completions.create(
            model="claude-x",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        r = oa.responses.create(
            model="claude-x",
            input="hello",
            tools=[{"type": "function", "name": "search", "parameters": SCHEMA}],
        )
        assert r.output[0].type == "function_call" and r.usage.output_tokens > 0  # type: ignore[union-attr]
    steps = __import__("protocol_support").read_steps(tmp_path).steps
    assert set(steps["protocol"]) == {"chat", "responses"} and (steps["tier"] == "frontier").all()
    assert (steps["prompt_tokens"] > 0).all()


def test_an_untranslatable_request_is_a_400_in_the_clients_shape_and_is_logged(
    tmp_path, sidecar, proto_fakes
):
    import httpx

    local = {"urls": [proto_fakes["v0"].url], "model": "local-model", "protocols": ["chat"]}
    with sidecar(local=local, policy={"kind": "always-local"}) as (url, app):
        body = {"model": "auto", "input": "find it", "tools": [{"type": "web_search"}]}
        r = httpx.post(url + "/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "untranslatable"
        m = {
            "model": "auto",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        }
        r = httpx.post(url + "/v1/messages", json=m)
        assert (
            r.status_code == 400
            and r.json()["type"] == "error"
            and r.json()["error"]["code"] == "untranslatable"
        )
        assert all(b.inflight == 0 for b in app.state.proxy.backends.values())
    steps = __import__("protocol_support").read_steps(tmp_path).steps
    assert steps["status"].tolist() == [400, 400] and set(steps["error_code"]) == {"untranslatable"}
