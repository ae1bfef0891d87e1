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

Ids are limited to 200 printable characters; longer or unprintable ids are hashed the same way
(``"h-" + sha256(id)[:20]``) so they are safe in logs, headers and URLs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["run_id_for", "hash_opening", "MAX_ID_LEN"]

MAX_ID_LEN = 200


def _clean(rid: str) -> str:
    if 0 < len(rid) <= MAX_ID_LEN and rid.isprintable() and "/" not in rid:
        return rid
    return "h-" + hashlib.sha256(rid.encode("utf-8", "replace")).hexdigest()[:20]


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
        return _clean(header_value.strip()), "header"
    meta = body.get("metadata")
    if isinstance(meta, dict):
        rid = meta.get("run_id")
        if isinstance(rid, str) and rid:
            return _clean(rid), "metadata"
    user = body.get("user")
    if isinstance(user, str) and user:
        return _clean(user), "user"
    return hash_opening(body.get("messages") or []), "hash"
