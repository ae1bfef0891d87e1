"""``GET /v1/runs``: the runs this router tracks, one page at a time, only the caller's.

Algorithm (this router process's view: with several routers on one Redis store, each lists the
runs it has served): take the runs of the router's run history (:class:`router.server.hotpath.proxy.RunHistory`,
bounded by ``server.run_history_runs``), keep those the caller's key owns (``tenant`` is the
caller's key id, passed explicitly; without client keys every run is visible, as for
``GET /v1/runs/{id}``), then the ``state`` and ``domain`` filters, order them by start (oldest
first, run id breaking ties) and cut one page after the cursor. The page is OpenAI's list shape
(``object: "list"``, ``data``, ``first_id``, ``last_id``, ``has_more``); a run's row is the summary
of ``GET /v1/runs/{id}`` without its steps.

Query parameters (each checked; bad values answer 400 in OpenAI's error shape with a code):

- ``state``: ``active`` (not ended) or ``ended``; absent = both (``invalid_state``);
- ``domain``: exact domain string (``GET /v1/runs/{id}``'s ``domain``);
- ``limit``: rows per page, 1..:data:`MAX_LIMIT` (default :data:`DEFAULT_LIMIT`; ``invalid_limit``);
- ``after``: the ``last_id`` of the previous page (``invalid_after`` when that run is unknown or
  not the caller's: a cursor never reveals another tenant's run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from router.server.auth import Access
from router.server.errors import ProxyError
from router.server.runs.identity import client_id

if TYPE_CHECKING:
    from router.server.hotpath.proxy import RunHistory

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "list_runs", "run_row"]

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
STATES = ("active", "ended")


def run_row(run_id: str, h: RunHistory) -> dict[str, Any]:
    """One run's summary (no steps): what ``GET /v1/runs`` lists."""
    entries = list(h.entries)
    return {
        "run_id": client_id(run_id),  # the id the client sent (the store key is tenant-scoped)
        "object": "runroute.run",
        "state": "ended" if h.ended else "active",
        "id_source": h.id_source,
        "domain": h.domain,
        "domain_source": h.domain_source,
        "protocols": sorted(h.protocols),
        "n_steps": len(entries),
        "tiers": sorted({e["tier"] for e in entries if e.get("tier")}),
        "replicas": sorted({e["replica"] for e in entries if e.get("replica")}),
        "inflight": h.inflight,
    }


def _int(value: str | None, default: int, lo: int, hi: int, code: str, name: str) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise ProxyError(400, code, f"'{name}' must be an integer in {lo}..{hi}")
    return n


def list_runs(runs: Mapping[str, RunHistory], tenant: str | None, query: Mapping[str, str]) -> dict[str, Any]:
    """The page of ``GET /v1/runs`` for ``tenant`` (the caller's key id; None without keys).

    ``runs``: run id -> run history (insertion order is irrelevant: rows are ordered by start).
    Raises :class:`ProxyError` (400) for a bad parameter."""
    state = query.get("state")
    if state is not None and state not in STATES:
        raise ProxyError(400, "invalid_state", f"'state' must be one of {', '.join(STATES)}")
    domain = query.get("domain")
    limit = _int(query.get("limit"), DEFAULT_LIMIT, 1, MAX_LIMIT, "invalid_limit", "limit")
    after = query.get("after")

    def key(item: tuple[str, RunHistory]) -> tuple[float, str]:
        rid, h = item
        return (h.started_s if h.started_s is not None else float("-inf"), rid)

    mine = sorted(((rid, h) for rid, h in runs.items() if Access.owns(h.owner, tenant)), key=key)
    if after is not None:
        idx = next((i for i, (rid, _) in enumerate(mine) if client_id(rid) == after), None)
        if idx is None:
            raise ProxyError(400, "invalid_after", f"'after' names no run of yours: {after!r}")
        mine = mine[idx + 1 :]
    rows = _filtered(mine, state, domain)
    page = rows[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["run_id"] if page else None,
        "last_id": page[-1]["run_id"] if page else None,
        "has_more": len(rows) > limit,
    }


def _filtered(
    runs: Iterable[tuple[str, RunHistory]], state: str | None, domain: str | None
) -> list[dict[str, Any]]:
    out = []
    for rid, h in runs:
        row = run_row(rid, h)
        if state is not None and row["state"] != state:
            continue
        if domain is not None and row["domain"] != domain:
            continue
        out.append(row)
    return out
