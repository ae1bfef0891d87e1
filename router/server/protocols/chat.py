"""Chat Completions, the protocol side: read a request into a step, rewrite it, capture the answer.

Reading (:meth:`ChatAdapter.validate`, in :class:`router.server.protocols.base.Adapter`'s order): only ``model``, ``messages``, ``stream``, ``stream_options``,
``tools``, ``response_format``, ``metadata``, ``user`` are looked at; the rest passes through
untouched. The step the engine sees (:class:`router.core.record.StepRequest`): the prompt-size
estimate (:func:`features.tokens.prompt_tokens`: the run's previous prompt + completion + the
messages after the last assistant message, or the whole request at a run's first step), the tool
results after the last assistant message (count, estimated size, error flag: the result starts
with or mentions ``error``, ``exception`` or ``traceback`` in its first 200 characters), tools
offered and JSON mode.

Forwarding (:func:`router.server.protocols.base.rewrite_body`): the client's bytes with only ``model`` rewritten (a byte splice
when the body has exactly one ``"model": "..."`` pair, otherwise one orjson re-serialisation);
streaming requests also get ``stream_options.include_usage`` so usage (incl. cached tokens) is
always captured, and the usage-only chunk is removed again when the client did not ask for it.

Capture (:class:`ChatReader`): usage (prompt, cached = ``prompt_tokens_details.cached_tokens``,
completion) and tool calls (names, argument strings -> a key per call: a repeated key is a loop
signal) from a JSON answer or from the SSE events that mention ``usage`` or ``tool_calls``.

Logprobs (``ClientRequest.extra["logprobs"]``, set by the hot path for a local replica with
``local.request_logprobs``, :mod:`router.server.hotpath.posthoc`): ``"router"`` = the sidecar asked
and the client did not: :func:`add_logprobs` sets ``logprobs: true`` on the outgoing body (a
splice after the opening brace; one re-serialisation when the client's body has the key, e.g.
``false``), the reader keeps each token's logprob and :func:`null_logprobs` turns every
``"logprobs":`` value back into ``null`` (what vLLM sends when not asked) in the JSON answer and in
each SSE event (events with ``"logprobs":{`` are handed to the reader too); a chunk that exists
only for its logprobs (empty delta, no finish reason: vLLM sends one per token its tool parser
holds back, and none when not asked) is dropped; ``"client"`` = the client asked: read, relayed
as they came.

:class:`ChatAdapter` is this module as a :class:`router.server.protocols.base.Adapter` (the hot path's
interface and what the protocols share); a backend that does not speak Chat Completions (an Anthropic frontier) gets the request
translated by :mod:`router.server.protocols.translate`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from xxhash import xxh64_intdigest

from features.tokens import prompt_tokens
from router.core.prefix_index import Segments
from router.server.errors import ProxyError
from router.server.protocols.base import (
    AUTO_MODELS,
    Adapter,
    AnswerReader,
    ClientRequest,
    JSONObject,
    rewrite_body,
    since_assistant,
    tool_key,
)
from router.server.protocols.sse import text_of
from router.server.protocols.validate import (
    check_messages,
    check_metadata,
    check_object,
    check_optional_str,
    check_stream_options,
    check_tools,
)

__all__ = [
    "ChatReader",
    "ChatAdapter",
    "MessageSegments",
    "chat_opening",
    "add_logprobs",
    "null_logprobs",
    "rewrite_body",
    "tool_key",
    "AUTO_MODELS",
]


class MessageSegments:
    """The prefix index's lazy text view of a chat body (:class:`router.core.prefix_index.Segments`):
    segment 0 = the tools offered (JSON; empty without), segment ``i`` = message ``i - 1``'s role,
    text and tool calls. Only the segments the run's chainer asks for are built (O(new messages))."""

    __slots__ = ("msgs", "tools")

    def __init__(self, body: Mapping[str, object]):
        msgs, tools = body.get("messages"), body.get("tools")
        self.msgs: list[object] = msgs if isinstance(msgs, list) else []
        self.tools: list[object] | None = tools if isinstance(tools, list) else None

    def __len__(self) -> int:
        return len(self.msgs) + 1

    def __getitem__(self, i: int) -> str:
        if i == 0:
            return orjson.dumps(self.tools).decode() if self.tools else ""
        m = self.msgs[i - 1]
        if not isinstance(m, dict):  # validated messages are objects
            return ""
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


def _index(v: object) -> int:
    return v if isinstance(v, int) else 0


_LOGPROBS_KEY = b'"logprobs":'
_LOGPROBS_MARK = b'"logprobs":{'
# a JSON string (with its escapes) or one bracket: what skipping a value has to see
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')


def add_logprobs(out: bytes, body: Mapping[str, object]) -> bytes:
    """The outgoing chat body ``out`` with ``logprobs: true`` (``body``: the client's, parsed)."""
    if "logprobs" in body:  # the client's own value (false/null): replaced, not duplicated
        obj = orjson.loads(out)
        obj["logprobs"] = True
        return orjson.dumps(obj)
    j = out.find(b"{")
    return out[: j + 1] + b'"logprobs":true,' + out[j + 1 :]


def null_logprobs(data: bytes) -> bytes:
    """``data`` (a chat answer or SSE event, compact JSON as vLLM writes it) with every
    ``"logprobs":`` member whose value is an object or a list set to ``null``; the other bytes
    unchanged. Inside a JSON string every quote is escaped, so ``"logprobs":`` (unescaped quotes,
    no blank) is always a key; ``top_logprobs``/``prompt_logprobs`` do not match."""
    i = data.find(_LOGPROBS_MARK)
    if i < 0 and data.find(b'"logprobs":[') < 0:
        return data
    out: list[bytes] = []
    pos = 0
    i = data.find(_LOGPROBS_KEY)
    while i >= 0:
        v = i + len(_LOGPROBS_KEY)
        if data[v : v + 1] in (b"{", b"["):
            depth = 0
            for m in _JSON_TOKEN.finditer(data, v):
                t = m.group()
                if t in (b"{", b"["):
                    depth += 1
                elif t in (b"}", b"]"):
                    depth -= 1
                    if depth == 0:
                        out.append(data[pos:v])
                        out.append(b"null")
                        pos = m.end()
                        break
            else:  # unbalanced (a truncated body): left as it is
                break
        i = data.find(_LOGPROBS_KEY, max(v, pos))
    out.append(data[pos:])
    return b"".join(out)


def _logprobs_only(obj: JSONObject) -> bool:
    """A chunk vLLM sends only because logprobs were asked for: every choice has an empty delta, no
    finish reason, no token ids and a logprobs object (the tokens a tool parser held back; vLLM
    skips such a chunk when not asked, so the strip drops it)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or obj.get("usage") is not None:
        return False
    return all(
        isinstance(ch, dict)
        and ch.get("delta") == {}
        and ch.get("finish_reason") is None
        and ch.get("token_ids") is None
        and isinstance(ch.get("logprobs"), dict)
        for ch in choices
    )


def _token_logprobs(choice: object) -> list[float]:
    """The ``logprob`` of each token in a choice's ``logprobs.content`` (chat JSON and chunks)."""
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    content = lp.get("content") if isinstance(lp, dict) else None
    out: list[float] = []
    for t in content if isinstance(content, list) else ():
        v = t.get("logprob") if isinstance(t, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return out


class ChatReader(AnswerReader):
    """Usage and tool calls seen in a Chat Completions answer (JSON or SSE)."""

    markers: tuple[bytes, ...] = (b'"usage"', b'"tool_calls"')

    def __init__(self, strip_usage: bool = False, logprobs: str | None = None):
        super().__init__()
        self.strip_usage = strip_usage
        self.usage: JSONObject | None = None
        self.strip_logprobs = logprobs == "router"
        if logprobs is not None:
            self.markers = (*ChatReader.markers, _LOGPROBS_MARK)

    def json(self, data: bytes) -> bytes:
        data = super().json(data)
        return null_logprobs(data) if self.strip_logprobs else data

    def read(self, obj: JSONObject) -> None:
        """Usage and tool calls of a ``chat.completion`` object."""
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = u
        ch = obj.get("choices")
        if isinstance(ch, list) and ch and isinstance(ch[0], dict):
            self.logprobs.extend(_token_logprobs(ch[0]))
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
        self.read_event(obj)
        if self.strip_logprobs and _logprobs_only(obj):
            return None
        if self.strip_usage and isinstance(obj.get("usage"), dict):
            if not obj.get("choices"):
                return None
            del obj["usage"]
            ev = ev[:i] + b"data: " + orjson.dumps(obj)
        return null_logprobs(ev) if self.strip_logprobs else ev

    def read_event(self, obj: JSONObject) -> None:
        """Usage and tool-call deltas of one ``chat.completion.chunk``."""
        choices = obj.get("choices")
        for ch in choices if isinstance(choices, list) else ():
            if isinstance(ch, dict) and ch.get("index", 0) == 0:
                self.logprobs.extend(_token_logprobs(ch))
            delta = ch.get("delta") if isinstance(ch, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for tc in calls if isinstance(calls, list) else ():
                if not isinstance(tc, dict):
                    continue
                idx = _index(tc.get("index", 0))
                f = tc.get("function")
                fn: JSONObject = f if isinstance(f, dict) else {}
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


def _is_assistant(m: JSONObject) -> bool:
    return m.get("role") == "assistant"


class ChatAdapter(Adapter):
    """Chat Completions as a :class:`router.server.protocols.base.Adapter`."""

    name = "chat"
    path = "/v1/chat/completions"
    incremental_list = b'"messages"'

    def validate_incremental(self, body: Mapping[str, object], new: list[Any]) -> bool:
        """:meth:`validate` of the new messages only (the earlier ones passed it already)."""
        for m in new:
            if not isinstance(m, dict):
                return False
        check_messages(new)
        return isinstance(body.get("model", "auto"), str) and isinstance(body.get("stream", False), bool)

    def validate(self, body: Mapping[str, object]) -> None:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise ProxyError(
                422, "invalid_messages", "'messages' must be a non-empty list of message objects"
            )
        check_messages(msgs)
        if not isinstance(body.get("model", "auto"), str):
            raise ProxyError(422, "invalid_model", "'model' must be a string")
        if not isinstance(body.get("stream", False), bool):
            raise ProxyError(422, "invalid_stream", "'stream' must be a boolean")

    def validate_options(self, body: Mapping[str, object]) -> None:
        check_stream_options(body.get("stream_options"))
        check_tools(body.get("tools"))
        check_metadata(body.get("metadata"))
        check_optional_str(body.get("user"), "user")
        check_object(body.get("response_format"), "response_format")

    def strips_usage(self, body: Mapping[str, object]) -> bool:
        so = body.get("stream_options")
        return body.get("stream") is True and not (isinstance(so, dict) and so.get("include_usage") is True)

    def tool_results(self, body: Mapping[str, object]) -> list[tuple[object, bool]]:
        turns = since_assistant(body.get("messages"), _is_assistant)
        return [(m.get("content"), False) for m in turns if m.get("role") == "tool"]

    def prompt_estimate(self, req: ClientRequest, previous_total: int | None) -> int:
        msgs = req.body["messages"]
        tools = req.body.get("tools")
        tools_chars = len(orjson.dumps(tools)) if previous_total is None and isinstance(tools, list) else 0
        return prompt_tokens(msgs, previous_total=previous_total, tools_chars=tools_chars)

    def wants_json(self, body: Mapping[str, object]) -> bool:
        rf = body.get("response_format")
        return isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")

    def segments(self, body: Mapping[str, object]) -> Segments:
        return MessageSegments(body)

    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]:
        msgs = req.body.get("messages")
        return chat_opening(msgs if isinstance(msgs, list) else [])

    def asks_usage(self, req: ClientRequest) -> bool:
        return req.stream

    def translated(self, body: Mapping[str, object], backend_protocol: str, model: str) -> JSONObject:
        from router.server.protocols.translate import chat_to_messages

        return chat_to_messages(body, model)

    def reader(self, req: ClientRequest) -> ChatReader:
        return ChatReader(strip_usage=req.strip_usage, logprobs=req.extra.get("logprobs"))


def chat_opening(messages: Sequence[object]) -> tuple[str | None, str | None, bool]:
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
