"""Anthropic Messages, the protocol side: ``POST /v1/messages`` (and ``/v1/messages/count_tokens``).

Reading (:class:`MessagesAdapter`.read): a JSON object with ``messages`` (a non-empty list of
``{"role": "user" | "assistant", "content": string | [blocks]}``; block types are checked against
the API's set, so an unknown one is a 400 here instead of a 5xx upstream, and every block field the
sidecar reads has its type: ``text.text``, ``tool_use.id/name/input``, ``tool_result.tool_use_id/
content/is_error`` and the blocks inside its content, ``image.source``, ``thinking.thinking``), ``max_tokens`` (a
positive integer; ``count_tokens`` bodies need none), ``system`` (a string or a list of ``text``
blocks), ``tools`` (a list of objects with a ``name``), ``tool_choice``, ``stop_sequences``,
``temperature``/``top_p``/``top_k``, ``stream``, ``metadata``. ``cache_control``
markers, ``thinking`` settings and blocks, and every other field pass through untouched. A body
that continues a conversation read before is parsed incrementally (:mod:`router.server.protocols.incremental`,
the ``messages`` list): only its new messages and its other fields are checked, anything else takes
the full parse, so the request or the error is the full parse's.

The step the engine sees: the prompt estimate (:func:`features.tokens.prompt_tokens` over the
messages, the system prompt and the tool definitions at a run's first step; the run's previous
prompt + completion + the turns after the last assistant message later), the ``tool_result``
blocks after the last assistant message (count, estimated size, error flag: ``is_error`` or the
shared text rule), tools offered, no JSON mode (Messages has none).

Capture (:class:`MessagesReader`): usage as Anthropic reports it, ``input_tokens`` being only the
uncached remainder: prompt = ``input_tokens + cache_creation_input_tokens +
cache_read_input_tokens``, cached = ``cache_read_input_tokens``, completion = ``output_tokens``
(the stream's ``message_start`` carries the input side, ``message_delta`` the cumulative output);
tool calls from ``tool_use`` blocks (the name, the JSON of ``input`` or the streamed
``input_json_delta`` pieces -> the loop key).

Errors: Anthropic's shape ``{"type": "error", "error": {"type": ..., "message": ...}}`` (plus the
sidecar's ``code``), 422-class validation failures answered 400 as the API does; a stream that
fails mid-way ends with an ``event: error``.

Run identity (``natural_id``): Claude Code's session (the ``x-claude-code-session-id`` header, or
the ``session_<uuid>`` part of its ``metadata.user_id``); a plain ``metadata.user_id`` is the user,
which scopes the opening hash (:mod:`router.server.runs.identity`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

from features.tokens import content_chars, prompt_tokens, text_tokens
from router.server.errors import ProxyError
from router.server.protocols.base import Adapter, AnswerReader, ClientRequest, JSONObject, since_assistant
from router.server.protocols.sse import text_of

__all__ = [
    "MessagesAdapter",
    "MessagesReader",
    "BLOCK_TYPES",
    "anthropic_error",
    "count_tokens_estimate",
    "validate",
]

BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "tool_reference",
    }
)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}
_SESSION_RE = re.compile(r"session_([0-9A-Za-z-]{8,64})")


def anthropic_error(status: int, code: str, message: str) -> bytes:
    t = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": t, "message": message, "code": code}})


def _bad(message: str, code: str = "invalid_request") -> ProxyError:
    return ProxyError(400, code, message)


def validate(body: object, *, need_max_tokens: bool = True) -> None:
    """Raise ProxyError(400) for a body the Messages API would refuse (module docstring)."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", "body_not_object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages: must be a non-empty list", "invalid_messages")
    _check_messages(msgs)
    _check_fields(body, need_max_tokens)


def _check_messages(msgs: list[object], start: int = 0) -> None:
    """Each message of ``msgs`` (numbered from ``start``): an object, its role and content blocks."""
    for i, m in enumerate(msgs, start):
        if not isinstance(m, dict):
            raise _bad(f"messages.{i}: must be an object", "invalid_messages")
        if m.get("role") not in ("user", "assistant"):
            raise _bad(
                f"messages.{i}.role: must be 'user' or 'assistant', got {m.get('role')!r}", "invalid_role"
            )
        c = m.get("content")
        if isinstance(c, str):
            continue
        if not isinstance(c, list):
            raise _bad(f"messages.{i}.content: must be a string or a list of blocks", "invalid_content")
        for j, b in enumerate(c):
            _check_block(b, f"messages.{i}.content.{j}")


def _check_fields(body: Mapping[str, object], need_max_tokens: bool = True) -> None:
    """Every field but ``messages`` (:func:`validate`'s order)."""
    mt = body.get("max_tokens")
    if need_max_tokens and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise _bad("max_tokens: must be a positive integer", "invalid_max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list) or not all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in system
        ):
            raise _bad("system: must be a string or a list of text blocks", "invalid_system")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(
            isinstance(t, dict)
            and isinstance(t.get("name"), str)
            and isinstance(t.get("type"), (str, type(None)))
            and isinstance(t.get("input_schema"), (dict, type(None)))
            and isinstance(t.get("description"), (str, type(None)))
            for t in tools
        )
    ):
        raise _bad(
            "tools: must be a list of objects with a name (type and description strings, "
            "input_schema an object)",
            "invalid_tools",
        )
    tc = body.get("tool_choice")
    if tc is not None and not (
        isinstance(tc, dict)
        and tc.get("type") in ("auto", "any", "none", "tool")
        and (tc.get("type") != "tool" or isinstance(tc.get("name"), str))
    ):
        raise _bad(
            "tool_choice: must be an object whose type is auto, any, none or tool (with a name)",
            "invalid_tool_choice",
        )
    stop = body.get("stop_sequences")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(x, str) for x in stop)):
        raise _bad("stop_sequences: must be a list of strings", "invalid_stop_sequences")
    for k in ("temperature", "top_p", "top_k"):
        v = body.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _bad(f"{k}: must be a number", f"invalid_{k}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream: must be a boolean", "invalid_stream")
    meta = body.get("metadata")
    if meta is not None and (
        not isinstance(meta, dict) or not isinstance(meta.get("user_id", ""), (str, type(None)))
    ):
        raise _bad("metadata: must be an object whose user_id is a string", "invalid_metadata")


#: the fields of a content block the sidecar reads (estimates, translation), by block type: each
#: must be absent or of the given types; ``None`` in a tuple allows null
_BLOCK_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "text": {"text": (str,)},
    "image": {"source": (dict,)},
    "tool_use": {"id": (str,), "name": (str,), "input": (dict, type(None))},
    "tool_result": {
        "tool_use_id": (str,),
        "content": (str, list, type(None)),
        "is_error": (bool, type(None)),
    },
    "thinking": {"thinking": (str,)},
}
_REQUIRED = {"text": ("text",), "tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}


def _check_block(b: object, where: str, nested: bool = False) -> None:
    """One content block: an object with a known ``type`` whose read fields have their types (a
    ``tool_result``'s ``content`` list holds blocks too, checked the same way)."""
    if not isinstance(b, dict):
        raise _bad(f"{where}: unknown block type {type(b).__name__!r}", "invalid_block_type")
    t = b.get("type")
    if not isinstance(t, str) or t not in BLOCK_TYPES:
        raise _bad(f"{where}: unknown block type {t!r}", "invalid_block_type")
    for k in _REQUIRED.get(t, ()):
        if k not in b:
            raise _bad(f"{where}.{k}: Field required", "invalid_block")
    for k, types in _BLOCK_FIELDS.get(t, {}).items():
        v = b.get(k)
        if k in b and not isinstance(v, types):
            names = " or ".join("null" if x is type(None) else x.__name__ for x in types)
            raise _bad(f"{where}.{k}: must be {names}", "invalid_block")
    if t == "tool_result" and isinstance(b.get("content"), list) and not nested:
        for j, inner in enumerate(b["content"]):
            _check_block(inner, f"{where}.content.{j}", nested=True)


def count_tokens_estimate(body: Mapping[str, object]) -> int:
    """The sidecar's estimate of a Messages prompt (features.tokens; no tokenizer here)."""
    msgs = body.get("messages")
    msgs = msgs if isinstance(msgs, list) else []
    system = body.get("system")
    tools = body.get("tools")
    extra = content_chars(system) + (len(orjson.dumps(tools)) if isinstance(tools, list) else 0)
    return prompt_tokens(msgs) + text_tokens(extra)


def _is_assistant(m: JSONObject) -> bool:
    return m.get("role") == "assistant"


class MessagesAdapter(Adapter):
    """Anthropic Messages as a :class:`router.server.protocols.base.Adapter`."""

    name = "messages"
    path = "/v1/messages"
    not_object_status = 400

    def __init__(self, session_header: str = "x-claude-code-session-id"):
        self.session_header = session_header.lower()

    incremental_list = b'"messages"'

    def validate(self, body: Mapping[str, object]) -> None:
        validate(body)

    def validate_incremental(self, body: Mapping[str, object], new: list[object]) -> bool:
        """:meth:`validate` of the new messages and every other field (the earlier messages passed
        it already; any error sends the body to the full parse, which gives it)."""
        _check_messages(new)
        _check_fields(body)
        return True

    def tool_results(self, body: Mapping[str, object]) -> list[tuple[object, bool]]:
        out: list[tuple[object, bool]] = []
        for m in since_assistant(body.get("messages"), _is_assistant):
            c = m.get("content")
            for b in c if isinstance(c, list) else ():
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append((b.get("content"), bool(b.get("is_error"))))
        return out

    def prompt_estimate(self, req: ClientRequest, previous_total: int | None) -> int:
        if previous_total is None:
            return count_tokens_estimate(req.body)
        return prompt_tokens(req.body["messages"], previous_total=previous_total)

    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]:
        body = req.body
        system = text_of(body.get("system"))
        user = None
        opening = True
        for m in body["messages"]:
            if m.get("role") == "assistant":
                opening = False
                break
            if user is None:
                user = _user_text(m.get("content"))
        return system, user, opening

    def natural_id(self, req: ClientRequest, headers: Mapping[str, str]) -> tuple[str, str] | None:
        sid = headers.get(self.session_header)
        if sid:
            return "cc-" + sid.strip(), "session"
        uid = self._user_id(req)
        if uid:
            m = _SESSION_RE.search(uid)
            if m:
                return "cc-" + m.group(1), "session"
        return None

    def user(self, req: ClientRequest) -> str | None:
        uid = self._user_id(req)
        m = _SESSION_RE.search(uid) if uid else None
        if uid and m:
            return uid[: m.start()].rstrip("_") or None
        return uid

    @staticmethod
    def _user_id(req: ClientRequest) -> str | None:
        meta = req.body.get("metadata")
        uid = meta.get("user_id") if isinstance(meta, dict) else None
        return uid if isinstance(uid, str) and uid else None

    def translated(self, body: Mapping[str, object], backend_protocol: str, model: str) -> JSONObject:
        from router.server.protocols.translate import messages_to_chat

        return messages_to_chat(body, model)

    def reader(self, req: ClientRequest) -> MessagesReader:
        return MessagesReader()

    def http_status(self, status: int) -> int:
        return _status(status)

    def error_body(self, status: int, code: str, message: str) -> bytes:
        return anthropic_error(_status(status), code, message)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return b"event: error\ndata: " + anthropic_error(status, code, message) + b"\n\n"


def _status(status: int) -> int:
    return 400 if status == 422 else status


def _user_text(content: object) -> str | None:
    if isinstance(content, list):  # the first user turn's text blocks (tool results excluded)
        return "".join(
            t
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(t := b.get("text", ""), str)
        )
    return text_of(content)


class MessagesReader(AnswerReader):
    """Usage and tool calls of an Anthropic Messages answer (JSON or SSE); passes bytes through."""

    markers = (b'"usage"', b'"tool_use"', b"input_json_delta")

    def __init__(self) -> None:
        super().__init__()
        self.usage: JSONObject = {}

    def read(self, obj: JSONObject) -> None:
        """A whole ``message`` object."""
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage.update(u)
        content = obj.get("content")
        for i, b in enumerate(content if isinstance(content, list) else ()):
            if isinstance(b, dict) and b.get("type") == "tool_use":
                self.tool_names[i] = str(b.get("name") or "")
                self.tool_args[i] = orjson.dumps(b.get("input") or {}).decode()

    def read_event(self, obj: JSONObject) -> None:
        t = obj.get("type")
        if t == "message_start":
            msg = obj.get("message")
            if isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
                self.usage.update(msg["usage"])
        elif t == "message_delta":
            u = obj.get("usage")
            if isinstance(u, dict):
                self.usage.update({k: v for k, v in u.items() if v is not None})
        elif t == "content_block_start":
            b = obj.get("content_block")
            idx = obj.get("index", 0)
            if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(idx, int):
                self.tool_names[idx] = str(b.get("name") or "")
                self.tool_args[idx] = ""
        elif t == "content_block_delta":
            d = obj.get("delta")
            idx = obj.get("index", 0)
            if isinstance(d, dict) and d.get("type") == "input_json_delta" and isinstance(idx, int):
                if idx in self.tool_names:
                    self.tool_args[idx] += str(d.get("partial_json") or "")

    def counts(self) -> tuple[int | None, int | None, int]:
        u = self.usage

        def num(k: str) -> int | None:
            v = u.get(k)
            return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        inp, cw, cr = num("input_tokens"), num("cache_creation_input_tokens"), num("cache_read_input_tokens")
        prompt = None if inp is None else inp + (cw or 0) + (cr or 0)
        return prompt, cr, num("output_tokens") or 0

    def call_key(self, args: str) -> str:
        """Streamed ``partial_json`` and a whole ``input`` object give the same key."""
        return _canon(args)


def _canon(args: str) -> str:
    """Streamed ``partial_json`` and a whole ``input`` object give the same key."""
    try:
        return orjson.dumps(orjson.loads(args), option=orjson.OPT_SORT_KEYS).decode() if args else "{}"
    except orjson.JSONDecodeError:
        return args
