"""Tool-call verb classes: what a tool call *does*, read from its name, the same in every domain.

Hash buckets of tool names (``fs-1``) carry one domain's meanings onto another's tools (bucket 3 is
``get_reservation_details`` in airline and some unrelated tool in retail). The verb of a tool name
means the same everywhere: an agent that keeps reading is exploring, one that writes is acting.

Algorithm (:func:`verb_class`): the name is split into lower-case tokens (on ``_``, ``-``, ``.``,
``/``, spaces, digits and camelCase boundaries: ``getUserDetails`` -> ``get user details``). The
first token decides when it is in a table (``search_flights`` -> read); otherwise the first later
token found in a table does, write before read (``user_update`` -> write; ``order_details_get`` ->
read); otherwise the call is ``other`` (``think``, ``calculate``, ``bash``). A token matches a
table entry when it equals it or starts with it and is at most 3 characters longer (``lists``,
``searching``, ``booked``, ``updates``). Results are cached per name (bounded), so the per-step
cost is a dict lookup.

The tables (:data:`READ_VERBS`, :data:`WRITE_VERBS`) are small on purpose; extend them here (and
bump the feature spec) rather than per deployment.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["READ", "WRITE", "OTHER", "VERB_CLASSES", "READ_VERBS", "WRITE_VERBS", "verb_class", "tokens"]

READ, WRITE, OTHER = 0, 1, 2
VERB_CLASSES: tuple[str, ...] = ("read", "write", "other")

#: look things up, change nothing
READ_VERBS: frozenset[str] = frozenset(
    {
        "get",
        "read",
        "search",
        "list",
        "find",
        "check",
        "lookup",
        "look",
        "fetch",
        "query",
        "retrieve",
        "show",
        "view",
        "describe",
        "inspect",
        "count",
        "verify",
        "browse",
        "open",
        "grep",
        "cat",
        "ls",
    }
)
#: change the world (bookings, orders, accounts, files, messages)
WRITE_VERBS: frozenset[str] = frozenset(
    {
        "create",
        "update",
        "cancel",
        "book",
        "modify",
        "transfer",
        "send",
        "delete",
        "remove",
        "add",
        "set",
        "change",
        "exchange",
        "return",
        "refund",
        "pay",
        "submit",
        "edit",
        "write",
        "upgrade",
        "suspend",
        "resume",
        "enable",
        "disable",
        "toggle",
        "reset",
        "reboot",
        "refuel",
        "grant",
        "apply",
        "insert",
        "replace",
        "move",
        "post",
        "put",
        "patch",
        "issue",
        "assign",
        "close",
        "escalate",
    }
)

_SPLIT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def tokens(name: str) -> list[str]:
    """Lower-case word tokens of a tool name (module docstring)."""
    return [t.lower() for t in _SPLIT.findall(name)]


def _match(tok: str, table: frozenset[str]) -> bool:
    if tok in table:
        return True
    for n in range(max(2, len(tok) - 3), len(tok)):
        if tok[:n] in table:
            return True
    return False


@lru_cache(maxsize=8192)
def verb_class(name: str) -> int:
    """:data:`READ`, :data:`WRITE` or :data:`OTHER` for a tool name (module docstring)."""
    toks = tokens(name)
    if not toks:
        return OTHER
    first = toks[0]
    if _match(first, WRITE_VERBS):
        return WRITE
    if _match(first, READ_VERBS):
        return READ
    rest = toks[1:]
    for t in rest:
        if _match(t, WRITE_VERBS):
            return WRITE
    for t in rest:
        if _match(t, READ_VERBS):
            return READ
    return OTHER
