"""The protocol-adapter interface of the hot path: what a client API (Chat Completions, OpenAI
Responses, Anthropic Messages) must provide so :mod:`router.server.proxy` can route it.

The hot path is protocol-independent (read -> identity -> turn.plan -> claim -> commit ->
forward/fallback -> finish -> record); each protocol module (:mod:`router.server.chat`,
:mod:`router.server.responses`, :mod:`router.server.messages`) implements :class:`Adapter`:

- ``read(raw, models, aliases, max_depth)`` parses and validates the body into a
  :class:`ClientRequest` (every field the router reads, :mod:`router.server.validate`; bad input:
  :class:`~router.server.errors.ProxyError`, a 4xx, rendered by ``error``);
- ``step_request(req, previous_total, **kw)``: the engine's protocol-free
  :class:`~router.core.record.StepRequest` (prompt estimate, tool results, tools offered, JSON);
- ``opening(req)``: ``(system text, first user text, is_opening)`` for the run-identity hash
  (the same text gives the same hash in every protocol, so a run may change protocol) and
  ``natural_id(req, headers)``: a run id the protocol itself carries (``previous_response_id``,
  a Claude Code session), or None;
- ``outbound(req, backend_protocol, model, backend)``: the bytes to send a backend speaking
  ``backend_protocol``: the client's bytes with only ``model`` rewritten when it is the client's
  own protocol (the fast path), else a translation (:mod:`router.server.translate`);
- ``capture(req, backend_protocol)``: a :class:`Capture` that reads usage (prompt, cached,
  completion tokens) and tool calls from the backend's JSON or SSE answer and, when translating,
  turns the answer into the client's protocol (``markers``: the byte strings that make the SSE
  relay hand an event to the capture; None = every event);
- ``error_body(status, code, message)``: the protocol's own error JSON (OpenAI ``{"error": {...}}``,
  Anthropic ``{"type": "error", "error": {...}}``) and ``stream_error(...)``: the SSE event that
  ends a stream which failed mid-way.

Backends declare the protocols they speak (``Backend.urls``); :func:`pick_protocol` chooses the
client's own when the backend speaks it, else Chat Completions (every OpenAI-shaped server speaks
it), else Messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

from router.core.record import StepRequest

__all__ = [
    "PROTOCOLS",
    "ClientRequest",
    "Capture",
    "Adapter",
    "pick_protocol",
    "json_error",
    "resolve_model",
    "AUTO_MODELS",
]

PROTOCOLS = ("chat", "responses", "messages")


@dataclass(slots=True)
class ClientRequest:
    """A validated client body and what the router reads from it (any protocol)."""

    protocol: str
    raw: bytes
    body: dict[str, Any]
    requested: str | None  # a concrete model served here (bypasses the policy), None for auto
    stream: bool
    model_alias: str | None = None  # a model name config maps to a frontier entry (tier: policy)
    strip_usage: bool = False  # chat: the client did not ask for the usage chunk
    extra: dict[str, Any] = field(default_factory=dict)
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
    def response_id(self) -> str | None: ...


class Adapter(Protocol):
    name: str
    path: str

    def read(
        self, raw: bytes, models: Mapping[str, str], aliases: Any, max_depth: int = ...
    ) -> ClientRequest: ...
    def step_request(self, req: ClientRequest, previous_total: int | None, **kw: Any) -> StepRequest: ...
    def opening(self, req: ClientRequest) -> tuple[str | None, str | None, bool]: ...
    def natural_id(self, req: ClientRequest, headers: Mapping[str, str]) -> tuple[str, str] | None: ...
    def user(self, req: ClientRequest) -> str | None: ...
    def outbound(self, req: ClientRequest, backend_protocol: str, model: str, backend: str = "") -> bytes: ...
    def capture(self, req: ClientRequest, backend_protocol: str) -> Capture: ...
    def error_body(self, status: int, code: str, message: str) -> bytes: ...
    def stream_error(self, status: int, code: str, message: str) -> bytes: ...
    def error_response(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> Response: ...


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
    model: Any, models: Mapping[str, str], aliases: Any, default: str = "auto"
) -> tuple[str | None, str | None]:
    """``(requested, alias)`` of a body's ``model``: a model a backend serves is *requested* (the
    policy is bypassed); a name config maps to a frontier entry (``aliases(name) -> backend name``)
    is an *alias* (the policy still chooses the tier); ``auto`` is neither. Raises ProxyError 404
    for anything else, 422 for a non-string."""
    from router.server.errors import ProxyError

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


AUTO_MODELS = frozenset({"auto", "runroute-auto"})
