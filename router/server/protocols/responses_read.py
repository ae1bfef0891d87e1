"""``GET /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``: the stored Responses.

The router keeps every answered Response it may need for ``previous_response_id`` chaining
(:class:`router.server.protocols.responses.ResponseStore`: bounded, in memory, never logged). These two reads
answer from that store in OpenAI's shapes, so a client that retrieves a response it created
through the router (openai ``client.responses.retrieve`` / ``input_items.list``) gets it back.

Algorithm: look the id up in the store; the response belongs to the run it was answered for, and
that run to the key that started it (``owner_of(run_id)``); a caller (``tenant``: its key id,
passed explicitly; None without client keys) that does not own it gets the same 404
``response_not_found`` as for an unknown id, so ids never leak across tenants.

What comes back is what the store holds, no more: ``id``, ``object: "response"``, ``status:
"completed"``, ``output`` (the answer's output items), ``previous_response_id``, and the router's
``metadata`` of where it was served (``runroute_run_id``, ``runroute_backend``); ``usage`` and
``model`` are not stored and are absent. ``input_items`` lists that response's own input items
(not the whole chain), newest first by default like OpenAI's, each with an ``id`` (the item's own,
or ``<response id>_in_<index>`` when the client sent none), ``type: "message"`` on messages and a
message's string content as one ``input_text`` part, as OpenAI lists them.

Query parameters of ``input_items`` (400 ``invalid_limit`` / ``invalid_order`` / ``invalid_after``):
``limit`` 1..100 (default 20), ``order`` ``desc`` (default) or ``asc``, ``after`` an item id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from router.server.auth import Access
from router.server.errors import ProxyError
from router.server.protocols.responses import ResponseStore, StoredResponse
from router.server.protocols.sse import JSONObject
from router.server.runs.identity import client_id, scoped_id

__all__ = ["get_response", "list_input_items"]


def _stored(
    store: ResponseStore, rid: str, tenant: str | None, owner_of: Callable[[str], str | None]
) -> StoredResponse:
    entry = store.get(scoped_id(tenant, rid))  # stored under the caller key's namespace
    if entry is None or not Access.owns(owner_of(entry.run_id), tenant):
        raise ProxyError(404, "response_not_found", f"no stored response {rid!r}")
    return entry


def get_response(
    store: ResponseStore, rid: str, tenant: str | None, owner_of: Callable[[str], str | None]
) -> JSONObject:
    """The stored response ``rid`` in OpenAI's Response shape (the fields the store holds)."""
    e = _stored(store, rid, tenant, owner_of)
    return {
        "id": rid,
        "object": "response",
        "status": "completed",
        "output": list(e.output),
        "previous_response_id": client_id(e.previous) if e.previous is not None else None,
        "metadata": {"runroute_run_id": client_id(e.run_id), "runroute_backend": e.backend},
    }


def _as_listed(item: JSONObject, fallback_id: str) -> JSONObject:
    """An input item as OpenAI lists it: an ``id``, ``type: "message"`` on a message, and a
    message's string content as one ``input_text`` (``output_text`` for the assistant) part."""
    out = dict(item)
    if not isinstance(out.get("id"), str):
        out = {"id": fallback_id, **out}
    if "role" in out and "type" not in out:
        out["type"] = "message"
    if out.get("type") == "message" and isinstance(out.get("content"), str):
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": part, "text": out["content"]}]
    return out


def list_input_items(
    store: ResponseStore,
    rid: str,
    tenant: str | None,
    owner_of: Callable[[str], str | None],
    query: Mapping[str, str],
) -> JSONObject:
    """One page of the stored response's input items (OpenAI's list shape)."""
    e = _stored(store, rid, tenant, owner_of)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ProxyError(400, "invalid_order", "'order' must be asc or desc")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ProxyError(400, "invalid_limit", "'limit' must be an integer in 1..100")
    items = [_as_listed(it, f"{rid}_in_{i}") for i, it in enumerate(e.input)]
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        idx = next((i for i, it in enumerate(items) if it["id"] == after), None)
        if idx is None:
            raise ProxyError(400, "invalid_after", f"'after' names no input item of {rid!r}")
        items = items[idx + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
