"""The what-if's optional model elements, each with a single-request analytic case and a conservation
check: lower KV tiers (CPU, SSD), KV quantisation, speculative decoding, prefill/decode disaggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_helpers import PROF, Fixed, decode_s, prefill_s, simulate

from router.sim.kvtier import KVTier, TierStack
from router.sim.node import Request
from router.sim.profiles import NodeProfile
from router.sim.simconfig import SimConfig, kv_quant_note
from router.sim.specdec import KindRate, SpecDecode, SpecError, eagle, parse_spec, prompt_lookup
from router.sim.whatif import SERVED_LOCAL, SimError, details

B = 512
GPU8 = 8 * B * PROF.kv_bytes_per_token / 1e9  # a GPU KV cache of exactly 8 blocks
# run A: step 0 writes 4 blocks; run B (at t=1) needs 7 and evicts three of them; A's step 1 reuses 4
EVICTING = [
    [(2000, 48, 0.0, None, None), (2600, 20, 10.0, 2048, None)],
    [(3500, 1, 0.0, None, None)],
]


def check_tier_conservation(res) -> None:
    stats = res.tier_stats
    for st in stats:
        assert st["resident_blocks"] == st["stored_blocks"] - st["dropped_blocks"] <= st["capacity_blocks"]
    assert res.gpu_evictions == stats[0]["stored_blocks"] + stats[0]["refreshed_blocks"]
    lower = res.tier_cached.sum(axis=0)
    local = res.outcome == SERVED_LOCAL
    assert np.all(lower[local] + (res.cached[local] - lower[local]) <= res.prompt[local])
    assert np.all(lower[~local] == 0)


# ------------------------------------------------------------------------------ KV tiers


def test_cpu_tier_hit_pays_the_transfer_instead_of_the_prefill() -> None:
    kw = dict(starts=[0.0, 1.0], kv_cache_gb=GPU8)
    base, _ = simulate(EVICTING, Fixed("local-0"), **kw)
    tier, _ = simulate(
        EVICTING, Fixed("local-0"), cpu_kv_gb=0.04, cpu_kv_gbps=1.0, cpu_kv_latency_s=0.01, **kw
    )
    # without the tier only A's head block survived B (tail-first eviction)
    assert base.cached.tolist() == [0, B, 0]
    assert base.latency[1] == pytest.approx(
        prefill_s(PROF, [(2600 - B, B)]) + decode_s(PROF, 2600, 20), abs=1e-9
    )
    # with it the three evicted blocks come back over the link: 1 GPU block + 3 CPU blocks hit
    assert tier.cached[1] == 4 * B and tier.tier_cached[0, 1] == 3 * B
    load = 0.01 + 3 * B * PROF.kv_bytes_per_token / 1e9
    assert tier.latency[1] == pytest.approx(
        prefill_s(PROF, [(2600 - 4 * B, 4 * B)]) + load + decode_s(PROF, 2600, 20), abs=1e-9
    )
    assert tier.latency[1] < base.latency[1]
    check_tier_conservation(tier)
    d = details(tier)
    assert d["cache_hit_rate_gpu"] == pytest.approx(B / 2600, abs=1e-6)
    assert d["cache_hit_rate_cpu"] == pytest.approx(3 * B / 2600, abs=1e-6)
    assert d["kv_tiers"][0]["hit_blocks"] == 3 and d["kv_tiers"][0]["loads"] == 1


def test_tier_stack_demotes_down_and_loads_contiguously_from_both_tiers() -> None:
    cpu = KVTier("cpu", 2, gbps=2.0, latency_s=0.001, bytes_per_block=1e6)
    ssd = KVTier("ssd", 10, gbps=0.5, latency_s=0.01, bytes_per_block=1e6)
    st = TierStack([cpu, ssd])
    st.demote([3, 2, 1])  # the GPU's eviction order (tail first)
    assert list(cpu.lru) == [2, 1] and list(ssd.lru) == [3]
    got, secs = st.extend([0, 1, 2, 3, 4], 1, 5)  # block 0 hit in GPU; 4 is nowhere
    assert got == [2, 1]
    assert secs == pytest.approx(0.001 + 2 * 1e6 / 2e9 + 0.01 + 1e6 / 0.5e9)
    assert st.extend([9, 1], 0, 2) == ([0, 0], 0.0)  # contiguous: a miss at the start stops the walk
    st.demote([1])  # already in CPU: refreshed, not stored twice
    assert (cpu.stored, cpu.refreshed, cpu.dropped) == (3, 1, 1)
    for t in (cpu, ssd):
        assert len(t.lru) == t.stored - t.dropped <= t.capacity
    st.wipe()
    assert not cpu.lru and not ssd.lru and cpu.dropped == cpu.stored


def test_ssd_needs_cpu_and_tiers_scale_with_the_gpu_kv() -> None:
    with pytest.raises(SimError, match="SSD"):
        SimConfig(profile=PROF, ssd_kv_gb=1.0)
    c = SimConfig(profile=PROF, kv_cache_gb=2.0, cpu_kv_x=4.0)
    assert c.cpu_gb() == 8.0 and c.tiers_on


# ------------------------------------------------------------------------------ KV quantisation


def test_kv_formats_scale_capacity_by_bytes_per_element() -> None:
    p = NodeProfile(name="q", a=0.01, kv_bytes_per_token=2 * 1024)  # 1024 fp16 elements per token
    gb = 1024 * B * 2 * 1024 / 1e9  # exactly 1024 fp16 blocks
    blocks = {
        dt: SimConfig(profile=p, kv_cache_gb=gb, kv_dtype=dt).kv_blocks()
        for dt in ("fp16", "fp8", "int4", "int2")
    }
    assert blocks["fp16"] == 1024 and blocks["fp8"] == 2048
    assert blocks["int4"] == int(1024 * 2 / (0.5 + 4 / 32))  # 4-bit + fp16 scale/zero per 32
    assert blocks["int2"] == int(1024 * 2 / (0.25 + 4 / 32))
    assert kv_quant_note("fp16") is None and "accuracy" in kv_quant_note("int2")  # type: ignore[operator]
    with pytest.raises(SimError, match="kv_dtype"):
        SimConfig(profile=p, kv_dtype="int3")


def test_quantised_kv_fits_what_fp16_cannot_and_read_scaling_halves_d() -> None:
    run = [[(5000, 30, 0.0, None, None)]]
    kv = 6 * B * PROF.kv_bytes_per_token / 1e9  # 6 fp16 blocks < the 10 the prompt needs
    fp16, _ = simulate(run, Fixed("local-0"), kv_cache_gb=kv)
    fp8, _ = simulate(run, Fixed("local-0"), kv_cache_gb=kv, kv_dtype="int2")
    assert np.isnan(fp16.latency[0]) and fp8.outcome.tolist() == [SERVED_LOCAL]
    res, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), kv_dtype="fp8", kv_read_scales=True)
    half = NodeProfile(name="h", a=PROF.a, b=PROF.b, c=PROF.c, d=PROF.d / 2, e=PROF.e)
    assert res.latency[0] == pytest.approx(prefill_s(half, [(3000, 0)]) + decode_s(half, 3000, 50), abs=1e-9)


# ------------------------------------------------------------------------------ speculative decoding


def spec_decode_s(p: NodeProfile, prompt: int, n_out: int, e: float, v: float, draft: float) -> float:
    m = math.ceil((n_out - 1) / e)
    return sum(p.a + p.e + p.d * (prompt + 1 + j * e) + p.b * v + draft for j in range(m))


def test_eagle_decode_time_and_token_conservation() -> None:
    spec = eagle(alpha=0.5, k=3, draft_cost_ratio=0.1)
    e = (1 - 0.5**4) / 0.5
    assert (
        spec.free_text.tokens_per_iteration == pytest.approx(e) and spec.free_text.proposed_per_iteration == 3
    )
    for ff in (True, False):
        res, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), spec=spec, fast_forward=ff)
        want = prefill_s(PROF, [(3000, 0)]) + spec_decode_s(PROF, 3000, 50, e, 3.0, 3 * 0.1 * PROF.a)
        assert res.latency[0] == pytest.approx(want, abs=1e-9)
    off, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"))
    assert res.latency[0] < off.latency[0]
    req = Request("k", 3000, 50, (), 0, 0.0, B)
    spec.apply(req, tool_call=False)
    m = req.it_target - 1
    assert 1 + m * e >= 50 > 1 + (m - 1) * e  # the iterations emit every output token, no fewer


def test_draft_model_prices_each_proposed_token_of_each_decoding_request() -> None:
    """draft-model: the drafting time of an iteration is ms x the proposed tokens of its batch."""
    spec = parse_spec("draft-model:alpha=0.5,k=3,ms=2")
    assert (
        spec is not None and spec.method == "draft-model" and spec.draft_s_per_token == pytest.approx(0.002)
    )
    assert spec.draft_s(PROF) == 0.0
    e = (1 - 0.5**4) / 0.5
    for ff in (True, False):
        res, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), spec=spec, fast_forward=ff)
        want = prefill_s(PROF, [(3000, 0)]) + spec_decode_s(PROF, 3000, 50, e, 3.0, 3 * 0.002)
        assert res.latency[0] == pytest.approx(want, abs=1e-9)
    # two decoding requests: twice the proposed tokens, twice the drafting time per iteration
    one = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), spec=spec)[0].latency[0]
    two = simulate([[(3000, 50, 0.0, None, None)]] * 2, Fixed("local-0"), spec=spec)[0].latency
    free = parse_spec("draft-model:alpha=0.5,k=3,ms=0")
    one0 = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), spec=free)[0].latency[0]
    two0 = simulate([[(3000, 50, 0.0, None, None)]] * 2, Fixed("local-0"), spec=free)[0].latency
    assert two[0] - two0[0] == pytest.approx(2 * (one - one0), rel=1e-9)
    with pytest.raises(SpecError, match="ms"):
        parse_spec("draft-model:alpha=0.5")


def test_prompt_lookup_rates_are_per_step_kind_and_measured() -> None:
    pl = prompt_lookup()
    assert pl.method == "prompt-lookup" and pl.source.startswith("measured")
    assert pl.tool_call.tokens_per_iteration > 1.0 and pl.free_text.tokens_per_iteration >= 1.0
    spec = SpecDecode("t", 4, KindRate(3.0, 2.0), KindRate(1.5, 1.0))
    tool, text = Request("a", 100, 31, (), 0, 0.0, B), Request("b", 100, 31, (), 0, 0.0, B)
    spec.apply(tool, tool_call=True)
    spec.apply(text, tool_call=False)
    assert (tool.it_target, text.it_target) == (11, 21)  # 1 + 30/3, 1 + 30/1.5
    assert parse_spec("none") is None and parse_spec("eagle:alpha=0.6,k=2").num_speculative_tokens == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="prompt-lookup"):
        parse_spec("prompt-lookup:min=9,max=9,k=9")


# ------------------------------------------------------------------------------ disaggregation


def test_disaggregated_request_prefills_transfers_then_decodes() -> None:
    res, _ = simulate(
        [[(3000, 50, 0.0, None, None)]],
        Fixed("local-0"),
        replicas=2,
        disagg_prefill=1,
        kv_link_gbps=2.0,
        kv_link_latency_s=0.003,
    )
    ttft = prefill_s(PROF, [(3000, 0)])
    xfer = 0.003 + 3000 * PROF.kv_bytes_per_token / 2e9
    assert res.ttft[0] == pytest.approx(ttft, abs=1e-9)
    assert res.latency[0] == pytest.approx(ttft + xfer + decode_s(PROF, 3000, 50), abs=1e-9)
    st = res.disagg_stats
    assert (st["prefilled"], st["kv_transfers"], st["decoded"]) == (1, 1, 1)
    assert st["kv_transfer_s"] == pytest.approx(xfer)
    assert res.gpu_hours == pytest.approx(2 * res.makespan_s / 3600)


def test_tensor_parallel_pools_scale_the_profile_terms_the_gpus_and_the_kv() -> None:
    """tp_prefill/tp_decode: each pool's time terms / (t x efficiency), t GPUs and t x the KV each."""
    from router.sim.disagg import tp_profile

    eff = 0.8
    res, _ = simulate(
        [[(3000, 50, 0.0, None, None)]],
        Fixed("local-0"),
        replicas=2,
        disagg_prefill=1,
        kv_link_gbps=2.0,
        kv_link_latency_s=0.003,
        tp=2,
        tp_decode=4,
        tp_efficiency=eff,
    )
    p2, p4 = tp_profile(PROF, 2, eff), tp_profile(PROF, 4, eff)
    assert p2.b == pytest.approx(PROF.b / 1.6) and p4.d == pytest.approx(PROF.d / 3.2)
    assert (p2.gpus_per_replica, p4.gpus_per_replica) == (2, 4) and tp_profile(PROF, 1, eff) is PROF
    ttft = prefill_s(p2, [(3000, 0)])
    xfer = 0.003 + 3000 * PROF.kv_bytes_per_token / 2e9
    assert res.ttft[0] == pytest.approx(ttft, abs=1e-9)
    assert res.latency[0] == pytest.approx(ttft + xfer + decode_s(p4, 3000, 50), abs=1e-9)
    assert res.gpu_hours == pytest.approx((2 + 4) * res.makespan_s / 3600)
    co, _ = simulate([[(3000, 50, 0.0, None, None)]], Fixed("local-0"), tp=2, tp_efficiency=eff)
    assert co.latency[0] == pytest.approx(prefill_s(p2, [(3000, 0)]) + decode_s(p2, 3000, 50), abs=1e-9)
    from router.sim.disagg import build_replicas
    from router.sim.engine import EventLoop

    cfg = SimConfig(profile=PROF, replicas=2, disagg_prefill=1, tp=2, tp_decode=4, kv_cache_gb=1.0)
    _, reps, _ = build_replicas(cfg, EventLoop(start=0.0, seed=0), lambda r: None)
    assert [r.capacity for r in reps] == [2 * cfg.kv_blocks(), 4 * cfg.kv_blocks()]
    with pytest.raises(SimError, match="tp"):
        SimConfig(profile=PROF, tp=0)


def test_disaggregation_conserves_requests_and_bytes_and_shares_the_link() -> None:
    runs = [
        [(1500 + 100 * i, 1 + (i % 3) * 20, 0.0, None, None), (2000, 10, 1.0, None, None)] for i in range(12)
    ]
    res, w = simulate(
        runs,
        Fixed("local-0"),
        starts=[0.01 * i for i in range(12)],
        replicas=3,
        disagg_prefill=1,
        kv_link_gbps=0.5,
    )
    st = res.disagg_stats
    n_local = int((res.outcome == SERVED_LOCAL).sum())
    assert n_local == 24 and st["prefilled"] == st["decoded"] == n_local
    multi = [s for r in w.runs for s in r.steps if s.completion > 1]
    assert st["kv_transfers"] == len(multi)
    assert st["kv_transfer_gb"] == pytest.approx(sum(s.prompt for s in multi) * PROF.kv_bytes_per_token / 1e9)
    assert st["kv_link_wait_s"] > 0  # one prefill replica's link is shared first-come-first-served
    assert np.all(res.latency >= res.ttft)
    with pytest.raises(SimError, match="decode replica"):
        SimConfig(profile=PROF, replicas=2, disagg_prefill=2)


def test_all_elements_together_serve_every_step_once_and_conserve() -> None:
    runs = [[(800 + 300 * k + 40 * i, 5 + 7 * k, 0.5 * k, None, None) for k in range(4)] for i in range(15)]
    res, _ = simulate(
        runs,
        Fixed("local-0"),
        starts=[0.2 * i for i in range(15)],
        kv_cache_gb=GPU8 * 2,
        cpu_kv_gb=0.01,
        ssd_kv_gb=0.05,
        kv_dtype="fp8",
        spec=eagle(0.6, 4),
    )
    assert (res.outcome == SERVED_LOCAL).all()
    check_tier_conservation(res)
    assert all(t["hit_blocks"] > 0 for t in res.tier_stats)  # both the CPU and the SSD tier served hits


def test_global_cpu_pool_is_one_tier_shared_by_the_replicas() -> None:
    """cpu_kv_global: one CPU tier of the summed size; a block replica 0 demoted extends replica 1's hit."""
    from router.sim.disagg import build_replicas
    from router.sim.engine import EventLoop

    base = SimConfig(profile=PROF, replicas=2, kv_cache_gb=1.0, cpu_kv_x=2.0)
    glob = SimConfig(profile=PROF, replicas=2, kv_cache_gb=1.0, cpu_kv_x=2.0, cpu_kv_global=True)
    _, own, _ = build_replicas(base, EventLoop(start=0.0, seed=0), lambda r: None)
    _, pool, _ = build_replicas(glob, EventLoop(start=0.0, seed=0), lambda r: None)
    assert own[0].tiers.tiers[0] is not own[1].tiers.tiers[0]
    assert pool[0].tiers.tiers[0] is pool[1].tiers.tiers[0]
    assert pool[0].tiers.tiers[0].capacity == 2 * own[0].tiers.tiers[0].capacity
    for reps in (own, pool):
        reps[0].tiers.demote([11, 12, 13])
    assert own[1].tiers.extend([11, 12, 13, 14], 0, 4)[0] == [0]
    got, secs = pool[1].tiers.extend([11, 12, 13, 14], 0, 4)
    assert got == [3] and secs == pytest.approx(pool[1].tiers.tiers[0].transfer_s(3))
    with pytest.raises(SimError, match="global"):
        SimConfig(profile=PROF, cpu_kv_x=1.0, ssd_kv_x=1.0, cpu_kv_global=True)
