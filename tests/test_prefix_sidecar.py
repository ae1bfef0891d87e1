"""The sidecar places through the prefix index (real HTTP, fake vLLM replicas with a prefix cache):
runs that share a long system prompt land on the replica that holds it, and that replica reports
the reuse in ``usage.prompt_tokens_details.cached_tokens``."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings


def _system(words: int = 1500) -> str:
    return "You are the shared support agent. " + " ".join(f"rule{i % 89}-{i}" for i in range(words))


def test_runs_sharing_a_system_prompt_land_where_the_prefix_is(tmp_path: Path) -> None:
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.2)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("vllm", name="v1", **knobs) as v1,
        fake_in_thread("vllm", name="v2", **knobs) as v2,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-f") as fr,
    ):
        os.environ["RR_TEST_PREFIX_KEY"] = "sk-f"
        s = RouterSettings.load(
            None,
            local={"urls": [v0.url, v1.url, v2.url], "model": "local-model"},
            frontier={"url": fr.base_url, "model": "frontier-model", "api_key_env": "RR_TEST_PREFIX_KEY"},
            policy={"kind": "prefix-aware"},
            scrape={"interval_s": 0.2},
            runlog={"dir": str(tmp_path / "logs")},
        )
        system = _system()
        with serve_in_thread(create_app(s)) as url, httpx.Client(timeout=30) as c:

            def step(run_id: str, user: str) -> tuple[str, int]:
                body = {
                    "model": "auto",
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                    "max_tokens": 4,
                }
                r = c.post(url + "/v1/chat/completions", json=body, headers={"X-Run-Id": run_id})
                assert r.status_code == 200, r.text
                cached = r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                return r.headers["x-runroute-replica"], cached

            first, cached0 = step("shared-0", "ticket 0: refund")
            assert cached0 == 0
            placed = [step(f"shared-{i}", f"ticket {i}: a different question") for i in range(1, 7)]
            # every later run goes where the system prompt is, and vLLM (the fake) reuses it there
            assert {rep for rep, _ in placed} == {first}, placed
            assert all(cached > 1000 for _, cached in placed), placed
            ready = c.get(url + "/ready").json()["prefix_index"]
            assert {r["mode"] for r in ready["replicas"].values()} == {"approximate"}
            assert ready["replicas"][first]["blocks"] > 0 and ready["shared"] is False
