"""Run identity: which agent run does a request belong to, in any of the three protocols?

Algorithm, first match wins:

1. the ``X-Run-Id`` request header (the agent or its framework knows the run; recommended);
2. ``metadata.run_id`` in the body (OpenAI's ``metadata`` object);
3. an id the protocol itself carries (:meth:`router.server.protocols.base.Adapter.natural_id`): a
   Responses ``previous_response_id`` names the run of the response it continues; a Claude Code
   session (``x-claude-code-session-id`` header, or the ``session_<uuid>`` in its
   ``metadata.user_id``) is one run;
4. a stable hash of the conversation's opening, protocol-independent so a run may change protocol
   between steps: ``"h-" + sha256(orjson([user scope, system text, first user text]))[:20]`` where
   the texts are normalised to plain strings (a chat system/developer message, Responses
   ``instructions`` or a system item, Messages ``system``; the first user message; string content
   or the concatenated ``text`` of its parts) and the user scope is the body's ``user`` (chat,
   Responses) or ``metadata.user_id`` (Messages), so identical openings of two users never merge.
   ``user`` is a tenant/user attribute, never a run id by itself.

   Generations (:class:`OpeningRuns`): the hash names the *latest* run with that opening; a request
   with that opening starts a new run (``<hash>.<n>``) when the latest run ended (``POST
   /v1/runs/{id}/end`` or the idle sweep), went idle longer than ``identity.reopen_gap_s``, or when
   the request is itself an opening (no assistant turn yet) while the latest run already served
   one: the second trial of a task starts at step 0 instead of resuming the first at step 2.

Sanitising (:func:`clean_id`, every id from a header or the body): surrounding whitespace is
stripped; every character outside the safe set :data:`SAFE` (ASCII letters, digits and
``-._~:@!$&'()*+,;=%``) is percent-encoded as its UTF-8 bytes (``"中文-run"`` ->
``"%E4%B8%AD%E6%96%87-run"``, ``"a/b"`` -> ``"a%2Fb"``), so an id is always a valid HTTP header
value (``x-runroute-run-id``), one URL path segment and one log token. ``%`` itself is kept, so
cleaning is idempotent: the id in ``x-runroute-run-id`` and its decoded form both find the run
under ``/v1/runs/{id}`` (the endpoints clean the path parameter the same way). An id longer than
:data:`MAX_ID_LEN` after encoding (or empty) is hashed: ``"h-" + sha256(id)[:20]``.

Tenants (:func:`scoped_id`): with client keys configured every run id lives in the namespace of
the key that sent it: the store key, the run tracker's key and the run log's ``run_id`` are
``"<key id>/<client id>"`` (:func:`router.server.auth.key_id`; ``/`` never occurs in a cleaned id,
so the split is unambiguous), and the client sees only ``<client id>`` (``x-runroute-run-id``,
``GET /v1/runs/{id}``: :func:`client_id`). Two tenants using one id, or one opening, have two
runs; a step or a read on an id another tenant uses finds nothing of it (the same answer as for an
unused id), and an ended run keeps its tenant for as long as its history is kept. The opening hash
(rule 4) is salted with the key id as well, so hash-derived ids of two tenants differ. Without keys
(open mode) ids are not scoped.

Idle end (:func:`idle_end_from_pauses`): a run with no step for ``identity.idle_end_s`` is ended by
the sidecar's sweep (end reason ``idle``), releasing its admission slot. The default, 900 s, is
``1.25 x`` the largest per-source p99 of ``tool_pause_s`` in the shipped run logs (Mooncake 690 s,
tau2-bench 4.6 s), rounded up to a minute; run :func:`idle_end_from_pauses` on your own logs.

How clients pass a run id: see docs/protocols.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "run_id_for",
    "explicit_id",
    "hash_opening",
    "opening_hash",
    "clean_id",
    "OpeningRuns",
    "idle_end_from_pauses",
    "MAX_ID_LEN",
    "SAFE",
    "scoped_id",
    "client_id",
    "tenant_of",
    "SCOPE_SEP",
    "header_text",
]

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


_clean = clean_id

#: separates a tenant's key id from a client run id in a scoped id (never in a cleaned id)
SCOPE_SEP = "/"


def scoped_id(tenant: str | None, run_id: str) -> str:
    """The store key of ``run_id`` (a cleaned id) sent by ``tenant`` (a key id; None in open mode)."""
    return run_id if tenant is None else f"{tenant}{SCOPE_SEP}{run_id}"


def client_id(sid: str) -> str:
    """The id a client sees for the scoped id ``sid`` (the inverse of :func:`scoped_id`)."""
    return sid.split(SCOPE_SEP, 1)[1] if SCOPE_SEP in sid else sid


def tenant_of(sid: str) -> str | None:
    """The tenant (key id) of a scoped id; None for an unscoped one (open mode)."""
    return sid.split(SCOPE_SEP, 1)[0] if SCOPE_SEP in sid else None


def opening_hash(
    system: str | None, user: str | None, scope: str | None = None, salt: str | None = None
) -> str:
    """The protocol-independent hash of an opening (module docstring, rule 4); ``salt``: the
    tenant's key id (None in open mode, which keeps the unsalted hash)."""
    parts = [scope, system, user] if salt is None else [scope, system, user, salt]
    return "h-" + hashlib.sha256(orjson.dumps(parts)).hexdigest()[:20]


def hash_opening(messages: list[object], scope: str | None = None) -> str:
    """The opening hash of a chat-completions message list."""
    from router.server.protocols.chat import chat_opening

    system, user, _ = chat_opening(messages)
    return opening_hash(system, user, scope)


def header_text(value: str) -> str:
    """A header value as the client wrote it: the server decodes header bytes as Latin-1, so raw
    UTF-8 bytes (``X-Run-Id: 中文``) are re-read as UTF-8 (kept as is when they are not UTF-8)."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def explicit_id(header_value: str | None, body: Mapping[str, object]) -> tuple[str, str] | None:
    """Rules 1-2: the ``X-Run-Id`` header (raw UTF-8 read as UTF-8, :func:`header_text`), else
    ``metadata.run_id``; the same text names the same run either way."""
    if header_value and header_value.strip():
        return _clean(header_text(header_value.strip())), "header"
    meta = body.get("metadata")
    if isinstance(meta, dict):
        rid = meta.get("run_id")
        if isinstance(rid, str) and rid:
            return _clean(rid), "metadata"
    return None


def run_id_for(header_value: str | None, body: Mapping[str, Any]) -> tuple[str, str]:
    """Chat-completions identity without generations: ``(run_id, source)`` (header, metadata,
    hash); the sidecar resolves through :class:`OpeningRuns`."""
    found = explicit_id(header_value, body)
    if found is not None:
        return found
    user = body.get("user")
    return hash_opening(body.get("messages") or [], user if isinstance(user, str) and user else None), "hash"


@dataclass(slots=True)
class _Latest:
    run_id: str
    generation: int


class OpeningRuns:
    """The latest run of each opening hash and the rule that starts the next one (rule 4).

    ``status(run_id) -> (ended, idle_s, served_opening)`` is asked of the caller's run tracker."""

    def __init__(self, reopen_gap_s: float, max_entries: int = 100000):
        self.reopen_gap_s = reopen_gap_s
        self.max_entries = max_entries
        self._latest: dict[str, _Latest] = {}

    def resolve(
        self, base: str, is_opening: bool, status: Callable[[str], tuple[bool, float | None, bool]]
    ) -> str:
        cur = self._latest.get(base)
        if cur is None:
            cur = self._latest[base] = _Latest(base, 1)
            if len(self._latest) > self.max_entries:
                self._latest.pop(next(iter(self._latest)))
            return base
        ended, idle_s, served_opening = status(cur.run_id)
        if ended or (idle_s is not None and idle_s > self.reopen_gap_s) or (is_opening and served_opening):
            cur.generation += 1
            cur.run_id = f"{base}.{cur.generation}"
        return cur.run_id


def idle_end_from_pauses(pauses: Iterable[float], factor: float = 1.25, round_to_s: float = 60.0) -> float:
    """The idle-end time for a population of tool pauses: ``factor x p99``, rounded up."""
    xs = sorted(float(p) for p in pauses if p is not None and p == p)
    if not xs:
        raise ValueError("no tool pauses")
    k = min(len(xs) - 1, max(0, math.ceil(0.99 * len(xs)) - 1))
    return math.ceil(factor * xs[k] / round_to_s) * round_to_s
