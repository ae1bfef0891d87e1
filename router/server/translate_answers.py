"""Answers translated between the protocols (whole JSON bodies; the field mapping is the one of
:mod:`router.server.translate`): :func:`chat_to_responses_json`, :func:`chat_to_messages_json`,
:func:`messages_to_chat_json`, and the usage conversions and Responses shells the stream
translators (:mod:`router.server.translate_stream`) share.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from router.server.translate import finish_to_stop, new_id, stop_to_finish

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


def chat_usage_from_messages(u: dict[str, Any]) -> dict[str, Any]:
    inp = int(u.get("input_tokens") or 0)
    cw = int(u.get("cache_creation_input_tokens") or 0)
    cr = int(u.get("cache_read_input_tokens") or 0)
    out = int(u.get("output_tokens") or 0)
    return {
        "prompt_tokens": inp + cw + cr,
        "completion_tokens": out,
        "total_tokens": inp + cw + cr + out,
        "prompt_tokens_details": {"cached_tokens": cr},
    }


def messages_usage_from_chat(u: dict[str, Any] | None) -> dict[str, Any]:
    u = u or {}
    p = int(u.get("prompt_tokens") or 0)
    d = u.get("prompt_tokens_details")
    c = int((d or {}).get("cached_tokens") or 0) if isinstance(d, dict) else 0
    return {
        "input_tokens": max(p - c, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": c,
        "output_tokens": int(u.get("completion_tokens") or 0),
    }


def responses_usage_from_chat(u: dict[str, Any] | None) -> dict[str, Any]:
    u = u or {}
    p = int(u.get("prompt_tokens") or 0)
    d = u.get("prompt_tokens_details")
    c = int((d or {}).get("cached_tokens") or 0) if isinstance(d, dict) else 0
    o = int(u.get("completion_tokens") or 0)
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": c, "cache_write_tokens": 0},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": p + o,
    }


def response_shell(req: dict[str, Any], model: str, rid: str, status: str) -> dict[str, Any]:
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


def message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else [],
    }


def call_item(
    call_id: str, name: str, arguments: str, item_id: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def chat_to_responses_json(obj: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` as a Responses ``response`` object."""
    ch = (obj.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    finish = ch.get("finish_reason")
    r = response_shell(
        req, str(obj.get("model", "")), new_id("resp_"), "incomplete" if finish == "length" else "completed"
    )
    if finish == "length":
        r["incomplete_details"] = {"reason": "max_output_tokens"}
    out = r["output"]
    if msg.get("content"):
        out.append(message_item(str(msg["content"]), new_id("msg_")))
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        out.append(
            call_item(str(tc.get("id")), str(fn.get("name")), str(fn.get("arguments") or ""), new_id("fc_"))
        )
    r["usage"] = responses_usage_from_chat(obj.get("usage"))
    return r


def chat_to_messages_json(obj: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` as an Anthropic ``message``."""
    ch = (obj.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": str(msg["content"])})
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        try:
            args = orjson.loads(fn.get("arguments") or "{}")
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
        "usage": messages_usage_from_chat(obj.get("usage")),
    }


def messages_to_chat_json(obj: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``message`` as a ``chat.completion``."""
    blocks = obj.get("content") or []
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
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
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
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
        "usage": chat_usage_from_messages(obj.get("usage") or {}),
    }
