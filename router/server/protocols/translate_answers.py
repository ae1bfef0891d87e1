"""Answers translated between the protocols (whole JSON bodies; the field mapping is the one of
:mod:`router.server.protocols.translate`): :func:`chat_to_responses_json`, :func:`chat_to_messages_json`,
:func:`messages_to_chat_json`, and the usage conversions and Responses shells the stream
translators (:mod:`router.server.protocols.translate_stream`) share.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import orjson

from router.server.protocols.sse import JSONObject, obj_of, objs_of
from router.server.protocols.translate import finish_to_stop, new_id, stop_to_finish

__all__ = [
    "chat_usage_from_messages",
    "messages_usage_from_chat",
    "responses_usage_from_chat",
    "response_shell",
    "message_item",
    "call_item",
    "chat_to_responses_json",
    "chat_to_messages_json",
    "messages_to_chat_json",
]


def _count(v: object) -> int:
    """A token count of a usage object (absent, null or 0: 0)."""
    return int(v) if isinstance(v, (int, float, str)) and v else 0


def chat_usage_from_messages(u: Mapping[str, object]) -> JSONObject:
    inp = _count(u.get("input_tokens"))
    cw = _count(u.get("cache_creation_input_tokens"))
    cr = _count(u.get("cache_read_input_tokens"))
    out = _count(u.get("output_tokens"))
    return {
        "prompt_tokens": inp + cw + cr,
        "completion_tokens": out,
        "total_tokens": inp + cw + cr + out,
        "prompt_tokens_details": {"cached_tokens": cr},
    }


def messages_usage_from_chat(u: Mapping[str, object] | None) -> JSONObject:
    u = u or {}
    p = _count(u.get("prompt_tokens"))
    d = u.get("prompt_tokens_details")
    c = _count(d.get("cached_tokens")) if isinstance(d, dict) else 0
    return {
        "input_tokens": max(p - c, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": c,
        "output_tokens": _count(u.get("completion_tokens")),
    }


def responses_usage_from_chat(u: Mapping[str, object] | None) -> JSONObject:
    u = u or {}
    p = _count(u.get("prompt_tokens"))
    d = u.get("prompt_tokens_details")
    c = _count(d.get("cached_tokens")) if isinstance(d, dict) else 0
    o = _count(u.get("completion_tokens"))
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": c, "cache_write_tokens": 0},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": p + o,
    }


def response_shell(req: Mapping[str, object], model: str, rid: str, status: str) -> JSONObject:
    """The fields of a Responses ``response`` object that echo the request."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "metadata": req.get("metadata") or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": req.get("store", True),
        "temperature": req.get("temperature", 1.0),
        "text": req.get("text") or {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p", 1.0),
        "truncation": req.get("truncation", "disabled"),
        "usage": None,
        "user": req.get("user"),
    }


def message_item(text: str, item_id: str, status: str = "completed") -> JSONObject:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else [],
    }


def call_item(call_id: str, name: str, arguments: str, item_id: str, status: str = "completed") -> JSONObject:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _first_choice(obj: Mapping[str, object]) -> JSONObject:
    """A ``chat.completion``'s first choice (empty when it has none)."""
    choices = obj.get("choices")
    return obj_of(choices[0]) if isinstance(choices, list) and choices else {}


def chat_to_responses_json(obj: Mapping[str, object], req: Mapping[str, object]) -> JSONObject:
    """A ``chat.completion`` as a Responses ``response`` object."""
    ch = _first_choice(obj)
    msg = obj_of(ch.get("message"))
    finish = ch.get("finish_reason")
    r = response_shell(
        req, str(obj.get("model", "")), new_id("resp_"), "incomplete" if finish == "length" else "completed"
    )
    if finish == "length":
        r["incomplete_details"] = {"reason": "max_output_tokens"}
    out: list[JSONObject] = []
    r["output"] = out
    if msg.get("content"):
        out.append(message_item(str(msg["content"]), new_id("msg_")))
    for tc in objs_of(msg.get("tool_calls")):
        fn = obj_of(tc.get("function"))
        out.append(
            call_item(str(tc.get("id")), str(fn.get("name")), str(fn.get("arguments") or ""), new_id("fc_"))
        )
    r["usage"] = responses_usage_from_chat(obj_of(obj.get("usage")))
    return r


def chat_to_messages_json(obj: Mapping[str, object]) -> JSONObject:
    """A ``chat.completion`` as an Anthropic ``message``."""
    ch = _first_choice(obj)
    msg = obj_of(ch.get("message"))
    content: list[JSONObject] = []
    if msg.get("content"):
        content.append({"type": "text", "text": str(msg["content"])})
    for tc in objs_of(msg.get("tool_calls")):
        fn = obj_of(tc.get("function"))
        text = fn.get("arguments") or "{}"
        try:
            args = orjson.loads(text) if isinstance(text, (str, bytes)) else {}
        except orjson.JSONDecodeError:
            args = {}
        content.append(
            {"type": "tool_use", "id": str(tc.get("id")), "name": str(fn.get("name")), "input": args}
        )
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": str(obj.get("model", "")),
        "content": content,
        "stop_reason": finish_to_stop(ch.get("finish_reason")),
        "stop_sequence": None,
        "usage": messages_usage_from_chat(obj_of(obj.get("usage"))),
    }


def messages_to_chat_json(obj: Mapping[str, object]) -> JSONObject:
    """An Anthropic ``message`` as a ``chat.completion``."""
    blocks = objs_of(obj.get("content"))
    text = "".join(t for b in blocks if b.get("type") == "text" and isinstance(t := b.get("text", ""), str))
    calls = [
        {
            "id": str(b.get("id")),
            "type": "function",
            "function": {
                "name": str(b.get("name")),
                "arguments": orjson.dumps(b.get("input") or {}).decode(),
            },
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    message: JSONObject = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(obj.get("id", new_id(""))),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(obj.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": stop_to_finish(obj.get("stop_reason")),
            }
        ],
        "usage": chat_usage_from_messages(obj_of(obj.get("usage"))),
    }
