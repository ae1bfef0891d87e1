"""Two routers sharing Redis share one prefix index (router.server.state.prefix_share): a run begun on
router A is placed warm by router B, and new runs with the same system prompt sent to B land where
A put that prefix. Real HTTP, a private redis-server, fake vLLM replicas with a prefix cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from multi_router_support import REDIS_BIN, RedisProc, free_port

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

pytestmark = pytest.mark.redis


def _system(words: int = 1500) -> str:
    return "You are the shared billing agent. " + " ".join(f"clause{i % 83}-{i}" for i in range(words))


@pytest.mark.skipif(REDIS_BIN is None, reason="redis-server not installed")
def test_two_routers_share_one_prefix_index(tmp_path: Path) -> None:
    redis = RedisProc(free_port(), tmp_path)
    redis.start()
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.2)
    try:
        with (
            fake_in_thread("vllm", name="v0", **knobs) as v0,
            fake_in_thread("vllm", name="v1", **knobs) as v1,
            fake_in_thread("vllm", name="v2", **knobs) as v2,
            fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-f") as fr,
        ):
            os.environ["RR_TEST_SHARE_KEY"] = "sk-f"

            def settings(name: str) -> RouterSettings:
                return RouterSettings.load(
                    None,
                    local={"urls": [v0.url, v1.url, v2.url], "model": "local-model"},
                    frontier={
                        "url": fr.base_url,
                        "model": "frontier-model",
                        "api_key_env": "RR_TEST_SHARE_KEY",
                    },
                    policy={"kind": "prefix-aware"},
                    scrape={"interval_s": 0.2},
                    runlog={"dir": str(tmp_path / f"logs-{name}")},
                    store={"kind": "redis", "redis_url": redis.url, "ttl_s": 600},
                )

            app_a, app_b = create_app(settings("a")), create_app(settings("b"))
            system = _system()
            with (
                serve_in_thread(app_a) as url_a,
                serve_in_thread(app_b) as url_b,
                httpx.Client(timeout=30) as c,
            ):

                def step(url: str, run_id: str, users: list[str]) -> tuple[str, int]:
                    msgs = [{"role": "system", "content": system}]
                    for u in users:
                        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": "ok"}]
                    body = {"model": "auto", "messages": msgs[:-1], "max_tokens": 4}
                    r = c.post(url + "/v1/chat/completions", json=body, headers={"X-Run-Id": run_id})
                    assert r.status_code == 200, r.text
                    cached = r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                    return r.headers["x-runroute-replica"], cached

                def b_applied(n: int) -> None:
                    deadline = time.monotonic() + 10
                    while app_b.prefix_share.applied < n:
                        assert time.monotonic() < deadline, "router B never applied router A's records"
                        time.sleep(0.02)

                first, _ = step(url_a, "run-a", ["ticket 1: the invoice is wrong"])
                b_applied(1)
                # the same run's next step, sent to router B, goes where A put its context
                again, cached = step(url_b, "run-a", ["ticket 1: the invoice is wrong", "and the refund?"])
                assert again == first and cached > 1000, (first, again, cached)
                # new runs with the same system prompt, sent to B, land where that prefix is
                placed = [step(url_b, f"run-b{i}", [f"ticket {i}: another question"]) for i in range(4)]
                assert {rep for rep, _ in placed} == {first}, placed
                assert all(cached > 1000 for _, cached in placed), placed
                assert app_a.prefix_share.applied >= 1  # and A hears of B's placements
    finally:
        redis.kill()
