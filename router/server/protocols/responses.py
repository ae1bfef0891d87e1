"""OpenAI Responses, the protocol side: ``POST /v1/responses``.

Reading (:class:`ResponsesAdapter`.read): a JSON object whose ``input`` is a string or a list of
items; an item is a message (``{"role": "user" | "assistant" | "system" | "developer", "content":
string | [parts]}``, ``type`` ``message`` or absent) or one of the API's typed items
(``function_call`` with ``call_id``/``name``/``arguments``, ``function_call_output`` with
``call_id``/``output``, ``reasoning``, ``item_reference``, the built-in tools' calls); anything else
is a 400 in OpenAI's error shape. ``instructions``, ``tools``, ``previous_response_id``, ``store``,
``stream``, ``text.format`` (JSON mode), ``metadata`` and ``user`` are read; every other field passes
through untouched. A body whose ``input`` list continues a conversation read before is parsed
incrementally (:mod:`router.server.protocols.incremental`): only its new items and its other fields
are checked, anything else (a string ``input`` too) takes the full parse, so the request or the
error is the full parse's.

The step the engine sees: the prompt estimate (the run's previous prompt + completion + the items
after the last assistant output, or everything incl. instructions and tools at a run's first
step), the ``function_call_output`` items after the last ``function_call``/assistant message as
tool results, tools offered, JSON wanted (``text.format.type`` ``json_object``/``json_schema``).

Chaining (:class:`ResponseStore`): every answered response is remembered (bounded LRU, in
memory only, never logged) as ``id -> (run, backend, previous id, its input items, its output
items)`` unless the request said ``store: false``; with client keys the id is scoped by the
caller's key (:func:`router.server.runs.identity.scoped_id`), so another tenant's
``previous_response_id`` finds nothing, exactly like an unknown id. ``previous_response_id`` then names the run
(``natural_id``), and when the step goes to a backend other than the one that stored the previous
response, or to a backend that needs a translation, the chain is expanded into the full ``input``
(``previous_response_id`` dropped) so any backend can serve it; to the same backend the body passes
untouched.

Capture (:class:`ResponsesReader`): the ``response`` object of a JSON answer or of the stream's
``response.completed`` / ``response.incomplete`` / ``response.failed`` event: its ``id``, usage
(prompt = ``input_tokens``, cached = ``input_tokens_details.cached_tokens``, completion =
``output_tokens``) and ``function_call`` outputs (name, arguments -> the loop key).

Knobs: ``ResponseStore(max_entries)`` (``identity.response_store_entries``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from features.tokens import MESSAGE_OVERHEAD_TOKENS, content_chars, text_tokens
from router.server.errors import ProxyError
from router.server.protocols.base import (
    Adapter,
    AnswerReader,
    Capture,
    ClientRequest,
    JSONObject,
    rewrite_body,
    since_assistant,
)
from router.server.protocols.sse import text_of
from router.server.protocols.validate import check_metadata, check_optional_str
from router.server.runs.identity import scoped_id

__all__ = [
    "ResponsesAdapter",
    "ResponsesReader",
    "ResponseStore",
    "StoredResponse",
    "ITEM_TYPES",
    "input_items",
]

ITEM_TYPES = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "item_reference",
        "custom_tool_call",
        "custom_tool_call_output",
        "file_search_call",
        "web_search_call",
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "compaction",
    }
)
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_ASSISTANT_TYPES = frozenset({"function_call", "custom_tool_call", "reasoning"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


def _bad(message: str, code: str) -> ProxyError:
    return ProxyError(400, code, message)


def input_items(body: Mapping[str, object]) -> list[JSONObject]:
    """The request's ``input`` as a list of items (a string is one user message; validated items
    are objects)."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return [it for it in inp if isinstance(it, dict)] if isinstance(inp, list) else []


def _input(body: Mapping[str, object]) -> object:
    """``input`` as a list without a copy (a string is one user message): for the per-step reads
    that look at the newest items only (:func:`router.server.protocols.base.since_assistant`)."""
    inp = body.get("input")
    return [{"role": "user", "content": inp}] if isinstance(inp, str) else inp


def validate(body: Mapping[str, object]) -> None:
    """Raise ProxyError(400; 422 for ``stream``) for a body the Responses API would refuse."""
    inp = body.get("input")
    if inp is None and body.get("previous_response_id") is None:
        raise _bad("Missing required parameter: 'input'.", "invalid_input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise _bad("Invalid 'input': expected a string or an array of input items.", "invalid_input")
    _check_items(inp if isinstance(inp, list) else [])
    _check_fields(body)


def _check_items(items: list[object]) -> None:
    """Each input item: an object of a known type with the fields that type needs."""
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise _bad(f"Invalid 'input[{i}]': expected an object.", "invalid_input_item")
        t = it.get("type", "message")
        if not isinstance(t, str) or t not in ITEM_TYPES:
            raise _bad(f"Invalid value for 'input[{i}].type': {t!r}.", "invalid_input_item")
        if t == "message":
            role = it.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise _bad(
                    f"Invalid value for 'input[{i}].role': {it.get('role')!r}; expected one of "
                    "'user', 'assistant', 'system', 'developer'.",
                    "invalid_role",
                )
            c = it.get("content")
            if not isinstance(c, (str, list)) or (
                isinstance(c, list)
                and not all(
                    isinstance(p, dict)
                    and isinstance(p.get("type"), str)
                    and isinstance(p.get("text", ""), str)
                    and isinstance(p.get("refusal", ""), str)
                    for p in c
                )
            ):
                raise _bad(
                    f"Invalid 'input[{i}].content': expected a string or content parts.", "invalid_content"
                )
        elif t == "function_call" and not (
            isinstance(it.get("name"), str)
            and isinstance(it.get("call_id"), str)
            and isinstance(it.get("arguments", ""), str)
        ):
            raise _bad(
                f"Invalid 'input[{i}]': a function_call needs 'call_id' and 'name'.", "invalid_input_item"
            )
        elif t == "function_call_output" and not isinstance(it.get("call_id"), str):
            raise _bad(f"Invalid 'input[{i}]': a function_call_output needs 'call_id'.", "invalid_input_item")


def _check_fields(body: Mapping[str, object]) -> None:
    """Every field but ``input`` (:func:`validate`'s order)."""
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(
            isinstance(t, dict)
            and isinstance(t.get("type", "function"), str)
            and (t.get("type", "function") != "function" or isinstance(t.get("name"), str))
            for t in tools
        )
    ):
        raise _bad(
            "Invalid 'tools': expected an array of tool objects (a function tool needs a 'name').",
            "invalid_tools",
        )
    tc = body.get("tool_choice")
    if tc is not None and not isinstance(tc, (str, dict)):
        raise _bad("Invalid 'tool_choice': expected a string or an object.", "invalid_tool_choice")
    text = body.get("text")
    if text is not None and not (
        isinstance(text, dict) and isinstance(text.get("format", {}), (dict, type(None)))
    ):
        raise _bad("Invalid 'text': expected an object whose 'format' is an object.", "invalid_text")
    mot = body.get("max_output_tokens")
    if mot is not None and (not isinstance(mot, int) or isinstance(mot, bool) or mot < 1):
        raise _bad("Invalid 'max_output_tokens': expected a positive integer.", "invalid_max_output_tokens")
    for k in ("temperature", "top_p"):
        v = body.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _bad(f"Invalid '{k}': expected a number.", f"invalid_{k}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ProxyError(422, "invalid_stream", "'stream' must be a boolean")
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise _bad("Invalid 'previous_response_id': expected a string.", "invalid_previous_response_id")
    check_metadata(body.get("metadata"))
    check_optional_str(body.get("user"), "user")
    check_optional_str(body.get("instructions"), "instructions")


def _item_tokens(it: JSONObject) -> int:
    return text_tokens(content_chars(it) + len(str(it.get("name") or ""))) + MESSAGE_OVERHEAD_TOKENS


def _is_assistant(it: JSONObject) -> bool:
    t = it.get("type", "message")
    return t in _ASSISTANT_TYPES or (t == "message" and it.get("role") == "assistant")


def wants_json(body: Mapping[str, object]) -> bool:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


class ResponsesAdapter(Adapter):
    """OpenAI Responses as a :class:`router.server.protocols.base.Adapter`."""

    name = "responses"
    path = "/v1/responses"

    def __init__(self, store: ResponseStore | None = None):
        self.store = store if store is not None else ResponseStore()

    incremental_list = b'"input"'

    def validate(self, body: Mapping[str, object]) -> None:
        validate(body)

    def validate_incremental(self, body: Mapping[str, object], new: list[object]) -> bool:
        """:meth:`validate` of the new input items and every other field (the earlier items passed
        it already, and a kept ``input`` is a list; any error sends the body to the full parse,
        which gives it)."""
        _check_items(new)
        _check_fields(body)
        return True

    def tool_results(self, body: Mapping[str, object]) -> list[tuple[object, bool]]:
        turns = since_assistant(_input(body), _is_assistant)
        return [(it.get("output"), False) for it in turns if it.get("type") in _OUTPUT_TYPES]

    def prompt_estimate(self, req: ClientRequest, previous_total: int | None) -> int:
        body = req.body
        if previous_total is not None:
            return previous_total + sum(
                _item_tokens(it) for it in since_assistant(_input(body), _is_assistant)
            )
        items = input_items(body)
        tools = body.get("tools")
        est = sum(_item_tokens(it) for it in items) + text_tokens(
            content_chars(body.get("instructions"))
            + (len(orjson.dumps(tools)) if isinstance(tools, list) else 0)
        )
        if body.get("previous_response_id"):  # a chain this router did not see: the chain's size
            est += self.store.chain_tokens(scoped_id(req.tenant, body["previous_response_id"]))
        return est

    def wants_json(self, body: Mapping[str, object]) -> bool:
        return wants_json(body)

    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]:
        body = req.body
        if body.get("previous_response_id"):
            return None, None, False
        system = text_of(body.get("instructions"))
        user = None
        inp = _input(body)
        for it in inp if isinstance(inp, list) else ():
            if not isinstance(it, dict):
                continue
            if _is_assistant(it) or it.get("type") in _OUTPUT_TYPES:
                return system, user, False
            role = it.get("role")
            if role in ("system", "developer") and system is None:
                system = text_of(it.get("content"))
            elif role == "user" and user is None:
                user = text_of(it.get("content"))
        return system, user, True

    def natural_id(self, req: ClientRequest, headers: Mapping[str, str]) -> tuple[str, str] | None:
        prev = req.body.get("previous_response_id")
        if isinstance(prev, str):  # another tenant's response id is as unknown as a made-up one
            entry = self.store.get(scoped_id(req.tenant, prev))
            if entry is not None:
                return entry.run_id, "previous_response"
        return None

    def user(self, req: ClientRequest) -> str | None:
        for k in ("user", "safety_identifier"):
            u = req.body.get(k)
            if isinstance(u, str) and u:
                return u
        return None

    def expand(self, req: ClientRequest, backend: str, backend_protocol: str) -> JSONObject | None:
        """The body with its chain expanded (module docstring), or None to pass it untouched."""
        prev = req.body.get("previous_response_id")
        if not isinstance(prev, str):
            return None
        key = scoped_id(req.tenant, prev)
        entry = self.store.get(key)
        if entry is None or (entry.backend == backend and backend_protocol == "responses"):
            return None
        out = dict(req.body)
        out["input"] = self.store.chain(key) + input_items(req.body)
        out.pop("previous_response_id", None)
        return out

    def outbound(self, req: ClientRequest, backend_protocol: str, model: str, backend: str = "") -> bytes:
        expanded = self.expand(req, backend, backend_protocol)
        if backend_protocol == "responses":
            if expanded is None:
                return rewrite_body(req.raw, req.body, model, False)
            expanded["model"] = model
            return orjson.dumps(expanded)
        return orjson.dumps(
            self.translated(expanded if expanded is not None else req.body, backend_protocol, model)
        )

    def translated(self, body: Mapping[str, object], backend_protocol: str, model: str) -> JSONObject:
        from router.server.protocols.translate import chat_to_messages, responses_to_chat

        chat = responses_to_chat(body, model)
        return chat if backend_protocol == "chat" else chat_to_messages(chat, model)

    def reader(self, req: ClientRequest) -> ResponsesReader:
        return ResponsesReader()

    def remember(self, req: ClientRequest, cap: Capture, run_id: str, backend: str) -> None:
        """Keep the answered response for later ``previous_response_id`` steps."""
        rid = cap.response_id()
        if rid is None or req.body.get("store") is False:
            return
        prev = req.body.get("previous_response_id")
        self.store.put(
            scoped_id(req.tenant, rid),
            StoredResponse(
                run_id,
                backend,
                scoped_id(req.tenant, prev) if isinstance(prev, str) else None,
                input_items(req.body),
                cap.output_items(),
            ),
        )

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        err = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        return b"event: error\ndata: " + orjson.dumps(err) + b"\n\n"


@dataclass(slots=True)
class StoredResponse:
    run_id: str
    backend: str
    previous: str | None
    input: list[JSONObject]
    output: list[JSONObject]


class ResponseStore:
    """Answered responses by id (bounded LRU; in memory only). See the module docstring."""

    def __init__(self, max_entries: int = 20000):
        self.max_entries = max_entries
        self._d: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, rid: str, entry: StoredResponse) -> None:
        self._d[rid] = entry
        self._d.move_to_end(rid)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        return self._d.get(rid)

    def chain(self, rid: str) -> list[JSONObject]:
        """Every input and output item of the chain ending at ``rid``, oldest first."""
        parts: list[StoredResponse] = []
        seen = set()
        cur: str | None = rid
        while cur is not None and cur not in seen:
            seen.add(cur)
            e = self._d.get(cur)
            if e is None:
                break
            parts.append(e)
            cur = e.previous
        out: list[JSONObject] = []
        for e in reversed(parts):
            out.extend(e.input)
            out.extend(_as_input(e.output))
        return out

    def chain_tokens(self, rid: str) -> int:
        return sum(_item_tokens(it) for it in self.chain(rid))

    def __len__(self) -> int:
        return len(self._d)


def _as_input(output: list[JSONObject]) -> list[JSONObject]:
    """Output items as input items (what a client resending the history would send)."""
    out: list[JSONObject] = []
    for it in output:
        t = it.get("type")
        if t == "message":
            out.append({"type": "message", "role": "assistant", "content": it.get("content") or []})
        elif t == "function_call":
            out.append({k: it[k] for k in ("type", "call_id", "name", "arguments") if k in it})
        elif t == "reasoning":
            continue  # reasoning items are only valid beside their own response
        else:
            out.append(it)
    return out


class ResponsesReader(AnswerReader):
    """Usage, tool calls and the id of a Responses answer (JSON or SSE); passes bytes through."""

    markers = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')

    def __init__(self) -> None:
        super().__init__()
        self.response: JSONObject | None = None

    def read(self, obj: JSONObject) -> None:
        self.response = obj

    def read_event(self, obj: JSONObject) -> None:
        if obj.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            r = obj.get("response")
            if isinstance(r, dict):
                self.response = r

    def response_id(self) -> str | None:
        rid = (self.response or {}).get("id")
        return rid if isinstance(rid, str) else None

    def output_items(self) -> list[JSONObject]:
        out = (self.response or {}).get("output")
        return [it for it in out if isinstance(it, dict)] if isinstance(out, list) else []

    def counts(self) -> tuple[int | None, int | None, int]:
        u = (self.response or {}).get("usage")
        u = u if isinstance(u, dict) else {}
        p = u.get("input_tokens")
        prompt = p if isinstance(p, int) and p >= 0 else None
        d = u.get("input_tokens_details")
        c = d.get("cached_tokens") if isinstance(d, dict) else None
        cached = c if isinstance(c, int) and c >= 0 else None
        o = u.get("output_tokens")
        return prompt, cached, o if isinstance(o, int) and o >= 0 else 0

    def calls(self) -> list[tuple[str, str]]:
        """``(name, arguments)`` of each ``function_call`` output item, in output order."""
        return [
            (str(c.get("name") or ""), str(c.get("arguments") or ""))
            for c in self.output_items()
            if c.get("type") == "function_call"
        ]
