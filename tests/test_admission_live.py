"""Admission in the live sidecar (real uvicorn, fake vLLM/frontier on loopback) and in the simulator.

Covers: priority order (batch shed before interactive) and hysteresis through HTTP, the 429 with
Retry-After and ``run_rejected_overload``, spilled runs pinned to the frontier for all their steps,
the tenant spill budget, slot release on end and on idle expiry, ``GET /v1/capacity`` (+ gauges)
following the arrival rate up and down, the load model's estimates, a small closed-loop overload
run (bench/admission_load.py, smaller), and the simulator driving the same controller.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[1]

# 1000 work tokens/s per replica, 100 per run, idle short step 0.2 s, SLO 1 s:
# interactive (headroom 0.9) admits while active + 1 <= floor((1 - 0.2/0.9) * 10) = 7 runs,
# batch (headroom 0.6) while active + 1 <= floor((1 - 0.2/0.6) * 10) = 6 runs;
# batch resumes (hysteresis 0.1) only when (active + 1) / 10 < 0.667 - 0.1, i.e. active <= 4.
ADM = {
    "slo_short_step_s": 1.0,
    "base_short_step_s": 0.2,
    "replica_tokens_per_s": 1000.0,
    "default_run_token_rate": 100.0,
    "min_rate_steps": 1_000_000,  # keep the configured per-run rate: deterministic thresholds
    "sweep_s": 0,
}


@pytest.fixture(scope="module")
def fakes():
    with (
        fake_in_thread("vllm", name="v0", model="local-model", zero_latency=True) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
    ):
        yield v0, fr


def make_settings(tmp_path: Path, fakes, **adm) -> RouterSettings:
    v0, fr = fakes
    return RouterSettings.load(
        None,
        local={"urls": [v0.url], "model": "local-model"},
        frontier={"url": fr.base_url, "model": "frontier-model", "api_key_env": None, "allow_no_key": True},
        policy={"kind": "always-local", "sticky": True},
        scrape={"interval_s": 0},
        runlog={"dir": str(tmp_path / "logs")},
        admission={**ADM, **adm},
    )


def step(url: str, run_id: str, prio: str | None = None, tenant: str | None = None, **body) -> httpx.Response:
    hdr = {"x-run-id": run_id}
    if prio:
        hdr["x-run-priority"] = prio
    if tenant:
        hdr["x-tenant"] = tenant
    payload = {"model": "auto", "messages": [{"role": "user", "content": f"hi {run_id}"}], "max_tokens": 4}
    payload.update(body)
    return httpx.post(url + "/v1/chat/completions", json=payload, headers=hdr, timeout=10)


def end(url: str, run_id: str) -> None:
    assert httpx.post(f"{url}/v1/runs/{run_id}/end", json={"outcome": "success"}).status_code == 200


def test_settings_derive_conservative_defaults_and_env_overrides(monkeypatch):
    s = RouterSettings.load(None, local={"urls": ["http://127.0.0.1:1"]}, policy={"kind": "always-local"})
    assert s.admission.enabled  # on by default
    cfg = s.admission.controller_config(s.local)
    # 0.02 + 512 x 1e-4 + 64 x 0.01; 32 slots / 0.01 s per token; 1e-4 x 32 / 0.01 (amortised GPU time)
    assert cfg.short_step_s == pytest.approx(0.7112)
    assert cfg.tokens_per_s == pytest.approx(3200)
    assert cfg.work_prefill_weight == pytest.approx(0.32)
    # the controller config is the settings' own knobs (one definition), with the tier's terms filled in
    assert cfg.slo_short_step_s == s.admission.slo_short_step_s and cfg.prefill_s_per_token == 1e-4
    monkeypatch.setenv("RUNROUTE_ADMISSION__ENABLED", "false")
    monkeypatch.setenv("RUNROUTE_ADMISSION__SLO_SHORT_STEP_S", "1.5")
    s2 = RouterSettings.load(None, local={"urls": ["http://127.0.0.1:1"]}, policy={"kind": "always-local"})
    assert not s2.admission.enabled and s2.admission.slo_short_step_s == 1.5


def test_batch_sheds_before_interactive_with_retry_after_and_hysteresis(tmp_path, fakes):
    app = create_app(make_settings(tmp_path, fakes, spill=False))
    with serve_in_thread(app) as url:
        for i in range(6):
            r = step(url, f"i{i}", "interactive")
            assert r.status_code == 200 and r.headers["x-runroute-admission"] == "admit-local"
        # 6 active: a batch run would be the 7th (> 6): rejected; an interactive one still fits
        rb = step(url, "b0", "batch")
        assert rb.status_code == 429
        err = rb.json()["error"]
        assert err["code"] == "run_rejected_overload" and err["type"] == "rate_limit_error"
        ra = int(rb.headers["retry-after"])
        assert 1 <= ra <= 120
        assert rb.headers["x-runroute-reason"].startswith("admission-reject-")
        assert step(url, "unknown", "urgent").status_code == 429  # unknown classes shed like batch
        assert step(url, "i6", "interactive").status_code == 200  # 7th interactive: admitted
        ri = step(url, "i7", "interactive")  # 8th: rejected too
        assert ri.status_code == 429 and ri.json()["error"]["code"] == "run_rejected_overload"
        # steps of admitted runs are never refused, however loaded
        for _ in range(3):
            r = step(url, "i0", "interactive")
            assert r.status_code == 200 and "x-runroute-admission" not in r.headers
        # hysteresis: 7 -> 5 active is below the entry threshold but not below the exit one
        end(url, "i0")
        end(url, "i1")
        assert step(url, "b1", "batch").status_code == 429
        end(url, "i2")  # 4 active: batch resumes
        rb2 = step(url, "b0", "batch")  # the rejected run retries: again a first step, now admitted
        assert rb2.status_code == 200 and rb2.headers["x-runroute-step"] == "0"
        cap = httpx.get(url + "/v1/capacity").json()
        assert cap["local"]["active_runs"] == 5
        assert cap["admission"]["verdicts"]["reject"] == 4
        assert cap["local"]["admissible_runs"] == {"interactive": 7, "batch": 6}
        metrics = httpx.get(url + "/metrics").text
        assert (
            'runroute_admission_total{priority="batch",reason="reject-predicted-slo-breach",verdict="reject"}'
            in metrics
        )


def test_spilled_run_is_pinned_to_the_frontier_and_tenant_budget_rejects(tmp_path, fakes):
    app = create_app(make_settings(tmp_path, fakes, tenant_spill_limits={"free": 0}))
    with serve_in_thread(app) as url:
        for i in range(7):
            assert step(url, f"a{i}").status_code == 200
        first = step(url, "sp")
        assert first.status_code == 200 and first.headers["x-runroute-admission"] == "spill"
        assert first.headers["x-runroute-tier"] == "frontier"
        assert first.headers["x-runroute-reason"] == "admission-spill-predicted-slo-breach"
        for i in range(7):  # load falls away: the spilled run still stays on the frontier
            end(url, f"a{i}")
        for _ in range(2):
            r = step(url, "sp")
            assert (
                r.headers["x-runroute-tier"] == "frontier"
                and r.headers["x-runroute-reason"] == "admission-spilled"
            )
        run = httpx.get(url + "/v1/runs/sp").json()
        assert run["admission"]["verdict"] == "spill" and run["tiers"] == ["frontier"]
        assert [s["reason"] for s in run["steps"]][0] == "admission-spill-predicted-slo-breach"
        # a tenant without frontier budget is rejected instead (header or metadata.tenant)
        for i in range(7):
            assert step(url, f"c{i}").status_code == 200
        assert step(url, "f0", tenant="free").status_code == 429
        r = step(url, "f1", metadata={"tenant": "free"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "run_rejected_overload"
        assert step(url, "p0", tenant="paid").headers["x-runroute-admission"] == "spill"
        # a client that names the local model is never moved: rejected rather than spilled
        assert step(url, "named", model="local-model").status_code == 429


def test_idle_runs_release_their_slot(tmp_path, fakes):
    s = make_settings(tmp_path, fakes, sweep_s=0.1, idle_release_s=0.3)
    s.store.ttl_s = 0.3
    app = create_app(s)
    with serve_in_thread(app) as url:
        assert step(url, "idle").status_code == 200
        assert httpx.get(url + "/v1/capacity").json()["local"]["active_runs"] == 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            cap = httpx.get(url + "/v1/capacity").json()
            if cap["local"]["active_runs"] == 0:
                break
            time.sleep(0.1)
        assert cap["local"]["active_runs"] == 0 and cap["admission"]["released_idle"] == 1
        # the expired run comes back: a new first step, admitted again
        assert step(url, "idle").headers["x-runroute-admission"] == "admit-local"


def test_capacity_recommends_more_replicas_as_arrivals_rise_and_fewer_as_they_fall(tmp_path, fakes):
    app = create_app(
        make_settings(
            tmp_path, fakes, forecast_bucket_s=0.5, forecast_alpha=0.6, default_run_s=10.0, spill=True
        )
    )

    def arrivals(rate: float, seconds: float, tag: str) -> None:
        t_end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < t_end:
            step(url, f"{tag}{i}")
            i += 1
            time.sleep(max(0.0, 1.0 / rate - 0.005))

    with serve_in_thread(app) as url:
        arrivals(2.0, 2.0, "lo")
        low = httpx.get(url + "/v1/capacity").json()["forecast"][0]
        arrivals(12.0, 2.0, "hi")
        high = httpx.get(url + "/v1/capacity").json()
        time.sleep(2.5)  # nobody arrives
        quiet = httpx.get(url + "/v1/capacity").json()["forecast"][0]
        metrics = httpx.get(url + "/metrics").text
    hf = high["forecast"][0]
    assert hf["runs_per_s"] > 2 * low["runs_per_s"] > 0
    assert hf["recommended_replicas"] > low["recommended_replicas"] > quiet["recommended_replicas"] - 1
    assert (
        quiet["recommended_replicas"] < hf["recommended_replicas"] and quiet["runs_per_s"] < low["runs_per_s"]
    )
    assert [f["horizon_s"] for f in high["forecast"]] == [300.0, 900.0, 3600.0]
    assert hf["expected_spill_share"] > 0 and hf["expected_reject_share"] == 0  # frontier healthy, spill on
    rep = high["replicas"][0]
    assert rep["name"] == "local-0" and rep["utilisation"] >= 0 and rep["inflight_steps"] == 0
    assert 'runroute_capacity_recommended_replicas{horizon_s="300"}' in metrics
    assert 'runroute_capacity_expected_spill_share{horizon_s="900"}' in metrics
    assert 'runroute_replica_utilisation{backend="local-0"}' in metrics


def test_load_model_rates_inflight_work_and_remaining_time():
    from models.types import Predictions
    from router.core.capacity import ArrivalForecaster
    from router.core.traffic import TrafficModel as LoadModel

    now = [0.0]
    lm = LoadModel(
        ["r0"],
        tau_s=10.0,
        prefill_weight=0.01,
        min_rate_steps=5,
        clock=lambda: now[0],
        wall=lambda: now[0],
        forecaster=ArrivalForecaster(bucket_s=1.0, alpha=0.5, min_history_s=1e9),
    )
    for rid in ("a", "b"):
        lm.admitted(rid, "interactive", None)
    assert lm.run_token_rate() is None  # not enough history
    p = Predictions(p_frontier=0.0, remaining_steps_p50=4.0, remaining_tokens_p50=800.0)
    for _ in range(30):  # each run: a 100-token step (+1000 uncached prompt tokens) every 2 s
        for rid in ("a", "b"):
            tok = lm.step_started("r0", rid, 1500, 500, p)
            assert tok.prefill == 1000
            lm.step_finished(tok, "r0", 1500, 500, 100, True)
        now[0] += 2.0
    # work per step 100 + 0.01 x 1000 = 110 tokens every 2 s = 55 tokens/s per run
    assert lm.run_token_rate() == pytest.approx(55.0, rel=0.1)
    assert lm.replica_work_rate("r0") == pytest.approx(110.0, rel=0.1)
    assert lm.step_cycle_s == pytest.approx(2.0)
    assert lm.mean_remaining_run_s() == pytest.approx(8.0)
    assert lm.predicted_remaining_tokens() == pytest.approx(1600.0)
    tok = lm.step_started("r0", "a", 1500, 0, p)
    assert lm.replicas["r0"].inflight_steps == 1 and lm.replicas["r0"].decode_tokens == pytest.approx(100.0)
    lm.step_finished(tok, "r0", 1500, 0, 100, False)
    lm.step_finished(tok, "r0", 1500, 0, 100, False)  # idempotent
    assert lm.replicas["r0"].inflight_steps == 0 and lm.replicas["r0"].prefill_tokens == 0
    assert lm.release("a") and not lm.release("a")


def _bench():
    spec = importlib.util.spec_from_file_location("admission_load", ROOT / "bench" / "admission_load.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["admission_load"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_overload_keeps_admitted_runs_within_slo_and_sheds_new_runs():
    """bench/admission_load.py, smaller: 1 replica x 2 slots, arrivals 1x then 3x capacity."""
    b = _bench()
    spec = b.LoadSpec(
        seed=3,
        replicas=1,
        concurrency=2,
        base_ms=10.0,
        decode_ms_per_token=10.0,
        out_tokens=16,
        prompt_words=100,
        steps=(3, 4),
        pause_s=(0.2, 0.5),
        phase_s=3.0,
        multipliers=(1.0, 3.0),
        slo_short_step_s=0.5,
        frontier_ttft_ms=50.0,
        drain_s=20.0,
        scrape_s=0.25,
    )
    on = b.summarise(b.run_load(spec, admission=True))
    failed = [name for name, ok in b.checks(on) if not ok]
    assert not failed, (failed, on)
    assert on["admitted"] > 0 and on["spilled"] > 0 and on["rejected"] > 0
    off = b.summarise(b.run_load(spec, admission=False))
    assert off["admitted"] == off["runs"] == on["runs"]  # same seed, same arrivals; all admitted
    assert off["p95"] > spec.slo_short_step_s  # without admission the overload breaks the SLO
    assert off["p95"] > on["p95"]


def _sim(spill: bool):
    from features.runlog import records_to_frame
    from features.schema import Run, Step
    from router.policy.admission import AdmissionConfig, AdmissionController
    from router.policy.baselines import AlwaysLocalPolicy
    from router.sim.frontier import FrontierConfig
    from router.sim.profiles import NodeProfile
    from router.sim.whatif import SimConfig, Simulator, Workload, scorecard

    prof = NodeProfile(
        name="t", a=0.01, b=1e-4, c=1e-8, d=1e-6, e=0.002, kv_bytes_per_token=1000, token_budget=8192
    )
    recs: list = []
    for i in range(60):
        recs.append(Run(run_id=f"r{i:03d}", source="t", started_at=i * 0.05))
        for k in range(4):
            recs.append(
                Step(
                    run_id=f"r{i:03d}",
                    step=k,
                    prompt_tokens=2000 + 300 * k,
                    completion_tokens=48,
                    tool_pause_s=0.5 if k else None,
                )
            )
    df = records_to_frame(recs)
    w = Workload.from_frames(df[df.record == "step"], df[df.record == "run"])
    starts = np.arange(60) * 0.05  # 20 new runs/s on one replica: overload
    cfg = SimConfig(
        profile=prof,
        replicas=1,
        kv_cache_gb=1.0,
        frontier=FrontierConfig(ttft_sigma=0.0, tokens_per_s_sigma=0.0),
    )
    acfg = AdmissionConfig(
        slo_short_step_s=2.0,  # idle short step ~0.82 s: interactive admits up to 5 runs at 1000 tok/s each
        base_short_step_s=64 * (prof.a + prof.e) + 512 * prof.b,
        replica_tokens_per_s=1.0 / prof.b,
        default_run_token_rate=1000.0,
        spill=spill,
    )
    ctl = AdmissionController(acfg)  # the sidecar's controller class, unchanged
    res = Simulator(w, AlwaysLocalPolicy(), cfg, starts, admission=ctl).run()
    return res, scorecard(res)


def test_simulator_runs_the_same_admission_controller_and_sheds_under_overload():
    res, card = _sim(spill=True)
    assert card["runs_spilled"] > 0 and (res.run_status == 0).sum() > 0
    assert card["runs_rejected"] == 0
    res2, card2 = _sim(spill=False)
    assert card2["runs_rejected"] == card["runs_spilled"] and card2["runs_spilled"] == 0
