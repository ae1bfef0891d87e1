"""Read-only endpoints for clients and people: the runs list, stored Responses, ``/`` and ``/ui``.

- ``GET /v1/runs``: the caller's runs, filtered and paged (:mod:`router.server.runs.listing`);
- ``GET /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``: stored Responses of the
  caller's runs (:mod:`router.server.protocols.responses_read`);
- ``GET`` / ``HEAD /``: a small JSON index of the endpoints (Claude Code sends ``HEAD /`` on every
  start to check the base URL; it is a route, so it is counted under ``handler="/"``, not
  ``unmatched``);
- ``GET /ui``, ``/ui/data``, ``/ui/static/*``, ``/ui/plots/*``: the live page (:mod:`router.server.ui`).

Each takes the caller's key id from :meth:`router.server.hotpath.proxy.Proxy.check_auth` (401 without a
valid client key when keys are configured) and passes it explicitly as the tenant to the reader,
so a run or a response of another key is a 404 exactly like an unknown one. Errors are OpenAI's
shape with a code (these are OpenAI-style paths).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.server.errors import ProxyError, error_response
from router.server.openapi import error_responses
from router.server.protocols.responses_read import get_response, list_input_items
from router.server.routes import Parts, json_response
from router.server.runs.identity import scoped_id
from router.server.runs.listing import list_runs
from router.server.settings import RouterSettings

__all__ = ["register_read_routes"]


def register_read_routes(app: FastAPI, parts: Parts, settings: RouterSettings) -> None:
    """Add the endpoints of the module docstring to ``app``."""
    proxy = parts.proxy
    responses_store = proxy.adapters["responses"].store

    async def owner_of(run_id: str) -> str | None:
        """The key that started ``run_id``; ``""`` (nobody's) when the router no longer knows it."""
        state = await parts.store.get(run_id)
        if state is not None:
            return state.owner
        h = proxy.runs.get(run_id)
        return h.owner if h is not None else ""

    @app.get("/v1/runs", responses=error_responses(400, 401), summary="The caller's runs (paged)")
    async def runs(request: Request) -> Response:
        try:
            tenant = proxy.check_auth(request)
            return json_response(list_runs(proxy.runs, tenant, request.query_params))
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)

    async def stored(request: Request, response_id: str, items: bool) -> Response:
        try:
            tenant = proxy.check_auth(request)
            rid = response_id
            entry = responses_store.get(scoped_id(tenant, rid))
            owner = await owner_of(entry.run_id) if entry is not None else ""
            if items:
                body = list_input_items(responses_store, rid, tenant, lambda _r: owner, request.query_params)
            else:
                body = get_response(responses_store, rid, tenant, lambda _r: owner)
            return json_response(body)
        except ProxyError as e:
            return error_response(e.status, e.code, e.message)

    @app.get("/v1/responses/{response_id}", responses=error_responses(401, 404), summary="A stored Response")
    async def get_stored(response_id: str, request: Request) -> Response:
        return await stored(request, response_id, items=False)

    @app.get(
        "/v1/responses/{response_id}/input_items",
        responses=error_responses(400, 401, 404),
        summary="A stored Response's input items (paged)",
    )
    async def get_items(response_id: str, request: Request) -> Response:
        return await stored(request, response_id, items=True)

    async def index(request: Request) -> Response:
        return json_response(
            {
                "name": "runroute",
                "openai_base_url": "/v1",
                "anthropic_base_url": "/",
                "endpoints": [
                    "/v1/chat/completions",
                    "/v1/responses",
                    "/v1/messages",
                    "/v1/runs",
                    "/v1/models",
                ],
                "metrics": "/metrics",
                "ui": "/ui",
            }
        )

    app.add_api_route("/", index, methods=["GET"], summary="Index")
    # Claude Code probes HEAD /; one operation in the spec (two methods on one route share an id)
    app.add_api_route("/", index, methods=["HEAD"], include_in_schema=False)

    from router.server.ui import register_ui

    register_ui(app, parts, settings)
