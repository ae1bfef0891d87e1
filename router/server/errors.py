"""OpenAI-style error responses of the sidecar: ``{"error": {"message", "type", "code"}}``.

Every error the proxy returns goes through :func:`error_response` with one of the codes below, so
clients (and tests) can rely on status + ``code``:

=====  ==========================  ===========================================================
400    ``invalid_json``            the body is not JSON
400    ``invalid_state`` / ``invalid_limit`` / ``invalid_after`` / ``invalid_order``: a bad query
                                   parameter of ``GET /v1/runs`` or ``/v1/responses/{id}/input_items``
401    ``invalid_api_key``         client bearer keys are configured and the request has none
                                   or a wrong one (admin / metrics endpoints: their keys)
403    ``admin_key_required``      ``/admin/*`` with a client key, or no admin key configured
403    ``admin_loopback_only``     ``/admin/*`` without any keys from a non-loopback client
404    ``run_not_found``           ``/v1/runs/{id}`` (or a step) for a run the router does not
                                   know, or one another key started
404    ``model_not_found``         the body names a model that is neither ``auto`` nor a tier's
404    ``response_not_found``      ``GET /v1/responses/{id}[/input_items]``: not stored, or
                                   another key's
404    ``not_found``               no such path (``/v1/messages/...`` paths: Anthropic's shape)
409    ``bundle_refused``          ``/admin/reload`` loaded a bad bundle; the old one keeps serving
409    ``no_bundle_source``        ``/admin/reload`` with no bundle source configured
413    ``body_too_large``          the body exceeds ``server.max_body_bytes``
422    ``body_not_object``         the JSON is not an object
422    ``invalid_messages``        ``messages`` missing, empty, not a list of objects, or a
                                   message's role / content / tool_calls of the wrong type
422    ``invalid_model``           ``model`` is not a string
422    ``invalid_stream``          ``stream`` is not a boolean
422    ``invalid_stream_options``  ``stream_options`` not an object / ``include_usage`` not bool
422    ``invalid_tools``           ``tools`` not a list of tool objects (function needs a name)
422    ``invalid_metadata``        ``metadata`` not an object of (short) string values
422    ``invalid_user``            ``user`` is not a string
422    ``invalid_response_format`` ``response_format`` is not an object
422    ``body_too_deep``           the body nests deeper than ``server.max_json_depth``
422    ``invalid_outcome``         ``/v1/runs/{id}/end``: outcome not success/failure/unknown
422    ``invalid_reward``          ``/v1/runs/{id}/end``: reward not a number
429    ``run_rejected_overload``   admission control refused a *new* run under load (``Retry-After``
                                   set); steps of admitted runs never get it
431    ``headers_too_large``       more than ``server.max_headers`` headers or
                                   ``server.max_header_bytes`` bytes of them
502    ``upstream_unreachable``    connect error to the chosen upstream (after any fallback)
502    ``upstream_error``          the upstream answered 5xx before the first byte
502    ``upstream_auth``           the upstream refused the *router's* key (401/403): the message
                                   names the backend
503    ``no_healthy_backend``      no backend the policy may use is healthy
503    ``bundle_not_loaded``       no bundle serving
504    ``upstream_timeout``        no response headers within ``timeouts.first_byte_s``
=====  ==========================  ===========================================================

Mid-stream failures cannot change the status any more; the stream ends with one SSE event
``data: {"error": {..., "code": "upstream_stream_error"}}``. A client that disconnects mid-stream
gets nothing; its step is logged with status 499 and code ``client_cancelled`` (so is a
non-streaming step whose client went away before the answer). An unexpected exception on the hot
path is 500 ``internal_error`` (a bug: the step is still closed and its slot given back).
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

__all__ = ["ProxyError", "error_body", "error_response", "ERROR_TYPES"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    499: "client_cancelled",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ProxyError(Exception):
    """Raised inside the sidecar; turned into an OpenAI-style error response."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_body(status: int, code: str, message: str) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"), "code": code}}
    )


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        error_body(status, code, message), status_code=status, media_type="application/json", headers=headers
    )
