"""Every bad input and upstream failure of the sidecar: exact status and error code.

Uses the in-memory FakeUpstream (router.server.hotpath.upstream) through httpx's ASGI transport, plus one real
uvicorn (in a thread) for the client-disconnect case.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest

from models.predictor import ConstantPredictor
from models.types import Predictions
from router.server.app import create_app, serve_in_thread
from router.server.hotpath.upstream import FakeCall, FakeReply, FakeUpstream, UpstreamError
from router.server.protocols.chat import rewrite_body
from router.server.settings import RouterSettings, SettingsError

USAGE = {"prompt_tokens": 120, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 96}}
MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


def ok_handler(call: FakeCall) -> FakeReply:
    body = orjson.loads(call.body)
    if body.get("stream"):
        chunks = [
            b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}) + b"\n\n",
            b"data: "
            + orjson.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            + b"\n\n",
            b"data: " + orjson.dumps({"choices": [], "usage": USAGE}) + b"\n\n",
            b"data: [DONE]\n\n",
        ]
        return FakeReply(chunks=chunks, headers={"content-type": "text/event-stream"})
    return FakeReply(
        body=orjson.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": USAGE,
            }
        )
    )


def settings(tmp_path: Path, **over) -> RouterSettings:
    base = {
        "local": {"urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"]},
        "frontier": {"url": "http://127.0.0.1:11", "allow_no_key": True},
        "policy": {"kind": "always-local"},
        "scrape": {"interval_s": 0},
        "bundle": {"watch_s": 0},
        "runlog": {"dir": str(tmp_path / "logs")},
    }
    for k, v in over.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return RouterSettings.load(None, **base)


class Harness:
    def __init__(self, tmp_path: Path, handler=ok_handler, **over):
        self.up = FakeUpstream(handler)
        self.app = create_app(settings(tmp_path, **over), upstream=self.up, bundle=ConstantPredictor())

    async def __aenter__(self) -> httpx.AsyncClient:
        self._life = self.app.router.lifespan_context(self.app)
        await self._life.__aenter__()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://r")
        return self.client

    async def __aexit__(self, *exc) -> None:
        await self.client.aclose()
        await self._life.__aexit__(None, None, None)


def err(r: httpx.Response) -> tuple[int, str]:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "code"}
    return r.status_code, body["error"]["code"]


def logged_steps(tmp_path: Path):
    from features.runlog import read_runlog

    return read_runlog(sorted((tmp_path / "logs").glob("runlog-*"))).steps


# ---------------------------------------------------------------- bad client input


@pytest.mark.parametrize(
    "content, status, code",
    [
        (b"{not json", 400, "invalid_json"),
        (b"", 400, "invalid_json"),
        (b"[1, 2]", 422, "body_not_object"),
        (b'{"model": "auto"}', 422, "invalid_messages"),
        (b'{"model": "auto", "messages": []}', 422, "invalid_messages"),
        (b'{"model": "auto", "messages": ["hi"]}', 422, "invalid_messages"),
        (b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}', 422, "invalid_model"),
        (b'{"stream": "yes", "messages": [{"role": "user", "content": "x"}]}', 422, "invalid_stream"),
        (b'{"model": "gpt-nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
    ],
)
async def test_bad_bodies(tmp_path, content, status, code):
    async with Harness(tmp_path) as c:
        r = await c.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
        assert err(r) == (status, code)


async def test_body_too_large_by_length_and_by_stream(tmp_path):
    async with Harness(tmp_path, server={"max_body_bytes": 1000}) as c:
        big = orjson.dumps({"messages": [{"role": "user", "content": "x" * 2000}]})
        r = await c.post("/v1/chat/completions", content=big)
        assert err(r) == (413, "body_too_large")

        async def chunks():
            for _ in range(4):
                yield b" " * 400

        r = await c.post("/v1/chat/completions", content=chunks())  # no Content-Length: chunked
        assert err(r) == (413, "body_too_large")
        small = orjson.dumps({"messages": MSGS})
        assert (await c.post("/v1/chat/completions", content=small)).status_code == 200


async def test_bearer_keys(tmp_path):
    async with Harness(tmp_path, server={"api_keys": ["k-good"]}) as c:
        body = {"messages": MSGS}
        assert err(await c.post("/v1/chat/completions", json=body)) == (401, "invalid_api_key")
        bad = {"authorization": "Bearer k-bad"}
        assert err(await c.post("/v1/chat/completions", json=body, headers=bad)) == (401, "invalid_api_key")
        assert err(await c.get("/v1/runs/x", headers=bad)) == (401, "invalid_api_key")
        good = {"authorization": "Bearer k-good"}
        r = await c.post("/v1/chat/completions", json=body, headers=good)
        assert r.status_code == 200
        # the client's key never reaches an upstream
        assert all("k-good" not in str(call.headers) for call in (await _calls(c, r)))


async def _calls(c, r):  # helper: the FakeUpstream calls so far
    return c._transport.app.state.proxy.upstream.calls  # type: ignore[attr-defined]


async def test_unknown_run_and_route(tmp_path):
    async with Harness(tmp_path) as c:
        assert err(await c.get("/v1/runs/nope")) == (404, "run_not_found")
        assert err(await c.post("/v1/runs/nope/end")) == (404, "run_not_found")
        assert err(await c.get("/v2/whatever")) == (404, "not_found")
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "r1"})
        assert r.status_code == 200
        assert err(await c.post("/v1/runs/r1/end", json={"outcome": "great"})) == (422, "invalid_outcome")
        assert err(await c.post("/v1/runs/r1/end", json={"reward": "x"})) == (422, "invalid_reward")
        assert err(await c.post("/v1/runs/r1/end", content=b"{x")) == (400, "invalid_json")
        r = await c.post("/v1/runs/r1/end", json={"outcome": "success", "reward": 1.0})
        assert r.status_code == 200 and r.json()["n_steps"] == 1
    from features.runlog import read_runlog

    runs = read_runlog(sorted((tmp_path / "logs").glob("runlog-*"))).runs
    assert runs["run_id"].tolist() == ["r1"] and runs["outcome"].tolist() == ["success"]


# ---------------------------------------------------------------- upstream failures


def failing(kind_by_tier: dict[str, str | int]):
    def handler(call: FakeCall) -> FakeReply:
        what = kind_by_tier.get(call.tier)
        if isinstance(what, int):
            return FakeReply(status=what, body=b'{"error": {"message": "boom"}}')
        if what is not None:
            raise UpstreamError(what, f"fake {what}")
        return ok_handler(call)

    return handler


@pytest.mark.parametrize(
    "kind, status, code",
    [
        ("connect", 502, "upstream_unreachable"),
        ("timeout", 504, "upstream_timeout"),
        (500, 502, "upstream_error"),
    ],
)
async def test_upstream_failure_without_fallback(tmp_path, kind, status, code):
    async with Harness(tmp_path, failing({"local": kind}), fallback={"enabled": False}) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "f1"})
        assert err(r) == (status, code)
        assert r.headers["x-runroute-tier"] == "local"
        run = (await c.get("/v1/runs/f1")).json()
        assert run["steps"][0]["status"] == status and run["steps"][0]["error_code"] == code
    steps = logged_steps(tmp_path)
    assert steps["status"].tolist() == [status] and steps["error_code"].tolist() == [code]


@pytest.mark.parametrize("kind", ["connect", 503])
async def test_fallback_to_other_tier(tmp_path, kind):
    async with Harness(tmp_path, failing({"local": kind})) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "fb"})
        assert r.status_code == 200
        assert r.headers["x-runroute-tier"] == "frontier"
        assert r.headers["x-runroute-fallback-from"].startswith("local-")
        want = "fallback-connect" if kind == "connect" else "fallback-5xx"
        assert r.headers["x-runroute-reason"] == want
        assert r.json()["model"] == "frontier-model"
        run = (await c.get("/v1/runs/fb")).json()
        assert run["pinned"]["tier"] == "frontier" and run["steps"][0]["fallback_from"].startswith("local-")
        metrics = (await c.get("/metrics")).text
        assert 'runroute_fallbacks_total{from_tier="local",to_tier="frontier"} 1.0' in metrics
    steps = logged_steps(tmp_path)
    assert steps["tier"].tolist() == ["frontier"] and steps["reason"].tolist() == [want]


async def test_both_tiers_down_is_one_clear_error(tmp_path):
    async with Harness(tmp_path, failing({"local": "connect", "frontier": "connect"})) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS})
        assert err(r) == (502, "upstream_unreachable")
        assert len(c._transport.app.state.proxy.upstream.calls) == 2  # type: ignore[attr-defined]


async def test_no_backend_for_policy_is_503(tmp_path):
    async with Harness(tmp_path, frontier=None, policy={"kind": "always-local"}) as c:
        scraper = c._transport.app.state.scraper  # type: ignore[attr-defined]
        for name in list(scraper.stats):
            scraper.mark_failed(name)
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "nb"})
        assert err(r) == (503, "no_healthy_backend")
        assert (await c.get("/v1/runs/nb")).json()["steps"][0]["error_code"] == "no_healthy_backend"


async def test_upstream_4xx_passes_through(tmp_path):
    async with Harness(tmp_path, failing({"local": 429})) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 429 and r.json()["error"]["message"] == "boom"


async def test_mid_stream_failure_ends_with_error_event(tmp_path):
    def handler(call: FakeCall) -> FakeReply:
        rep = ok_handler(call)
        rep.fail_after_chunks = 1
        return rep

    async with Harness(tmp_path, handler) as c:
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS, "stream": True}, headers={"x-run-id": "ms"}
        )
        assert r.status_code == 200
        events = [e for e in r.text.split("\n\n") if e]
        assert '"content":"hi"' in events[0]
        assert orjson.loads(events[-1].removeprefix("data: "))["error"]["code"] == "upstream_stream_error"
        step = (await c.get("/v1/runs/ms")).json()["steps"][0]
        assert (step["status"], step["error_code"]) == (502, "upstream_stream_error")


# ---------------------------------------------------------------- pass-through and usage


def test_rewrite_body_keeps_bytes_but_model():
    raw = (
        b'{"model" : "auto", "messages":[{"role":"user","content":"say \\"model\\": 1.50"}],'
        b'"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"auto",'
        b'"response_format":{"type":"json_object"},"x_custom":{"a":[1.50,2e3]}}'
    )
    out = rewrite_body(raw, orjson.loads(raw), "local-model", False)
    assert out == raw.replace(b'"model" : "auto"', b'"model":"local-model"')
    # nested "model" key: one orjson re-serialisation, same content
    raw2 = b'{"model":"auto","metadata":{"model":"auto"},"messages":[]}'
    out2 = orjson.loads(rewrite_body(raw2, orjson.loads(raw2), "m", True))
    assert out2 == {
        "model": "m",
        "metadata": {"model": "auto"},
        "messages": [],
        "stream_options": {"include_usage": True},
    }
    # no model at all: inserted
    raw3 = b'{"messages":[]}'
    assert orjson.loads(rewrite_body(raw3, orjson.loads(raw3), "m", False)) == {"model": "m", "messages": []}
    # model last (how the openai SDK orders its body): a byte splice too
    raw4 = b'{"messages":[{"role":"user","content":"hi"}],"metadata":{"model":"x"},"model":"auto"}'
    assert rewrite_body(raw4, orjson.loads(raw4), "m", False) == raw4.replace(
        b'"model":"auto"', b'"model":"m"'
    )
    # a nested "model" last in its object is never mistaken for the top-level one
    for raw5 in (
        b'{"model":"auto","messages":[],"metadata":{"q":1,"model":"x"}}',
        b'{"messages":[{"role":"user","content":"m","model":"x"}],"model":"auto","n":1}',
    ):
        want = {**orjson.loads(raw5), "model": "m"}
        assert orjson.loads(rewrite_body(raw5, orjson.loads(raw5), "m", False)) == want


async def test_streaming_usage_stripped_unless_asked(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS, "stream": True}, headers={"x-run-id": "s"}
        )
        assert '"usage"' not in r.text and r.text.endswith("data: [DONE]\n\n")
        sent = orjson.loads(c._transport.app.state.proxy.upstream.calls[-1].body)  # type: ignore[attr-defined]
        assert sent["stream_options"] == {"include_usage": True}
        r = await c.post(
            "/v1/chat/completions",
            headers={"x-run-id": "s"},
            json={"messages": MSGS, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert '"usage"' in r.text
        steps = (await c.get("/v1/runs/s")).json()["steps"]
        assert [s["cached_tokens"] for s in steps] == [96, 96]  # captured in both cases
        assert all(s["ttft_s"] is not None and s["ttft_s"] <= s["latency_s"] for s in steps)


async def test_concrete_model_bypasses_policy_but_is_logged(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "frontier-model", "messages": MSGS},
            headers={"x-run-id": "cm"},
        )
        assert r.status_code == 200 and r.headers["x-runroute-tier"] == "frontier"
        models = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
        assert models == ["auto", "local-model", "frontier-model"]
    assert logged_steps(tmp_path)["tier"].tolist() == ["frontier"]


# ---------------------------------------------------------------- reload, settings


async def test_bad_bundle_refused_old_keeps_serving(tmp_path):
    bad = tmp_path / "bad-bundle"
    bad.mkdir()
    (bad / "manifest.json").write_text("{ not a manifest")
    async with Harness(tmp_path, bundle={"path": str(bad)}) as c:
        r = await c.post("/admin/reload")
        assert err(r) == (409, "bundle_refused")
        assert (await c.post("/v1/chat/completions", json={"messages": MSGS})).status_code == 200
        assert 'runroute_bundle_reloads_total{result="refused"} 1.0' in (await c.get("/metrics")).text
    async with Harness(tmp_path) as c:
        assert err(await c.post("/admin/reload")) == (409, "no_bundle_source")


def test_settings_refuse_frontier_without_key(tmp_path, monkeypatch):
    monkeypatch.delenv("RR_TEST_KEY", raising=False)
    with pytest.raises(SettingsError, match="RR_TEST_KEY is unset or empty"):
        RouterSettings.load(
            None,
            frontier={"url": "http://127.0.0.1:1", "api_key_env": "RR_TEST_KEY"},
            policy={"kind": "always-frontier"},
        )
    monkeypatch.setenv("RR_TEST_KEY", "")
    with pytest.raises(SettingsError):
        RouterSettings.load(
            None,
            frontier={"url": "http://127.0.0.1:1", "api_key_env": "RR_TEST_KEY"},
            policy={"kind": "always-frontier"},
        )
    monkeypatch.setenv("RR_TEST_KEY", "sk-x")
    s = RouterSettings.load(
        None,
        frontier={"url": "http://127.0.0.1:1/v1", "api_key_env": "RR_TEST_KEY"},
        policy={"kind": "always-frontier"},
    )
    assert s.frontier is not None and s.frontier.url == "http://127.0.0.1:1"
    assert "sk-x" not in s.model_dump_json()


def test_settings_yaml_env_override_and_errors(tmp_path, monkeypatch):
    p = tmp_path / "rr.yaml"
    p.write_text(
        "local:\n  urls: [http://127.0.0.1:8000]\npolicy: {kind: always-local}\nserver: {port: 9000}\n"
    )
    monkeypatch.setenv("RUNROUTE_SERVER__PORT", "9100")
    s = RouterSettings.load(p)
    assert s.server.port == 9100 and s.local is not None and s.local.names == ["local-0"]
    p.write_text("policy: {kind: nope}\nlocal: {urls: [http://x]}\n")
    with pytest.raises(SettingsError, match="unknown policy kind"):
        RouterSettings.load(p)
    p.write_text("local: {urls: []}\npolicy: always-local\n")
    with pytest.raises(SettingsError, match="local.urls"):
        RouterSettings.load(p)
    with pytest.raises(SettingsError, match="not found"):
        RouterSettings.load(tmp_path / "missing.yaml")
    with pytest.raises(SettingsError, match="learned.*bundle"):
        RouterSettings.load(None, local={"urls": ["http://127.0.0.1:1"]}, policy={"kind": "learned"})


# ---------------------------------------------------------------- client disconnect (real uvicorn)


def test_client_disconnect_cancels_upstream_and_logs_step(tmp_path):
    def slow(call: FakeCall) -> FakeReply:
        chunk = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]}) + b"\n\n"
        return FakeReply(
            chunks=[chunk] * 200, headers={"content-type": "text/event-stream"}, chunk_delay_s=0.02
        )

    up = FakeUpstream(slow)
    app = create_app(settings(tmp_path), upstream=up, bundle=ConstantPredictor())
    with serve_in_thread(app) as url:
        with httpx.Client(base_url=url, timeout=10) as c:
            with c.stream(
                "POST",
                "/v1/chat/completions",
                json={"messages": MSGS, "stream": True},
                headers={"x-run-id": "dc"},
            ) as r:
                it = r.iter_raw()
                next(it)
            deadline = time.monotonic() + 5
            steps: list = []
            while time.monotonic() < deadline:
                steps = c.get("/v1/runs/dc").json()["steps"]
                if steps:
                    break
                time.sleep(0.05)
        assert steps and (steps[0]["status"], steps[0]["error_code"]) == (499, "client_cancelled")
        assert up.closed_responses >= 1
        assert steps[0]["latency_s"] < 3.0  # cancelled well before the 4 s the stream would take


def test_predictions_constant_stand_in_is_logged(tmp_path):
    pred = ConstantPredictor(Predictions(p_frontier=0.25))

    async def go():
        app = create_app(settings(tmp_path), upstream=FakeUpstream(ok_handler), bundle=pred)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
                await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "p"})

    asyncio.run(go())
    steps = logged_steps(tmp_path)
    assert (
        steps["predictions"].iloc[0]["p_frontier"] == 0.25
        or dict(steps["predictions"].iloc[0])["p_frontier"] == 0.25
    )


async def test_concurrent_steps_of_one_run_get_distinct_indexes(tmp_path):
    async with Harness(tmp_path, policy={"kind": "session-sticky"}) as c:
        rs = await asyncio.gather(
            *(
                c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "cc"})
                for _ in range(10)
            )
        )
        assert sorted(int(r.headers["x-runroute-step"]) for r in rs) == list(range(10))
        assert len({r.headers["x-runroute-replica"] for r in rs}) == 1, [
            (r.headers["x-runroute-step"], r.headers["x-runroute-replica"], r.headers["x-runroute-reason"])
            for r in rs
        ]
    assert sorted(logged_steps(tmp_path)["step"].tolist()) == list(range(10))
