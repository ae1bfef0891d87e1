"""The incremental body parse (router/server/protocols/incremental.py) gives the same request and
the same errors as the full parse: on growing agent bodies (the realistic bench's), on bodies that
edit an earlier message (the full parse again), on bad new messages, odd layouts and any
serialisation (hypothesis)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.server.errors import ProxyError
from router.server.protocols.base import Adapter
from router.server.protocols.chat import ChatAdapter
from router.server.protocols.incremental import ParseCache, opening_key, scan_list
from router.server.protocols.messages import MessagesAdapter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from realistic_load import ChatBodies, MessagesBodies, ResponsesBodies  # noqa: E402

MODELS = {"fake-model": "local"}


def _outcome(a: Adapter, raw: bytes, max_depth: int = 64) -> tuple[Any, ...]:
    try:
        r = a.read(raw, MODELS, None, max_depth)
    except ProxyError as e:
        return ("error", e.status, e.code, e.message)
    return ("ok", r.body, list(r.body), r.requested, r.stream, r.model_alias, r.strip_usage, r.raw)


def _pair() -> tuple[ChatAdapter, ChatAdapter]:
    full, inc = ChatAdapter(), ChatAdapter()
    inc.use_parse_cache(64, 64 << 20)
    assert full.parse_cache is None and inc.parse_cache is not None
    return full, inc


def _same(full: Adapter, inc: Adapter, raw: bytes, max_depth: int = 64) -> tuple[Any, ...]:
    want = _outcome(full, raw, max_depth)
    got = _outcome(inc, raw, max_depth)
    assert got == want
    return got


def _body(msgs: list[Any], **extra: Any) -> bytes:
    return orjson.dumps({"model": "auto", "messages": msgs, **extra})


def _turn(k: int) -> list[dict[str, Any]]:
    call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": f'result {k}: "quoted" ] }}' + " \\ é 🙂"},
    ]


OPEN = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do the task."}]


def test_growing_agent_bodies_parse_incrementally_to_the_same_request():
    full, inc = _pair()
    bodies = ChatBodies("auto", 20, 2048, 40_000, False, "header")
    for run in range(3):
        for k in range(20):
            _same(full, inc, bodies.body(run, 0, k, f"r{run}"))
    pc = inc.parse_cache
    assert pc is not None and pc.hits == 3 * 19 and pc.misses == 3 and len(pc) == 3


def test_an_edited_earlier_message_takes_the_full_parse():
    full, inc = _pair()
    msgs = OPEN + _turn(0)
    _same(full, inc, _body(msgs))
    _same(full, inc, _body(msgs + _turn(1)))
    pc = inc.parse_cache
    assert pc is not None and pc.hits == 1
    edited = [dict(m) for m in msgs + _turn(1) + _turn(2)]
    edited[3]["content"] = "compacted"  # the client rewrote an earlier tool result
    got = _same(full, inc, _body(edited))
    assert got[1]["messages"][3]["content"] == "compacted"
    assert pc.hits == 1 and pc.misses == 2
    _same(full, inc, _body(edited + _turn(3)))  # and continues from the edited conversation
    assert pc.hits == 2
    shorter = msgs  # a retry of an older step
    _same(full, inc, _body(shorter))
    assert pc.hits == 2


def test_the_fields_after_the_list_are_reused_only_when_their_bytes_repeat():
    """Steps that send the same fields after the list reuse the accepted body's parsed fields,
    depth and checks (``same_outside``); changed fields (bad tools, a deeper value) and another
    depth limit are parsed and checked afresh: every outcome is the full parse's."""
    full, inc = _pair()
    pc = inc.parse_cache
    assert pc is not None
    deep_tool = {"type": "function", "function": {"name": "f", "parameters": {"a": {"b": {"c": [1]}}}}}
    extra = {"tools": [deep_tool], "temperature": 0}
    msgs = OPEN + _turn(0)
    _same(full, inc, _body(msgs, **extra))  # read whole: the outside fields are not kept yet
    for k in range(1, 4):
        msgs = msgs + _turn(k)
        ck, parsed = pc.try_incremental(_body(msgs, **extra))
        assert parsed is not None and parsed.same_outside == (k > 1)
        _same(full, inc, _body(msgs, **extra))
    assert pc.hits == 3
    depth = _outcome(full, _body(msgs, **extra))
    # the same bytes under a lower depth limit: counted again, the full parse's error
    for limit in (7, 6, 64):
        _same(full, inc, _body(msgs + _turn(9), **extra), max_depth=limit)
    assert depth[0] == "ok"
    bad = {"tools": [{"type": "function", "function": {}}], "temperature": 0}
    got = _same(full, inc, _body(msgs + _turn(10), **bad))
    assert got[0] == "error" and got[2] == "invalid_tools"
    deeper = {"tools": [deep_tool, {"x": [[[[[[[1]]]]]]]}], "temperature": 0}
    got = _same(full, inc, _body(msgs + _turn(11), **deeper), max_depth=8)
    assert got[0] == "error" and got[2] == "body_too_deep"
    msgs = msgs + _turn(9) + _turn(12)
    _same(full, inc, _body(msgs, **extra))  # and back to the kept fields
    assert pc.hits == 5
    # a body that ends with the kept bytes after a new field whose value ends in "]": the byte before
    # them is not the list's end (the new elements do not parse up to it), found by the scan instead
    got = _same(full, inc, _body(msgs + _turn(13), x=[1], **extra))
    assert got[0] == "ok" and got[1]["x"] == [1] and pc.hits == 6


@pytest.mark.parametrize(
    "new, extra",
    [
        ([{"role": "robot", "content": "x"}], {}),  # bad role
        ([{"role": "tool", "content": 5}], {}),  # bad content
        ([{"role": "assistant", "tool_calls": [{"function": "x"}]}], {}),  # bad tool call
        (["not an object"], {}),
        ([5], {}),
        ([{"role": "user", "content": [[[[[[[["deep"]]]]]]]]}], {}),  # too deep at max_depth 8
        ([], {"model": 5}),
        ([], {"model": "no-such-model"}),
        ([], {"stream": "yes"}),
        ([], {"tools": [{"type": "function", "function": {}}]}),
        ([], {"metadata": {"k": 1}}),
        ([], {"user": 3}),
        ([], {"response_format": []}),
        ([], {"stream_options": {"include_usage": 1}}),
    ],
)
def test_bad_new_input_gives_the_full_parses_error(new, extra):
    full, inc = _pair()
    msgs = OPEN + _turn(0)
    _same(full, inc, _body(msgs), max_depth=8)
    got = _same(full, inc, _body(msgs + new, **extra), max_depth=8)
    assert got[0] == "error"


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # missing }
        b'}"',  # trailing bytes
        b',"messages":[{"role":"user","content":"replaced"}]}',  # the key again: last one wins
        b',"\\u0000":1}',  # the sentinel's own key
        b',"model":"fake-model"}',  # a field again after the list
        b",}",
        b"  \n}",
    ],
)
def test_odd_tails_parse_as_the_full_parse_does(tail):
    full, inc = _pair()
    prefix = b'{"model":"auto","messages":' + orjson.dumps(OPEN + _turn(0))[:-1]
    _same(full, inc, prefix + b"]}")
    _same(full, inc, prefix + b"," + orjson.dumps(_turn(1))[1:] + tail)


def test_invalid_json_in_a_new_message_gives_the_same_message():
    full, inc = _pair()
    prefix = b'{"model":"auto","messages":' + orjson.dumps(OPEN + _turn(0))[:-1]
    _same(full, inc, prefix + b"]}")
    for bad in (
        b',{"role":"user","content":"x}]}',
        b',{"role":"user",}]}',
        b',{"role":"user","content":"\xff"}]}',
    ):
        got = _same(full, inc, prefix + bad)
        assert got[0] == "error" and got[2] == "invalid_json"


def test_layout_offsets_and_key():
    raw = _body(OPEN + _turn(0), tools=[{"type": "function", "function": {"name": "f"}}])
    lay = scan_list(raw)
    assert lay is not None
    assert raw[lay.m : lay.m + 1] == b"[" and raw[lay.e : lay.e + 1] == b"]"
    assert lay.p is not None and orjson.loads(raw[lay.m : lay.e + 1]) == OPEN + _turn(0)
    assert raw[: lay.p].endswith(b"}") and raw[lay.p : lay.e].strip() == b""
    assert opening_key(raw) == opening_key(_body(OPEN + _turn(0) + _turn(1)))
    assert opening_key(raw) != opening_key(_body([OPEN[0], {"role": "user", "content": "Other."}]))
    assert scan_list(b'{"model":"auto","input":[1]}') is None
    assert opening_key(b'{"messages":[]}') is None


def test_the_cache_is_bounded_by_runs_and_bytes():
    pc = ParseCache(runs=2, max_bytes=1 << 20)
    a = ChatAdapter()
    a.parse_cache = pc
    for i in range(5):
        a.read(_body([{"role": "user", "content": f"task {i}"}] + _turn(0)), {}, None, 64)
    assert len(pc) == 2
    one = len(_body([{"role": "user", "content": "task 0"}] + _turn(0)))
    a.use_parse_cache(100, one + 10)  # bytes for one of these conversations at a time
    pc = a.parse_cache
    assert pc is not None
    for i in range(5):
        a.read(_body([{"role": "user", "content": f"task {i}"}] + _turn(0)), {}, None, 64)
    assert len(pc) == 1
    a.use_parse_cache(0, 1 << 20)
    assert a.parse_cache is None


_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30
) | st.sampled_from(['"', "\\", '\\"', "]", "}", '"}]', "\\u0000", "é", "\U0001f642", ""])
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "robot"])},
    optional={
        "content": st.none()
        | _text
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)
    },
)
_style = st.sampled_from(["orjson", "spaces", "indent", "ascii"])


def _dump(obj: Any, style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(obj)
    if style == "spaces":
        return json.dumps(obj, ensure_ascii=False).encode()
    if style == "indent":
        return json.dumps(obj, indent=2, ensure_ascii=False).encode()
    return json.dumps(obj).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_message, min_size=1, max_size=4),
    st.lists(st.lists(_message, max_size=3), min_size=1, max_size=4),
    _style,
    st.lists(st.integers(0, 3), min_size=4, max_size=4),
    st.booleans(),
)
def test_any_conversation_parses_the_same_incrementally(opening, turns, style, edits, tools_first):
    """Random messages (quotes, backslashes, brackets, non-ASCII, bad roles), serialisations
    (compact, spaced, indented, ASCII-escaped), fields before or after the list, appended turns and
    edits of earlier messages: every step's outcome equals the full parse's."""
    full, inc = _pair()
    pc = inc.parse_cache
    assert pc is not None
    msgs = list(opening)
    prev_ok = False
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for i, turn in enumerate(turns):
        msgs = msgs + list(turn)
        if edits[i] == 3 and len(msgs) > 1:  # edit an earlier message
            msgs = [{"role": "user", "content": "edited"}] + msgs[1:]
        body: dict[str, Any] = {"tools": tools} if tools_first else {}
        body.update(model="auto", messages=msgs, stream=bool(edits[i] & 1))
        if not tools_first:
            body["tools"] = tools
        hits, n_before = pc.hits, len(msgs) - len(turn)
        got = _same(full, inc, _dump(body, style))
        ok = got[0] == "ok"
        if ok and prev_ok and edits[i] != 3 and n_before >= 2:  # a continued conversation
            assert pc.hits == hits + 1
        prev_ok = ok


def test_the_prefix_digest_is_seeded_per_cache():
    """A kept prefix is matched by a digest nobody outside the process can compute: two caches fed
    the same body keep different digests (a random seed each), and both still read the next body
    incrementally."""
    caches = []
    for _ in range(2):
        full, inc = _pair()
        _same(full, inc, _body(OPEN + _turn(0)))
        _same(full, inc, _body(OPEN + _turn(0) + _turn(1)))
        pc = inc.parse_cache
        assert pc is not None and pc.hits == 1
        caches.append(pc)
    (a,), (b,) = (list(c._entries.values()) for c in caches)
    assert a.p == b.p and a.digest != b.digest


_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": _text, "name": _text, "input": st.just({"a": [1, {"b": 2}]})}
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": _text},
        optional={
            "content": _text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text})),
            "is_error": st.booleans() | st.just("yes"),
        },
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "bogus"])}),  # refused blocks
)
_amessage = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "user", "assistant", "system"])},
    optional={"content": _text | st.lists(_block, max_size=3) | st.just(5)},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_amessage, min_size=1, max_size=4),
    st.lists(st.lists(_amessage, max_size=3), min_size=1, max_size=4),
    _style,
    st.lists(st.integers(0, 7), min_size=4, max_size=4),
    st.booleans(),
)
def test_any_messages_conversation_parses_the_same_incrementally(opening, turns, style, edits, fields_first):
    """Anthropic Messages bodies (``messages``, the list an agent's steps grow): random blocks (text,
    tool use and results, refused ones), roles, serialisations, fields before or after the list
    (``max_tokens`` sometimes missing or bad, the system prompt, tools), appended turns and edits of
    earlier messages: every step's outcome equals the full parse's, continued conversations hit."""
    tools = [{"name": "f", "input_schema": {"type": "object"}}]

    def fields(edit: int) -> dict[str, Any]:
        f: dict[str, Any] = {"system": "You are an agent.", "tools": tools}
        max_tokens = {5: None, 6: "64"}.get(edit, 64)
        if max_tokens is not None:
            f["max_tokens"] = max_tokens
        return f

    _grow_and_compare(
        MessagesAdapter(), MessagesAdapter(), "messages", fields, opening, turns, style, edits, fields_first
    )


def _grow_and_compare(full, inc, list_key, fields, opening, turns, style, edits, fields_first) -> None:  # type: ignore[no-untyped-def]
    """Grow a conversation turn by turn (``edits[i] == 3`` rewrites its first item; odd edits
    stream), the other ``fields(edit)`` before or after the list: every step's outcome through
    ``inc`` (parse cache on) equals ``full``'s, and a continued conversation hits the cache."""
    inc.use_parse_cache(64, 64 << 20)
    pc = inc.parse_cache
    assert full.parse_cache is None and pc is not None
    items = list(opening)
    prev_ok = False
    for i, turn in enumerate(turns):
        items = items + list(turn)
        if edits[i] == 3 and len(items) > 1:  # edit an earlier item
            items = [{"role": "user", "content": "edited"}] + items[1:]
        extra = fields(edits[i])
        body: dict[str, Any] = dict(extra) if fields_first else {}
        body.update({"model": "auto", list_key: items, "stream": bool(edits[i] & 1)})
        if not fields_first:
            body.update(extra)
        hits, n_before = pc.hits, len(items) - len(turn)
        got = _same(full, inc, _dump(body, style))
        ok = got[0] == "ok"
        if ok and prev_ok and edits[i] != 3 and n_before >= 2:  # a continued conversation
            assert pc.hits == hits + 1
        prev_ok = ok


def test_growing_messages_bodies_parse_incrementally_to_the_same_request():
    full, inc = MessagesAdapter(), MessagesAdapter()
    inc.use_parse_cache(64, 64 << 20)
    bodies = MessagesBodies("auto", 20, 2048, 40_000, False, "header")
    for run in range(3):
        for k in range(20):
            _same(full, inc, bodies.body(run, 0, k, f"r{run}"))
    pc = inc.parse_cache
    assert pc is not None and pc.hits == 3 * 19 and pc.misses == 3


@pytest.mark.parametrize(
    "new, fields",
    [
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "x"}]}], {}),
        ([{"role": "system", "content": "x"}], {}),
        ([{"role": "user", "content": [{"type": "bogus"}]}], {}),
        ([{"role": "user", "content": "ok"}], {"max_tokens": "64"}),
        ([{"role": "user", "content": "ok"}], {"max_tokens": None}),
        ([{"role": "user", "content": "ok"}], {"tools": [{"name": 5}]}),
        ([{"role": "user", "content": "ok"}], {"system": 5}),
        ([{"role": "user", "content": "ok"}], {"stream": "yes"}),
    ],
)
def test_bad_new_messages_input_gives_the_full_parses_error(new, fields):
    full, inc = MessagesAdapter(), MessagesAdapter()
    inc.use_parse_cache(64, 64 << 20)
    pc = inc.parse_cache
    assert pc is not None
    base: dict[str, Any] = {"model": "auto", "max_tokens": 64}
    msgs = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "step"}]
    _same(full, inc, orjson.dumps({**base, "messages": msgs}))
    msgs = msgs + [{"role": "user", "content": "more"}]
    _same(full, inc, orjson.dumps({**base, "messages": msgs}))
    assert pc.hits == 1
    body = {**base, "messages": msgs + new, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    got = _same(full, inc, orjson.dumps(body))
    assert got[0] == "error"


_item = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("message"), "role": st.sampled_from(["user", "assistant", "system", "robot"])},
        optional={
            "content": _text
            | st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": _text}), max_size=2)
            | st.just(5)
        },
    ),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": _text}),  # no type
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": _text, "name": _text}, optional={"arguments": _text}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _text, "output": _text}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call", "bogus"])}),  # refused items
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_item, min_size=1, max_size=4),
    st.lists(st.lists(_item, max_size=3), min_size=1, max_size=4),
    _style,
    st.lists(st.integers(0, 7), min_size=4, max_size=4),
    st.booleans(),
)
def test_any_responses_conversation_parses_the_same_incrementally(opening, turns, style, edits, fields_first):
    """OpenAI Responses bodies (``input``, the list an agent's steps grow): random items (messages,
    function calls and outputs, refused ones), serialisations, fields before or after the list
    (``max_output_tokens`` sometimes bad, instructions, tools), appended turns and edits: every
    step's outcome equals the full parse's, continued conversations hit."""
    from router.server.protocols.responses import ResponsesAdapter, ResponseStore

    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]

    def fields(edit: int) -> dict[str, Any]:
        return {
            "instructions": "You are an agent.",
            "tools": tools,
            "max_output_tokens": {5: 0, 6: "64"}.get(edit, 64),
        }

    _grow_and_compare(
        ResponsesAdapter(ResponseStore(16)),
        ResponsesAdapter(ResponseStore(16)),
        "input",
        fields,
        opening,
        turns,
        style,
        edits,
        fields_first,
    )


@pytest.mark.parametrize(
    "new, fields",
    [
        ([{"type": "bogus"}], {}),
        ([{"type": "function_call", "call_id": "c"}], {}),
        ([{"type": "function_call_output"}], {}),
        ([{"role": "robot", "content": "x"}], {}),
        ([{"role": "user", "content": "ok"}], {"max_output_tokens": 0}),
        ([{"role": "user", "content": "ok"}], {"tools": [{"type": "function"}]}),
        ([{"role": "user", "content": "ok"}], {"stream": "yes"}),
        ([{"role": "user", "content": "ok"}], {"previous_response_id": 5}),
    ],
)
def test_bad_new_responses_input_gives_the_full_parses_error(new, fields):
    from router.server.protocols.responses import ResponsesAdapter, ResponseStore

    full, inc = ResponsesAdapter(ResponseStore(16)), ResponsesAdapter(ResponseStore(16))
    inc.use_parse_cache(64, 64 << 20)
    pc = inc.parse_cache
    assert pc is not None
    items = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "step"}]
    _same(full, inc, orjson.dumps({"model": "auto", "input": items}))
    items = items + [{"role": "user", "content": "more"}]
    _same(full, inc, orjson.dumps({"model": "auto", "input": items}))
    assert pc.hits == 1
    got = _same(full, inc, orjson.dumps({"model": "auto", "input": items + new, **fields}))
    assert got[0] == "error"


def test_growing_responses_bodies_parse_incrementally_to_the_same_request():
    from router.server.protocols.responses import ResponsesAdapter, ResponseStore

    full, inc = ResponsesAdapter(ResponseStore(16)), ResponsesAdapter(ResponseStore(16))
    inc.use_parse_cache(64, 64 << 20)
    bodies = ResponsesBodies("auto", 20, 2048, 40_000, False, "header")
    for run in range(3):
        for k in range(20):
            _same(full, inc, bodies.body(run, 0, k, f"r{run}"))
    pc = inc.parse_cache
    assert pc is not None and pc.hits == 3 * 19 and pc.misses == 3
    _same(full, inc, orjson.dumps({"model": "auto", "input": "just a string"}))  # not incremental
    assert pc.hits == 3 * 19 and pc.misses == 3
