"""The request path's cheaper forms (issue 26) give what the forms they replaced gave.

- ``json_depth`` (one comprehension per level) equals the node-by-node walk it replaced, on random
  nested values, at every limit;
- ``record._construct_step`` equals ``Step.model_construct`` (the same ``__dict__`` in the same
  order, the same fields set, unknown names dropped, required fields left out when absent);
- ``client_gone`` answers what starlette's ``Request.is_disconnected`` answers: a disconnect that
  is already there, a body message that is there (dropped, not a disconnect), nothing there yet
  (the receive's wait is unregistered);
- ``read_body`` (plain awaits) leaves what starlette's ``Request.body()`` leaves, ``_receive_within``
  reads a message that is there without a timer and still times out / cancels a wait,
  ``FirstHeaders`` answers what starlette's ``Headers`` answers, the in-process store's expiry skip
  equals the full walk (issue 26, fifth pass).
"""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest
from starlette.requests import Request

from features.schema import Step
from router.core.record import _construct_step
from router.server.hotpath.backends import client_gone
from router.server.protocols.base import rewrite_body
from router.server.protocols.validate import json_depth


def _walk_depth(obj: object, limit: int) -> int:
    """The node-by-node walk json_depth used before."""
    if not isinstance(obj, (dict, list)):
        return 0
    level: list[object] = [obj]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return depth
        deeper: list[object] = []
        for node in level:
            values = node.values() if isinstance(node, dict) else node
            deeper += [v for v in values if isinstance(v, (dict, list))]
        level = deeper
    return depth


def _nested(rng: random.Random, d: int) -> object:
    if d == 0 or rng.random() < 0.3:
        return rng.choice([1, "s", None, 2.5, True, ""])
    if rng.random() < 0.5:
        return {str(i): _nested(rng, d - 1) for i in range(rng.randint(0, 4))}
    return [_nested(rng, d - 1) for _ in range(rng.randint(0, 4))]


def test_json_depth_equals_the_node_by_node_walk():
    rng = random.Random(0)
    for _ in range(2000):
        obj = _nested(rng, rng.randint(0, 14))
        for limit in (1, 3, 6, 64):
            assert json_depth(obj, limit) == _walk_depth(obj, limit)
    deep: object = "x"
    for _ in range(100):
        deep = {"a": [deep]}
    assert json_depth(deep, 64) == 65 == _walk_depth(deep, 64)
    assert json_depth(deep, 250) == 200 == _walk_depth(deep, 250)


_STEP = dict(
    run_id="r1",
    step=3,
    arrival_s=1.0,
    tool_pause_s=None,
    prompt_tokens=5,
    cached_tokens=None,
    completion_tokens=2,
    tool_calls=["grep"],
    tool_call_keys=["k"],
    tool_results_n=1,
    tool_result_tokens=[7],
    tool_result_errors=[False],
    structured=False,
    tier="local",
    replica="v0",
    model="m",
    ttft_s=None,
    latency_s=0.1,
    status=200,
    error_code=None,
    feature_spec_version="v",
    features=[1.0, 2.0],
    predictions={"p_frontier": 0.1},
    decision="local",
    reason="pinned",
    prompt_tokens_est=5,
    n_tools_offered=3,
    wants_json=False,
    protocol="chat",
    admission=None,
    propensity=1.0,
    explore=False,
    signals=None,
)


@pytest.mark.parametrize(
    "values",
    [
        _STEP,
        {**_STEP, "not_a_field": 1},
        {k: v for k, v in _STEP.items() if k not in ("signals", "run_id", "explore")},
        {k: v for k, v in _STEP.items() if k not in ("tool_calls", "tool_result_errors")},
    ],
    ids=["all", "unknown-name", "some-absent", "factory-defaults"],
)
def test_construct_step_equals_model_construct(values):
    for _ in range(2):  # the first call works out the layout of these names, the second reuses it
        a, b = Step.model_construct(**values), _construct_step(**values)
        assert list(a.__dict__.items()) == list(b.__dict__.items())
        assert a.model_fields_set == b.model_fields_set
        assert a.__pydantic_extra__ == b.__pydantic_extra__ and a == b
        if "run_id" in values:
            assert Step.model_validate(b.model_dump()) == Step.model_validate(a.model_dump())
    c = _construct_step(**values)  # a mutable default is made per record, never shared
    for n, v in b.__dict__.items():
        if n not in values and isinstance(v, (list, dict, set)):
            assert c.__dict__[n] == v and c.__dict__[n] is not v, n


def _request(receive) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_client_gone_reads_a_disconnect_that_is_there():
    async def go():
        async def receive():
            return {"type": "http.disconnect"}

        req = _request(receive)
        assert client_gone(req) and client_gone(req)
        assert await _request(receive).is_disconnected()  # starlette's answer is the same

    asyncio.run(go())


def test_client_gone_drops_a_body_message_and_waits_for_nothing():
    async def go():
        event = asyncio.Event()
        waiting: list[object] = []

        async def receive():
            waiting.append(1)
            try:
                await event.wait()
            finally:
                waiting.pop()
            return {"type": "http.disconnect"}

        req = _request(receive)
        assert not client_gone(req)
        assert waiting == [] and not event._waiters  # the wait was unregistered
        assert not await _request(receive).is_disconnected()

        async def more():
            return {"type": "http.request", "body": b"", "more_body": False}

        assert not client_gone(_request(more))
        assert not await _request(more).is_disconnected()

    asyncio.run(go())


def _spliced(raw: bytes, body: dict, model: str, include_usage: bool) -> bytes:
    """rewrite_body as it was before (three copies of the body), for the comparison."""
    from router.server.protocols.base import _model_span, _reserialise

    so = body.get("stream_options")
    need_usage = include_usage and not (isinstance(so, dict) and so.get("include_usage") is True)
    if need_usage and so is not None:
        return _reserialise(body, model, True)
    new_model = b'"model":' + orjson.dumps(model)
    if isinstance(body.get("model"), str):
        span = _model_span(raw)
        if span is None:
            return _reserialise(body, model, need_usage)
        raw = raw[: span[0]] + new_model + raw[span[1] :]
        prefix = b""
    elif "model" not in body:
        prefix = new_model + b","
    else:
        return _reserialise(body, model, need_usage)
    if need_usage:
        prefix += b'"stream_options":{"include_usage":true},'
    if prefix:
        j = raw.find(b"{")
        raw = raw[: j + 1] + prefix + raw[j + 1 :]
    return raw


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"auto","messages":[{"role":"user","content":"hi"}]}',
        b' { "model" : "x", "messages":[]}',
        b'{"messages":[],"model":"auto"}',
        b'{"messages":[], "stream":true, "model": "auto" }',
        b'{"messages":[]}',
        b'{"stream":true,"messages":[]}',
        b'{"messages":[{"model":"inner"}],"model":"a","x":1}',
        b'{"model":null,"messages":[]}',
        b'{"stream":true,"stream_options":{"include_usage":false},"model":"a"}',
        b'{"stream":true,"stream_options":{"include_usage":true},"model":"a"}',
        b'{"model":"a\\"b","messages":[]}',
    ],
)
def test_rewrite_body_joins_what_the_splices_gave(raw):
    body = orjson.loads(raw)
    for model in ("m1", 'we"ird'):
        for usage in (False, True):
            out = rewrite_body(raw, body, model, usage)
            assert type(out) is bytes and out == _spliced(raw, body, model, usage)


def _scripted(messages: list[dict], waits: set[int] = frozenset()):
    """A receive handing out ``messages`` in order; those whose index is in ``waits`` come after
    a loop turn (the receive suspends first), the others at once."""
    it = iter(enumerate(messages))

    async def receive():
        i, msg = next(it)
        if i in waits:
            await asyncio.sleep(0)
        return msg

    return receive


BODY_SCRIPTS = [
    [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}],
    [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ],
    [{"type": "http.request", "more_body": False}],
    [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}],
    [{"type": "lifespan.odd"}, {"type": "http.request", "body": b"x", "more_body": False}],
]


@pytest.mark.parametrize("script", BODY_SCRIPTS)
def test_read_body_leaves_what_starlettes_body_leaves(script):
    """``read_body`` with a Content-Length (plain awaits) = ``Request.body()`` (its async
    generator): the same body or ClientDisconnect, the same state on the request, a second read."""
    from starlette.requests import ClientDisconnect

    from router.server.hotpath.backends import read_body

    def req(waits):
        r = _request(_scripted(script, waits))
        r.scope["headers"] = [(b"content-length", b"4")]
        return r

    async def outcome(read, r):
        try:
            got = await read(r)
        except ClientDisconnect:
            got = "disconnect"
        again = None
        if got != "disconnect":
            again = await read(r)
        return (
            got,
            again,
            getattr(r, "_body", None),
            r._stream_consumed,
            getattr(r, "_is_disconnected", False),
        )

    async def go():
        for waits in (set(), {0, 1, 2}):
            ours = await outcome(lambda r: read_body(r, 1 << 20), req(waits))
            theirs = await outcome(lambda r: r.body(), req(waits))
            assert ours == theirs, (script, waits)

    asyncio.run(go())


def test_receive_within_reads_at_once_waits_under_the_deadline_and_times_out():
    """``limits._receive_within``: a message that is there is read without a timer; one that
    comes after a wait is read under the deadline; none within it is 408; a cancellation of the
    caller reaches the receive."""
    from router.server.limits import BodyError, _receive_within

    async def go():
        loop = asyncio.get_running_loop()
        timers = len(loop._scheduled)
        msg = {"type": "http.request", "body": b"x", "more_body": False}

        async def at_once():
            return msg

        assert await _receive_within(at_once, 5.0) is msg
        assert len(loop._scheduled) == timers  # no timer armed

        async def later():
            await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            return msg

        assert await _receive_within(later, 5.0) is msg

        ev = asyncio.Event()
        seen: list[str] = []

        async def never():
            try:
                await ev.wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return msg

        with pytest.raises(BodyError) as e:
            await _receive_within(never, 0.05)
        assert e.value.status == 408 and seen == ["cancelled"] and not ev._waiters

        task = asyncio.ensure_future(_receive_within(never, 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled", "cancelled"] and not ev._waiters

        async def fails():
            await asyncio.sleep(0)
            raise ValueError("boom")

        with pytest.raises(ValueError):
            await _receive_within(fails, 5.0)

    asyncio.run(go())


def test_first_headers_answer_what_starlettes_headers_answer():
    """``FirstHeaders`` (the hot path's request headers) = starlette's ``Headers`` for ``get``,
    ``[]`` and ``in``: names compared lower-cased, the first of a repeated name, absent names."""
    from starlette.datastructures import Headers

    from router.server.hotpath.backends import FirstHeaders, HotRequest

    raw = [
        (b"host", b"x"),
        (b"x-run-id", b"run-1"),
        (b"x-priority", b"batch"),
        (b"x-run-id", b"run-2"),
        (b"anthropic-beta", b"caf\xe9"),
        (b"empty", b""),
    ]
    names = ["x-run-id", "X-Run-Id", "X-PRIORITY", "anthropic-beta", "empty", "absent", "Host", ""]
    ours, theirs = FirstHeaders({"headers": list(raw)}), Headers(scope={"headers": list(raw)})
    for n in names:
        assert ours.get(n) == theirs.get(n) and ours.get(n, "d") == theirs.get(n, "d"), n
        assert (n in ours) == (n in theirs), n
        if n in theirs:
            assert ours[n] == theirs[n], n
        else:
            with pytest.raises(KeyError):
                ours[n]
    assert ours.getlist("x-run-id") == theirs.getlist("x-run-id") and ours.raw == theirs.raw
    req = HotRequest({"type": "http", "method": "POST", "path": "/", "headers": list(raw)})
    assert isinstance(req.headers, FirstHeaders) and req.headers is req.headers


def test_store_expiry_skip_equals_the_full_walk():
    """``InProcessStore._expire`` skips its walk until the oldest entry can be due: random puts,
    gets, step counters and signals on a stepping clock (ttl changed now and then) leave the same
    runs, counters and signals as the walk at every call."""
    from router.policy.types import RunState
    from router.server.state.store import InProcessStore

    class Walking(InProcessStore):
        def _expire(self) -> None:  # the walk at every call (the form before the skip)
            now = self._clock()
            for d in (self._runs, self._steps, self._signals):
                while d:
                    rid, (t, _) = next(iter(d.items()))
                    if now - t < self.ttl_s:
                        break
                    d.pop(rid)

    rng = random.Random(5)
    now = [0.0]
    stores = [InProcessStore(ttl_s=10.0, clock=lambda: now[0]), Walking(ttl_s=10.0, clock=lambda: now[0])]

    async def go():
        for _ in range(3000):
            now[0] += rng.choice([0.0, 0.5, 1.0, 3.0, 9.999, 10.0])
            rid = f"r{rng.randrange(12)}"
            op = rng.randrange(5)
            if rng.random() < 0.02:
                ttl = rng.choice([2.0, 10.0, 30.0])
                for s in stores:
                    s.ttl_s = ttl
            got = []
            for s in stores:
                if op == 0:
                    await s.put(RunState(run_id=rid, replica="local-0"))
                elif op == 1:
                    got.append(await s.get(rid))
                elif op == 2:
                    got.append(await s.begin_step(rid, 0))
                elif op == 3:
                    got.append(await s.add_signal(rid, "tool_error", 4))
                else:
                    got.append((await s.signals(rid), s.counters()))
            assert not got or got[0] == got[1]
            a, b = stores
            assert list(a._runs) == list(b._runs) and a._steps == b._steps and a._signals == b._signals

    asyncio.run(go())
