"""Run identity and lifecycle in the live sidecar, overload answers, and the frontier adapters.

Clocks are injected (a test clock the sweeper and the traffic model read); waiting is polling with a
bound, never a sleep for a fixed time.
"""

from __future__ import annotations

import math
import os
import time

import httpx
import pytest
from protocol_support import read_steps, running_sidecar, sidecar_settings

from router.fakes.launch import fake_in_thread
from router.server.runs.identity import idle_end_from_pauses
from router.server.settings import RouterSettings, SettingsError

ADM = {
    "slo_short_step_s": 1.0,
    "base_short_step_s": 0.2,
    "replica_tokens_per_s": 1000.0,
    "default_run_token_rate": 100.0,
    "min_rate_steps": 1_000_000,
    "sweep_s": 0,
}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def chat(url: str, content: str, run_id: str | None = None, **kw) -> httpx.Response:
    hdr = {"x-run-id": run_id} if run_id else {}
    body = {
        "model": "auto",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": content}],
        **kw,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, headers=hdr, timeout=10)


def poll(pred, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_idle_runs_end_release_their_slot_and_log_the_reason(tmp_path, proto_fakes, small_bundle):
    clock = Clock()
    s = sidecar_settings(
        tmp_path,
        proto_fakes,
        small_bundle,
        policy={"kind": "always-local"},
        identity={"idle_end_s": 300, "sweep_s": 0.05},
        admission=ADM,
    )
    with running_sidecar(s, clock=clock) as (url, app):
        for rid in ("a", "b"):
            assert chat(url, f"task {rid}", rid).status_code == 200
        cap = lambda: httpx.get(url + "/v1/capacity").json()["local"]["active_runs"]  # noqa: E731
        assert cap() == 2
        clock.t += 200
        assert chat(url, "more for b", "b").status_code == 200  # b is busy again; a idles on
        clock.t += 150  # a: 350 s idle > 300; b: 150 s
        assert poll(lambda: cap() == 1)
        assert httpx.get(url + "/v1/runs/a").json()["ended"] is True
        assert httpx.get(url + "/v1/runs/b").json()["ended"] is False
        assert app.state.proxy.lifecycle.ended_idle == 1
        assert app.state.admission.stats.released_end == 1
        r = chat(url, "task a again", "a")  # an ended run id that comes back starts a new run
        assert r.status_code == 200 and r.headers["x-runroute-step"] == "1" and cap() == 2
    runs = read_steps(tmp_path).runs
    assert runs["run_id"].tolist() == ["a"] and runs["end_reason"].tolist() == ["idle"]


def test_idle_end_default_is_derived_from_the_shipped_tool_pauses():
    import pandas as pd

    from features.samples import sample_path

    p99s = []
    for name in ("mooncake_20min.parquet", "tau2bench_airline.parquet"):
        df = pd.read_parquet(sample_path(name))
        p99s.append(idle_end_from_pauses(df["tool_pause_s"].dropna()))
    default = RouterSettings.model_fields["identity"].default_factory().idle_end_s  # type: ignore[misc]
    assert default == max(p99s) and default < 3600


def test_retry_after_is_the_predicted_time_a_slot_frees(tmp_path, proto_fakes, small_bundle):
    """One replica: interactive runs are admitted while active + 1 <= 7 (ADM's figures)."""
    clock = Clock()
    one = {"urls": [proto_fakes["v0"].url], "model": "local-model", "max_context": 200000}
    s = sidecar_settings(
        tmp_path,
        proto_fakes,
        small_bundle,
        policy={"kind": "always-local"},
        identity={"idle_end_s": 300, "sweep_s": 0},
        admission={**ADM, "spill": False, "retry_after_max_s": 1000},
        local=one,
    )
    with running_sidecar(s, clock=clock) as (url, app):
        for i in range(7):
            assert chat(url, f"t{i}", f"r{i}").status_code == 200
            clock.t += 10
        # runs idle 70, 60, ..., 10 s: the soonest slot is r0's idle expiry, 300 - 70 = 230 s
        r = chat(url, "new", "late")
        assert r.status_code == 429 and r.json()["error"]["code"] == "run_rejected_overload"
        assert int(r.headers["retry-after"]) == 230 and int(r.headers["retry-after-ms"]) == 230000
        assert r.headers["x-should-retry"] == "false"  # > client_retry_max_s: SDKs raise at once
        clock.t += 200
        r = chat(url, "new", "late")
        assert int(r.headers["retry-after"]) == 30 and r.headers["x-should-retry"] == "true"
    with running_sidecar(
        sidecar_settings(
            tmp_path, proto_fakes, small_bundle, policy={"kind": "always-local"}, admission=ADM, local=one
        )
    ) as (url, app):
        for i in range(7):
            chat(url, f"t{i}", f"s{i}")
        r = chat(url, "new", "late2")  # spill possible: the new run goes to the frontier, no 429
        assert r.status_code == 200 and r.headers["x-runroute-admission"] == "spill"


def test_identity_user_is_a_tenant_repeated_openings_start_new_runs(tmp_path, sidecar):
    with sidecar(policy={"kind": "always-local"}, identity={"reopen_gap_s": 60}) as (url, app):
        a = chat(url, "task one", user="alice")
        b = chat(url, "task two", user="alice")
        assert a.headers["x-runroute-run-id"] != b.headers["x-runroute-run-id"]  # user is not the run
        rid = a.headers["x-runroute-run-id"]
        assert app.state.proxy.runs[rid].tenant == "alice"
        bob = chat(url, "task one", user="bob")
        assert bob.headers["x-runroute-run-id"] != rid  # the user scopes the opening hash
        cont = {
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "task one"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"},
            ]
        }
        r = httpx.post(url + "/v1/chat/completions", json={"model": "auto", "user": "alice", **cont})
        assert r.headers["x-runroute-run-id"] == rid and r.headers["x-runroute-step"] == "1"
        again = chat(url, "task one", user="alice")  # a second trial of the same task: a new run at step 0
        assert again.headers["x-runroute-run-id"] == rid + ".2" and again.headers["x-runroute-step"] == "0"
        assert httpx.post(f"{url}/v1/runs/{rid}.2/end", json={}).status_code == 200
        third = chat(url, "task one", user="alice")  # the latest ended: a new run
        assert third.headers["x-runroute-run-id"] == rid + ".3"


def test_a_run_may_change_protocol_between_steps(tmp_path, sidecar):
    from openai import OpenAI

    system = "You are the support agent. " * 20
    with sidecar(policy={"kind": "always-local"}) as (url, app):
        oa = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        tools = [
            {
                "type": "function",
                "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
            }
        ]
        raw = oa.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "find it"}],
            tools=tools,
        )
        c = raw.parse()
        call = c.choices[0].message.tool_calls[0]  # type: ignore[index]
        rraw = oa.responses.with_raw_response.create(
            model="auto",
            instructions=system,
            input=[
                {"role": "user", "content": "find it"},
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                },  # type: ignore[union-attr]
                {"type": "function_call_output", "call_id": call.id, "output": "here"},
            ],
        )
        rid = raw.headers["x-runroute-run-id"]
        assert rraw.headers["x-runroute-run-id"] == rid and rraw.headers["x-runroute-step"] == "1"
        assert rraw.headers["x-runroute-replica"] == raw.headers["x-runroute-replica"]
        assert app.state.proxy.runs[rid].protocols == {"chat", "responses"}
    steps = read_steps(tmp_path).steps
    assert steps["run_id"].nunique() == 1 and steps["protocol"].tolist() == ["chat", "responses"]


def test_responses_chain_is_expanded_when_the_step_moves_to_another_backend(
    tmp_path, proto_fakes, small_bundle
):
    from openai import OpenAI

    with (
        fake_in_thread("vllm", name="k0", model="local-model", zero_latency=True) as k0,
        fake_in_thread("vllm", name="k1", model="local-model", zero_latency=True) as k1,
    ):
        s = sidecar_settings(
            tmp_path,
            proto_fakes,
            small_bundle,
            policy={"kind": "always-local"},
            local={"urls": [k0.url, k1.url], "model": "local-model"},
        )
        with running_sidecar(s) as (url, app):
            oa = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            raw = oa.responses.with_raw_response.create(model="auto", input="hello there")
            first = raw.headers["x-runroute-replica"]
            dead, alive = (k0, k1) if first == "local-0" else (k1, k0)
            dead.pause()
            try:
                raw2 = oa.responses.with_raw_response.create(
                    model="auto", input="and then?", previous_response_id=raw.parse().id
                )
            finally:
                dead.resume()
            assert raw2.headers["x-runroute-fallback-from"] == first
            assert raw2.headers["x-runroute-run-id"] == raw.headers["x-runroute-run-id"]
            # the other replica never saw the first response: the sidecar sent the whole chain
            assert raw2.parse().usage.input_tokens > raw.parse().usage.input_tokens  # type: ignore[union-attr]
            assert alive.server.stats.bad_requests == 0


def test_azure_and_openai_compatible_frontiers(tmp_path, small_bundle, proto_fakes):
    os.environ["RR_AZ_KEY"], os.environ["RR_GEM_KEY"] = "az-1", "gm-1"
    with (
        fake_in_thread(
            "frontier",
            model="gpt-az",
            zero_latency=True,
            api_key="az-1",
            api_style="azure",
            azure_deployment="dep1",
        ) as az,
        fake_in_thread(
            "frontier",
            model="gemini-x",
            zero_latency=True,
            api_key="gm-1",
            api_style="compatible",
            auth_header="x-goog-api-key",
            auth_scheme="",
        ) as gm,
    ):
        front = [
            {
                "kind": "azure",
                "name": "azure",
                "url": az.url,
                "deployment": "dep1",
                "model": "gpt-az",
                "api_key_env": "RR_AZ_KEY",
                "default": True,
            },
            {
                "kind": "openai-compatible",
                "name": "gemini",
                "url": gm.url,
                "chat_path": "/v1beta/openai/chat/completions",
                "auth_header": "x-goog-api-key",
                "auth_scheme": "",
                "model": "gemini-x",
                "api_key_env": "RR_GEM_KEY",
                "models": ["gemini-*"],
            },
        ]
        s = sidecar_settings(
            tmp_path, proto_fakes, small_bundle, policy={"kind": "always-frontier"}, frontiers=front
        )
        with running_sidecar(s) as (url, app):
            r = chat(url, "hello")
            assert r.status_code == 200 and r.headers["x-runroute-replica"] == "azure"
            g = chat(url, "hi", model="gemini-2.5-pro")  # the alias picks the entry; the policy the tier
            assert g.status_code == 200 and g.headers["x-runroute-replica"] == "gemini"
            m = httpx.post(
                url + "/v1/messages",
                json={"model": "auto", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert m.status_code == 200 and m.json()["type"] == "message"  # Messages client -> Azure chat
        assert az.server.stats.completed == 2 and gm.server.stats.completed == 1
        assert az.server.stats.unauthorized == 0 and gm.server.stats.unauthorized == 0
    with pytest.raises(SettingsError, match="deployment"):
        RouterSettings.load(
            None,
            frontier={"kind": "azure", "url": "http://127.0.0.1:1", "allow_no_key": True},
            policy={"kind": "always-frontier"},
        )


def test_cache_write_price_raises_the_switch_cost_to_the_frontier():
    from models.types import Predictions
    from router.policy.learned import LearnedPolicy
    from router.policy.types import BackendState, RunState, Snapshot

    def cost(write: float) -> float:
        front = BackendState(
            "f", "frontier", "m", price_in_per_m=3.0, price_cached_in_per_m=0.3, price_cache_write_per_m=write
        )
        snap = Snapshot(
            RunState("r", tier="local", replica="l"),
            3,
            {},
            Predictions(p_frontier=0.5),
            [BackendState("l", "local", "m"), front],
            context_tokens=10000,
        )
        return LearnedPolicy(p_frontier_up=0.9, p_frontier_down=0.1).economics(snap)[2]

    assert cost(0.0) == pytest.approx(10000 * 3.0e-6)  # no write price: the input price
    assert cost(3.75) == pytest.approx(10000 * 3.75e-6) and math.isfinite(cost(3.75))


def test_local_model_patterns_accept_a_clients_model_names(tmp_path, sidecar, proto_fakes):
    local = {"urls": [proto_fakes["v0"].url], "model": "local-model", "models": ["claude-*"]}
    with sidecar(local=local, frontiers=[], policy={"kind": "always-local"}) as (url, app):
        m = {"model": "claude-opus-9", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(url + "/v1/messages", json=m, headers={"x-claude-code-session-id": "s-1"})
        assert r.status_code == 200 and r.headers["x-runroute-run-id"] == "cc-s-1"
        assert httpx.post(url + "/v1/messages", json={**m, "model": "gpt-4o"}).status_code == 404
