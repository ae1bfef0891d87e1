"""Chat Completions, the protocol side: read a request into a step, rewrite it, capture the answer.

Reading (:func:`read_request`): only ``model``, ``messages``, ``stream``, ``stream_options``,
``tools``, ``response_format``, ``metadata``, ``user`` are looked at; the rest passes through
untouched. The step the engine sees (:class:`router.core.record.StepRequest`): the prompt-size
estimate (:func:`features.tokens.prompt_tokens`: the run's previous prompt + completion + the
messages after the last assistant message, or the whole request at a run's first step), the tool
results after the last assistant message (count, estimated size, error flag: the result starts
with or mentions ``error``, ``exception`` or ``traceback`` in its first 200 characters), tools
offered and JSON mode.

Forwarding (:func:`rewrite_body`): the client's bytes with only ``model`` rewritten (a byte splice
when the body has exactly one ``"model": "..."`` pair, otherwise one orjson re-serialisation);
streaming requests also get ``stream_options.include_usage`` so usage (incl. cached tokens) is
always captured, and the usage-only chunk is removed again when the client did not ask for it.

Capture (:class:`Capture`): usage (prompt, cached = ``prompt_tokens_details.cached_tokens``,
completion) and tool calls (names, argument strings -> a key per call: a repeated key is a loop
signal) from a JSON answer or from the SSE events that mention ``usage`` or ``tool_calls``.

:class:`ChatAdapter` is this module as a :class:`router.server.protocol.Adapter` (the hot path's
interface); a backend that does not speak Chat Completions (an Anthropic frontier) gets the request
translated by :mod:`router.server.translate`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from xxhash import xxh64_intdigest

from features.tokens import content_chars, prompt_tokens, text_tokens
from router.core.record import StepRequest
from router.server.errors import ProxyError, error_body, error_response
from router.server.protocol import AUTO_MODELS, ClientRequest, resolve_model
from router.server.sse import looks_error, text_of
from router.server.validate import (
    DEFAULT_MAX_DEPTH,
    check_depth,
    check_messages,
    check_metadata,
    check_object,
    check_optional_str,
    check_stream_options,
    check_tools,
)

__all__ = [
    "ChatRequest",
    "Capture",
    "ChatAdapter",
    "read_request",
    "rewrite_body",
    "tool_key",
    "AUTO_MODELS",
]

_MODEL_RE = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
ChatRequest = ClientRequest


def read_request(
    raw: bytes, models: Mapping[str, str], aliases: Any = None, max_depth: int = DEFAULT_MAX_DEPTH
) -> ClientRequest:
    """Parse and validate (:mod:`router.server.validate` for every field the router reads);
    raises :class:`ProxyError` (4xx) for bad input."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProxyError(422, "body_not_object", "request body must be a JSON object")
    check_depth(body, max_depth)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise ProxyError(422, "invalid_messages", "'messages' must be a non-empty list of message objects")
    check_messages(msgs)
    model = body.get("model", "auto")
    if not isinstance(model, str):
        raise ProxyError(422, "invalid_model", "'model' must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ProxyError(422, "invalid_stream", "'stream' must be a boolean")
    requested, alias = resolve_model(model, models, aliases)
    so = body.get("stream_options")
    check_stream_options(so)
    check_tools(body.get("tools"))
    check_metadata(body.get("metadata"))
    check_optional_str(body.get("user"), "user")
    check_object(body.get("response_format"), "response_format")
    strip = stream and not (isinstance(so, dict) and so.get("include_usage") is True)
    return ClientRequest("chat", raw, body, requested, stream, model_alias=alias, strip_usage=strip)


_looks_error = looks_error


class MessageSegments:
    """The prefix index's lazy text view of a chat body (:class:`router.core.prefix_index.Segments`):
    segment 0 = the tools offered (JSON; empty without), segment ``i`` = message ``i - 1``'s role,
    text and tool calls. Only the segments the run's chainer asks for are built (O(new messages))."""

    __slots__ = ("msgs", "tools")

    def __init__(self, body: Mapping[str, Any]):
        self.msgs = body["messages"]
        self.tools = body.get("tools")

    def __len__(self) -> int:
        return len(self.msgs) + 1

    def __getitem__(self, i: int) -> str:
        if i == 0:
            return orjson.dumps(self.tools).decode() if self.tools else ""
        m = self.msgs[i - 1]
        calls = m.get("tool_calls")
        text = text_of(m.get("content")) or ""
        if calls:
            text += orjson.dumps(calls).decode()
        return f"{m.get('role')}\x1f{text}"

    def fingerprint(self, i: int) -> object:
        """Segment ``i``'s fingerprint for the chainer's history checks: the tools offered (0) by
        their count and an xxh64 of the first and the last tool's JSON, not the whole list (the
        chainer reads segment 0's at every step); a message by its segment's length and ends."""
        if i == 0:
            t = self.tools
            if not t:
                return None
            return (len(t), xxh64_intdigest(orjson.dumps(t[0])), xxh64_intdigest(orjson.dumps(t[-1])))
        seg = self[i]
        return (len(seg), seg[:32], seg[-32:])


def step_request(req: ClientRequest, previous_total: int | None, **kw: Any) -> StepRequest:
    """The engine's view of a chat request (module docstring). ``previous_total``: the run's
    previous served step's prompt + completion tokens (None at its first step)."""
    body = req.body
    msgs = body["messages"]
    n, errs, toks = 0, [], []
    for m in reversed(msgs):
        role = m.get("role")
        if role == "assistant":
            break
        if role == "tool":
            c = m.get("content")
            n += 1
            errs.append(_looks_error(c))
            toks.append(text_tokens(content_chars(c)))
    errs.reverse()
    toks.reverse()
    rf = body.get("response_format")
    tools = body.get("tools")
    tools_chars = len(orjson.dumps(tools)) if previous_total is None and isinstance(tools, list) else 0
    return StepRequest(
        prompt_tokens=prompt_tokens(msgs, previous_total=previous_total, tools_chars=tools_chars),
        tool_results_n=n,
        tool_result_errors=tuple(errs),
        tool_result_tokens=tuple(toks),
        n_tools_offered=len(tools) if isinstance(tools, list) else 0,
        wants_json=isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"),
        requested_model=req.requested,
        protocol="chat",
        estimated=True,
        segments=MessageSegments(body),
        **kw,
    )


def _model_span(raw: bytes) -> tuple[int, int] | None:
    """Where the top-level ``"model": "..."`` pair is, when it is the body's first or last member
    (what SDKs send); None otherwise. O(1) in the body's size: only its two ends are read."""
    head = raw.find(b'"model"', 0, 64)
    if head >= 0 and raw[:head].strip() == b"{":
        m = _MODEL_RE.match(raw, head)
        if m is not None:
            return m.start(), m.end()
    tail = raw.rfind(b'"model"', max(0, len(raw) - 4096))
    if tail >= 0:
        m = _MODEL_RE.match(raw, tail)
        if m is not None and raw[m.end() :].strip() == b"}" and raw[:tail].rstrip().endswith(b","):
            return m.start(), m.end()
    return None


def rewrite_body(raw: bytes, body: dict[str, Any], model: str, include_usage: bool) -> bytes:
    """The client's bytes with ``model`` set (and ``stream_options.include_usage`` when asked).

    A byte splice when the top-level ``model`` pair is the body's first or last member, or absent
    (then inserted first); otherwise one orjson re-serialisation of the parsed body."""
    so = body.get("stream_options")
    need_usage = include_usage and not (isinstance(so, dict) and so.get("include_usage") is True)
    if need_usage and so is not None:
        return _reserialise(body, model, True)
    new_model = b'"model":' + orjson.dumps(model)
    if isinstance(body.get("model"), str):
        span = _model_span(raw)
        if span is None:
            return _reserialise(body, model, need_usage)
        raw = raw[: span[0]] + new_model + raw[span[1] :]
        prefix = b""
    elif "model" not in body:
        prefix = new_model + b","
    else:
        return _reserialise(body, model, need_usage)
    if need_usage:
        prefix += b'"stream_options":{"include_usage":true},'
    if prefix:
        j = raw.find(b"{")
        raw = raw[: j + 1] + prefix + raw[j + 1 :]
    return raw


def _reserialise(body: dict[str, Any], model: str, need_usage: bool) -> bytes:
    out = dict(body)
    out["model"] = model
    if need_usage:
        so = out.get("stream_options")
        so = dict(so) if isinstance(so, dict) else {}
        so["include_usage"] = True
        out["stream_options"] = so
    return orjson.dumps(out)


def tool_key(name: str, args: str) -> str:
    return hashlib.blake2b(f"{name}\x00{args}".encode(), digest_size=8).hexdigest()


@dataclass
class Capture:
    """Usage and tool calls seen in an upstream answer (JSON or SSE)."""

    strip_usage: bool = False
    usage: dict[str, Any] | None = None
    tool_names: dict[int, str] = field(default_factory=dict)
    tool_args: dict[int, str] = field(default_factory=dict)
    markers: tuple[bytes, ...] | None = (b'"usage"', b'"tool_calls"')
    translating: bool = False

    def json(self, data: bytes) -> bytes:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if isinstance(obj, dict):
            self.read(obj)
        return data

    def finish_stream(self) -> bytes:
        return b""

    def response_id(self) -> str | None:
        return None

    def read(self, obj: dict[str, Any]) -> None:
        """Usage and tool calls of a ``chat.completion`` object."""
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = u
        ch = obj.get("choices")
        if isinstance(ch, list) and ch and isinstance(ch[0], dict):
            msg = ch[0].get("message") or {}
            calls = msg.get("tool_calls") if isinstance(msg, dict) else None
            for i, tc in enumerate(calls if isinstance(calls, list) else ()):
                fn = tc.get("function") if isinstance(tc, dict) else None
                fn = fn if isinstance(fn, dict) else {}
                self.tool_names[i] = str(fn.get("name") or "")
                self.tool_args[i] = str(fn.get("arguments") or "")

    def event(self, ev: bytes) -> bytes | None:
        """Inspect one SSE event that mentions usage/tool_calls; return bytes to relay (None = drop)."""
        i = ev.find(b"data:")
        if i < 0:
            return ev
        payload = ev[i + 5 :].strip()
        if payload == b"[DONE]":
            return ev
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return ev
        if not isinstance(obj, dict):
            return ev
        self.read_chunk(obj)
        if self.strip_usage and isinstance(obj.get("usage"), dict):
            if not obj.get("choices"):
                return None
            del obj["usage"]
            return ev[:i] + b"data: " + orjson.dumps(obj)
        return ev

    def read_chunk(self, obj: dict[str, Any]) -> None:
        """Usage and tool-call deltas of one ``chat.completion.chunk``."""
        for ch in obj.get("choices") or ():
            delta = ch.get("delta") if isinstance(ch, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for tc in calls if isinstance(calls, list) else ():
                if not isinstance(tc, dict):
                    continue
                idx = tc.get("index", 0)
                idx = idx if isinstance(idx, int) else 0
                f = tc.get("function")
                fn: dict[str, Any] = f if isinstance(f, dict) else {}
                if fn.get("name"):
                    self.tool_names[idx] = str(fn["name"])
                if fn.get("arguments"):
                    self.tool_args[idx] = self.tool_args.get(idx, "") + str(fn["arguments"])
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = u

    def counts(self) -> tuple[int | None, int | None, int]:
        """``(prompt, cached, completion)`` from the captured usage (None where absent)."""
        u = self.usage or {}
        p = u.get("prompt_tokens")
        prompt = int(p) if isinstance(p, int) and p >= 0 else None
        details = u.get("prompt_tokens_details")
        c = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = int(c) if isinstance(c, int) and c >= 0 else None
        comp = u.get("completion_tokens")
        completion = int(comp) if isinstance(comp, int) and comp >= 0 else 0
        return prompt, cached, completion

    def tools(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(names, keys)`` of the captured tool calls, in index order."""
        order = sorted(self.tool_names)
        names = tuple(self.tool_names[k] for k in order)
        keys = tuple(tool_key(self.tool_names.get(k, ""), self.tool_args.get(k, "")) for k in order)
        return names, keys

    def call_args(self) -> tuple[str, ...]:
        """Each captured call's raw arguments text, in :meth:`tools`' order."""
        return tuple(self.tool_args.get(k, "") for k in sorted(self.tool_names))


class ChatAdapter:
    """Chat Completions as a :class:`router.server.protocol.Adapter`."""

    name = "chat"
    path = "/v1/chat/completions"

    def read(
        self, raw: bytes, models: Mapping[str, str], aliases: Any = None, max_depth: int = DEFAULT_MAX_DEPTH
    ) -> ClientRequest:
        return read_request(raw, models, aliases, max_depth)

    def step_request(self, req: ClientRequest, previous_total: int | None, **kw: Any) -> StepRequest:
        return step_request(req, previous_total, **kw)

    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]:
        return chat_opening(req.body.get("messages") or [])

    def natural_id(self, req: ClientRequest, headers: Mapping[str, str]) -> tuple[str, str] | None:
        return None

    def user(self, req: ClientRequest) -> str | None:
        u = req.body.get("user")
        return u if isinstance(u, str) and u else None

    def outbound(self, req: ClientRequest, backend_protocol: str, model: str, backend: str = "") -> bytes:
        if backend_protocol == "chat":
            return rewrite_body(req.raw, req.body, model, req.stream)
        from router.server.translate import chat_to_messages

        return orjson.dumps(chat_to_messages(req.body, model))

    def capture(self, req: ClientRequest, backend_protocol: str) -> Any:
        if backend_protocol == "chat":
            return Capture(strip_usage=req.strip_usage)
        from router.server.translate_stream import translating_capture

        return translating_capture(req, backend_protocol)

    def error_body(self, status: int, code: str, message: str) -> bytes:
        return error_body(status, code, message)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return b"data: " + error_body(status, code, message) + b"\n\n"

    def error_response(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> Any:
        return error_response(status, code, message, headers)


def chat_opening(messages: list[Any]) -> tuple[str | None, str | None, bool]:
    """``(system text, first user text, is_opening)`` of a message list: the first
    system/developer message, the first user message, and whether no assistant turn came yet."""
    system = user = None
    opening = True
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer"):
            if system is None:
                system = text_of(m.get("content"))
        elif role == "user":
            if user is None:
                user = text_of(m.get("content"))
        elif role in ("assistant", "tool", "function"):
            opening = False
            break
    return system, user, opening
