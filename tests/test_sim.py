"""What-if simulator: exact analytic cases, prefix cache/LRU, scale-to-zero, workload."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import FRONT, PROF, Fixed, decode_s, frame, prefill_s, simulate

from router.policy.defaults import GPU_HOUR_USD
from router.policy.types import Decision, Snapshot
from router.sim.engine import EventLoop
from router.sim.frontier import FrontierConfig
from router.sim.node import Replica, Request
from router.sim.profiles import NodeProfile
from router.sim.whatif import REJECTED, SERVED_FRONTIER, SERVED_LOCAL, SimError, Workload, scorecard

# ------------------------------------------------------------------------------ analytic cases


def test_one_step_local_matches_cost_model_to_the_millisecond():
    res, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"))
    ttft = prefill_s(PROF, [(3000, 0)])
    lat = ttft + decode_s(PROF, 3000, 50)
    assert res.outcome.tolist() == [SERVED_LOCAL]
    assert abs(res.ttft[0] - ttft) < 1e-3 and abs(res.latency[0] - lat) < 1e-3
    assert res.ttft[0] == pytest.approx(ttft, abs=1e-9)
    assert res.latency[0] == pytest.approx(lat, abs=1e-9)
    assert res.run_completion_s[0] == pytest.approx(lat, abs=1e-9)


def test_chunked_prefill_prices_each_chunk_with_its_context():
    prof = NodeProfile(
        name="t", a=0.01, b=1e-4, c=1e-8, d=1e-6, e=0.002, kv_bytes_per_token=1000, token_budget=1024
    )
    res, _ = simulate([[(2500, 1, 0.0, None, None)]], Fixed("local-0"), profile=prof)
    want = sum(prefill_s(prof, [(ln, s)]) for ln, s in [(1024, 0), (1024, 1024), (452, 2048)])
    assert res.latency[0] == pytest.approx(want, abs=1e-9)
    assert res.ttft[0] == res.latency[0]


def test_second_step_hits_the_run_prefix_and_waits_the_tool_pause():
    res, _ = simulate([[(2000, 100, 0.0, None, None), (2600, 20, 3.0, 2100, None)]], Fixed("local-0"))
    lat0 = prefill_s(PROF, [(2000, 0)]) + decode_s(PROF, 2000, 100)
    cached = (2100 // 512) * 512  # the previous prompt + output's full blocks
    lat1 = prefill_s(PROF, [(2600 - cached, cached)]) + decode_s(PROF, 2600, 20)
    assert res.cached.tolist() == [0, cached]
    assert res.latency[1] == pytest.approx(lat1, abs=1e-9)
    assert res.run_completion_s[0] == pytest.approx(lat0 + 3.0 + lat1, abs=1e-9)
    card = scorecard(res)
    assert card["cache_hit_rate"] == pytest.approx(cached / 2600, abs=1e-6)
    assert card["cache_hit_upper_bound"] == pytest.approx(2100 / 2600, abs=1e-6)


def test_two_simultaneous_requests_share_iterations():
    res, _ = simulate([[(1000, 10, 0.0, None, None)], [(1000, 10, 0.0, None, None)]], Fixed("local-0"))
    t1 = PROF.a + PROF.b * 2000 + PROF.c * 2 * 1000 * 1000 + PROF.e * 2
    dec = sum(PROF.a + PROF.d * 2 * (1001 + j) + PROF.e * 2 for j in range(9))
    assert res.latency.tolist() == pytest.approx([t1 + dec] * 2, abs=1e-9)


def test_arrival_during_decode_joins_at_the_next_iteration_boundary():
    # run 1 arrives mid-way through run 0's decode: run 0's tokens before the boundary are solo
    p0, c0 = 500, 200
    res_solo, _ = simulate([[(p0, c0, 0.0, None, None)]], Fixed("local-0"))
    res, _ = simulate(
        [[(p0, c0, 0.0, None, None)], [(300, 5, 0.0, None, None)]], Fixed("local-0"), starts=[0.0, 0.5]
    )
    ref, _ = simulate(
        [[(p0, c0, 0.0, None, None)], [(300, 5, 0.0, None, None)]],
        Fixed("local-0"),
        starts=[0.0, 0.5],
        fast_forward=False,
    )
    assert res.latency[0] > res_solo.latency[0]  # contention slowed run 0 down
    assert res.latency.tolist() == pytest.approx(ref.latency.tolist(), abs=1e-9)
    assert res.ttft.tolist() == pytest.approx(ref.ttft.tolist(), abs=1e-9)


def test_frontier_step_latency_and_provider_cache_cost():
    res, _ = simulate([[(2000, 100, 0.0, None, None), (2600, 20, 1.0, 2100, None)]], Fixed("frontier"))
    assert res.outcome.tolist() == [SERVED_FRONTIER, SERVED_FRONTIER]
    assert res.latency[0] == pytest.approx(0.5 + 1e-5 * 2000 + 99 / 50, abs=1e-9)
    cached = 2048  # 4 leading blocks equal to the previous frontier call's prompt + output
    assert res.cached.tolist() == [0, cached]
    assert res.latency[1] == pytest.approx(0.5 + 1e-5 * (2600 - cached) + 19 / 50, abs=1e-9)
    f = FRONT
    cost = (
        2000 * f.price_in_per_m
        + 100 * f.price_out_per_m
        + (2600 - cached) * f.price_in_per_m
        + cached * f.price_cached_in_per_m
        + 20 * f.price_out_per_m
    ) / 1e6
    assert res.frontier_cost_usd == pytest.approx(cost, rel=1e-12)
    gpu = res.makespan_s / 3600 * GPU_HOUR_USD  # one always-on replica at the deployment default
    assert scorecard(res)["cost_usd"] == pytest.approx(cost + gpu, abs=1e-6)


def test_frontier_rate_limit_delays_requests_over_the_limit():
    fr = FrontierConfig(ttft_sigma=0.0, tokens_per_s_sigma=0.0, rpm_limit=60.0)
    many = [[(100, 1, 0.0, None, None)] for _ in range(70)]
    res, _ = simulate(many, Fixed("frontier"), frontier=fr)
    lat = np.sort(res.latency)
    assert lat[59] == pytest.approx(lat[0])  # a minute's burst passes at once
    assert lat[-1] > lat[0] + 9.0  # the 70th waits ~10 s for the bucket


def test_scale_to_zero_cold_start_reaper_and_billing():
    runs = [[(1000, 10, 0.0, None, None)], [(1000, 10, 0.0, None, None)]]
    res, _ = simulate(
        runs,
        Fixed("local-0"),
        starts=[0.0, 1000.0],
        scale_to_zero=True,
        wake_s=(270.0, 270.0),
        idle_reap_s=100.0,
    )
    service = prefill_s(PROF, [(1000, 0)]) + decode_s(PROF, 1000, 10)
    assert res.latency.tolist() == pytest.approx([270 + service] * 2, abs=1e-9)
    assert res.cold_starts == 2
    billed = (270 + service + 100) + (270 + service)
    assert res.gpu_hours == pytest.approx(billed / 3600, abs=1e-9)
    always, _ = simulate(runs, Fixed("local-0"), starts=[0.0, 1000.0])
    assert always.cold_starts == 0 and always.latency[0] == pytest.approx(service)
    assert always.gpu_hours == pytest.approx(always.makespan_s / 3600)


# ------------------------------------------------------------------------------ prefix cache


def test_lru_evicts_unreferenced_tail_blocks_first_and_keeps_hits():
    loop = EventLoop()
    done: list[Request] = []
    rep = Replica(
        "r", NodeProfile(name="t", a=1.0), loop, kv_capacity_blocks=6, block_tokens=4, on_done=done.append
    )

    def go(key, prompt, chain):
        req = Request(key, prompt, 1, chain, min(prompt // 4, len(chain)), loop.now, 4)
        assert rep.submit(req)
        loop.run()
        return req

    go("A", 12, (1, 2, 3))  # 3 hashed + 1 private block
    go("B", 8, (7, 8))
    assert set(rep.cache) == {1, 2, 3, 7, 8} and rep.used == 5
    c = go("C", 12, (1, 2, 9))  # hits 1, 2; needs 9 + 1 private: evicts block 3 (A's tail) only
    assert c.cached == 8
    assert set(rep.cache) == {1, 2, 7, 8, 9}
    assert [r.key for r in done] == ["A", "B", "C"]
    assert rep.lookup((1, 2, 9), 3) == 3 and rep.lookup((1, 2, 3), 3) == 2 and rep.lookup((3,), 1) == 0


def test_prompt_larger_than_kv_is_rejected_with_the_rest_of_its_run():
    runs = [[(100, 5, 0.0, None, None), (600_000, 5, 1.0, None, None), (700_000, 5, 1.0, None, None)]]
    res, _ = simulate(runs, Fixed("local-0"), kv_cache_gb=0.5)  # 500k tokens
    assert res.outcome.tolist() == [SERVED_LOCAL, REJECTED, REJECTED]
    card = scorecard(res)
    assert card["runs_rejected"] == 1 and card["runs_completed"] == 0


def test_policy_naming_a_missing_backend_is_an_error():
    with pytest.raises(SimError, match="does not exist"):
        simulate([[(100, 5, 0.0, None, None)]], _Ghost())


class _Ghost:
    name = "ghost"

    def decide(self, snap: Snapshot) -> Decision:
        return Decision(tier="local", backend="local-9", model="m", reason="x")


# ------------------------------------------------------------------------------ workload


def test_workload_chains_hash_ids_and_derived_prefixes():
    steps, runs = frame(
        [
            [(1100, 10, 0.0, None, [5, 6, 7]), (1600, 10, 1.0, None, [5, 6, 8, 9])],
            [(1000, 100, 0.0, None, None), (1700, 10, 1.0, None, None)],
        ]
    )
    w = Workload.from_frames(steps, runs)
    a, b = w.runs
    assert a.steps[0].chain == (5, 6, 7) and a.steps[0].n_lookup == 2
    assert a.steps[1].upper == 1024  # blocks 5, 6 repeat the run's earlier prefix
    assert b.steps[0].chain[:2] == b.steps[1].chain[:2]  # 1100 // 512 = 2 shared blocks
    assert b.steps[1].chain[2] not in b.steps[0].chain
    assert all(x < 0 for x in b.steps[0].chain)  # run-private ids never collide with logged hashes
    assert b.steps[1].upper == 1100
    assert b.steps[1].pause == 1.0
    assert not b.steps[0].short and b.steps[1].short  # short = <= 64 output tokens (or a tool call)


def test_empty_runlog_is_a_clear_error():
    steps, runs = frame([[(10, 1, 0.0, None, None)]])
    with pytest.raises(SimError, match="no step records"):
        Workload.from_frames(steps.iloc[:0], runs)


def test_incremental_prefill_queue_equals_its_definition_at_every_step(monkeypatch):
    """Replica.owed (kept incrementally, what the policy sees) equals prefill_owed (the O(queue) sum)
    every time a backend state is built, on an overloaded generated workload (long queues, chunks)."""
    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim import simulator as simmod
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator

    seen = []
    orig, orig_refresh = simmod.Simulator._local_state, simmod.Simulator._refresh

    def checked(self, rep, t):
        assert rep.owed == simmod.prefill_owed(rep)
        seen.append(rep.owed)
        return orig(self, rep, t)

    def checked_refresh(self, st, rep, t):  # a cached state brought up to date in place
        orig_refresh(self, st, rep, t)
        assert st.prefill_queue_tokens == rep.owed == simmod.prefill_owed(rep)
        seen.append(rep.owed)

    monkeypatch.setattr(simmod.Simulator, "_local_state", checked)
    monkeypatch.setattr(simmod.Simulator, "_refresh", checked_refresh)
    w = Workload.from_runlog(RunLog.from_frame(generate(150, seed=3)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=16.0)
    Simulator(w, build_policy("session-sticky"), cfg, st).run()
    assert len(seen) > 100 and max(seen) > 0


def test_gc_threshold_is_raised_while_the_loop_runs_and_restored_after_even_on_error():
    import gc

    from router.sim.simulator import GC_GEN0

    seen: list[int] = []

    class _Watch(Fixed):
        def decide(self, snap: Snapshot) -> Decision:
            seen.append(gc.get_threshold()[0])
            return super().decide(snap)

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, before[1], before[2])
        simulate([[(100, 5, 0.0, None, None), (120, 5, 1.0, None, None)]], _Watch("local-0"))
        assert seen and all(t == GC_GEN0 for t in seen)
        assert gc.get_threshold() == (700, before[1], before[2])
        with pytest.raises(SimError, match="does not exist"):
            simulate([[(100, 5, 0.0, None, None)]], _Ghost())
        assert gc.get_threshold() == (700, before[1], before[2])
        gc.set_threshold(GC_GEN0 * 2, before[1], before[2])  # a caller's higher threshold is kept
        seen.clear()
        simulate([[(100, 5, 0.0, None, None)]], _Watch("local-0"))
        assert seen == [GC_GEN0 * 2]
    finally:
        gc.set_threshold(*before)
