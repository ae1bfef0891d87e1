"""Acceptance tests of the sidecar: real uvicorn on loopback, fake vLLM x2 + fake frontier, the
``openai`` SDK (sync, async, streaming, tool calls), the learned policy with a small real bundle.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI, OpenAI

from models.predictor import FeaturePredictor
from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search the docs",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def system_prompt(tag: str, words: int = 1200) -> str:
    return f"You are agent {tag}. " + " ".join(f"rule{i % 97}-{tag}" for i in range(words))


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    """A small real ModelBundle (LightGBM escalation model on synthetic rows); P(frontier) stays ~0.15."""
    from features.extract import N_FEATURES
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, N_FEATURES))
    y = (rng.random(400) < 0.15).astype(int)  # labels unrelated to the features: P stays low
    est = EscalationClassifier(n_estimators=20, calibration="sigmoid", cv=3, n_jobs=1).fit(X, y)
    out = tmp_path_factory.mktemp("bundle") / "b"
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.95, "p_frontier_down": 0.9}).save(out)
    return out


@pytest.fixture(scope="module")
def fakes():
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.2)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("vllm", name="v1", **knobs) as v1,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-front") as fr,
    ):
        yield v0, v1, fr


def make_settings(tmp_path: Path, fakes, bundle_dir: Path, **over) -> RouterSettings:
    v0, v1, fr = fakes
    os.environ["RR_TEST_FRONTIER_KEY"] = "sk-front"
    base = {
        "local": {"urls": [v0.url, v1.url], "model": "local-model"},
        "frontier": {"url": fr.base_url, "model": "frontier-model", "api_key_env": "RR_TEST_FRONTIER_KEY"},
        "policy": {"kind": "learned"},
        "bundle": {"path": str(bundle_dir), "watch_s": 0},
        "scrape": {"interval_s": 0.2},
        "runlog": {"dir": str(tmp_path / "logs")},
    }
    base.update(over)
    return RouterSettings.load(None, **base)


def agent_run(client: OpenAI, run_id: str, steps: int, sys_tag: str) -> list:
    """A tool-using agent loop through the sidecar; returns the raw responses."""
    msgs: list[dict] = [
        {"role": "system", "content": system_prompt(sys_tag)},
        {"role": "user", "content": f"Task for {run_id}: find the refund policy."},
    ]
    out = []
    for _ in range(steps):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=msgs, tools=TOOLS, extra_headers={"X-Run-Id": run_id}
        )
        r = raw.parse()
        out.append((raw.headers, r))
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if m.tool_calls:
            for tc in m.tool_calls:
                msgs.append(
                    {"role": "tool", "tool_call_id": tc.id, "content": f"result for {tc.function.name}: ok"}
                )
        else:
            msgs.append({"role": "user", "content": "continue"})
    return out


def test_twenty_step_run_is_pinned_and_cached(tmp_path, fakes, bundle_dir):
    app = create_app(make_settings(tmp_path, fakes, bundle_dir))
    with serve_in_thread(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        res = agent_run(client, "run-20", 20, "A")
        tiers = {h["x-runroute-tier"] for h, _ in res}
        replicas = {h["x-runroute-replica"] for h, _ in res}
        assert tiers == {"local"} and len(replicas) == 1
        assert all(r.choices[0].message.tool_calls for _, r in res)  # tool calls came back through
        prompt = sum(r.usage.prompt_tokens for _, r in res[2:])
        cached = sum(r.usage.prompt_tokens_details.cached_tokens for _, r in res[2:])
        assert cached / prompt >= 0.8, (cached, prompt)
        run = httpx.get(f"{url}/v1/runs/run-20").json()
        assert [s["step"] for s in run["steps"]] == list(range(20))
        assert run["tiers"] == ["local"] and run["replicas"] == list(replicas) and run["switches"] == 0
        for s in run["steps"]:
            assert s["reason"] and s["predictions"]["p_frontier"] >= 0 and s["status"] == 200
        assert httpx.post(f"{url}/v1/runs/run-20/end", json={"outcome": "success"}).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'runroute_bundle_info{registry_version="",version=' in metrics
        assert (
            "runroute_cached_prompt_tokens_total" in metrics and "runroute_cache_hit_tokens_total" in metrics
        )
        ready = httpx.get(f"{url}/ready").json()
        assert ready["ready"] and all(ready["backends"].values())
    from features.runlog import read_runlog

    log = read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))
    assert log.steps["step"].tolist() == list(range(20))
    assert log.steps["features"].map(len).nunique() == 1 and log.steps["feature_spec_version"].notna().all()
    assert log.steps["prompt_text"].isna().all()
    assert log.runs["outcome"].tolist() == ["success"]


def test_two_runs_under_load_spread_and_stay_pinned(tmp_path, fakes, bundle_dir):
    """Two concurrent runs (steps of ~50 ms, so each sees the other's in-flight step) spread over
    the two replicas by load, then each stays on its replica."""

    async def run(client: AsyncOpenAI, tag: str, stream: bool) -> list[str]:
        from router.server.runs.identity import hash_opening

        msgs = [{"role": "system", "content": system_prompt(tag, 300)}, {"role": "user", "content": "go"}]
        rid = hash_opening(msgs)
        seen = []
        for _ in range(6):
            if stream:
                resp = await client.chat.completions.with_raw_response.create(
                    model="auto", messages=msgs, stream=True, stream_options={"include_usage": True}
                )
                text, usage = "", None
                async for chunk in resp.parse():
                    if chunk.choices:
                        text += chunk.choices[0].delta.content or ""
                    if chunk.usage:
                        usage = chunk.usage
                assert usage is not None and usage.prompt_tokens > 0
            else:
                resp = await client.chat.completions.with_raw_response.create(model="auto", messages=msgs)
                text = resp.parse().choices[0].message.content or ""
            assert resp.headers["x-runroute-run-id"] == rid  # identity from the hash of the opening
            seen.append(resp.headers["x-runroute-replica"])
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
        return seen

    async def main(url: str) -> list[list[str]]:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        results = await asyncio.gather(run(client, "X", True), run(client, "Y", False))
        return results

    knobs = dict(model="local-model", base_ms=50.0, prefill_ms_per_token=0.0, decode_ms_per_token=0.0)
    with fake_in_thread("vllm", name="s0", **knobs) as s0, fake_in_thread("vllm", name="s1", **knobs) as s1:
        app = create_app(
            make_settings(
                tmp_path, fakes, bundle_dir, local={"urls": [s0.url, s1.url], "model": "local-model"}
            )
        )
        with serve_in_thread(app) as url:
            a, b = asyncio.run(main(url))
            for rid, h in app.state.proxy.runs.items():
                assert [e["status"] for e in h.entries] == [200] * 6, rid
    assert len(set(a)) == 1 and len(set(b)) == 1, (a, b)  # each pinned
    assert set(a) != set(b)  # spread over the replicas
    assert set(a) | set(b) == {"local-0", "local-1"}


def test_upstream_killed_mid_run_falls_back_and_logs(tmp_path, fakes, bundle_dir):
    knobs = dict(model="local-model", zero_latency=True)
    with fake_in_thread("vllm", name="k0", **knobs) as k0, fake_in_thread("vllm", name="k1", **knobs) as k1:
        s = make_settings(
            tmp_path, fakes, bundle_dir, local={"urls": [k0.url, k1.url], "model": "local-model"}
        )
        app = create_app(s)
        with serve_in_thread(app) as url:
            client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            msgs = [{"role": "system", "content": system_prompt("K", 100)}, {"role": "user", "content": "hi"}]
            first = client.chat.completions.with_raw_response.create(
                model="auto", messages=msgs, extra_headers={"X-Run-Id": "kill-mid"}
            )
            pinned = first.headers["x-runroute-replica"]
            (k0 if pinned == "local-0" else k1).pause()  # connection refused from now on
            again = client.chat.completions.with_raw_response.create(
                model="auto", messages=msgs, extra_headers={"X-Run-Id": "kill-mid"}
            )
            assert again.headers["x-runroute-fallback-from"] == pinned
            assert again.headers["x-runroute-tier"] == "frontier"
            assert again.parse().model == "frontier-model"
            run = httpx.get(f"{url}/v1/runs/kill-mid").json()
            assert [st["status"] for st in run["steps"]] == [200, 200]
            assert run["steps"][1]["reason"] == "fallback-connect"
    from features.runlog import read_runlog

    steps = read_runlog(sorted((tmp_path / "logs").glob("runlog-*"))).steps
    assert steps["reason"].tolist()[1] == "fallback-connect" and steps["tier"].tolist() == [
        "local",
        "frontier",
    ]


def test_hot_reload_swaps_bundle_and_refuses_bad(tmp_path, fakes, bundle_dir):
    import shutil

    live = tmp_path / "live-bundle"
    shutil.copytree(bundle_dir, live)
    s = make_settings(tmp_path, fakes, bundle_dir, bundle={"path": str(live), "watch_s": 0.1})
    app = create_app(s)
    with serve_in_thread(app) as url:
        v1 = httpx.get(f"{url}/ready").json()["bundle"]
        (live / "bundle.joblib").write_bytes(b"corrupt")  # the watcher sees it and refuses it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and app.state.holder.last_error is None:
            time.sleep(0.05)
        assert app.state.holder.last_error is not None
        assert httpx.get(f"{url}/ready").json()["bundle"] == v1
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200
        shutil.rmtree(live)
        shutil.copytree(bundle_dir, live)
        r = httpx.post(f"{url}/admin/reload")
        assert r.status_code == 200 and r.json()["version"] == v1
        assert app.state.holder.last_error is None


@pytest.mark.slow
def test_sigkill_server_keeps_steps_older_than_one_second(tmp_path, fakes, bundle_dir):
    v0, v1, fr = fakes
    cfg = {
        "local": {"urls": [v0.url, v1.url], "model": "local-model"},
        "frontier": {"url": fr.url, "model": "frontier-model", "api_key_env": "RR_TEST_FRONTIER_KEY"},
        "policy": {"kind": "learned"},
        "bundle": {"path": str(bundle_dir), "watch_s": 0},
        "runlog": {"dir": str(tmp_path / "logs")},
        "server": {"port": 0},
    }
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    (tmp_path / "rr.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RR_TEST_FRONTIER_KEY": "sk-front", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runroute",
            "serve",
            "--config",
            str(tmp_path / "rr.yaml"),
            "--port",
            str(port),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    done: list[tuple[int, float]] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
        body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
        with httpx.Client(base_url=url, timeout=10) as c:
            t_end = time.monotonic() + 2.5
            while time.monotonic() < t_end:
                r = c.post("/v1/chat/completions", json=body, headers={"x-run-id": "sigkill"})
                assert r.status_code == 200
                done.append((int(r.headers["x-runroute-step"]), time.time()))
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
    finally:
        proc.kill()
        proc.wait(10)
    files = list((tmp_path / "logs").glob("runlog-*.jsonl"))
    have = set()
    for f in files:
        for line in f.read_bytes().splitlines():
            if line.endswith(b"}"):
                rec = orjson.loads(line)
                if rec.get("run_id") == "sigkill":
                    have.add(rec["step"])
    must = {k for k, t in done if t < killed - 1.0}
    assert len(must) >= 5
    assert must <= have, sorted(must - have)


class _SeqPredictor(FeaturePredictor):
    """Stand-in predictor: P(frontier) from a fixed sequence, indexed by the run's step."""

    version = "seq"

    def __init__(self, ps: list[float]):
        self.ps = ps

    def predict_features(self, x):
        from features.extract import FEATURE_NAMES
        from models.types import Predictions

        k = int(x[FEATURE_NAMES.index("step_index")])
        return Predictions(p_frontier=self.ps[min(k, len(self.ps) - 1)])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ps=st.lists(st.floats(0.35, 0.75), min_size=6, max_size=14))
def test_oscillating_predictions_switch_at_most_once(ps, bundle_dir):
    """Predictions oscillating around the escalation threshold (0.6), never below the
    de-escalation one (0.3): the live router switches the run at most once (hysteresis)."""
    import tempfile

    from router.server.hotpath.upstream import FakeReply, FakeUpstream

    def handler(call):
        body = orjson.loads(call.body)
        return FakeReply(
            body=orjson.dumps(
                {
                    "id": "x",
                    "model": body["model"],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 3},
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        )

    s = RouterSettings.load(
        None,
        local={"urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"], "model": "local-model"},
        frontier={"url": "http://127.0.0.1:11", "model": "frontier-model", "allow_no_key": True},
        policy={"kind": "learned", "p_frontier_up": 0.6, "p_frontier_down": 0.3, "min_dwell_steps": 0},
        bundle={"path": str(bundle_dir)},
        scrape={"interval_s": 0},
        runlog={"dir": tempfile.mkdtemp(prefix="rr-osc-")},
    )
    app = create_app(s, upstream=FakeUpstream(handler), bundle=_SeqPredictor(ps))

    async def go() -> dict:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
                msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
                for _ in ps:
                    r = await c.post(
                        "/v1/chat/completions", json={"messages": msgs}, headers={"x-run-id": "osc"}
                    )
                    assert r.status_code == 200
                    msgs = msgs + [
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": "next"},
                    ]
                return (await c.get("/v1/runs/osc")).json()

    run = asyncio.run(go())
    assert len(run["steps"]) == len(ps)
    assert run["switches"] <= 1, [
        (s["tier"], s["reason"], s["predictions"]["p_frontier"]) for s in run["steps"]
    ]


def test_scraper_reads_vllm_metrics_and_marks_dead_replicas(fakes):
    from router.server.hotpath.upstream import AiohttpUpstream
    from router.server.metrics.scrape import Scraper

    v0, _, _ = fakes
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sk.getsockname()[1]}"  # closed again: connection refused

    async def go() -> Scraper:
        up = AiohttpUpstream(connect_s=0.5)
        await up.start()
        sc = Scraper({"a": v0.url, "b": dead}, up, interval_s=0, unhealthy_after=2, model_name="local-model")
        try:
            async with httpx.AsyncClient() as c:  # some traffic so the prefix-cache counters move
                for _ in range(2):
                    await c.post(
                        v0.url + "/v1/chat/completions",
                        json={
                            "model": "local-model",
                            "messages": [{"role": "user", "content": "hello " * 200}],
                        },
                    )
            await sc.scrape_once()
            assert sc.stats["b"].healthy  # one failure is not enough
            await sc.scrape_once()
        finally:
            await up.close()
        return sc

    sc = asyncio.run(go())
    a, b = sc.stats["a"], sc.stats["b"]
    assert a.healthy and a.scraped and a.prefix_queries > 0 and 0.0 <= a.kv_usage <= 1.0
    assert not b.healthy and b.failures == 2
