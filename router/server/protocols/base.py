"""The protocol adapters of the hot path: what a client API (Chat Completions, OpenAI Responses,
Anthropic Messages) provides so :mod:`router.server.hotpath.proxy` can route it, and the part the three
share (:class:`Adapter`, :class:`AnswerReader`); each protocol module (:mod:`router.server.protocols.chat`,
:mod:`router.server.protocols.responses`, :mod:`router.server.protocols.messages`) keeps only what differs.

The hot path is protocol-independent (read -> identity -> turn.plan -> claim -> commit ->
forward/fallback -> finish -> record). An :class:`Adapter`:

- ``read(raw, models, aliases, max_depth)`` parses and validates the body into a
  :class:`ClientRequest`. Shared order: JSON (400 ``invalid_json``), an object
  (``body_not_object``, the protocol's :attr:`Adapter.not_object_status`), nesting depth
  (:func:`router.server.protocols.validate.check_depth`), the protocol's ``validate`` (every field the router
  reads), the model (:func:`resolve_model`: 404 ``model_not_found``), then the protocol's
  ``validate_options`` (fields whose errors rank below an unknown model; chat's options). Bad
  input: :class:`~router.server.errors.ProxyError`, a 4xx, rendered by ``error_response``. An
  adapter with an ``incremental_list`` (chat: ``messages``) and a parse cache
  (``server.parse_cache_runs``) parses a run's next body from where its previous one's list
  ended and validates the new elements only (:mod:`router.server.protocols.incremental`; the same
  request, and every error from the full parse);
- ``step_request(req, previous_total, priority=, tenant=)``: the engine's protocol-free
  :class:`~router.core.record.StepRequest`. Shared: the tool results are those of the turns after
  the last assistant turn (:func:`since_assistant`; the protocol's ``tool_results`` gives each one's
  content and explicit error flag), each counted with its size (``features.tokens``) and error
  flag (explicit, or :func:`router.server.protocols.sse.looks_error`'s text rule); tools offered = the length
  of a ``tools`` list. The protocol's: ``prompt_estimate``, ``wants_json``, ``segments`` (the
  prefix index's text view; chat only);
- ``opening(req)``: ``(system text, first user text, is_opening)`` for the run-identity hash
  (the same text gives the same hash in every protocol, so a run may change protocol) and
  ``natural_id(req, headers)``: a run id the protocol itself carries (``previous_response_id``,
  a Claude Code session), or None; ``user(req)``: the end user (default: a string ``user``);
- ``outbound(req, backend_protocol, model, backend)``: the bytes to send a backend speaking
  ``backend_protocol``: the client's bytes with only ``model`` rewritten when it is the client's
  own protocol (the fast path, :func:`rewrite_body`), else the protocol's ``translated`` body
  (:mod:`router.server.protocols.translate`);
- ``capture(req, backend_protocol)``: a :class:`Capture`: the protocol's own
  :class:`AnswerReader` (``reader(req)``) when the backend speaks it, else
  :func:`router.server.protocols.translate_stream.translating_capture`. A capture reads usage (prompt, cached,
  completion tokens) and tool calls from the backend's JSON or SSE answer and, when translating,
  turns the answer into the client's protocol (``markers``: the byte strings that make the SSE
  relay hand an event to the capture; None = every event);
- ``error_body(status, code, message)``: the protocol's own error JSON (default OpenAI's
  ``{"error": {...}}``), ``error_response`` (at ``http_status(status)``: Messages answers 422-class
  failures 400) and ``stream_error(...)``: the SSE event that ends a stream which failed mid-way;
- ``remember(req, capture, run_id, backend)``: keep what a later step needs (Responses: the
  answered response for ``previous_response_id``); nothing by default.

:class:`AnswerReader` (a capture for a backend speaking the client's protocol; bytes pass through):
``json`` parses a whole answer for ``read``, ``event`` hands each SSE event's object to
``read_event``; ``calls()`` lists the tool calls (name, raw arguments) from which ``tools()``
derives the names and loop keys (:func:`tool_key` over ``call_key``'s arguments) and
``call_args()`` the arguments. A reader that collects calls by index fills ``tool_names`` /
``tool_args``.

Backends declare the protocols they speak (``Backend.urls``); :func:`pick_protocol` chooses the
client's own when the backend speaks it, else Chat Completions (every OpenAI-shaped server speaks
it), else Messages.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.responses import Response

from features.tokens import content_chars, text_tokens
from router.core.prefix_index import Segments
from router.core.record import StepRequest
from router.server.errors import ProxyError, error_body
from router.server.protocols.incremental import ParseCache, Parsed
from router.server.protocols.sse import JSONObject, looks_error, parse_event
from router.server.protocols.validate import DEFAULT_MAX_DEPTH, check_depth, json_depth

__all__ = [
    "PROTOCOLS",
    "ClientRequest",
    "Capture",
    "Adapter",
    "AnswerReader",
    "AliasLookup",
    "JSONObject",
    "pick_protocol",
    "json_error",
    "resolve_model",
    "rewrite_body",
    "since_assistant",
    "load_object",
    "tool_key",
    "AUTO_MODELS",
]

PROTOCOLS = ("chat", "responses", "messages")
AUTO_MODELS = frozenset({"auto", "runroute-auto"})

AliasLookup = Callable[[str], str | None]
"""A client's model name -> the backend it is an alias of, or None (``BackendPool.aliases``)."""

_MODEL_RE = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')


@dataclass(slots=True)
class ClientRequest:
    """A validated client body and what the router reads from it (any protocol)."""

    protocol: str
    raw: bytes
    # the validated body: its shape is the protocol's (module docstrings), checked field by field
    # by the adapter's ``validate``; the hot path and the translations read it by those checks
    body: dict[str, Any]
    requested: str | None  # a concrete model served here (bypasses the policy), None for auto
    stream: bool
    model_alias: str | None = None  # a model name config maps to a frontier entry (tier: policy)
    strip_usage: bool = False  # chat: the client did not ask for the usage chunk
    extra: dict[str, Any] = field(default_factory=dict)  # the hot path's per-request notes
    tenant: str | None = None  # the caller's key id (None in open mode): the run-id namespace


class Capture(Protocol):
    """Reads an upstream answer (and translates it when the protocols differ)."""

    markers: tuple[bytes, ...] | None
    translating: bool

    def json(self, data: bytes) -> bytes: ...  # returns the body to send the client
    def event(self, ev: bytes) -> bytes | None: ...  # SSE event -> bytes to relay (None: drop)
    def finish_stream(self) -> bytes: ...  # bytes to send after the upstream stream ended
    def counts(self) -> tuple[int | None, int | None, int]: ...
    def tools(self) -> tuple[tuple[str, ...], tuple[str, ...]]: ...
    def call_args(self) -> tuple[str, ...]: ...  # each call's raw arguments text, as tools() orders
    def token_logprobs(self) -> list[float]: ...  # the answer's token logprobs, when asked for
    def response_id(self) -> str | None: ...
    def output_items(self) -> list[JSONObject]: ...  # a Responses answer's output items ([] else)


def load_object(data: bytes) -> JSONObject | None:
    """``data`` parsed when it is a JSON object, else None."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def tool_key(name: str, args: str) -> str:
    """A tool call's loop key: a repeated key (same tool, same arguments) is a loop signal."""
    return hashlib.blake2b(f"{name}\x00{args}".encode(), digest_size=8).hexdigest()


class AnswerReader(ABC):
    """Usage and tool calls of an answer in the client's own protocol (module docstring)."""

    markers: tuple[bytes, ...] | None = None
    translating: bool = False

    def __init__(self) -> None:
        self.tool_names: dict[int, str] = {}  # tool calls by index: name
        self.tool_args: dict[int, str] = {}  # and raw arguments text
        self.logprobs: list[float] = []  # each generated token's logprob (chat, when asked for)

    @abstractmethod
    def read(self, obj: JSONObject) -> None:
        """A whole answer object."""

    @abstractmethod
    def read_event(self, obj: JSONObject) -> None:
        """One SSE event's object."""

    @abstractmethod
    def counts(self) -> tuple[int | None, int | None, int]:
        """``(prompt, cached, completion)`` tokens from the answer's usage (None where absent)."""

    def json(self, data: bytes) -> bytes:
        obj = load_object(data)
        if obj is not None:
            self.read(obj)
        return data

    def event(self, ev: bytes) -> bytes | None:
        _, obj = parse_event(ev)
        if obj is not None:
            self.read_event(obj)
        return ev

    def finish_stream(self) -> bytes:
        return b""

    def response_id(self) -> str | None:
        return None

    def output_items(self) -> list[JSONObject]:
        return []

    def calls(self) -> list[tuple[str, str]]:
        """``(name, raw arguments)`` of each tool call, in index order."""
        return [(self.tool_names[k], self.tool_args.get(k, "")) for k in sorted(self.tool_names)]

    def call_key(self, args: str) -> str:
        """The arguments text the loop key hashes (a protocol may canonicalise it)."""
        return args

    def tools(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(names, keys)`` of the captured tool calls, in :meth:`calls`' order."""
        calls = self.calls()
        return tuple(n for n, _ in calls), tuple(tool_key(n, self.call_key(a)) for n, a in calls)

    def call_args(self) -> tuple[str, ...]:
        """Each captured call's raw arguments text, in :meth:`tools`' order."""
        return tuple(a for _, a in self.calls())

    def token_logprobs(self) -> list[float]:
        """Each generated token's logprob, when the backend was asked for them (chat); else []."""
        return self.logprobs


def since_assistant(items: object, is_assistant: Callable[[JSONObject], bool]) -> list[JSONObject]:
    """The objects of the list ``items`` after the last one ``is_assistant`` accepts (all of them
    without one), in order; O(turns since then), the run's history is not walked."""
    out: list[JSONObject] = []
    seq: list[object] = items if isinstance(items, list) else []
    for it in reversed(seq):
        if not isinstance(it, dict):
            continue
        if is_assistant(it):
            break
        out.append(it)
    out.reverse()
    return out


class Adapter(ABC):
    """One client protocol on the hot path (module docstring); subclasses fill in what differs."""

    name: str
    path: str
    not_object_status: int = 422  # the status of a body that is not a JSON object

    # ------------------------------------------------------------------ reading
    #: the top-level list an agent's steps grow, as its key's exact JSON bytes (incremental parse,
    #: :mod:`router.server.protocols.incremental`; None: always the full parse)
    incremental_list: bytes | None = None
    parse_cache: ParseCache | None = None

    def use_parse_cache(self, runs: int, max_bytes: int) -> None:
        """Turn the incremental parse on (``runs`` > 0 and a protocol that has one) or off."""
        key = self.incremental_list
        self.parse_cache = ParseCache(runs, max_bytes, key) if key and runs > 0 and max_bytes > 0 else None

    def read(
        self,
        raw: bytes,
        models: Mapping[str, str],
        aliases: AliasLookup | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> ClientRequest:
        """Parse and validate (module docstring's order); raises :class:`ProxyError` (4xx). With a
        parse cache, a body that continues a conversation read before is parsed from where that one
        ended (:mod:`router.server.protocols.incremental`); it gives the same request, and any
        error comes from the full parse."""
        cache = self.parse_cache
        if cache is None:
            return self.read_full(raw, models, aliases, max_depth)
        ck, parsed = cache.try_incremental(raw)
        if parsed is not None and ck is not None:
            got = self._read_incremental(raw, parsed, models, aliases, max_depth)
            if got is not None:
                cache.remember(ck, raw, parsed, got[1])
                return got[0]
        req = self.read_full(raw, models, aliases, max_depth)
        if ck is not None:
            items = req.body.get(cache.field)
            if isinstance(items, list):
                depth = json_depth(items, max_depth) - 1
                cache.remember(ck, raw, Parsed(req.body, items, depth, False), depth)
        return req

    def _read_incremental(
        self,
        raw: bytes,
        parsed: Parsed,
        models: Mapping[str, str],
        aliases: AliasLookup | None,
        max_depth: int,
    ) -> tuple[ClientRequest, int] | None:
        """The checks of :meth:`read_full` on an incrementally parsed body: the list's new elements
        and every other field; None when any fails (the caller then reads the body whole). With
        the request, the list elements' deepest nesting."""
        cache = self.parse_cache
        assert cache is not None
        body, field_ = parsed.body, cache.field
        d = parsed.kept_depth
        for m in parsed.new:
            dm = json_depth(m, max_depth)
            if dm > d:
                d = dm
        out = parsed.outside
        same = parsed.same_outside and out is not None and out.max_depth == max_depth
        if same:  # the fields outside the list are an accepted body's (incremental module doc, 3)
            assert out is not None
            od = out.depth
        else:
            od = 0
            for k, v in body.items():
                if k != field_:
                    dv = json_depth(v, max_depth)
                    if dv > od:
                        od = dv
            if out is not None:  # kept with the entry once this body is accepted
                out.depth, out.max_depth = od, max_depth
        depth = max(1 + d, od)  # 1 + d: the list's
        if depth + 1 > max_depth:
            return None
        try:
            if not self.validate_incremental(body, parsed.new):
                return None
            requested, alias = resolve_model(body.get("model"), models, aliases)
            if not same:
                self.validate_options(body)
        except ProxyError:
            return None
        stream = body.get("stream", False) is True
        req = ClientRequest(
            self.name, raw, body, requested, stream, model_alias=alias, strip_usage=self.strips_usage(body)
        )
        return req, d

    def validate_incremental(self, body: Mapping[str, object], new: list[Any]) -> bool:
        """:meth:`validate` of a body whose list elements before ``new`` were validated already;
        False (or a :class:`ProxyError`) where :meth:`validate` would refuse it."""
        return False

    def read_full(
        self,
        raw: bytes,
        models: Mapping[str, str],
        aliases: AliasLookup | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> ClientRequest:
        """One ``orjson.loads`` of the whole body and every check (module docstring's order)."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ProxyError(self.not_object_status, "body_not_object", "request body must be a JSON object")
        check_depth(body, max_depth)
        self.validate(body)
        requested, alias = resolve_model(body.get("model"), models, aliases)
        self.validate_options(body)
        stream = body.get("stream", False) is True
        return ClientRequest(
            self.name, raw, body, requested, stream, model_alias=alias, strip_usage=self.strips_usage(body)
        )

    @abstractmethod
    def validate(self, body: Mapping[str, object]) -> None:
        """Raise :class:`ProxyError` for a body the protocol's API would refuse."""

    def validate_options(self, body: Mapping[str, object]) -> None:
        """Checks that rank below an unknown model (none by default)."""
        return None

    def strips_usage(self, body: Mapping[str, object]) -> bool:
        """Whether the relay drops the usage-only chunk the client did not ask for (chat)."""
        return False

    # ------------------------------------------------------------------ the engine's view
    def step_request(
        self,
        req: ClientRequest,
        previous_total: int | None,
        *,
        priority: str = "interactive",
        tenant: str | None = None,
    ) -> StepRequest:
        """The engine's view of a request (module docstring). ``previous_total``: the run's
        previous served step's prompt + completion tokens (None at its first step)."""
        body = req.body
        results = self.tool_results(body)
        tools = body.get("tools")
        return StepRequest(
            prompt_tokens=self.prompt_estimate(req, previous_total),
            tool_results_n=len(results),
            tool_result_errors=tuple(flagged or looks_error(c) for c, flagged in results),
            tool_result_tokens=tuple(text_tokens(content_chars(c)) for c, _ in results),
            n_tools_offered=len(tools) if isinstance(tools, list) else 0,
            wants_json=self.wants_json(body),
            requested_model=req.requested,
            priority=priority,
            tenant=tenant,
            protocol=self.name,
            estimated=True,
            segments=self.segments(body),
        )

    @abstractmethod
    def tool_results(self, body: Mapping[str, object]) -> list[tuple[object, bool]]:
        """``(content, explicitly flagged an error)`` of each tool result after the last assistant
        turn, oldest first."""

    @abstractmethod
    def prompt_estimate(self, req: ClientRequest, previous_total: int | None) -> int:
        """The prompt-size estimate (tokens) of the step."""

    def wants_json(self, body: Mapping[str, object]) -> bool:
        return False

    def segments(self, body: Mapping[str, object]) -> Segments | None:
        """The prefix index's lazy text view of the prompt (None: no index lookup)."""
        return None

    # ------------------------------------------------------------------ identity
    @abstractmethod
    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]: ...

    def natural_id(self, req: ClientRequest, headers: Mapping[str, str]) -> tuple[str, str] | None:
        return None

    def user(self, req: ClientRequest) -> str | None:
        u = req.body.get("user")
        return u if isinstance(u, str) and u else None

    # ------------------------------------------------------------------ forwarding
    def outbound(self, req: ClientRequest, backend_protocol: str, model: str, backend: str = "") -> bytes:
        if backend_protocol == self.name:
            return rewrite_body(req.raw, req.body, model, self.asks_usage(req))
        return orjson.dumps(self.translated(req.body, backend_protocol, model))

    def asks_usage(self, req: ClientRequest) -> bool:
        """Whether the fast path adds ``stream_options.include_usage`` (chat streams)."""
        return False

    @abstractmethod
    def translated(self, body: Mapping[str, object], backend_protocol: str, model: str) -> JSONObject:
        """The request for a backend that speaks ``backend_protocol``, not the client's."""

    def capture(self, req: ClientRequest, backend_protocol: str) -> Capture:
        if backend_protocol == self.name:
            return self.reader(req)
        from router.server.protocols.translate_stream import translating_capture

        return translating_capture(req, backend_protocol)

    @abstractmethod
    def reader(self, req: ClientRequest) -> AnswerReader:
        """The capture of an answer in this protocol."""

    def remember(self, req: ClientRequest, cap: Capture, run_id: str, backend: str) -> None:
        """Keep what a later step of the run needs from this answer (nothing by default)."""
        return None

    # ------------------------------------------------------------------ errors
    def http_status(self, status: int) -> int:
        """The status the client is answered with for a sidecar error ``status``."""
        return status

    def error_body(self, status: int, code: str, message: str) -> bytes:
        return error_body(status, code, message)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return b"data: " + self.error_body(status, code, message) + b"\n\n"

    def error_response(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> Response:
        st = self.http_status(status)
        return json_error(self.error_body(st, code, message), st, headers)


def pick_protocol(client: str, speaks: Mapping[str, str]) -> str:
    """The protocol to talk to a backend that serves ``speaks`` (protocol -> URL)."""
    if client in speaks:
        return client
    if "chat" in speaks:
        return "chat"
    return "messages"


def json_error(body: bytes, status: int, headers: dict[str, str] | None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def resolve_model(
    model: object, models: Mapping[str, str], aliases: AliasLookup | None, default: str = "auto"
) -> tuple[str | None, str | None]:
    """``(requested, alias)`` of a body's ``model``: a model a backend serves is *requested* (the
    policy is bypassed); a name config maps to a frontier entry (``aliases(name) -> backend name``)
    is an *alias* (the policy still chooses the tier); ``auto`` is neither. Raises ProxyError 404
    for anything else, 422 for a non-string."""
    if model is None:
        model = default
    if not isinstance(model, str):
        raise ProxyError(422, "invalid_model", "'model' must be a string")
    if model in AUTO_MODELS:
        return None, None
    if model in models:
        return model, None
    if aliases is not None and aliases(model) is not None:
        return None, model
    raise ProxyError(
        404, "model_not_found", f"model {model!r} is not served here; use 'auto' or one of {sorted(models)}"
    )


# ------------------------------------------------------------------ the fast path's rewrite
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


def rewrite_body(raw: bytes, body: Mapping[str, object], model: str, include_usage: bool) -> bytes:
    """The client's bytes with ``model`` set (and ``stream_options.include_usage`` when asked).

    A byte splice when the top-level ``model`` pair is the body's first or last member, or absent
    (then inserted first); otherwise one orjson re-serialisation of the parsed body."""
    so = body.get("stream_options")
    need_usage = include_usage and not (isinstance(so, dict) and so.get("include_usage") is True)
    if need_usage and so is not None:
        return _reserialise(body, model, True)
    new_model = b'"model":' + orjson.dumps(model)
    # the output is built by one join of slices (memoryviews: no copy of the body's bytes before
    # the join), so a 200 KB body is copied once, not once per splice
    view = memoryview(raw)
    if isinstance(body.get("model"), str):
        span = _model_span(raw)
        if span is None:
            return _reserialise(body, model, need_usage)
        parts: list[bytes | memoryview] = [view[: span[0]], new_model, view[span[1] :]]
        prefix = b""
    elif "model" not in body:
        parts = [view]
        prefix = new_model + b","
    else:
        return _reserialise(body, model, need_usage)
    if need_usage:
        prefix += b'"stream_options":{"include_usage":true},'
    if prefix:  # inserted after the opening brace (which comes before the model pair)
        j = raw.find(b"{")
        first = parts[0]
        parts[0:1] = [first[: j + 1], prefix, first[j + 1 :]]
    return b"".join(parts)


def _reserialise(body: Mapping[str, object], model: str, need_usage: bool) -> bytes:
    out = dict(body)
    out["model"] = model
    if need_usage:
        so = out.get("stream_options")
        opts = dict(so) if isinstance(so, dict) else {}
        opts["include_usage"] = True
        out["stream_options"] = opts
    return orjson.dumps(out)
