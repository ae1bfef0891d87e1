"""Issue 17 regressions: bad input is a 4xx with a code and leaks nothing (F1-F3), every exit of a
committed step gives its counters back, a client that left is logged 499, header limits, the fakes
answer 400. Each F test fails on the code before the fix (commit 1523f92: 500s, phantom active runs).

In-process app with the in-memory FakeUpstream (httpx ASGI transport), a real uvicorn for the
disconnect case.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse

import httpx
import orjson
import pytest
from test_sidecar_errors import Harness, err, ok_handler, settings

from models.predictor import ConstantPredictor
from router.fakes.protocol import FakeRequestError, parse_request
from router.server.app import create_app, serve_in_thread
from router.server.hotpath.upstream import FakeCall, FakeReply, FakeUpstream

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


async def counters(c: httpx.AsyncClient) -> dict[str, int]:
    """Admission slots held, in-flight requests per backend and in-flight steps in the traffic model."""
    app = c._transport.app  # type: ignore[attr-defined]
    proxy, adm = app.state.proxy, app.state.admission
    return {
        "slots": await app.state.store.active(adm.key),
        "inflight": sum(b.inflight for b in proxy.backends.values()),
        "traffic_steps": sum(r.inflight_steps for r in adm.load.replicas.values()),
    }


async def end_all(c: httpx.AsyncClient) -> None:
    proxy = c._transport.app.state.proxy  # type: ignore[attr-defined]
    for rid in list(proxy.runs):
        await c.post(f"/v1/runs/{urllib.parse.quote(rid, safe='')}/end", json={"outcome": "unknown"})


ZERO = {"slots": 0, "inflight": 0, "traffic_steps": 0}


# ---------------------------------------------------------------- F1: stream_options not an object


@pytest.mark.parametrize("so", ["yes", 3, [True], {"include_usage": "yes"}])
async def test_f1_bad_stream_options_is_422_and_holds_no_slot(tmp_path, so):
    async with Harness(tmp_path) as c:
        for i in range(20):
            body = {"messages": MSGS, "stream": True, "stream_options": so}
            r = await c.post("/v1/chat/completions", json=body, headers={"x-run-id": f"f1-{i}"})
            assert err(r) == (422, "invalid_stream_options")
        assert await counters(c) == ZERO
        cap = (await c.get("/v1/capacity")).json()
        assert cap["local"]["active_runs"] == 0 and cap["local"]["tracked_runs"] == 0


# ---------------------------------------------------------------- F2: non-Latin-1 run ids


@pytest.mark.parametrize("stream", [False, True])
async def test_f2_unicode_run_id_is_served_under_a_header_safe_id(tmp_path, stream):
    raw_id = "中文-run 🚀x"
    async with Harness(tmp_path) as c:
        # (``user`` is a tenant attribute, not a run id, since issue 16: metadata.run_id carries it)
        body: dict = {"messages": MSGS, "stream": stream, "metadata": {"run_id": raw_id}}
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        rid = r.headers["x-runroute-run-id"]
        assert rid.isascii() and "/" not in rid and " " not in rid
        assert urllib.parse.unquote(rid) == raw_id  # percent-encoded UTF-8, reversible
        # the header value and its decoded form both find the run
        for path_id in (urllib.parse.quote(rid, safe=""), urllib.parse.quote(raw_id, safe="")):
            got = await c.get(f"/v1/runs/{path_id}")
            assert got.status_code == 200 and got.json()["run_id"] == rid
            assert got.json()["steps"][0]["status"] == 200
        await end_all(c)
        assert await counters(c) == ZERO


async def test_f2_slash_in_a_run_id_is_encoded_and_found_by_its_header_form(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS, "metadata": {"run_id": "team/run-1"}}
        )
        rid = r.headers["x-runroute-run-id"]
        assert rid == "team%2Frun-1"
        assert (await c.get(f"/v1/runs/{urllib.parse.quote(rid, safe='')}")).status_code == 200


async def test_f2_overlong_run_id_is_hashed_and_bounded(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS, "metadata": {"run_id": "é" * 500}})
        rid = r.headers["x-runroute-run-id"]
        assert r.status_code == 200 and rid.startswith("h-") and len(rid) == 22


# ---------------------------------------------------------------- F3: deep nesting


def _nested_body(depth: int, stream: bool) -> bytes:
    """A user message whose one text part carries an object nested ``depth`` deep (built as bytes:
    orjson itself refuses to serialise past 255 levels, but parses up to 1024)."""
    deep = b'{"a":' * depth + b'"x"' + b"}" * depth
    part = b'{"type":"text","text":"hi","meta":' + deep + b"}"
    head = b'{"stream":' + (b"true" if stream else b"false")
    msgs = b',"messages":[{"role":"system","content":"s"},{"role":"user","content":[' + part + b"]}]"
    return head + msgs + b',"tools":[{"type":"function","function":{"name":"f"}}]}'


@pytest.mark.parametrize("depth", [300, 900, 1015])
@pytest.mark.parametrize("stream", [False, True])
async def test_f3_deeply_nested_content_is_422(tmp_path, depth, stream):
    async with Harness(tmp_path) as c:
        raw = _nested_body(depth, stream)
        assert isinstance(orjson.loads(raw), dict)  # it parses: the router must refuse it itself
        r = await c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert err(r) == (422, "body_too_deep")
        assert await counters(c) == ZERO


async def test_reasonable_nesting_passes(tmp_path):
    async with Harness(tmp_path) as c:
        schema: object = {"type": "string"}
        for _ in range(20):
            schema = {"type": "object", "properties": {"a": schema}}
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        r = await c.post("/v1/chat/completions", json={"messages": MSGS, "tools": tools})
        assert r.status_code == 200


@pytest.mark.parametrize(
    "patch, code",
    [
        ({"messages": [{"role": ["user"], "content": "x"}]}, "invalid_messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_messages"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, "invalid_messages"),
        ({"messages": [{"role": "assistant", "tool_calls": "f"}]}, "invalid_messages"),
        ({"tools": {"f": 1}}, "invalid_tools"),
        ({"tools": [{"type": "function", "function": ["f"]}]}, "invalid_tools"),
        ({"metadata": {"run_id": 3}}, "invalid_metadata"),
        ({"metadata": "x"}, "invalid_metadata"),
        ({"user": 7}, "invalid_user"),
        ({"response_format": "json"}, "invalid_response_format"),
    ],
)
async def test_mistyped_fields_are_422(tmp_path, patch, code):
    async with Harness(tmp_path) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS, **patch})
        assert err(r) == (422, code)
        assert await counters(c) == ZERO


# ---------------------------------------------------------------- structural release


@pytest.mark.parametrize("stream", [False, True])
async def test_exception_after_commit_closes_the_step_and_gives_the_slot_back(tmp_path, stream):
    def boom(call: FakeCall) -> FakeReply:
        raise RuntimeError("a bug in the upstream client")

    async with Harness(tmp_path, boom) as c:
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS, "stream": stream}, headers={"x-run-id": "bug"}
        )
        assert err(r) == (500, "internal_error")
        assert await counters(c) == ZERO  # the failed start holds no slot, nothing is in flight
        step = (await c.get("/v1/runs/bug")).json()["steps"][0]
        assert (step["status"], step["error_code"]) == (500, "internal_error")
        # the run's retry is a first step again and is admitted afresh
        c._transport.app.state.proxy.upstream.handler = ok_handler  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "bug"})
        assert r.status_code == 200 and r.headers["x-runroute-admission"] == "admit-local"
        assert (await counters(c))["slots"] == 1
        await end_all(c)
        assert await counters(c) == ZERO


async def test_failed_first_step_gives_its_slot_back(tmp_path):
    async with Harness(
        tmp_path, lambda call: FakeReply(status=500, body=b"{}"), fallback={"enabled": False}
    ) as c:
        for i in range(5):
            r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": f"u{i}"})
            assert err(r) == (502, "upstream_error")
        assert await counters(c) == ZERO


# ---------------------------------------------------------------- 499 for a non-streaming client that left


class SlowUpstream(FakeUpstream):
    async def post(self, tier, url, body, headers):  # type: ignore[override]
        await asyncio.sleep(1.0)  # the upstream's own latency: the client gives up before it
        return await super().post(tier, url, body, headers)


def test_non_streaming_client_gone_is_logged_499(tmp_path):
    app = create_app(settings(tmp_path), upstream=SlowUpstream(ok_handler), bundle=ConstantPredictor())
    with serve_in_thread(app) as url:
        with httpx.Client(base_url=url) as c:
            with pytest.raises(httpx.TimeoutException):
                c.post(
                    "/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "gone"}, timeout=0.2
                )
            deadline = time.monotonic() + 10
            steps: list = []
            while not steps and time.monotonic() < deadline:
                r = c.get("/v1/runs/gone", timeout=5)
                steps = r.json()["steps"] if r.status_code == 200 else []
                time.sleep(0.05)
    assert steps and (steps[0]["status"], steps[0]["error_code"]) == (499, "client_cancelled")


# ---------------------------------------------------------------- header limits


async def test_too_many_or_too_large_headers_are_431(tmp_path):
    async with Harness(tmp_path, server={"max_headers": 20, "max_header_bytes": 4096}) as c:
        many = {f"x-h{i}": "v" for i in range(30)}
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers=many)
        assert err(r) == (431, "headers_too_large")
        r = await c.get("/v1/models", headers={"x-big": "v" * 5000})
        assert err(r) == (431, "headers_too_large")
        assert (await c.post("/v1/chat/completions", json={"messages": MSGS})).status_code == 200


# ---------------------------------------------------------------- fakes: 400, not 500


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": ["user"], "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": ["f"]}]},
        {"messages": [{"role": "assistant", "tool_calls": [["f"]]}]},
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": {"function": ["f"]}},
    ],
)
def test_fakes_refuse_mistyped_fields_with_400(body):
    with pytest.raises(FakeRequestError) as e:
        parse_request(orjson.dumps(body))
    assert e.value.status == 400
