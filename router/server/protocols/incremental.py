"""Incremental body parse: a run's next step re-reads only the bytes after its previous step's messages.

An agent run's step ``k + 1`` sends the body of step ``k`` with one or two messages appended
(a tool call and its result): the same bytes up to the end of step ``k``'s last message, then the new
messages, then the request's other fields. Parsing and validating the whole body at every step
(2-200 KB) was ~8% of the sidecar's CPU under the realistic bench (issue 26). This module parses
only what follows the bytes a previous step of the same conversation already parsed, and gives
the same body ``orjson.loads`` of the whole would.

Algorithm (:class:`ParseCache`, one per protocol adapter, used by ``Adapter.read``):

1. Layout (:func:`scan_list`): a scan for quotes and brackets (``re`` finds the next one, strings
   are skipped with ``bytes.find``) finds the top-level key naming the message list (``messages``
   for chat and Anthropic Messages, ``input`` for Responses: the adapter's ``incremental_list``,
   written exactly so; any other spelling is simply not incremental) and the offset ``M`` of the
   list's ``[``; orjson finds the list's ``]`` (``E``) itself: parsing ``raw[M:]`` it stops with
   "unexpected content after document" right after the list; ``P`` is the end of the list's last
   element when that is an object. The *key* of a conversation is an xxh3 hash of the bytes up to
   the end of the list's second element (its opening: system prompt and task; the first element
   when there is one), found by scanning only that far.
2. A body read whole (one ``orjson.loads`` and every check) that passed is kept for its
   conversation: ``P``, a seeded 128-bit xxh3 hash of ``raw[:P]``, the fields before the list (the head:
   ``raw[:M] + b"[]}"`` parsed alone), the list's parsed elements and their deepest nesting; not
   when the fields after the list (``{"\\u0000":0`` + ``raw[E+1:]``, refused when they hold the text
   ``\\u0000``, so no client key can be the sentinel) repeat the list's key.
3. The next body of the conversation (same key, longer than ``P``, the same hash of its first ``P``
   bytes) is parsed in pieces whose concatenation is the body: the kept head and elements for
   ``raw[:P]``, ``[0`` + ``raw[P:E'+1]`` (its new elements; ``E'`` found by orjson from ``P``) and
   the tail ``{"\\u0000":0`` + ``raw[E'+1:]``. JSON's grammar is unambiguous, so when the pieces
   parse the body is valid and its value is the head with the list set and then each tail field set
   in order: the same dict, key order and duplicate-key outcome (last value, first position) as one
   ``orjson.loads``. Only the new elements are validated (by the adapter); the fields outside the
   list are validated whole, and the nesting depth is the kept elements' depth combined with the
   new parts' and the outside fields'. An agent sends the same fields outside the list at every
   step (tools, sampling options): when the bytes after the list equal those of the body the entry
   was kept for (accepted, so its outside fields passed every check), their parsed fields, depth and
   checks are that body's (the head is inside the hashed prefix, so it is the same too); any other
   bytes are parsed and checked afresh. Those bytes also give the list's end at once: when the body
   ends with them and ``[0`` + the bytes from ``P`` up to the one before them parses, that byte is
   the list's ``]`` (orjson's failing parse that finds ``E'`` otherwise is not needed).
4. Anything else (no entry, another prefix: a client that edited an earlier message, a layout the
   scan does not follow, a piece that does not parse, any validation error) takes the full path:
   one ``orjson.loads`` and the whole validation, so errors are exactly those of the full parse.

The kept elements are shared with the bodies built from them: the request path never modifies a
parsed body in place (the forwarders splice the raw bytes; translations build new objects).

Tenants: one cache serves every client key, and a kept prefix is reused only for a body whose
first ``P`` bytes hash the same. That hash is 128-bit xxh3 with a seed drawn at random for each
cache (``os.urandom``), so nobody outside the process can compute it, let alone craft bytes that
collide with another client's conversation to have its messages substituted into their request.

Cost: the conversation's bytes are hashed once per step (xxh3, ~10 GB/s); the scan touches only the
opening, orjson only the new messages and the fields after them. Memory: each entry keeps its conversation's parsed messages (about the raw size, plus
~100 bytes per JSON container); bounded by ``server.parse_cache_runs`` entries and
``server.parse_cache_mb`` (the sum of the kept prefixes' and outside bytes' raw sizes), least
recently used out.

Knobs: ``server.parse_cache_runs`` (0 turns the cache off), ``server.parse_cache_mb``.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

__all__ = ["ParseCache", "Parsed", "Outside", "Layout", "scan_list", "opening_key"]

_SPECIAL = re.compile(rb'["\[\]{}]')  # the next quote or bracket
_WS = b" \t\r\n"
_QUOTE, _OPEN_SQ, _CLOSE_SQ, _OPEN_CU, _CLOSE_CU, _COLON, _BSLASH = 0x22, 0x5B, 0x5D, 0x7B, 0x7D, 0x3A, 0x5C
_SENTINEL = "\x00"
_TAIL_OPEN = b'{"\\u0000":0'
_AFTER = "unexpected content after document"  # orjson's error for bytes after one JSON value


@dataclass(slots=True)
class Layout:
    """Offsets of the message list in a body (module docstring): ``m`` its ``[``, ``e`` its ``]``,
    ``p`` the end of its last element when that is an object (else None)."""

    m: int
    e: int
    p: int | None


def _skip_ws(raw: bytes, i: int) -> int:
    n = len(raw)
    while i < n and raw[i] in _WS:
        i += 1
    return i


def _string_end(raw: bytes, i: int) -> int:
    """The offset after the closing quote of the JSON string opening at ``i`` (-1: none)."""
    find = raw.find
    j = find(b'"', i + 1)
    while j != -1 and raw[j - 1] == _BSLASH:
        k = j - 1
        while raw[k] == _BSLASH:
            k -= 1
        if (j - 1 - k) % 2 == 0:  # an even run of backslashes: the quote is not escaped
            break
        j = find(b'"', j + 1)
    return -1 if j == -1 else j + 1


def _find_list(raw: bytes, key: bytes) -> int | None:
    """Offset of the ``[`` of the top-level ``key``'s value (the first such key), else None. A
    scan for quotes and brackets (strings skipped with ``bytes.find``), so only the fields before
    the list are walked."""
    depth, pos, search = 0, 0, _SPECIAL.search
    while True:
        mt = search(raw, pos)
        if mt is None:
            return None
        i = mt.start()
        c = raw[i]
        if c == _QUOTE:
            pos = _string_end(raw, i)
            if pos < 0:
                return None
            if depth == 1:
                j = _skip_ws(raw, pos)
                if j < len(raw) and raw[j] == _COLON and raw[i:pos] == key:
                    v = _skip_ws(raw, j + 1)
                    return v if v < len(raw) and raw[v] == _OPEN_SQ else None
            continue
        pos = i + 1
        if c == _OPEN_SQ or c == _OPEN_CU:
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return None


def _elements_end(raw: bytes, start: int, want: int) -> int | None:
    """From ``start`` just after a list's ``[``: the end of its ``want``-th element, or of its last
    one when it has fewer (None: an empty list or bytes that end first)."""
    depth, pos, seen, end, search = 0, start, 0, None, _SPECIAL.search
    while True:
        mt = search(raw, pos)
        if mt is None:
            return None
        i = mt.start()
        c = raw[i]
        if c == _QUOTE:
            pos = _string_end(raw, i)
            if pos < 0:
                return None
            if depth == 0:
                seen, end = seen + 1, pos
        else:
            pos = i + 1
            if c == _OPEN_SQ or c == _OPEN_CU:
                depth += 1
                continue
            if depth == 0:
                return end
            depth -= 1
            if depth == 0:
                seen, end = seen + 1, pos
        if seen >= want and depth == 0:
            return end


def _list_end(raw: bytes, start: int, lead: bytes) -> int | None:
    """The offset of the ``]`` closing the list that ``lead + raw[start:]`` opens, found by
    orjson itself: it parses the list and stops at the first byte after it."""
    try:
        orjson.loads(lead + raw[start:])
    except orjson.JSONDecodeError as err:
        if err.msg != _AFTER:
            return None
        d, pos = err.doc, err.pos
        if not d.isascii():  # orjson's position counts characters
            pos = len(d[:pos].encode("utf-8", "surrogatepass"))
        e = start - len(lead) + pos
        while e > start and raw[e - 1] in _WS:
            e -= 1
        e -= 1
        return e if start <= e < len(raw) and raw[e] == _CLOSE_SQ else None
    return None


def _last_object_end(raw: bytes, after: int, e: int) -> int | None:
    """The end of the list's last element when it is an object; ``after`` when no element follows
    it before ``e`` (the list's ``]``); None otherwise."""
    q = e
    while q > after and raw[q - 1] in _WS:
        q -= 1
    if q == after:
        return after
    return q if raw[q - 1] == _CLOSE_CU else None


def scan_list(raw: bytes, key: bytes = b'"messages"') -> Layout | None:
    """The message list's :class:`Layout` in ``raw`` (module docstring), None when not found."""
    m = _find_list(raw, key)
    if m is None:
        return None
    e = _list_end(raw, m + 1, b"[")
    if e is None:
        return None
    p = _last_object_end(raw, m + 1, e)
    return Layout(m, e, p if p is not None and p > m + 1 else None)


def opening_key(raw: bytes, key: bytes = b'"messages"') -> int | None:
    """The conversation key: xxh3 of ``raw`` up to the end of the list's second element (first when
    there is one); None when the list is not found or is empty."""
    m = _find_list(raw, key)
    if m is None:
        return None
    end = _elements_end(raw, m + 1, 2)
    if end is None:
        return None
    return xxhash.xxh3_64_intdigest(memoryview(raw)[:end])


def _tail(raw: bytes, e: int) -> dict[str, Any] | None:
    """The fields after the list (``raw[e+1:]``), or None (refused or not JSON)."""
    return _tail_of(raw[e + 1 :])


def _tail_of(rest: bytes) -> dict[str, Any] | None:
    """The fields in ``rest`` (the bytes after the list's ``]``), or None (refused or not JSON)."""
    if b"\\u0000" in rest:
        return None
    try:
        t = orjson.loads(_TAIL_OPEN + rest)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(t, dict):  # pragma: no cover - the wrapper is an object
        return None
    t.pop(_SENTINEL, None)
    return t


@dataclass(slots=True)
class Outside:
    """The fields outside the list of an accepted body (module docstring, 3): the bytes after the
    list, their parsed fields, and the deepest json_depth of every field but the list (counted
    with ``max_depth``; -1: not counted yet)."""

    rest: bytes
    tail: dict[str, Any]
    depth: int
    max_depth: int


@dataclass(slots=True)
class _Entry:
    p: int
    digest: int
    head: dict[str, Any]
    items: list[Any]
    depth: int  # the deepest element's json_depth (0 without elements)
    outside: Outside | None = None  # the accepted body's fields outside the list, when known

    @property
    def size(self) -> int:
        """The bytes it counts against ``max_bytes``: the kept prefix and the kept outside bytes."""
        return self.p + (len(self.outside.rest) if self.outside is not None else 0)


@dataclass(slots=True)
class Parsed:
    """A body parsed by :meth:`ParseCache.try_incremental` (or whole): the body, the list's elements the caller has
    not validated yet (``new``: all of them after a full parse) and the elements' depth so far."""

    body: dict[str, Any]
    new: list[Any]
    kept_depth: int  # the kept (already validated) elements' deepest json_depth
    incremental: bool
    p: int | None = None  # incremental: the end of the last element (None: not an object)
    digest: int = 0  # incremental: xxh3 of raw[:p]
    # the fields outside the list: the kept ones of an accepted body when this body's are the same
    # bytes (``same_outside``: their depth and checks are that body's), else new ones whose depth
    # the caller counts (``Outside.depth``), kept with the entry once the body is accepted
    outside: Outside | None = None
    same_outside: bool = False


class ParseCache:
    """Per-conversation parse state (module docstring). Not thread-safe (the event loop's)."""

    def __init__(self, runs: int = 2048, max_bytes: int = 256 << 20, key: bytes = b'"messages"'):
        self.runs = runs
        self.max_bytes = max_bytes
        self.key = key
        self.field = key.strip(b'"').decode()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._seed = int.from_bytes(os.urandom(8), "little")  # the prefix digest's (module docstring)
        self._bytes = 0
        self.hits = 0  # bodies read incrementally
        self.misses = 0  # bodies with a conversation key read whole

    @property
    def enabled(self) -> bool:
        return self.runs > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def try_incremental(self, raw: bytes) -> tuple[int | None, Parsed | None]:
        """``(conversation key, parsed)``: ``parsed`` is None when the incremental path does not
        apply (the caller parses the whole body); never raises for bad input."""
        ck = opening_key(raw, self.key)
        if ck is None:
            return None, None
        ent = self._entries.get(ck)
        if ent is None or len(raw) <= ent.p:
            return ck, None
        h = xxhash.xxh3_128(seed=self._seed)
        mv = memoryview(raw)
        h.update(mv[: ent.p])
        if h.intdigest() != ent.digest:
            return ck, None
        kept = ent.outside
        new: Any = None
        e = len(raw) - 1 - len(kept.rest) if kept is not None else -1
        if e >= ent.p and raw[e] == _CLOSE_SQ and raw.endswith(kept.rest):  # type: ignore[union-attr]
            # the accepted body's outside bytes end this one: the list's ``]`` is the byte before
            # them when the new elements parse up to it (the failing parse of _list_end not needed)
            try:
                new = orjson.loads(b"[0" + raw[ent.p : e + 1])
            except orjson.JSONDecodeError:
                new = None
        if new is None:
            e2 = _list_end(raw, ent.p, b"[0")
            if e2 is None:
                return ck, None
            e = e2
            try:
                new = orjson.loads(b"[0" + raw[ent.p : e + 1])
            except orjson.JSONDecodeError:
                return ck, None
        p = _last_object_end(raw, ent.p, e)
        rest = raw[e + 1 :]
        if kept is not None and rest == kept.rest:  # the accepted body's fields again
            tail, outside, same = kept.tail, kept, True
        else:
            t = _tail_of(rest)
            if t is None or self.field in t:
                return ck, None
            tail, outside, same = t, Outside(rest, t, -1, -1), False
        del new[0]
        body = dict(ent.head)
        body[self.field] = ent.items + new
        for k, v in tail.items():
            body[k] = v
        if p is not None:
            h.update(mv[ent.p : p])
        return ck, Parsed(body, new, ent.depth, True, p, h.intdigest(), outside, same)

    def remember(self, ck: int, raw: bytes, parsed: Parsed, depth: int) -> None:
        """Keep ``raw``'s state for the conversation ``ck`` after its body was accepted (validated);
        ``depth``: the deepest json_depth of all the list's elements."""
        items = parsed.body.get(self.field)
        if not isinstance(items, list):
            return
        if parsed.incremental:
            self.hits += 1  # an accepted incremental read
            old = self._entries.get(ck)
            if old is None or parsed.p is None:  # the last element is not an object: start over
                self._drop(ck)
                return
            p, digest, head = parsed.p, parsed.digest, old.head
            outside = parsed.outside if parsed.outside is not None and parsed.outside.depth >= 0 else None
        else:
            self.misses += 1
            # the body parsed whole (valid JSON), so the scan's layout is exact; the value at the
            # first exactly-spelled key is the body's list unless the tail repeats the key
            lay = scan_list(raw, self.key)
            if lay is None or lay.p is None:
                return
            p = lay.p
            try:  # the fields before the list, parsed alone (module docstring)
                head = orjson.loads(raw[: lay.m] + b"[]}")
            except orjson.JSONDecodeError:  # pragma: no cover - a prefix of a valid body
                return
            tail = _tail(raw, lay.e)
            if tail is None or self.field in tail or not isinstance(head, dict):
                return
            digest = xxhash.xxh3_128_intdigest(memoryview(raw)[:p], seed=self._seed)
            outside = None  # counted at the conversation's next step
        self._drop(ck)
        self._entries[ck] = _Entry(p, digest, head, items, depth, outside)
        self._bytes += self._entries[ck].size
        while self._entries and (len(self._entries) > self.runs or self._bytes > self.max_bytes):
            _, ev = self._entries.popitem(last=False)
            self._bytes -= ev.size

    def _drop(self, ck: int) -> None:
        old = self._entries.pop(ck, None)
        if old is not None:
            self._bytes -= old.size
