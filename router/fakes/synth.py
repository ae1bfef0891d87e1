"""Completion synthesis for the fakes: a deterministic answer (text, JSON or one tool call) per request.

Algorithm: the request's seed (:func:`router.fakes.protocol.parse_request`) drives a
``random.Random``; text is words of at most 4 characters separated by one space, so a completion of
``n`` words is exactly ``n`` tokens of the fakes' tokeniser; a tool call's arguments and JSON content
follow the request's JSON schema (enum, integer, number, boolean, array, object; depth-limited).

Knobs (arguments of :func:`synthesize`, the fakes' ``CommonKnobs``): ``default_tokens`` (length
without max_tokens), ``max_tokens_cap`` (upper bound on any length), ``tool_call_rate`` (chance of a
tool call under tool_choice "auto"), ``malformed_tool_call_rate`` (chance that a tool call's
arguments lose their closing byte: JSON that does not parse, as a small model's cut-off call).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.fakes.protocol import ParsedRequest, tokenize

__all__ = ["Completion", "synthesize"]

_WORDS = (
    "the a to of and in is it for on with as at by an be or we do if so up no go run fix add "
    "test code file line path call tool step plan edit read list data next then done ok yes "
    "more fast slow cach load send wait keep view open make find grep diff note use try"
).split()


@dataclass(slots=True)
class Completion:
    """What the fake 'generated': text or one tool call, its token count and finish reason."""

    content: str | None
    tool_name: str | None
    tool_arguments: str | None
    completion_tokens: int
    finish_reason: str
    pieces: list[str] = field(default_factory=list)  # streamed deltas (content or argument pieces)


def _value_for(schema: object, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return " ".join(rng.choice(_WORDS) for _ in range(2))
    if "enum" in schema and schema["enum"]:
        return schema["enum"][rng.randrange(len(schema["enum"]))]
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t == "integer":
        return rng.randrange(0, 100)
    if t == "number":
        return round(rng.random() * 100, 2)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [] if depth > 2 else [_value_for(schema.get("items"), rng, depth + 1)]
    if t == "object" or "properties" in schema:
        return _object_for(schema, rng, depth + 1)
    return " ".join(rng.choice(_WORDS) for _ in range(2))


def _object_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props = schema.get("properties") or {}
    if depth > 3 or not isinstance(props, dict):
        return {}
    required = schema.get("required")
    names = [k for k in props if not required or k in required] or list(props)
    return {k: _value_for(props[k], rng, depth) for k in names}


def synthesize(
    req: ParsedRequest,
    *,
    default_tokens: int,
    max_tokens_cap: int,
    tool_call_rate: float,
    malformed_tool_call_rate: float = 0.0,
) -> Completion:
    """Make a deterministic completion for a request (same request + seed -> same answer).

    Length: ``min(max_tokens, max_tokens_cap)`` when the request sets max_tokens (finish "length" if
    the request's own limit was the binding one), else ``default_tokens``. With tools and tool_choice
    not "none": a tool call (the named tool, else one picked by the seed) with arguments built from
    the tool's JSON schema, when tool_choice is "required"/named or with probability tool_call_rate
    for "auto". With response_format json_object / json_schema: JSON content.
    """
    rng = random.Random(req.seed)
    limit = req.max_tokens
    n = min(limit, max_tokens_cap) if limit is not None else default_tokens
    n = max(1, n)
    finish = "length" if limit is not None and limit <= max_tokens_cap else "stop"
    tc = req.tool_choice
    if (
        req.tools
        and tc != "none"
        and (tc == "required" or isinstance(tc, dict) or rng.random() < tool_call_rate)
    ):
        if isinstance(tc, dict):
            name = tc["function"]["name"]
            tool = next(t for t in req.tools if t["function"]["name"] == name)
        else:
            tool = req.tools[rng.randrange(len(req.tools))]
        params = tool["function"].get("parameters") or {}
        args = orjson.dumps(_object_for(params, rng) if isinstance(params, dict) else {}).decode()
        if malformed_tool_call_rate and rng.random() < malformed_tool_call_rate:
            args = args[:-1]  # the closing brace lost: does not parse
        ntok = len(
            tokenize(f'<tool_call>{{"name":"{tool["function"]["name"]}","arguments":{args}}}</tool_call>')
        )
        mid = max(1, len(args) // 2)
        return Completion(None, tool["function"]["name"], args, ntok, "tool_calls", [args[:mid], args[mid:]])
    words = [rng.choice(_WORDS) for _ in range(n)]
    if req.response_format is not None:
        rf = req.response_format
        schema = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
        obj = _object_for(schema, rng) if isinstance(schema, dict) else {"answer": " ".join(words)}
        text = orjson.dumps(obj).decode()
        ntok = len(tokenize(text))
        step = max(1, len(text) // max(1, min(n, 16)))
        return Completion(
            text, None, None, ntok, "stop", [text[i : i + step] for i in range(0, len(text), step)]
        )
    pieces = [words[0]] + [" " + w for w in words[1:]]
    return Completion("".join(pieces), None, None, n, finish, pieces)
