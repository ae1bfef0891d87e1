"""Fuzzing every endpoint (issue 17): hypothesis-generated bodies, valid and invalid, then
schemathesis against the published ``/openapi.json``. Both must find no 5xx, and once every run
the fuzz started is ended, no admission slot, in-flight request or in-flight step is left.

Bounded for CI on 2 cores: the hypothesis fuzzer sends ~500 requests, schemathesis up to 40
positive and 40 negative cases per operation (8 each for Responses, Messages and count_tokens,
whose generated bodies are the slowest; a few hundred in all); ``FUZZ_EXAMPLES`` scales both.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse

import httpx
import orjson
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from test_hardening import ZERO, counters, end_all
from test_sidecar_errors import Harness, ok_handler

from router.server.hotpath.upstream import FakeCall, FakeReply, UpstreamError

N = int(os.environ.get("FUZZ_EXAMPLES", "1"))


def flaky_handler(call: FakeCall) -> FakeReply:
    """Mostly the normal answer; some connect errors, 5xx and mid-stream failures (seeded by body)."""
    h = sum(call.body) % 7
    if h == 0:
        raise UpstreamError("connect", "fuzz: refused")
    if h == 1:
        return FakeReply(status=503, body=b'{"error": {"message": "busy"}}')
    rep = ok_handler(call)
    if h == 2 and rep.chunks:
        rep.fail_after_chunks = 1
    return rep


scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
json_any = st.recursive(
    scalar,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)
role = st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | json_any
message = st.fixed_dictionaries(
    {"role": role},
    optional={
        "content": st.text(max_size=40) | json_any,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"function": st.fixed_dictionaries({"name": st.text(max_size=5)})}),
            max_size=2,
        )
        | json_any,
    },
)
chat_body = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=4) | json_any},
    optional={
        "model": st.sampled_from(["auto", "local-model", "frontier-model", "nope"]) | json_any,
        "stream": st.booleans() | json_any,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_any})
        | json_any,
        "tools": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries({"name": st.text(max_size=5)}),
                }
            ),
            max_size=2,
        )
        | json_any,
        "metadata": st.dictionaries(
            st.sampled_from(["run_id", "tenant", "x"]), st.text(max_size=10), max_size=2
        )
        | json_any,
        "user": st.text(max_size=20) | json_any,
        "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}]) | json_any,
    },
)
run_id = st.sampled_from(["r1", "r2", "中文", "a/b", "%2F", ""]) | st.text(max_size=12)
request = st.one_of(
    st.tuples(st.just("chat"), chat_body, run_id),
    st.tuples(st.just("raw"), st.binary(max_size=60), run_id),
    st.tuples(
        st.just("end"), st.fixed_dictionaries({}, optional={"outcome": json_any, "reward": json_any}), run_id
    ),
    st.tuples(
        st.just("signal"),
        st.fixed_dictionaries(
            {},
            optional={
                "kind": st.sampled_from(["verifier_failed", "tests_failed", "other", "nope"]) | json_any,
                "detail": json_any,
                "x": json_any,
            },
        )
        | json_any,
        run_id,
    ),
    st.tuples(st.just("get"), st.none(), run_id),
)


async def _send(c: httpx.AsyncClient, kind: str, body, rid: str) -> httpx.Response:
    hdr = {"x-run-id": rid} if rid.isascii() and rid.isprintable() and rid.strip() else {}
    path_id = urllib.parse.quote(rid, safe="") or "x"
    if kind == "chat":
        return await c.post("/v1/chat/completions", content=orjson.dumps(body), headers=hdr)
    if kind == "raw":
        return await c.post("/v1/chat/completions", content=body, headers=hdr)
    if kind == "end":
        return await c.post(f"/v1/runs/{path_id}/end", content=orjson.dumps(body))
    if kind == "signal":
        return await c.post(f"/v1/runs/{path_id}/signal", content=orjson.dumps(body))
    return await c.get(f"/v1/runs/{path_id}")


def test_hypothesis_fuzz_every_endpoint_no_5xx_no_leak(tmp_path):
    async def scenario(reqs) -> list[tuple[int, str]]:
        bad = []
        async with Harness(tmp_path, flaky_handler) as c:
            for kind, body, rid in reqs:
                r = await _send(c, kind, body, rid)
                if r.status_code >= 500 and r.status_code not in (502, 503, 504):
                    bad.append((r.status_code, f"{kind} {body!r} {rid!r}: {r.text[:200]}"))
                if r.status_code in (502, 503, 504):  # only the (injected) upstream failures
                    assert r.json()["error"]["code"].startswith(("upstream_", "no_healthy")), r.text
            for path in ("/v1/models", "/health", "/ready", "/metrics", "/v1/capacity", "/openapi.json"):
                r = await c.get(path)
                assert r.status_code < 500 or path == "/ready", (path, r.status_code)
            await end_all(c)
            assert await counters(c) == ZERO
        return bad

    @settings(max_examples=12 * N, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(request, min_size=20, max_size=60))
    def run(reqs):
        assert asyncio.run(scenario(reqs)) == []

    run()


# ---------------------------------------------------------------- schemathesis on /openapi.json


def test_schemathesis_no_5xx_and_no_leaked_counter(tmp_path):
    """Every operation of the published document, cases generated from its schemas (positive and
    negative), sent over real HTTP to a real uvicorn; afterwards every run is ended and the
    counters must be back at zero."""
    from test_sidecar_errors import settings as make_settings

    from models.predictor import ConstantPredictor
    from router.server.app import create_app, serve_in_thread
    from router.server.hotpath.upstream import FakeUpstream

    app = create_app(
        make_settings(tmp_path), upstream=FakeUpstream(flaky_handler), bundle=ConstantPredictor()
    )
    failures: list[tuple[str, int, bytes]] = []
    routed: dict[str, int] = {}  # per /v1 path: bodies that got through (2xx, or the upstream's failure)
    cases = 0
    with serve_in_thread(app) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        ops = [r.ok() for r in schema.get_all_operations()]
        for op, mode in [(op, m) for op in ops for m in schemathesis.GenerationMode]:
            try:
                strategy = op.as_strategy(generation_mode=mode)
            except Exception:  # noqa: BLE001 - no negative cases for an operation without inputs
                continue

            # the Responses / Messages bodies are the slowest to generate: fewer cases each (issue 25)
            per_op = 8 if op.path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens") else 40

            @settings(
                max_examples=per_op * N,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
            )
            @given(case=strategy)
            def one(case) -> None:
                nonlocal cases
                cases += 1
                resp = case.call(base_url=url, timeout=10)
                code = resp.status_code
                injected = code in (502, 503, 504) and b"upstream" in resp.content
                path, label = case.operation.path, case.operation.label
                if code >= 500 and not injected and not (path == "/ready" and code == 503):
                    failures.append((label, code, resp.content[:200]))
                if (code < 300 or injected) and path.startswith("/v1/"):
                    routed[path] = routed.get(path, 0) + 1

            t_op = time.monotonic()
            try:
                one()
                print(f"schemathesis: {op.label} {mode.name}: {time.monotonic() - t_op:.1f} s")
            except Unsatisfiable:  # negative mode of an operation without inputs: nothing to send
                assert mode is schemathesis.GenerationMode.NEGATIVE, op.label
        with httpx.Client(base_url=url, timeout=10) as c:
            for rid in list(app.state.proxy.runs):
                c.post(f"/v1/runs/{urllib.parse.quote(rid, safe='')}/end", json={})
        proxy, adm = app.state.proxy, app.state.admission
        left = {
            "slots": -1,
            "inflight": sum(b.inflight for b in proxy.backends.values()),
            "traffic_steps": sum(r.inflight_steps for r in adm.load.replicas.values()),
        }
        with httpx.Client(base_url=url, timeout=10) as c:
            left["slots"] = c.get("/v1/capacity").json()["local"]["active_runs"]
    print(f"schemathesis: {cases} cases, {len(failures)} failures, routed per path {routed}")
    assert failures == [], failures[:5]
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        assert routed.get(path, 0) > 0, (path, routed)  # reached the handler with a valid body
    assert cases >= 200
    assert left == ZERO
