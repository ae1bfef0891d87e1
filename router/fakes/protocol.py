"""What the fakes read: chat-completions request parsing, the chat template and a tokeniser stand-in.

Chat template (deterministic, documented so tests can reason about token prefixes):
``<|tools|>\\n{tools as sorted JSON}<|end|>\\n`` when tools are given, then for each message in order
``<|{role}|>\\n{text}{tool calls}<|end|>\\n`` (an assistant message's tool calls are rendered as
``<tool_call>{"name":..,"arguments":..}</tool_call>``; a tool message's ``tool_call_id`` is not
rendered), then the generation prompt ``<|assistant|>\\n``. Because messages are rendered in order and
nothing is rendered after the generation prompt, a later step of a run (earlier messages + the
assistant's answer + tool results) has the earlier step's prompt text as a text prefix.

Tokeniser stand-in: ``re.findall(r"\\s*\\S{1,4}|\\s+", text)``: leading whitespace is glued to the next
run of up to 4 non-space characters; a trailing whitespace run is one token. It is prefix-stable: if
text A is a prefix of text B, every token of A except possibly the last is a token of B at the same
position (like a real BPE, only the boundary token may change). English text gives ~3.5 chars/token.
A prompt is tokenised segment by segment (the tools block, each rendered message, the generation
prompt), so a message boundary is always a token boundary (as special tokens make it in real
templates) and the tokens of earlier messages are memoised per server (``TokenMemo``).

Request parsing (:func:`parse_request`) validates the fields the fakes act on and raises
:class:`FakeRequestError` (status, OpenAI-style type/code/param) on bad input; the seed of the
synthesised answer is the CRC32 of the rendered prompt xor the request's ``seed``.

Knobs: ``TokenMemo(max_entries)`` (4096 segments, then cleared).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "FakeRequestError",
    "ParsedRequest",
    "TokenMemo",
    "error_body",
    "parse_request",
    "parse_body",
    "load_body",
    "prompt_tokens",
    "render_prompt",
    "render_segments",
    "tokenize",
]

_TOKEN_RE = re.compile(r"\s*\S{1,4}|\s+")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class FakeRequestError(Exception):
    """A request the fake refuses, with the HTTP status and OpenAI-style error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "BadRequestError",
        code: str | int | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code if code is not None else status
        self.param = param


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def tokenize(text: str) -> list[str]:
    """The deterministic tokeniser stand-in (see the module docstring)."""
    return _TOKEN_RE.findall(text)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones, in order
        out = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    out.append(str(part.get("text", "")))
                elif part.get("type") in ("image_url", "input_audio", "file"):
                    out.append("<|media|>")
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    raise FakeRequestError(400, "message content must be a string or a list of content parts")


class TokenMemo:
    """Memo of segment text -> tokens (earlier messages of a run recur in every later step).

    Bounded: cleared when it holds ``max_entries`` segments. One per server, never shared globally.
    """

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._memo: dict[str, list[str]] = {}

    def tokens(self, segment: str) -> list[str]:
        hit = self._memo.get(segment)
        if hit is None:
            if len(self._memo) >= self.max_entries:
                self._memo.clear()
            hit = self._memo[segment] = tokenize(segment)
        return hit


def prompt_tokens(segments: Sequence[str], memo: TokenMemo | None = None) -> list[str]:
    """Tokens of a rendered prompt: each template segment is tokenised on its own."""
    out: list[str] = []
    for seg in segments:
        out.extend(memo.tokens(seg) if memo is not None else tokenize(seg))
    return out


def render_prompt(messages: Sequence[object], tools: Sequence[object] | None = None) -> str:
    """Render messages (and tools) with the fake's chat template; see the module docstring."""
    return "".join(render_segments(messages, tools))


def render_segments(messages: Sequence[object], tools: Sequence[object] | None = None) -> list[str]:
    """The template's segments: the tools block, one per message, the generation prompt."""
    parts: list[str] = []
    if tools:
        parts.append(
            "<|tools|>\n" + orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS).decode() + "<|end|>\n"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise FakeRequestError(400, f"messages[{i}] must be an object")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise FakeRequestError(400, f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}")
        text = _content_text(m.get("content"))
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise FakeRequestError(400, f"messages[{i}].tool_calls must be a list")
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict):
                    raise FakeRequestError(400, f"messages[{i}].tool_calls[].function must be an object")
                text += (
                    '<tool_call>{"name":'
                    + orjson.dumps(fn.get("name", "")).decode()
                    + ',"arguments":'
                    + orjson.dumps(fn.get("arguments", "")).decode()
                    + "}</tool_call>"
                )
        parts.append(f"<|{role}|>\n{text}<|end|>\n")
    parts.append("<|assistant|>\n")
    return parts


@dataclass(slots=True)
class ParsedRequest:
    """The fields of a chat-completions request the fakes act on (the rest is ignored)."""

    model: str | None
    prompt: str
    tokens: list[str]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    tools: list[dict[str, Any]]
    tool_choice: Any
    response_format: dict[str, Any] | None
    seed: int
    segments: list[str] | None = None  # the template's segments (tools, messages, generation prompt)
    tool_results: int = 0  # tool messages in the request (the run's tool turns so far)


def parse_request(raw: bytes, memo: TokenMemo | None = None) -> ParsedRequest:
    """Parse and validate a chat-completions body; raise FakeRequestError(400) on bad input."""
    return parse_body(load_body(raw), memo)


def load_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise FakeRequestError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise FakeRequestError(400, "request body must be a JSON object")
    return body


def parse_body(body: dict[str, Any], memo: TokenMemo | None = None) -> ParsedRequest:
    """Validate a chat-completions body (a dict); raise FakeRequestError(400) on bad input."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FakeRequestError(400, "'messages' must be a non-empty list")
    n = body.get("n")
    if n not in (None, 1):
        raise FakeRequestError(400, "the fake backend supports only n=1")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise FakeRequestError(400, "'tools' must be a list")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FakeRequestError(
                400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
            )
    tool_choice = body.get("tool_choice")
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in {t["function"]["name"] for t in tools}:
            raise FakeRequestError(400, f"tool_choice names a tool not in 'tools': {name!r}")
    elif tool_choice not in (None, "none", "auto", "required"):
        raise FakeRequestError(400, f"invalid tool_choice: {tool_choice!r}")
    if tool_choice == "required" and not tools:
        raise FakeRequestError(400, "tool_choice 'required' needs 'tools'")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise FakeRequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    rf = body.get("response_format")
    if rf is not None and (
        not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema")
    ):
        raise FakeRequestError(400, f"invalid response_format: {rf!r}")
    stream = body.get("stream") is True
    so = body.get("stream_options")
    include_usage = bool(stream and isinstance(so, dict) and so.get("include_usage"))
    segments = render_segments(messages, tools)
    prompt = "".join(segments)
    seed = body.get("seed")
    seed = zlib.crc32(prompt.encode()) ^ (seed if isinstance(seed, int) else 0)
    model = body.get("model")
    return ParsedRequest(
        model=model if isinstance(model, str) else None,
        prompt=prompt,
        tokens=prompt_tokens(segments, memo),
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        response_format=rf if rf and rf.get("type") != "text" else None,
        seed=seed,
        segments=segments,
        tool_results=sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool"),
    )
