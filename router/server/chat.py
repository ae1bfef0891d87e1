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
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from features.tokens import content_chars, prompt_tokens, text_tokens
from router.core.record import StepRequest
from router.server.errors import ProxyError
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

__all__ = ["ChatRequest", "Capture", "read_request", "rewrite_body", "tool_key", "AUTO_MODELS"]

_MODEL_RE = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
_ERR_WORDS = ("error", "exception", "traceback")
AUTO_MODELS = frozenset({"auto", "runroute-auto"})


@dataclass(slots=True)
class ChatRequest:
    """A validated chat-completions body and what the router reads from it."""

    raw: bytes
    body: dict[str, Any]
    requested: str | None  # a concrete model, None for auto
    stream: bool
    strip_usage: bool  # the client did not ask for the usage chunk


def read_request(raw: bytes, models: dict[str, str], max_depth: int = DEFAULT_MAX_DEPTH) -> ChatRequest:
    """Parse and validate (:mod:`router.server.validate` for every field the router reads);
    raises :class:`ProxyError` (4xx) for bad input."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProxyError(422, "body_not_object", "request body must be a JSON object")
    check_depth(raw, body, max_depth)
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
    requested = None if model in AUTO_MODELS else model
    if requested is not None and requested not in models:
        raise ProxyError(
            404,
            "model_not_found",
            f"model {requested!r} is not served here; use 'auto' or one of {sorted(models)}",
        )
    so = body.get("stream_options")
    check_stream_options(so)
    check_tools(body.get("tools"))
    check_metadata(body.get("metadata"))
    check_optional_str(body.get("user"), "user")
    check_object(body.get("response_format"), "response_format")
    strip = stream and not (isinstance(so, dict) and so.get("include_usage") is True)
    return ChatRequest(raw, body, requested, stream, strip)


def _looks_error(c: Any) -> bool:
    if isinstance(c, str):
        head = c[:200]
    elif isinstance(c, list):
        head = " ".join(
            p.get("text", "") for p in c[:4] if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
        head = head[:200]
    else:  # validated content is a string, a list or null: nothing else is stringified
        head = ""
    head = head.lower()
    return any(w in head for w in _ERR_WORDS)


def step_request(req: ChatRequest, previous_total: int | None, **kw: Any) -> StepRequest:
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

    def json(self, data: bytes) -> None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
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
            if self.strip_usage:
                if not obj.get("choices"):
                    return None
                del obj["usage"]
                return ev[:i] + b"data: " + orjson.dumps(obj)
        return ev

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
