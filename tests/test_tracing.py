"""OpenTelemetry tracing of the sidecar: a span per step with run id, step, tier, backend, reason and
tokens; the upstream call as its child; W3C ``traceparent`` continued from the client and sent to
the backend (seen by a real loopback HTTP hop in front of the fake vLLM); off by default with
nothing of the OpenTelemetry SDK imported (FastAPI itself imports the ``opentelemetry`` API package).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading

import httpx
import pytest
from aiohttp import ClientSession, web

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_TP = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


@contextlib.contextmanager
def recording_hop(target: str):
    """A real HTTP hop that records request headers and forwards to ``target`` (streams included)."""
    seen: list[dict[str, str]] = []
    started = threading.Event()
    box: dict = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        body = await request.read()
        hdr = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with (
            ClientSession() as s,
            s.request(request.method, target + request.path_qs, data=body, headers=hdr) as r,
        ):
            resp = web.StreamResponse(
                status=r.status, headers={"content-type": r.headers.get("content-type", "")}
            )
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
        box["loop"], box["runner"] = loop, runner
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10)
    try:
        yield box["url"], seen
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        t.join(10)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracing")
    with (
        fake_in_thread("vllm", name="v0", model="local-model", base_ms=1.0) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
        recording_hop(v0.url) as (hop, seen),
    ):
        s = RouterSettings.load(
            None,
            local={"urls": [hop], "model": "local-model"},
            frontier={"url": fr.base_url, "model": "frontier-model", "allow_no_key": True},
            policy={"kind": "always-local"},
            scrape={"interval_s": 0},
            admission={"enabled": False},
            tracing={"enabled": True, "exporter": "memory", "service_name": "rr-test"},
            runlog={"dir": str(tmp / "logs")},
        )
        app = create_app(s)
        with serve_in_thread(app) as url:
            yield url, app, seen


def _spans(app):
    return list(app.state.tracing.memory.get_finished_spans())


def test_a_step_span_with_an_upstream_child_and_traceparent_sent_on(traced):
    url, app, seen = traced
    app.state.tracing.memory.clear()
    n_seen = len(seen)
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi " * 200}]}
    r = httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"x-run-id": "trace-run", "traceparent": CLIENT_TP}
    )
    assert r.status_code == 200 and r.headers["x-runroute-replica"] == "local-0"
    spans = _spans(app)
    (step,) = [s for s in spans if s.name == "runroute.step"]
    (up,) = [s for s in spans if s.name == "runroute.upstream"]
    a = step.attributes
    assert a["runroute.run_id"] == "trace-run" and a["runroute.step"] == 0
    assert a["runroute.tier"] == "local" and a["runroute.backend"] == "local-0" and a["runroute.reason"]
    usage = r.json()["usage"]
    assert a["runroute.prompt_tokens"] == usage["prompt_tokens"] > 0
    assert a["runroute.completion_tokens"] == usage["completion_tokens"] > 0
    assert a["http.response.status_code"] == 200
    # the client's trace continues; the upstream span is the step's child
    assert format(step.context.trace_id, "032x") == CLIENT_TRACE
    assert step.parent is not None and format(step.parent.span_id, "016x") == "b7ad6b7169203331"
    assert up.parent.span_id == step.context.span_id and up.context.trace_id == step.context.trace_id
    assert up.attributes["runroute.backend"] == "local-0"
    assert step.resource.attributes["service.name"] == "rr-test"
    # the backend received the upstream span's traceparent
    (hdrs,) = seen[n_seen:]
    tp = {k.lower(): v for k, v in hdrs.items()}["traceparent"]
    assert tp == f"00-{CLIENT_TRACE}-{format(up.context.span_id, '016x')}-01"


def test_streaming_step_span_ends_after_the_stream(traced):
    url, app, _ = traced
    app.state.tracing.memory.clear()
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "stream please"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"x-run-id": "s-run"}) as r:
        assert r.status_code == 200
        assert b"[DONE]" in b"".join(r.iter_bytes())
    (step,) = [s for s in _spans(app) if s.name == "runroute.step"]
    assert step.attributes["runroute.completion_tokens"] > 0 and step.parent is None  # a new trace
    assert step.end_time >= max(s.end_time for s in _spans(app) if s.name == "runroute.upstream")


def test_a_failed_attempt_has_its_own_error_span(tmp_path):
    """The local replica is down: the first upstream child fails (connect), the fallback's succeeds."""
    with fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr:
        s = RouterSettings.load(
            None,
            local={"urls": ["http://127.0.0.1:9"], "model": "local-model"},
            frontier={"url": fr.base_url, "model": "frontier-model", "allow_no_key": True},
            policy={"kind": "always-local"},
            scrape={"interval_s": 0},
            admission={"enabled": False},
            tracing={"enabled": True, "exporter": "memory"},
            runlog={"dir": str(tmp_path / "logs")},
        )
        app = create_app(s)
        with serve_in_thread(app) as url:
            body = {"model": "auto", "messages": [{"role": "user", "content": "the local tier is down"}]}
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-run-id": "fb-run"})
            assert r.status_code == 200 and r.headers["x-runroute-tier"] == "frontier", r.text
            spans = _spans(app)
    ups = sorted((s for s in spans if s.name == "runroute.upstream"), key=lambda s: s.start_time)
    assert [u.attributes["runroute.backend"] for u in ups] == ["local-0", "frontier"]
    assert ups[0].attributes["runroute.error"] == "connect" and not ups[0].status.is_ok
    assert ups[1].status.is_ok
    (step,) = [s for s in spans if s.name == "runroute.step"]
    assert all(u.parent.span_id == step.context.span_id for u in ups)
    assert (
        step.attributes["runroute.reason"].startswith("fallback-")
        and step.attributes["runroute.tier"] == "frontier"
    )


def test_tracing_is_off_by_default_and_imports_nothing(tmp_path):
    code = f"""
import sys, httpx
from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings
with fake_in_thread("vllm", model="local-model") as v0:
    s = RouterSettings.load(None, local={{"urls": [v0.url], "model": "local-model"}},
        policy={{"kind": "always-local"}}, scrape={{"interval_s": 0}}, runlog={{"dir": {str(tmp_path)!r}}})
    assert not s.tracing.enabled
    app = create_app(s)
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={{"model": "auto", "messages": [{{"role": "user", "content": "x"}}]}})
        assert r.status_code == 200, r.text
    assert app.state.tracing is None
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"
