"""The fakes' Anthropic Messages endpoint: the request's chat view (with its ``cache_control``
breakpoints), the answer and its stream, Anthropic's error body (see :mod:`router.fakes.apis`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from router.fakes.protocol import FakeRequestError
from router.fakes.synth import Completion

__all__ = ["MESSAGE_BLOCKS", "anthropic_error_body", "messages_view", "messages_body", "messages_events"]

MESSAGE_BLOCKS = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "search_result"}
)
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _rid(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _text(c: object) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def anthropic_error_body(type_: str, message: str) -> bytes:
    return orjson.dumps(
        {"type": "error", "error": {"type": type_, "message": message}, "request_id": _rid("req_")}
    )


def messages_view(body: dict[str, Any], *, need_max_tokens: bool = True) -> tuple[dict[str, Any], list[int]]:
    """``(chat view, chat-message indexes that carry a cache_control breakpoint)`` of a Messages
    request (the tools block's index is -1)."""
    msgs_in = body.get("messages")
    if not isinstance(msgs_in, list) or not msgs_in:
        raise FakeRequestError(400, "messages: Field required", "invalid_request_error")
    mt = body.get("max_tokens")
    if need_max_tokens and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise FakeRequestError(400, "max_tokens: Field required", "invalid_request_error")
    msgs: list[dict[str, Any]] = []
    marks: list[int] = []
    tools = body.get("tools") or []
    if any(isinstance(t, dict) and t.get("cache_control") for t in tools):
        marks.append(-1)
    system = body.get("system")
    if system:
        msgs.append({"role": "system", "content": _text(system)})
        if isinstance(system, list) and any(isinstance(b, dict) and b.get("cache_control") for b in system):
            marks.append(0)
    for i, m in enumerate(msgs_in):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise FakeRequestError(
                400, f"messages.{i}.role: Input should be 'user' or 'assistant'", "invalid_request_error"
            )
        c = m.get("content")
        blocks = [{"type": "text", "text": c}] if isinstance(c, str) else c
        if not isinstance(blocks, list):
            raise FakeRequestError(
                400, f"messages.{i}.content: Input should be a valid list", "invalid_request_error"
            )
        text, calls, results = [], [], []
        marked = False
        for j, b in enumerate(blocks):
            t = b.get("type") if isinstance(b, dict) else None
            if t not in MESSAGE_BLOCKS:
                raise FakeRequestError(
                    400, f"messages.{i}.content.{j}.type: unknown block type {t!r}", "invalid_request_error"
                )
            marked = marked or bool(b.get("cache_control"))
            if t == "text":
                text.append(str(b.get("text", "")))
            elif t == "tool_use":
                calls.append(
                    {
                        "id": b.get("id"),
                        "type": "function",
                        "function": {
                            "name": b.get("name"),
                            "arguments": orjson.dumps(b.get("input") or {}).decode(),
                        },
                    }
                )
            elif t == "tool_result":
                results.append(
                    {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))}
                )
        msgs.extend(results)
        if role == "assistant":
            am: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
            if calls:
                am["tool_calls"] = calls
            msgs.append(am)
        elif text or not results:
            msgs.append({"role": "user", "content": "".join(text)})
        if marked:
            marks.append(len(msgs) - 1)
    view: dict[str, Any] = {
        "model": body.get("model"),
        "messages": msgs,
        "stream": body.get("stream") is True,
    }
    ctools = [
        {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema") or {}}}
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("name"), str)
    ]
    if ctools:
        view["tools"] = ctools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        if kind == "tool":
            view["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
        elif kind in ("auto", "any", "none"):
            view["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if isinstance(mt, int):
        view["max_tokens"] = mt
    return view, marks


def _blocks(comp: Completion, call_id: str) -> list[dict[str, Any]]:
    if comp.tool_name:
        return [
            {
                "type": "tool_use",
                "id": call_id,
                "name": comp.tool_name,
                "input": orjson.loads(comp.tool_arguments or "{}"),
            }
        ]
    return [{"type": "text", "text": comp.content or ""}]


def messages_body(
    comp: Completion, mid: str, model: str, usage: Mapping[str, object], call_id: str
) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(comp, call_id),
        "stop_reason": _STOP.get(comp.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": usage,
    }


def messages_events(
    comp: Completion, mid: str, model: str, usage: Mapping[str, object], call_id: str
) -> list[tuple[int, dict[str, Any]]]:
    """``[(output tokens so far, event)]`` of a streamed message (Anthropic's event order)."""
    start_usage = {**usage, "output_tokens": 1}
    msg: dict[str, Any] = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    out: list[tuple[int, dict[str, Any]]] = [(0, {"type": "message_start", "message": msg})]
    total, k = comp.completion_tokens, max(1, len(comp.pieces))
    if comp.tool_name:
        out.append(
            (
                0,
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": call_id, "name": comp.tool_name, "input": {}},
                },
            )
        )
        out.append((0, {"type": "ping"}))
        for i, p in enumerate(comp.pieces):
            done = total if i == k - 1 else max(1, total * (i + 1) // (k + 1))
            out.append(
                (
                    done,
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": p},
                    },
                )
            )
    else:
        out.append(
            (0, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        )
        out.append((0, {"type": "ping"}))
        for i, p in enumerate(comp.pieces):
            done = total if i == k - 1 else max(1, total * (i + 1) // k)
            out.append(
                (
                    done,
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
                )
            )
    out.append((total, {"type": "content_block_stop", "index": 0}))
    delta_usage = {
        "input_tokens": usage.get("input_tokens"),
        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens"),
        "cache_read_input_tokens": usage.get("cache_read_input_tokens"),
        "output_tokens": total,
    }
    out.append(
        (
            total,
            {
                "type": "message_delta",
                "delta": {"stop_reason": _STOP.get(comp.finish_reason, "end_turn"), "stop_sequence": None},
                "usage": delta_usage,
            },
        )
    )
    out.append((total, {"type": "message_stop"}))
    return out
