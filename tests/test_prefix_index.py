"""The prefix index (router.core.prefix_index) and the prefix-cost placement (router.policy.filters)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from models.types import Predictions
from router.core.prefix_index import PrefixIndex, ReplicaIndex, RunChain, TextChainer
from router.policy.baselines import AlwaysLocalPolicy, PrefixAwarePolicy
from router.policy.config import build_policy
from router.policy.filters import ScoreWeights, prefix_cost_pick
from router.policy.types import BackendState, RunState, Snapshot


def test_shared_prefix_matches_across_runs_and_replicas_are_walls() -> None:
    idx = PrefixIndex(16, [("a", 100), ("b", 100)])
    system = [11, 12, 13]
    idx.record("a", [*system, 21, 22])  # run 1 on replica a
    assert idx.match("a", [*system, 31, 32], 5) == 3  # run 2 shares the system prompt there
    assert idx.match("b", [*system, 31, 32], 5) == 0
    assert idx.match("a", [*system, 21, 22], 4) == 4  # capped by n
    assert idx.match("nope", system, 3) == 0


def test_leaf_lru_evicts_suffix_before_prefix() -> None:
    r = ReplicaIndex(4)
    r.record([1, 2, 3], 3, stamp=1)
    r.record([1, 4], 2, stamp=2)
    r.record([5, 6], 2, stamp=3)  # 6 blocks > 4: the oldest leaf (3), then its parent (2)
    assert set(r.stamp) == {1, 4, 5, 6}
    assert r.match([1, 2, 3], 3) == 1
    assert r.evictions == 2
    r.record([1, 4], 2, stamp=4)  # touch: the other chain is now the oldest
    r.record([7], 1, stamp=5)
    assert 7 in r and 4 in r and 6 not in r


chains = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=40
)  # (family, length): chains of one family share their leading blocks


@settings(max_examples=60, deadline=None)
@given(chains, st.integers(1, 12))
def test_index_stays_prefix_closed_and_bounded(recs: list[tuple[int, int]], cap: int) -> None:
    r = ReplicaIndex(cap)
    for stamp, (fam, n) in enumerate(recs, 1):
        chain = [fam * 100 + i for i in range(n)]
        r.record(chain, n, stamp)
        assert len(r) <= cap
        assert r.match(chain, n) == min(n, cap)  # the newest chain is held (up to the capacity)
        for b in r.stamp:
            p = r.parent.get(b)
            assert p is None or p in r, f"block {b} outlived its prefix"
            assert r.children.get(b, 0) == sum(1 for q in r.parent.values() if q == b)
        assert set(r.parent) <= set(r.stamp)
        for fam2 in range(4):  # binary search == a linear scan
            c = [fam2 * 100 + i for i in range(6)]
            lin = 0
            while lin < 6 and c[lin] in r:
                lin += 1
            assert r.match(c, 6) == lin
            for hint in range(-1, 8):  # a hint never changes the answer
                assert r.match(c, 6, hint) == lin


def test_text_chainer_is_incremental_stable_and_rehashes_an_edited_history() -> None:
    tc = TextChainer(8)
    msgs = ["system: you are a helpful agent", "user: list the files", "assistant: ls"]
    a = RunChain()
    tc.extend(a, msgs[:2])
    inc = list(tc.extend(a, msgs))
    full = list(TextChainer(8).extend(RunChain(), msgs))
    assert inc == full and len(full) > 5
    other = list(TextChainer(8).extend(RunChain(), [msgs[0], "user: something else entirely"]))
    k = 0
    while k < min(len(other), len(full)) and other[k] == full[k]:
        k += 1
    assert 2 <= k < len(full)  # the shared system prompt is a shared chain prefix
    compacted = ["system: you are a helpful agent", "user: summary of the files", "tool: a b"]
    assert list(tc.extend(a, compacted)) == list(TextChainer(8).extend(RunChain(), compacted))
    new_system = ["system: another agent", *compacted[1:]]
    assert list(tc.extend(a, new_system)) == list(TextChainer(8).extend(RunChain(), new_system))
    # non-ASCII text (per-block encoding) extends alike, and ids are stable across processes and
    # versions (routers sharing an index must agree): a pinned id of the xxh64 chain
    uni = ["system: agent é ü 漢字", "user: naïve café", "tool: ok"]
    b = RunChain()
    tc.extend(b, uni[:1])
    assert list(tc.extend(b, uni)) == list(TextChainer(8).extend(RunChain(), uni))
    assert TextChainer(4).extend(RunChain(), ["abc"]) == [5180170005345153941]  # xxh64(b"abc\x1e", 0)


def _b(name: str, warm: int, running: int = 0, waiting: int = 0) -> BackendState:
    return BackendState(name, "local", "m", running=running, waiting=waiting, warm_prefix_tokens=warm)


def test_prefix_cost_pick_weighs_prefill_against_load_and_bounds_imbalance() -> None:
    w = ScoreWeights(load_tokens=1000.0, balance_abs=4, balance_rel=1.5)
    ctx = 8000
    # equal load: the replica holding the prefix wins
    assert prefix_cost_pick([_b("a", 0), _b("b", 6000)], "r", ctx, w).name == "b"
    # 6000 tokens of prefix are worth more than 2 more requests of load (2 x 1000), not 7 more
    assert prefix_cost_pick([_b("a", 0, 1), _b("b", 6000, 3)], "r", ctx, w).name == "b"
    loose = ScoreWeights(load_tokens=1000.0, balance_abs=10, balance_rel=1.5)
    assert prefix_cost_pick([_b("a", 0, 1), _b("b", 6000, 8)], "r", ctx, loose).name == "a"
    # bounded imbalance: loads 1 vs 9 drift apart -> least loaded whatever the prefix
    w2 = ScoreWeights(load_tokens=1.0, balance_abs=4, balance_rel=1.5)
    assert prefix_cost_pick([_b("a", 0, 1), _b("b", 8000, 9)], "r", ctx, w2).name == "a"


def test_prefix_cost_pick_kv_pressure_moves_the_step_off_a_full_replica() -> None:
    ctx = 8000
    full = BackendState("a", "local", "m", warm_prefix_tokens=2000, kv_usage=0.95)
    free = BackendState("b", "local", "m", warm_prefix_tokens=0, kv_usage=0.1)
    # off: 2000 held tokens win
    assert prefix_cost_pick([full, free], "r", ctx, ScoreWeights(load_tokens=512.0)).name == "a"
    # on: 0.85 x 4000 = 3400 tokens of pressure outweigh the 2000 held
    w = ScoreWeights(load_tokens=512.0, kv_tokens=4000.0)
    assert prefix_cost_pick([full, free], "r", ctx, w).name == "b"
    # a larger held prefix still wins against the pressure
    full6 = BackendState("a", "local", "m", warm_prefix_tokens=6000, kv_usage=0.95)
    assert prefix_cost_pick([full6, free], "r", ctx, w).name == "a"


def test_prefix_cost_pick_min_gain_keeps_balance_for_small_savings() -> None:
    ctx = 8000
    busy, idle = _b("a", 1000, 2), _b("b", 0, 0)
    # off: 1000 held tokens beat 2 requests x 400
    assert prefix_cost_pick([busy, idle], "r", ctx, ScoreWeights(load_tokens=400.0)).name == "a"
    # on: a saving of 200 (1000 held - 2 x 400 load) < 1500 keeps the load-only pick
    w = ScoreWeights(load_tokens=400.0, min_gain_tokens=1500.0)
    assert prefix_cost_pick([busy, idle], "r", ctx, w).name == "b"
    # a saving of 3200 >= 1500 still moves the step to the prefix
    assert prefix_cost_pick([_b("a", 4000, 2), idle], "r", ctx, w).name == "a"
    # equal loads: the load-only pick is the cheapest of them, whatever the hash order
    for key in ("r", "s", "t", "u"):
        assert prefix_cost_pick([_b("a", 1000, 0), idle], key, ctx, w).name == "a"
        assert prefix_cost_pick([idle, _b("a", 1000, 0)], key, ctx, w).name == "a"


def test_prefix_aware_config_passes_the_new_knobs() -> None:
    w = build_policy(
        {"kind": "prefix-aware", "scoring": {"load_tokens": 512, "kv_tokens": 100, "min_gain_tokens": 7}}
    )
    assert isinstance(w, PrefixAwarePolicy)
    assert (w.weights.kv_tokens, w.weights.min_gain_tokens) == (100.0, 7.0)


def _snap(backends: list[BackendState], step: int = 0) -> Snapshot:
    return Snapshot(RunState("r1"), step, {}, Predictions(p_frontier=0.0), backends, context_tokens=8000)


def test_prefix_aware_policy_goes_where_the_prefix_is_and_is_a_config_kind() -> None:
    pol = build_policy({"kind": "prefix-aware"})
    assert isinstance(pol, PrefixAwarePolicy) and pol.name == "prefix-aware"
    d = pol.decide(_snap([_b("local-0", 0), _b("local-1", 7680)]))
    assert (d.backend, d.reason) == ("local-1", "prefix-aware")
    # always-local (load only) ignores the prefix
    d0 = AlwaysLocalPolicy().decide(_snap([_b("local-0", 0), _b("local-1", 7680, running=1)]))
    assert d0.backend == "local-0"


def test_simulator_places_through_the_index_and_keeps_reuse() -> None:
    """The what-if simulator places with the engine's prefix index: on real Mooncake chains (the
    shipped sample), prefix-aware keeps far more reuse than the load balancer, with no worse p95."""
    import numpy as np

    from features.runlog import read_runlog
    from features.samples import sample_path
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.scorecard import scorecard
    from router.sim.whatif import SimConfig, Simulator, Workload

    work = Workload.from_runlog(read_runlog([str(sample_path("mooncake_20min.parquet"))]), limit_runs=600)
    starts = run_starts("trace", len(work.runs), logged_starts=work.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), kv_cache_gb=50.0, replicas=8)
    cards = {
        k: scorecard(Simulator(work, build_policy(k), cfg, np.asarray(starts)).run())
        for k in ("always-local", "prefix-aware")
    }
    lb, pa = cards["always-local"], cards["prefix-aware"]
    assert pa["cache_hit_rate"] > 2 * lb["cache_hit_rate"] + 0.05, (
        lb["cache_hit_rate"],
        pa["cache_hit_rate"],
    )
    assert pa["step_latency_s_p95"] <= 1.05 * lb["step_latency_s_p95"]


def test_sidecar_segments_fingerprint_tools_cheaply_and_still_see_an_edit() -> None:
    """The sidecar's view fingerprints the tools without serialising them all; a grown history is
    hashed incrementally (the same chain as hashing it whole) and an edited first tool re-hashes."""
    from router.server.protocols.chat import MessageSegments

    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "d" * 300}} for i in range(20)]
    msgs = [{"role": "system", "content": "s" * 900}, {"role": "user", "content": "u" * 500}]
    tc, rc = TextChainer(64), RunChain()
    tc.extend(rc, MessageSegments({"messages": msgs, "tools": tools}))
    msgs2 = [*msgs, {"role": "tool", "content": "r" * 700}]
    body2 = {"messages": msgs2, "tools": tools}
    assert list(tc.extend(rc, MessageSegments(body2))) == list(
        TextChainer(64).extend(RunChain(), [MessageSegments(body2)[i] for i in range(4)])
    )
    edited = [{"type": "function", "function": {"name": "t0", "description": "e" * 300}}, *tools[1:]]
    body3 = {"messages": msgs2, "tools": edited}
    fresh = list(TextChainer(64).extend(RunChain(), [MessageSegments(body3)[i] for i in range(4)]))
    assert list(tc.extend(rc, MessageSegments(body3))) == fresh


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 8)), min_size=1, max_size=30),
    st.lists(st.integers(-1, 9), min_size=5, max_size=5),
    st.integers(0, 2),
    st.integers(0, 10),
)
def test_lookup_gives_every_replica_its_match(
    ops: list[tuple[int, int, int]], hints0: list[int], fam: int, n: int
) -> None:
    """PrefixIndex.lookup == one match per replica, whatever the hints (right, wrong, absent),
    through records, evictions (capacity 6), clears and mode switches."""
    names = ["a", "b", "c", "d"]
    idx = PrefixIndex(16, [(name, 6) for name in names])
    idx.set_precise("p")
    for rep, f, k in ops:  # families share their leading blocks (a shared system prompt)
        name = names[rep]
        if k == 0:
            idx.clear(name)
        elif k == 8 and rep == 3:  # d goes precise and back (empty)
            idx.set_precise(name)
            idx.set_approximate(name)
        else:
            idx.record(name, [f * 100 + i for i in range(k)])
    chain = [fam * 100 + i for i in range(8)]
    every = [*names, "p"]
    hints = {name: h for name, h in zip(every, hints0, strict=True) if h >= 0}
    want = {name: idx.match(name, chain, n, hints.get(name, 0)) for name in every}
    assert idx.lookup(chain, n, hints) is hints
    assert hints == want
    assert idx.lookup(chain, n, dict(want)) == want  # right hints: the same answers


def test_text_chainer_one_segment_at_a_time_is_the_whole_chain() -> None:
    msgs = [f"tool: result {i} " + "é" * (i % 3) + "x" * (7 * i) for i in range(12)]
    rc = RunChain()
    tc = TextChainer(16)
    for k in range(1, len(msgs) + 1):
        assert list(tc.extend(rc, msgs[:k])) == list(TextChainer(16).extend(RunChain(), msgs[:k]))
    assert rc.chars == sum(len(m) + 1 for m in msgs)


def test_prefix_cost_pick_decode_term_moves_the_step_off_a_replica_with_more_context_in_flight() -> None:
    ctx = 8000
    busy = BackendState("a", "local", "m", warm_prefix_tokens=2000, inflight_context_tokens=100_000)
    free = BackendState("b", "local", "m", warm_prefix_tokens=0, inflight_context_tokens=10_000)
    assert prefix_cost_pick([busy, free], "r", ctx, ScoreWeights(load_tokens=512.0)).name == "a"  # off
    # on: 0.05 x 90,000 = 4,500 tokens of decode load outweigh the 2,000 held
    w = ScoreWeights(load_tokens=512.0, decode_tokens=0.05)
    assert prefix_cost_pick([busy, free], "r", ctx, w).name == "b"
    big = BackendState("a", "local", "m", warm_prefix_tokens=7000, inflight_context_tokens=100_000)
    assert prefix_cost_pick([big, free], "r", ctx, w).name == "a"
    pol = build_policy({"kind": "prefix-aware", "scoring": {"load_tokens": 512, "decode_tokens": 0.5}})
    assert isinstance(pol, PrefixAwarePolicy) and pol.weights.decode_tokens == 0.5


def test_prefix_cost_pick_context_bound_drops_replicas_far_above_the_least_decode_load() -> None:
    ctx = 8000
    warm = BackendState("a", "local", "m", warm_prefix_tokens=7000, inflight_context_tokens=150_000)
    mid = BackendState("b", "local", "m", warm_prefix_tokens=3000, inflight_context_tokens=60_000)
    cold = BackendState("c", "local", "m", warm_prefix_tokens=0, inflight_context_tokens=20_000)
    three = [warm, mid, cold]
    assert prefix_cost_pick(three, "r", ctx, ScoreWeights(load_tokens=512.0)).name == "a"  # off
    # a is 130,000 context tokens above the least (c): out; b (40,000 above) stays and wins on prefix
    w = ScoreWeights(load_tokens=512.0, balance_context_tokens=50_000)
    assert prefix_cost_pick(three, "r", ctx, w).name == "b"
    tight = ScoreWeights(load_tokens=512.0, balance_context_tokens=10_000)
    assert prefix_cost_pick(three, "r", ctx, tight).name == "c"  # the least is always a candidate
    wide = ScoreWeights(load_tokens=512.0, balance_context_tokens=200_000)
    assert prefix_cost_pick(three, "r", ctx, wide).name == "a"
    pol = build_policy(
        {"kind": "prefix-aware", "scoring": {"load_tokens": 512, "balance_context_tokens": 5e4}}
    )
    assert isinstance(pol, PrefixAwarePolicy) and pol.weights.balance_context_tokens == 50_000


def test_traffic_model_charges_in_flight_context_and_credits_it_once() -> None:
    from router.core.traffic import TrafficModel

    tm = TrafficModel(["a", "b"], clock=lambda: 0.0, wall=lambda: 0.0)
    t1 = tm.step_started("a", "r1", 1000, 0.0, None)
    t2 = tm.step_started("a", "r2", 500, 200.0, None)
    d = tm.default_decode_tokens
    assert tm.replicas["a"].context_tokens == 1500 + 2 * d and tm.replicas["b"].context_tokens == 0
    tm.step_finished(t1, "a", 1000, 0, 10, True)
    tm.step_finished(t1, "a", 1000, 0, 10, True)  # twice: credited once
    assert tm.replicas["a"].context_tokens == 500 + d
    tm.step_finished(t2, "a", 500, 200, 10, True)
    assert tm.replicas["a"].context_tokens == 0


def test_simulator_reports_in_flight_context_to_the_policy() -> None:
    """The simulator's backend states carry each replica's in-flight context (prompt + the run's
    mean output so far, 64 before any), back to 0 when every step has ended."""
    import numpy as np

    from features.runlog import read_runlog
    from features.samples import sample_path
    from router.sim.profiles import load_profile
    from router.sim.simulator import DEFAULT_DECODE_TOKENS
    from router.sim.whatif import SimConfig, Simulator, Workload

    work = Workload.from_runlog(read_runlog([str(sample_path("mooncake_20min.parquet"))]), limit_runs=40)
    seen: list[tuple[int, int]] = []

    class Spy(AlwaysLocalPolicy):
        def decide(self, snap: Snapshot):  # type: ignore[no-untyped-def]
            seen.append((sum(b.inflight_context_tokens for b in snap.backends), len(seen)))
            return super().decide(snap)

    cfg = SimConfig(profile=load_profile(None, "a100"), kv_cache_gb=50.0, replicas=2)
    starts = np.zeros(len(work.runs))  # all at once: steps overlap
    sim = Simulator(work, Spy(), cfg, starts)
    sim.run()
    assert seen[0][0] == 0
    first = [r.steps[0].prompt + DEFAULT_DECODE_TOKENS for r in work.runs]
    # all runs start at 0: the k-th first step sees the k earlier ones in flight (none has ended)
    assert [s for s, _ in seen[:5]] == [sum(first[:k]) for k in range(5)]
    assert all(v == 0 for v in sim._inflight_ctx.values())


def test_engine_fills_owed_prefill_and_in_flight_context_from_the_traffic_model() -> None:
    """The sidecar's path: a local backend state without them gets the traffic model's in-flight
    prefill and context for its replica (what the decode term weighs)."""
    from models.predictor import ConstantPredictor
    from router.core.engine import StepEngine
    from router.core.record import StepRequest
    from router.core.runs import RunTrack
    from router.core.traffic import TrafficModel

    tm = TrafficModel(["local-0", "local-1"], clock=lambda: 0.0, wall=lambda: 0.0)
    tm.step_started("local-1", "other", 3000, 1000.0, None)
    eng = StepEngine(prefix_index=PrefixIndex(16, [("local-0", 100), ("local-1", 100)]), traffic=tm)
    backends = [BackendState("local-0", "local", "m"), BackendState("local-1", "local", "m")]
    turn = eng.begin(RunState("r1"), RunTrack.new("r1", 0.0))
    req = StepRequest(prompt_tokens=100, chain=[1, 2, 3], chain_lookup=3)
    turn.plan(
        req, backends, now=0.0, policy=build_policy({"kind": "prefix-aware"}), predictor=ConstantPredictor()
    )
    assert (backends[0].prefill_queue_tokens, backends[0].inflight_context_tokens) == (0, 0)
    assert backends[1].prefill_queue_tokens == 2000
    assert backends[1].inflight_context_tokens == 3000 + tm.default_decode_tokens


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([3, 6, 40]),
    st.lists(
        st.tuples(st.integers(0, 39), st.integers(0, 3), st.integers(0, 3), st.integers(0, 24)),
        min_size=1,
        max_size=60,
    ),
    st.lists(st.integers(-1, 30), min_size=40, max_size=40),
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(0, 30),
)
def test_lookup_over_many_replicas_equals_each_match_and_owners_follow_the_blocks(
    n_rep: int,
    ops: list[tuple[int, int, int, int]],
    hints0: list[int],
    fam: int,
    sub: int,
    n: int,
) -> None:
    """Both lookup paths (one replica at a time up to a handful, the owners map beyond) give each
    replica's match whatever the hints, through records, leaf-LRU evictions (capacity 12), clears and
    mode switches; ``owners`` names exactly the approximate replicas holding each block."""
    names = [f"r{i}" for i in range(n_rep)]
    idx = PrefixIndex(16, [(name, 12) for name in names])

    def chain_of(f: int, s: int, k: int) -> list[int]:
        # a hash chain: 4 blocks shared by family f (a system prompt), then the branch s's own
        return [f * 1000 + i if i < 4 else f * 1000 + s * 100 + i for i in range(k)]

    for rep, f, s, k in ops:
        name = names[rep % n_rep]
        if k == 0:
            idx.clear(name)
        elif k == 24:  # precise and back (empty)
            idx.set_precise(name)
            idx.set_approximate(name)
        else:
            idx.record(name, chain_of(f, s, k))
    owners: dict[int, set[str]] = {}
    for name, r in idx.replicas.items():
        for b in r.stamp:
            owners.setdefault(b, set()).add(name)
    bit = {}
    for name in names:
        r = idx.replicas[name]
        assert isinstance(r, ReplicaIndex)
        bit[name] = r.bit
    assert {b: {x for x in names if m & bit[x]} for b, m in idx.owners.items()} == owners
    chain = chain_of(fam, sub, 30)
    hints = {name: h for name, h in zip(names, hints0, strict=False) if h >= 0}
    want = {name: idx.match(name, chain, n, hints.get(name, 0)) for name in names}
    assert idx.lookup(chain, n, hints) == want
    assert idx.lookup(chain, n, dict(want)) == want
    assert idx.lookup(chain, n, {}) == want
