"""Fake backends, part 2: failure injection, the frontier fake (auth, rate limit, prices, prompt
cache, streaming), launchers and the command line."""

from __future__ import annotations

import json
import socket

import aiohttp
import orjson
import pytest

from router.fakes import KnobError, fake_in_thread, start_fake, start_fake_process
from router.fakes.launch import parse_knob_args
from router.fakes.server import Ticket
from router.policy.defaults import FRONTIER_IN_PER_M, FRONTIER_OUT_PER_M


async def post(session: aiohttp.ClientSession, url: str, body: dict, **kw) -> tuple[int, dict, dict]:
    async with session.post(url + "/v1/chat/completions", json=body, **kw) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


async def read_sse(session: aiohttp.ClientSession, url: str, body: dict) -> list:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


SYSTEM = "You are a careful coding agent. Use the tools to inspect and fix the repository. " * 6


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


async def test_failure_injection_error_abort_and_refusal(session) -> None:
    fake = await start_fake("vllm", zero_latency=True, error_rate=1.0, error_status=503)
    body = {"messages": [{"role": "user", "content": "x"}]}
    try:
        status, err, _ = await post(session, fake.url, body)
        assert status == 503 and err["error"]["code"] == 503
        fake.server.update(error_rate=0.0, abort_rate=1.0)
        for stream in (False, True):
            with pytest.raises(aiohttp.ClientPayloadError):
                async with session.post(
                    fake.url + "/v1/chat/completions", json={**body, "stream": stream}
                ) as r:
                    assert r.status == 200
                    await r.read()
        assert fake.server.stats.aborts_injected == 2 and fake.server.running == 0
        fake.server.update(abort_rate=0.0)
        await fake.pause()
        with pytest.raises(aiohttp.ClientConnectionError):
            await post(session, fake.url, body)
        await fake.resume()
        status, _, _ = await post(session, fake.url, body)
        assert status == 200
    finally:
        await fake.stop()


async def test_error_rate_is_a_rate(session) -> None:
    fake = await start_fake("vllm", zero_latency=True, error_rate=0.3, seed=3)
    try:
        statuses = [
            (await post(session, fake.url, {"messages": [{"role": "user", "content": "x"}]}))[0]
            for _ in range(100)
        ]
        assert 15 <= statuses.count(500) <= 45 and statuses.count(200) == 100 - statuses.count(500)
    finally:
        await fake.stop()


async def test_frontier_auth_rate_limit_prices_and_prompt_cache(session) -> None:
    fake = await start_fake(
        "frontier", zero_latency=True, api_key="sk-test", rate_limit_rps=0.5, rate_limit_burst=3, model="big"
    )
    auth = {"Authorization": "Bearer sk-test"}
    long_msgs = [{"role": "system", "content": SYSTEM * 10}, {"role": "user", "content": "hello"}]
    try:
        status, err, headers = await post(session, fake.url, {"messages": long_msgs})
        assert (
            status == 401
            and err["error"]["code"] == "invalid_api_key"
            and headers["x-fake-backend"] == "frontier-fake"
        )
        status, r1, h1 = await post(session, fake.url, {"model": "big", "messages": long_msgs}, headers=auth)
        assert status == 200 and r1["model"] == "big" and f"in={FRONTIER_IN_PER_M}" in h1["x-fake-prices"]
        n = r1["usage"]["prompt_tokens"]
        assert n >= 1024 and r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert float(h1["x-fake-cost-usd"]) == pytest.approx(
            (n * FRONTIER_IN_PER_M + r1["usage"]["completion_tokens"] * FRONTIER_OUT_PER_M) / 1e6
        )
        status, r2, _ = await post(session, fake.url, {"model": "big", "messages": long_msgs}, headers=auth)
        cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert status == 200 and cached > 0 and cached % 128 == 0
        status, err, headers = await post(session, fake.url, {"messages": long_msgs}, headers=auth)
        assert status == 200
        status, err, headers = await post(session, fake.url, {"messages": long_msgs}, headers=auth)
        assert status == 429 and err["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(headers["Retry-After"]) <= 2 and fake.server.stats.rate_limited == 1
    finally:
        await fake.stop()


async def test_frontier_streaming_latency_and_usage(session) -> None:
    fake = await start_fake("frontier", ttft_ms=60, tokens_per_s=400, default_tokens=20)
    try:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks = await read_sse(session, fake.url, body)
        assert chunks[-1]["usage"]["completion_tokens"] == 20 and all("usage" in c for c in chunks)
        # the latency model (the stream is paced by it; its speed is not asserted here)
        t = Ticket(arrived=0.0, prompt_tokens=1)
        assert fake.server.ttft_s(t) == pytest.approx(0.06) and fake.server.decode_s_per_token(
            t
        ) == pytest.approx(1 / 400)
        assert fake.server.cost_usd > 0
    finally:
        await fake.stop()


# --- launchers -----------------------------------------------------------------------------------


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_fake_in_thread_starts_and_stops_cleanly() -> None:
    import urllib.request

    with fake_in_thread("frontier", zero_latency=True, name="f1") as fake:
        req = urllib.request.Request(
            fake.base_url + "/chat/completions",
            data=orjson.dumps({"messages": [{"role": "user", "content": "hi"}]}),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.headers["x-fake-backend"] == "frontier-fake/f1"
            assert json.loads(r.read())["model"] == "fake-frontier-model"
        fake.update(error_rate=1.0)
        assert fake.server.knobs.error_rate == 1.0
        port = fake.port
    assert _refused(port)


def test_fake_process_starts_and_stops_cleanly() -> None:
    import urllib.request

    proc = start_fake_process("vllm", model="proc-model", zero_latency=True)
    try:
        with urllib.request.urlopen(proc.url + "/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["id"] == "proc-model"
    finally:
        code = proc.stop()
    assert code == 0 and _refused(proc.port)


def test_knob_parsing_and_errors() -> None:
    assert parse_knob_args(["--error-rate=0.5", "--model", "m", "--zero-latency"]) == {
        "error_rate": "0.5",
        "model": "m",
        "zero_latency": "true",
    }
    with pytest.raises(KnobError, match="bogus_knob"):
        fake_in_thread("vllm", bogus_knob=1).start()
    with pytest.raises(KnobError, match="error_rate"):
        fake_in_thread("vllm", error_rate=2).start()
    with pytest.raises(KnobError, match="unknown fake kind"):
        fake_in_thread("nope").start()


def test_cli_command_reports_bad_knobs_in_one_line() -> None:
    import typer
    from typer.testing import CliRunner

    from runroute.cli import CliError
    from runroute.commands import fake_backend

    app = typer.Typer()
    fake_backend.register(app)

    @app.callback()
    def _root() -> None:  # keep typer in multi-command mode
        return None

    result = CliRunner().invoke(app, ["fake-backend", "--kind", "vllm", "--bogus=1"])
    assert isinstance(result.exception, CliError) and "bogus" in str(result.exception)
