"""Run identity: which agent run does a chat-completions request belong to?

Algorithm, first match wins:

1. the ``X-Run-Id`` request header (the agent or its framework knows the run; recommended);
2. ``metadata.run_id`` in the body (OpenAI's ``metadata`` object), else the body's ``user`` field;
3. a stable hash of the conversation's opening: ``"h-" + sha256(orjson([system, first_user]))[:20]``
   where ``system`` is the content of the first ``system``/``developer`` message (or null) and
   ``first_user`` the content of the first ``user`` message (or null); contents are hashed as given
   (string or list of parts). Each step of an agent run re-sends the same opening, so its steps
   share the id; two runs that open with byte-identical system prompt *and* first user message
   collide and are treated as one run (send ``X-Run-Id`` to separate them).

Sanitising (:func:`clean_id`, every id from a header or the body): surrounding whitespace is
stripped; every character outside the safe set :data:`SAFE` (ASCII letters, digits and
``-._~:@!$&'()*+,;=%``) is percent-encoded as its UTF-8 bytes (``"中文-run"`` ->
``"%E4%B8%AD%E6%96%87-run"``, ``"a/b"`` -> ``"a%2Fb"``), so an id is always a valid HTTP header
value (``x-runroute-run-id``), one URL path segment and one log token. ``%`` itself is kept, so
cleaning is idempotent: the id in ``x-runroute-run-id`` and its decoded form both find the run
under ``/v1/runs/{id}`` (the endpoints clean the path parameter the same way). An id longer than
:data:`MAX_ID_LEN` after encoding (or empty) is hashed: ``"h-" + sha256(id)[:20]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["run_id_for", "hash_opening", "clean_id", "MAX_ID_LEN", "SAFE"]

MAX_ID_LEN = 200
SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:@!$&'()*+,;=%")


def clean_id(rid: str) -> str:
    """The header-, URL- and log-safe form of a run id (module docstring)."""
    rid = rid.strip()
    if rid and len(rid) <= MAX_ID_LEN and all(ch in SAFE for ch in rid):
        return rid  # the common case: nothing to encode
    out = "".join(
        ch if ch in SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")) for ch in rid
    )
    if 0 < len(out) <= MAX_ID_LEN:
        return out
    return "h-" + hashlib.sha256(rid.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def hash_opening(messages: list[Any]) -> str:
    system = user = None
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if system is None and role in ("system", "developer"):
            system = m.get("content")
        elif role == "user":
            user = m.get("content")
            break
    digest = hashlib.sha256(orjson.dumps([system, user])).hexdigest()[:20]
    return "h-" + digest


def run_id_for(header_value: str | None, body: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(run_id, source)`` with source one of ``header``, ``metadata``, ``user``, ``hash``."""
    if header_value:
        return clean_id(header_value), "header"
    meta = body.get("metadata")
    if isinstance(meta, dict):
        rid = meta.get("run_id")
        if isinstance(rid, str) and rid:
            return clean_id(rid), "metadata"
    user = body.get("user")
    if isinstance(user, str) and user:
        return clean_id(user), "user"
    return hash_opening(body.get("messages") or []), "hash"
