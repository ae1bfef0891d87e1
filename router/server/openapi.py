"""The sidecar's published HTTP API (``GET /openapi.json``): request and response models.

The hot path (``POST /v1/chat/completions``) bypasses FastAPI's routing and validation for speed
(:class:`router.server.app` short-cuts it), so its route is declared with the request model below
in ``openapi_extra`` only: the document describes exactly what :mod:`router.server.protocols.validate`
checks, and the handler stays the proxy's own; the same for ``/v1/responses``, ``/v1/messages`` and
``/v1/messages/count_tokens`` (:class:`ResponsesRequest`, :class:`MessagesRequest`,
:class:`CountTokensRequest`: what :mod:`router.server.protocols.responses` / :mod:`router.server.protocols.messages`
check), so a fuzzer generating from the document reaches them with real bodies. The other
endpoints parse their bodies themselves (so every error keeps the OpenAI error shape with a code)
and declare these models the same way. ``GET /metrics`` is declared as Prometheus text (or
OpenMetrics), not JSON.

:func:`install_openapi` adds the models' ``$defs`` to ``components.schemas`` and the bearer-key
security scheme, once, when the document is first built.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ErrorBody",
    "ChatMessage",
    "ChatCompletionRequest",
    "RunEndRequest",
    "ResponsesRequest",
    "MessagesRequest",
    "CountTokensRequest",
    "request_body",
    "error_responses",
    "install_openapi",
]

_REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str


class ErrorBody(BaseModel):
    """Every error: ``{"error": {"message", "type", "code"}}`` (:mod:`router.server.errors`)."""

    error: ErrorDetail


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any] | str] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """What the router reads of a chat-completions body; every other field passes through."""

    model_config = ConfigDict(extra="allow")

    model: str = Field("auto", description="'auto' (the router decides) or a served model")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = Field(None, description="string values; run_id, tenant are read")
    user: str | None = None


class ResponsesContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ResponsesMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesContentPart]


class ResponsesFunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = ""


class ResponsesFunctionCallOutput(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class ResponsesTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    name: str


class ResponsesRequest(BaseModel):
    """What the router reads of an OpenAI Responses body (:mod:`router.server.protocols.responses`); every
    other field passes through."""

    model_config = ConfigDict(extra="allow")

    model: Literal["auto"] | str = Field("auto", description="'auto' (the router decides) or a served model")
    input: str | list[ResponsesMessage | ResponsesFunctionCall | ResponsesFunctionCallOutput]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, description="continues a stored response (same key)")
    store: bool | None = None
    stream: bool = False
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    metadata: dict[str, str] | None = Field(None, description="string values; run_id, tenant are read")
    user: str | None = None


class MessagesTextBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class MessagesToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class MessagesToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[MessagesTextBlock] | None = None
    is_error: bool | None = None


class MessagesMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[MessagesTextBlock | MessagesToolUseBlock | MessagesToolResultBlock]


class MessagesTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class MessagesMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    user_id: str | None = None


class CountTokensRequest(BaseModel):
    """What the router reads of an Anthropic Messages body (:mod:`router.server.protocols.messages`); every
    other field passes through. ``POST /v1/messages/count_tokens`` takes it as is."""

    model_config = ConfigDict(extra="allow")

    model: Literal["auto"] | str = Field(
        "auto", description="'auto' (the router decides) or a served / mapped model"
    )
    messages: list[MessagesMessage] = Field(min_length=1)
    system: str | list[MessagesTextBlock] | None = None
    tools: list[MessagesTool] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    metadata: MessagesMetadata | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``: a Messages body with ``max_tokens``."""

    max_tokens: int = Field(ge=1)


class RunEndRequest(BaseModel):
    outcome: Literal["success", "failure", "unknown"] = "unknown"
    reward: float | None = None


class RunSignalRequest(BaseModel):
    """``POST /v1/runs/{run_id}/signal``: evidence about a run from a client or a verifier; the
    run's next step sees it (features ``sig_<kind>`` / ``new_sig_<kind>``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["verifier_failed", "user_rejected", "tests_failed", "other"]
    detail: dict[str, Any] | None = Field(
        default=None, description="optional, for the client's own bookkeeping: never stored or logged"
    )


def request_body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the JSON request body."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
        }
    }


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": "error (OpenAI shape, with a code)"} for s in statuses}


def install_openapi(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Build the document with ``models`` in ``components.schemas`` and bearer auth declared."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = base()
        comps = doc.setdefault("components", {})
        schemas = comps.setdefault("schemas", {})
        for m in models:
            js = m.model_json_schema(ref_template=_REF)
            schemas.update(js.pop("$defs", {}))
            schemas[m.__name__] = js
        comps.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
        doc["security"] = [{"bearer": []}, {}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
