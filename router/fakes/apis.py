"""The fakes' OpenAI Responses and Anthropic Messages endpoints: request views and answer shapes.

Requests are read into the chat view the fakes already render (:func:`responses_view`,
:func:`messages_view`): the same template, tokeniser and synthesis serve every protocol, so a
prompt's tokens (and so prefix-cache hits) do not depend on the protocol it came in. Validation
follows the real APIs: Responses ``input`` items (``message``, ``function_call``,
``function_call_output``, ``reasoning``) and ``previous_response_id`` resolved from the server's own
store (an unknown id is OpenAI's 400 ``previous_response_not_found``); Messages roles
(user/assistant), known block types, a required positive ``max_tokens``.

Answers (:func:`responses_body` / :func:`responses_events`, :func:`messages_body` /
:func:`messages_events`) have the real APIs' fields: a ``response`` object with ``output`` items
(``message`` with ``output_text`` parts, ``function_call`` with ``call_id``) and usage
``input_tokens`` / ``input_tokens_details.cached_tokens`` / ``output_tokens``; the semantic stream
events (``response.created`` ... ``response.completed``, each with ``sequence_number``); an
Anthropic ``message`` with ``text`` / ``tool_use`` blocks, ``stop_reason`` and usage
``input_tokens`` (uncached remainder), ``cache_creation_input_tokens``,
``cache_read_input_tokens``, ``output_tokens``; its stream (``message_start``,
``content_block_*``, ``ping``, ``message_delta``, ``message_stop``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from router.fakes.protocol import FakeRequestError
from router.fakes.synth import Completion

__all__ = [
    "MESSAGE_BLOCKS",
    "responses_view",
    "messages_view",
    "responses_body",
    "responses_events",
    "messages_body",
    "messages_events",
    "anthropic_error_body",
    "responses_usage",
]


def _rid(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _text(c: object) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# ------------------------------------------------------------------ Responses
def responses_view(
    body: dict[str, Any], store: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(chat view, the full input items incl. the resolved chain)`` of a Responses request."""
    inp = body.get("input")
    items: list[dict[str, Any]] = (
        [{"role": "user", "content": inp}] if isinstance(inp, str) else list(inp or [])
    )
    if not isinstance(inp, (str, list)) and not body.get("previous_response_id"):
        raise FakeRequestError(
            400, "Missing required parameter: 'input'.", "invalid_request_error", param="input"
        )
    prev = body.get("previous_response_id")
    if prev is not None:
        if prev not in store:
            raise FakeRequestError(
                400,
                f"Previous response with id '{prev}' not found.",
                "invalid_request_error",
                "previous_response_not_found",
                "previous_response_id",
            )
        items = store[prev] + items
    msgs: list[dict[str, Any]] = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": _text(body["instructions"])})
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise FakeRequestError(
                400, f"Invalid 'input[{i}]'.", "invalid_request_error", param=f"input[{i}]"
            )
        t = it.get("type", "message")
        if t == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise FakeRequestError(
                    400, f"Invalid value: {role!r}.", "invalid_request_error", param=f"input[{i}].role"
                )
            msgs.append({"role": role, "content": _text(it.get("content"))})
        elif t == "function_call":
            call = {
                "id": it.get("call_id"),
                "type": "function",
                "function": {"name": it.get("name"), "arguments": it.get("arguments", "")},
            }
            if msgs and msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls") is not None:
                msgs[-1]["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t == "function_call_output":
            msgs.append(
                {"role": "tool", "tool_call_id": it.get("call_id"), "content": _text(it.get("output"))}
            )
        elif t == "reasoning":
            continue
        else:
            raise FakeRequestError(
                400,
                f"Invalid value for 'input[{i}].type': {t!r}.",
                "invalid_request_error",
                param=f"input[{i}].type",
            )
    if not msgs:
        raise FakeRequestError(400, "Invalid 'input': empty.", "invalid_request_error", param="input")
    tools = []
    for t in body.get("tools") or ():
        if t.get("type") == "function":
            tools.append(
                {
                    "type": "function",
                    "function": {"name": t.get("name"), "parameters": t.get("parameters") or {}},
                }
            )
    view: dict[str, Any] = {
        "model": body.get("model"),
        "messages": msgs,
        "stream": body.get("stream") is True,
    }
    if tools:
        view["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        view["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
    elif tc is not None:
        view["tool_choice"] = tc
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        view["response_format"] = {"type": fmt["type"], "json_schema": {"schema": fmt.get("schema") or {}}}
    if body.get("max_output_tokens") is not None:
        view["max_tokens"] = body["max_output_tokens"]
    return view, items


def responses_usage(n: int, cached: int, out: int) -> dict[str, Any]:
    return {
        "input_tokens": n,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n + out,
    }


def _output(comp: Completion, call_id: str) -> list[dict[str, Any]]:
    if comp.tool_name:
        return [
            {
                "type": "function_call",
                "id": _rid("fc_"),
                "call_id": call_id,
                "name": comp.tool_name,
                "arguments": comp.tool_arguments or "",
                "status": "completed",
            }
        ]
    part = {"type": "output_text", "text": comp.content or "", "annotations": [], "logprobs": []}
    return [
        {"type": "message", "id": _rid("msg_"), "status": "completed", "role": "assistant", "content": [part]}
    ]


def _response(
    body: dict[str, Any], rid: str, model: str, status: str, output: list[dict[str, object]], usage: object
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": body.get("user"),
    }


def responses_body(
    body: dict[str, Any], comp: Completion, rid: str, model: str, usage: Mapping[str, object], call_id: str
) -> dict[str, Any]:
    return _response(body, rid, model, "completed", _output(comp, call_id), usage)


def responses_events(
    body: dict[str, Any], comp: Completion, rid: str, model: str, call_id: str
) -> tuple[list[tuple[int, dict[str, Any]]], Any]:
    """``([(output tokens so far, event)], finish(usage) -> the last event)`` of a streamed response."""
    seq = [0]
    out: list[tuple[int, dict[str, Any]]] = []

    def ev(done: int, type_: str, **kw: object) -> None:
        out.append((done, {"type": type_, "sequence_number": seq[0], **kw}))
        seq[0] += 1

    shell = _response(body, rid, model, "in_progress", [], None)
    ev(0, "response.created", response=shell)
    ev(0, "response.in_progress", response=shell)
    item = _output(comp, call_id)[0]
    total, k = comp.completion_tokens, max(1, len(comp.pieces))
    if comp.tool_name:
        ev(
            0,
            "response.output_item.added",
            output_index=0,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        for i, p in enumerate(comp.pieces):
            ev(
                total if i == k - 1 else max(1, total * (i + 1) // (k + 1)),
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=0,
                delta=p,
            )
        ev(
            total,
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=0,
            name=comp.tool_name,
            arguments=item["arguments"],
        )
    else:
        ev(
            0,
            "response.output_item.added",
            output_index=0,
            item={**item, "status": "in_progress", "content": []},
        )
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        ev(0, "response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=empty)
        for i, p in enumerate(comp.pieces):
            ev(
                total if i == k - 1 else max(1, total * (i + 1) // k),
                "response.output_text.delta",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                delta=p,
                logprobs=[],
            )
        ev(
            total,
            "response.output_text.done",
            item_id=item["id"],
            output_index=0,
            content_index=0,
            text=comp.content or "",
            logprobs=[],
        )
        ev(
            total,
            "response.content_part.done",
            item_id=item["id"],
            output_index=0,
            content_index=0,
            part=item["content"][0],
        )
    ev(total, "response.output_item.done", output_index=0, item=item)

    def finish(usage: Mapping[str, object]) -> dict[str, Any]:
        r = _response(body, rid, model, "completed", [item], usage)
        return {"type": "response.completed", "sequence_number": seq[0], "response": r}

    return out, finish


from router.fakes.api_messages import (  # noqa: E402 - re-exported: one import for the fakes' APIs
    MESSAGE_BLOCKS,
    anthropic_error_body,
    messages_body,
    messages_events,
    messages_view,
)
