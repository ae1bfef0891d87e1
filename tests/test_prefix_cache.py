"""The one prefix-cache model (router.core.prefix_cache) and the adapters that feed it.

Worked examples pin the rules (hit cap at prompt - 1, tail-first LRU, refcounted blocks never
evicted, capacity accounting, counters, turnover); a hypothesis property checks the model's
invariants against a brute-force reference; another drives the same agent runs through the fake
vLLM over HTTP and through the simulator (its workload adapter from logged ``hash_ids``, its node)
and requires identical cached tokens step by step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from features.generate import generate
from features.runlog import RunLog, records_to_frame
from features.schema import Run, Step
from router.core.prefix_cache import (
    ForestPrefixCache,
    PrefixCache,
    block_hashes,
    chains_form_forest,
    max_hit_blocks,
    turnover,
)
from router.fakes import fake_in_thread
from router.fakes.protocol import prompt_tokens, render_segments
from router.policy.config import build_policy
from router.sim.arrivals import run_starts
from router.sim.profiles import NodeProfile, load_profile
from router.sim.whatif import SERVED_LOCAL, SimConfig, Simulator, Workload
from training.dataset import lru_replay

# ------------------------------------------------------------------------------ worked examples


def test_hit_is_whole_blocks_and_the_last_prompt_token_is_always_computed() -> None:
    c = PrefixCache(capacity_blocks=100, block_size=4)
    chain = [1, 2, 3]
    assert c.admit(chain, 3, 12, 4) == 0  # cold: 3 hashed + 1 private block
    c.release(chain, 3, 1)
    assert c.admit(chain, 3, 12, 4) == 2  # 12 tokens, all cached: (12 - 1) // 4 = 2 blocks hit
    c.release(chain, 3, 1)
    assert c.admit(chain, 3, 13, 4) == 3  # 13 tokens: the 13th is computed, 3 full blocks hit
    c.release(chain, 3, 1)
    assert c.admit(chain, 1, 13, 4) == 1  # only the first block lies inside the looked-up prompt
    c.release(chain, 3, 1)
    assert c.hit_blocks(chain, 3, 12) == 2 and c.lookup(chain, 3) == 3  # lookup is uncapped
    assert [max_hit_blocks(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 0, 0, 1, 1, 2]


def test_allocation_reports_hit_and_created_tokens_and_frees_idempotently() -> None:
    c = PrefixCache(capacity_blocks=10, block_size=4)
    a = c.allocate([11, 12], 10, 3)  # 2 full prompt blocks; 13 tokens = 4 blocks
    assert a is not None
    assert (a.cached_tokens, a.created_tokens, a.private_blocks) == (0, 8, 2)
    assert (c.occupied, c.pinned, c.cached_blocks) == (4, 4, 2)
    c.free(a)
    c.free(a)  # a freed allocation holds nothing
    assert (c.occupied, c.pinned, c.cached_blocks) == (2, 0, 2)
    b = c.allocate([11, 12], 10, 3)
    assert b is not None and (b.cached_tokens, b.created_tokens) == (8, 0)
    with pytest.raises(ValueError, match="inside"):
        c.allocate([1, 2, 3], 4, 0)  # 3 hashed blocks cannot lie inside 4 tokens


def test_allocate_over_block_hashes_caches_full_prompt_blocks_only() -> None:
    """The fake vLLM's use: hashes of the prompt's full blocks, output blocks private."""
    cache = PrefixCache(capacity_blocks=100, block_size=4)
    toks = [str(i) for i in range(12)]  # exactly 3 blocks
    h = block_hashes(toks, 4)
    a = cache.allocate(h, 12, 2)
    assert a is not None
    assert (a.cached_tokens, a.created_tokens) == (0, 12)
    cache.free(a)
    b = cache.allocate(h, 12, 2)  # whole prompt cached -> floor((12 - 1) / 4) * 4
    assert b is not None
    assert b.cached_tokens == 8
    cache.free(b)
    longer = toks + ["x", "y"]  # 14 tokens: 3 full blocks shared, partial tail never cached
    c = cache.allocate(block_hashes(longer, 4), 14, 1)
    assert c is not None
    assert c.cached_tokens == 12 and c.created_tokens == 0
    cache.free(c)
    assert cache.pinned == 0 and cache.cached_blocks == 3


def test_lru_evicts_a_released_requests_tail_first_so_its_prefix_survives() -> None:
    c = PrefixCache(capacity_blocks=4, block_size=1)
    assert c.admit([1, 2, 3], 3, 3, 3) == 0
    c.release([1, 2, 3], 3, 0)
    assert list(c.lru) == [3, 2, 1]  # the tail is the least recently freed
    assert c.admit([9], 1, 1, 2) == 0  # 1 hashed + 1 private: one free slot, then evict block 3
    assert set(c.ref) == {1, 2, 9} and c.evictions == 1
    c.release([9], 1, 1)
    assert c.admit([1, 2, 5], 3, 3, 3) == 2  # the prefix 1, 2 survived
    c.release([1, 2, 5], 3, 0)
    # freed later = evicted later: 9 (freed before), then 5, 2, 1
    assert list(c.lru) == [9, 5, 2, 1]


def test_referenced_blocks_are_never_evicted_and_a_refused_request_changes_nothing() -> None:
    c = PrefixCache(capacity_blocks=4, block_size=1)
    assert c.admit([1, 2], 2, 2, 3) == 0  # running: blocks 1, 2 + 1 private
    before = (dict(c.ref), list(c.lru), c.occupied, c.inserted, c.evictions)
    assert not c.fits([7, 8], 2)
    assert c.admit([7, 8], 2, 2, 2) == -1  # would need one of the running request's blocks
    assert (dict(c.ref), list(c.lru), c.occupied, c.inserted, c.evictions) == before
    # a request sharing the running prefix needs only its new block: it fits and references 1, 2
    assert c.fits([1, 2, 3], 3)
    assert c.admit([1, 2, 3], 3, 4, 3) == 2
    assert c.ref == {1: 2, 2: 2, 3: 1} and c.pinned == 4 == c.capacity
    c.release([1, 2, 3], 3, 0)
    assert c.ref == {1: 1, 2: 1, 3: 0} and list(c.lru) == [3]
    c.release([1, 2], 2, 1)
    assert c.pinned == 0 and c.occupied == 3 and c.kv_usage() == 0.0


def test_capacity_accounting_private_blocks_and_kv_usage() -> None:
    c = PrefixCache(capacity_blocks=8, block_size=16)
    assert c.blocks_for(0) == 0 and c.blocks_for(16) == 1 and c.blocks_for(17) == 2
    assert c.admit([1, 2], 2, 40, c.blocks_for(40 + 30)) == 0  # 5 blocks: 2 hashed, 3 private
    assert (c.occupied, c.pinned, c.kv_usage()) == (5, 5, 5 / 8)
    c.release([1, 2], 2, 3)
    assert (c.occupied, c.pinned, c.cached_blocks, len(c.lru)) == (2, 0, 2, 2)
    assert c.admit([], 0, 100, 8) == 0  # the whole cache, all private: evicts both cached blocks
    assert (c.occupied, c.cached_blocks, c.evictions) == (8, 0, 2)
    with pytest.raises(ValueError, match=">= 1"):
        PrefixCache(0, 16)


def test_inserted_counts_new_hashed_blocks_and_wipes_count_whole_cache_losses() -> None:
    c = PrefixCache(capacity_blocks=10, block_size=1)
    assert c.admit([1, 2, 3], 3, 3, 5) == 0
    c.release([1, 2, 3], 3, 2)
    assert c.inserted == 3  # private blocks are not insertions
    assert c.admit([1, 2, 4], 3, 3, 3) == 2
    c.release([1, 2, 4], 3, 0)
    assert c.inserted == 4  # hits are not insertions either
    assert c.admit([1, 5], 2, 2, 2) == 1  # held while the cache is reset
    c.reset()  # drops the unreferenced blocks only
    assert c.wipes == 1 and set(c.ref) == {1, 5} and c.occupied == 2
    c.release([1, 5], 2, 0)
    c.wipe()  # a scale-to-zero reap: everything
    assert c.wipes == 2 and c.ref == {} and not c.lru and c.occupied == 0 and c.inserted == 5


def test_turnover_is_the_share_of_the_cache_rewritten_since_the_mark() -> None:
    assert turnover(100, 100, 400) == 0.0
    assert turnover(200, 100, 400) == 0.25
    assert turnover(900, 100, 400) == 1.0  # more than a whole cache: clipped
    assert turnover(100, 100, 400, wiped=True) == 1.0
    assert turnover(50, 100, 400) == 1.0  # the counter went backwards: the server restarted
    with pytest.raises(ValueError, match="> 0"):
        turnover(1, 0, 0)


def test_block_hashes_chain_full_blocks_only() -> None:
    toks = [f"t{i}" for i in range(10)]
    h = block_hashes(toks, 4)
    assert len(h) == 2 and len(set(h)) == 2  # the 2-token tail is not a full block
    assert block_hashes(toks[:8] + ["x"], 4) == h  # a different tail does not change full blocks
    assert block_hashes(toks[:4], 4) == h[:1]  # a prefix's chain is a prefix of the chain
    changed = block_hashes(["other"] + toks[1:], 4)
    assert changed[0] != h[0] and changed[1] != h[1]  # a block matches only with its whole prefix
    assert block_hashes(toks, 4) == h  # deterministic within the process


def test_training_replay_uses_the_same_model_tail_first_and_the_hit_cap() -> None:
    # capacity 4 blocks of 512: run a writes blocks 1-3; run b writes 2 blocks, so one of a's
    # blocks goes: the tail (3), not the head, and a's next step still hits its first 2 blocks
    hashes = [[1, 2, 3], [9, 10], [1, 2, 3, 4], [1, 2]]
    hits, pressure = lru_replay(
        hashes, ["a", "b", "a", "c"], np.array([1536, 1024, 2048, 1024]), 4, 512, np.zeros(4)
    )
    assert hits.tolist() == [0, 0, 2 * 512, 512]  # last step: whole prompt cached, (1024 - 1) // 512
    assert np.isnan(pressure[0]) and pressure[2] == 0.5  # blocks 9, 10 written in between / 4
    # output tokens are private blocks: they take room while the step runs
    hits2, _ = lru_replay(
        hashes[:3], ["a", "b", "a"], np.array([1536, 1024, 2048]), 4, 512, np.array([0, 512, 0])
    )
    assert hits2[2] == 1 * 512  # b needed 3 blocks: 2 of a's evicted (3, then 2)


# ------------------------------------------------------------------------------ model invariants

_OPS = st.lists(
    st.tuples(
        st.booleans(),  # True: admit a new request, False: release a running one
        st.lists(st.integers(0, 3), min_size=0, max_size=6),  # chain as a path in a small trie
        st.integers(0, 4),  # private blocks
        st.integers(0, 40),  # prompt tokens
        st.integers(0, 10),  # which running request to release
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, capacity=st.integers(1, 12))
def test_model_invariants_against_a_brute_force_reference(ops, capacity) -> None:  # type: ignore[no-untyped-def]
    c = PrefixCache(capacity_blocks=capacity, block_size=4)
    running: list[tuple[list[int], int, int]] = []
    for admit, path, n_private, prompt, pick in ops:
        if admit:
            chain = [hash(tuple(path[: i + 1])) for i in range(len(path))]  # distinct, hash-chain-like
            n_blocks = len(chain) + n_private
            lead = 0
            while lead < len(chain) and chain[lead] in c.ref:
                lead += 1
            fits = c.fits(chain, n_blocks)
            hit = c.admit(chain, len(chain), prompt, n_blocks)
            assert (hit >= 0) == fits
            if hit >= 0:
                assert hit == min(lead, max_hit_blocks(prompt, 4))
                assert all(c.ref[b] > 0 for b in chain)
                running.append((chain, len(chain), n_private))
        elif running:
            c.release(*running.pop(pick % len(running)))
        # reference counts = references held by running requests; unreferenced = the LRU list
        held: dict[int, int] = {}
        for chain, _, _ in running:
            for b in chain:
                held[b] = held.get(b, 0) + 1
        assert {b: n for b, n in c.ref.items() if n} == held
        assert set(c.lru) == {b for b, n in c.ref.items() if n == 0}
        private = sum(p for _, _, p in running)
        assert c.occupied == len(c.ref) + private <= capacity
        assert c.pinned == len(held) + private


# ------------------------------------------------------------------------------ forest cache

_FOREST_OPS = st.lists(
    st.tuples(
        st.integers(0, 5),  # 0-2: admit, 3-4: release a running request, 5: reset (or wipe when idle)
        st.lists(st.integers(0, 2), min_size=0, max_size=12),  # chain as a path in a small trie
        st.integers(0, 8),  # blocks reserved beyond... see below (may cut the hashed chain short)
        st.integers(0, 40),  # prompt tokens
        st.integers(0, 10),  # which running request to release
    ),
    max_size=60,
)


def _state(c: PrefixCache) -> tuple[object, ...]:
    """What the two classes must agree on: presence, referenced or not, LRU order, counters."""
    return (
        {b: n > 0 for b, n in c.ref.items()},
        list(c.lru),
        c.occupied,
        c.inserted,
        c.evictions,
        c.wipes,
        c.pinned,
        c.cached_blocks,
        c.kv_usage(),
        list(c.spill or ()),
    )


@settings(max_examples=300, deadline=None)
@given(ops=_FOREST_OPS, capacity=st.integers(1, 20), spill=st.booleans())
def test_forest_cache_matches_the_per_block_cache_op_by_op(ops, capacity, spill) -> None:  # type: ignore[no-untyped-def]
    # the paths of one trie are forest chains; both classes get the same calls and must answer
    # alike and hold the same state after every call (a wrong walk, count or LRU push fails here)
    a, b = PrefixCache(capacity, 4), ForestPrefixCache(capacity, 4)
    if spill:
        a.spill, b.spill = [], []
    running: list[tuple[Sequence[int], int, int]] = []
    refused = 0
    for kind, path, extra, prompt, pick in ops:
        if kind <= 2:
            chain: Sequence[int] = [hash(("n", *path[: i + 1])) for i in range(len(path))]
            if pick % 2:  # any sequence: the forest cache walks it with reversed() and slices
                chain = tuple(chain)
            n_blocks = max(1, len(chain) + extra - 4)  # sometimes fewer blocks than the chain
            assert a.fits(chain, n_blocks) == b.fits(chain, n_blocks)
            assert a.lookup(chain, len(chain)) == b.lookup(chain, len(chain))
            ha = a.admit(chain, len(chain) - extra % 3, prompt, n_blocks)
            hb = b.admit(chain, len(chain) - extra % 3, prompt, n_blocks)
            assert ha == hb
            if ha < 0:
                refused += 1
                assert a.shortfall == b.shortfall
            else:
                n_hashed = min(len(chain), n_blocks)
                running.append((chain, n_hashed, n_blocks - n_hashed))
        elif kind <= 4 and running:
            req = running.pop(pick % len(running))
            a.release(*req)
            b.release(*req)
        elif kind == 5:
            if running:
                a.reset()
                b.reset()
            else:
                a.wipe()
                b.wipe()
        assert _state(a) == _state(b)


def test_forest_cache_walks_only_the_changed_blocks_and_keeps_tail_first_order() -> None:
    c = ForestPrefixCache(capacity_blocks=5, block_size=4)
    assert c.admit([1, 2, 3], 3, 13, 3) == 0
    assert c.admit([1, 2, 4, 5], 4, 17, 4) == 2  # shares 1, 2 with the first request
    assert c.ref == {1: 1, 2: 2, 3: 1, 4: 1, 5: 1}  # holders: requests ending here + held children
    c.release([1, 2, 4, 5], 4, 0)
    assert list(c.lru) == [5, 4]  # tail first; 1, 2 stay held by the first request
    c.release([1, 2, 3], 3, 0)
    assert list(c.lru) == [5, 4, 3, 2, 1]
    assert c.admit([1, 2, 4, 6, 7], 5, 21, 5) == 3  # 6 and 7 are new: the cache is full
    assert c.evictions == 2 and set(c.ref) == {1, 2, 4, 6, 7}  # 5 and 3 evicted, oldest first
    assert list(c.lru) == [] and c.ref == {1: 1, 2: 1, 4: 1, 6: 1, 7: 1}


def test_chains_form_forest_needs_one_predecessor_per_block() -> None:
    assert chains_form_forest([(1, 2, 3), (1, 2, 4), (5, 6), (), (1,)])
    assert not chains_form_forest([(1, 2), (3, 2)])  # block 2 after 1 and after 3
    assert not chains_form_forest([(1, 2), (2, 3)])  # block 2 a root and a child
    assert not chains_form_forest([(1, 2, 1)])  # a repeated id
    w_forest = Workload.from_runlog(RunLog.from_frame(generate(20, seed=1)))
    assert w_forest.forest_chains()


def test_simulator_uses_the_forest_cache_only_over_forest_chains_and_both_give_the_same_results() -> None:
    w = Workload.from_runlog(RunLog.from_frame(generate(60, seed=4)))
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=2.0)
    starts = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    sim = Simulator(w, build_policy("session-sticky"), cfg, starts)
    assert all(type(r.kv) is ForestPrefixCache for r in sim.replicas)
    res = sim.run()
    w.__dict__["_forest"] = ((len(w.runs), w.n_steps), False)  # as if one chain broke the forest
    sim2 = Simulator(w, build_policy("session-sticky"), cfg, starts)
    assert all(type(r.kv) is PrefixCache for r in sim2.replicas)
    res2 = sim2.run()
    assert res.gpu_evictions > 0  # the cache was under pressure: evictions and refusals happened
    for name in ("outcome", "latency", "ttft", "cached", "run_completion_s"):
        assert np.array_equal(getattr(res, name), getattr(res2, name), equal_nan=True), name
    assert res.gpu_evictions == res2.gpu_evictions


# ------------------------------------------------------------------------------ fake vs simulator

_RUNS = st.lists(
    st.tuples(
        st.integers(10, 100),  # system prompt words (runs share a system prompt when equal modulo 3)
        st.lists(st.tuples(st.integers(1, 40), st.integers(1, 120)), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def vllm_fake():  # type: ignore[no-untyped-def]
    with fake_in_thread("vllm", model="m", zero_latency=True, max_concurrency=0) as f:
        yield f


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=_RUNS, block_size=st.sampled_from([8, 16, 32]), cache_tokens=st.integers(512, 1536))
# found by hypothesis: a 28-token prompt + 4 output tokens logs hash_ids=[] (no full prompt block);
# the workload took the empty list for "not logged" and cached a made-up 32-token block
@example(runs=[(10, [(1, 4)])], block_size=32, cache_tokens=512)
def test_fake_vllm_and_simulator_report_identical_hits(vllm_fake, runs, block_size, cache_tokens) -> None:  # type: ignore[no-untyped-def]
    """Runs one after another: the fake's ``cached_tokens`` equal the simulator's, step by step.

    The cache is small against the runs, so later runs evict earlier runs' blocks (and the private
    blocks of prompt tails and outputs decide how many).

    The simulator gets the fake's prompts as logged ``hash_ids`` (the fake's ``block_hashes`` of the
    tokens it served; comparable here because the fake runs in this process's thread)."""
    capacity = cache_tokens // block_size
    with httpx.Client(base_url=vllm_fake.url, timeout=30) as http:
        r = http.post("/fake/config", json={"block_size": block_size, "capacity_blocks": capacity})
        assert r.status_code == 200, r.text
        # the previous example's requests may still hold their blocks for a moment after their
        # answers were sent: wait (bounded) until nothing is running, then empty the cache
        for _ in range(500):
            st = http.get("/fake/state").json()
            if st["running"] == 0 and st["cache"]["used_blocks"] == 0:
                break
            time.sleep(0.01)
        vllm_fake.server.reset_prefix_cache()  # nothing in flight: an empty cache
        evictions0 = http.get("/fake/state").json()["cache"]["evictions"]
        recs: list = []
        fake_cached: list[int] = []
        created = 0
        for i, (sys_words, steps) in enumerate(runs):
            rid = f"r{i}"
            run_steps: list[Step] = []
            msgs: list[dict] = [
                {"role": "system", "content": " ".join(f"s{sys_words % 3}-{j}" for j in range(sys_words))}
            ]
            for k, (user_words, max_tokens) in enumerate(steps):
                msgs.append({"role": "user", "content": " ".join(f"u{i}.{k}.{j}" for j in range(user_words))})
                toks = prompt_tokens(render_segments(msgs))
                if -(-(len(toks) + max_tokens) // block_size) + 1 > capacity:
                    break  # the run ends before its KV need reaches the capacity (both refuse that)
                r = http.post(
                    "/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": max_tokens}
                )
                assert r.status_code == 200, r.text
                body = r.json()
                usage = body["usage"]
                assert usage["prompt_tokens"] == len(toks)
                fake_cached.append(usage["prompt_tokens_details"]["cached_tokens"])
                created += usage["prompt_tokens_details"]["created_cache_tokens"]
                run_steps.append(
                    Step(
                        run_id=rid,
                        step=k,
                        prompt_tokens=len(toks),
                        completion_tokens=usage["completion_tokens"],
                        tool_pause_s=0.0 if k else None,
                        hash_ids=block_hashes(toks, block_size),
                    )
                )
                msgs.append(body["choices"][0]["message"])
            if run_steps:
                recs += [Run(run_id=rid, source="t", started_at=len(recs) * 1e6), *run_steps]
        evictions = http.get("/fake/state").json()["cache"]["evictions"] - evictions0
    n_runs = sum(isinstance(x, Run) for x in recs)
    assert n_runs  # a run's first step always fits: <= 100 + 40 words, 120 output tokens in >= 512 tokens
    df = records_to_frame(recs)
    w = Workload.from_frames(df[df.record == "step"], df[df.record == "run"], block_tokens=block_size)
    prof = NodeProfile(name="t", a=0.01, b=1e-5, kv_bytes_per_token=1000)
    cfg = SimConfig(
        profile=prof, replicas=1, block_tokens=block_size, kv_cache_gb=(capacity * block_size + 0.5) * 1e-6
    )
    assert cfg.kv_blocks() == capacity
    starts = np.array([x.started_at for x in recs if isinstance(x, Run)])
    sim = Simulator(w, build_policy("always-local"), cfg, starts)
    res = sim.run()
    assert (res.outcome == SERVED_LOCAL).all()
    assert res.cached.astype(int).tolist() == fake_cached
    node = sim.replicas[0]
    assert (node.inserted * block_size, node.kv.evictions) == (created, evictions)
