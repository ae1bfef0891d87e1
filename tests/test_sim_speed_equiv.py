"""The simulator's speed changes keep what is simulated: the hand-written copies equal the generic
ones they replace (a new field would otherwise be dropped silently)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from models.types import Predictions


def test_with_cache_index_equals_replace_for_every_field() -> None:
    vals = {}
    for i, f in enumerate(fields(Predictions)):
        vals[f.name] = f"v{i}" if f.name.startswith("domain_") else float(i + 1)
    p = Predictions(**vals)
    assert p.with_cache_index(123.0) == replace(p, cache_index_tokens=123.0)
    assert p.with_cache_index(123.0).cache_index_tokens == 123.0


def _reference_decoding(rep) -> tuple[int, int, list]:
    """The decode bookkeeping by its definition: (n decoding, sum of prompt + decoded, them)."""
    dec = [r for r in rep.running if r.prefilled >= r.prompt]
    return len(dec), sum(r.prompt + (rep.tick - r.base) for r in dec), dec


@pytest.mark.parametrize("elements", [False, True])
def test_decode_tick_bookkeeping_equals_its_definition_at_every_iteration(monkeypatch, elements) -> None:
    """Replica's incremental decode state (n decoding, summed context, the finish heap) equals the
    batch walked request by request at every iteration start, and every request ends having emitted
    exactly its iteration target, on an overloaded generated workload (plain, and with a CPU tier,
    fp8 and prompt-lookup speculative decoding)."""
    from dataclasses import replace

    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim import node as nodemod
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.specdec import prompt_lookup
    from router.sim.whatif import SimConfig, Simulator, Workload

    starts, ends = [], []
    orig_start, orig_finish = nodemod.Replica._start, nodemod.Replica._finish

    def start(self, t):
        n, ctx, dec = _reference_decoding(self)
        assert (self._n_dec, self._dec_s + self._n_dec * self.tick) == (n, ctx)
        assert sorted(id(e[2]) for e in self._fin) == sorted(id(r) for r in dec)
        assert [r for r in self.running if r.prefilled < r.prompt] == self.prefilling
        starts.append(n)
        return orig_start(self, t)

    def finish(self, done, t):
        for r in done:
            assert r.decoded == r.it_target
        assert [r.seq for r in done] == sorted(r.seq for r in done)  # the running (admission) order
        ends.extend(done)
        return orig_finish(self, done, t)

    monkeypatch.setattr(nodemod.Replica, "_start", start)
    monkeypatch.setattr(nodemod.Replica, "_finish", finish)
    w = Workload.from_runlog(RunLog.from_frame(generate(150, seed=3)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=16.0)
    if elements:
        cfg = replace(cfg, cpu_kv_x=2.0, kv_dtype="fp8", spec=prompt_lookup())
    Simulator(w, build_policy("session-sticky"), cfg, st).run()
    assert len(starts) > 100 and max(starts) > 10 and len(ends) > 100


def test_grid_table_prints_hit_rates_with_intervals_and_the_global_pool_by_tier() -> None:
    from rich.console import Console

    from router.sim.report import render_table, tier_lines
    from router.sim.scorecard import SCORECARD_KEYS

    card: dict = dict.fromkeys(SCORECARD_KEYS)
    card.update(policy="always-local", replicas=8, kv_cache_gb=8.0, cache_hit_rate=0.177)
    iv = {"value": 0.177, "lo": 0.145, "hi": 0.209, "n": 10, "per_seed": [0.177]}
    det = {
        "kv_tiers": [{"tier": "cpu"}],
        "cache_hit_rate_gpu": 0.052,
        "cache_hit_rate_cpu": 0.126,
        "intervals": {"cache_hit_rate": iv, "cache_hit_rate_cpu": {**iv, "lo": 0.093, "hi": 0.155}},
    }
    result = {"scorecards": [card], "details": [det], "inputs": {"cpu_kv_global": True}}
    con = Console(width=300, record=True)
    render_table(result, con)
    out = con.export_text()
    assert "17.7% [14.5, 20.9]" in out
    (line,) = tier_lines(result)
    assert line == "always-local x8 @ 8 GB: hit by tier: gpu 5.2%, cpu (global pool) 12.6% [9.3, 15.5]"


def _sim_arrays(res) -> tuple:
    return tuple(
        getattr(res, n).tobytes() for n in ("outcome", "latency", "ttft", "cached", "run_completion_s")
    ) + (res.run_switches.tobytes(), res.iterations)


@pytest.mark.parametrize(
    ("policy", "n", "admission", "stz"),
    [
        ("session-sticky", 8, False, False),
        ("stall-escalation", 5, False, False),
        ("session-sticky", 6, True, False),
        ("oracle", 4, False, True),
    ],
)
def test_pin_only_steps_simulate_what_every_replica_would(policy, n, admission, stz) -> None:
    """A step of a run pinned under a pin-keeping policy reads only its replica's state and the
    frontier's (the pinned path of Simulator._arrive; the index matched for that replica only): the
    same simulated results as the same simulation given every replica at every step, and the
    shortcut is taken."""
    from dataclasses import replace

    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.admission import AdmissionConfig
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    w = Workload.from_runlog(RunLog.from_frame(generate(120, seed=5)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=n, kv_cache_gb=4.0)
    if stz:
        cfg = replace(cfg, scale_to_zero=True)
    adm = AdmissionConfig() if admission else None
    fast = Simulator(w, build_policy(policy), cfg, st, admission=adm)
    seen: list[int] = []  # the backend states each step was planned on
    orig = fast.engine._plan

    def plan(run, track, req, backends, *args):
        seen.append(len(backends))
        return orig(run, track, req, backends, *args)

    fast.engine._plan = plan  # type: ignore[method-assign]
    slow = Simulator(w, build_policy(policy), cfg, st, admission=adm)
    slow._keeps_pin = False
    a, b = fast.run(), slow.run()
    assert _sim_arrays(a) == _sim_arrays(b)
    assert seen.count(2) > len(seen) // 4 and seen.count(n + 1) > 0


def test_prefix_index_lookup_some_equals_lookup_for_the_replicas_named() -> None:
    from router.core.prefix_index import PrefixIndex

    idx = PrefixIndex(16, [(f"r{i}", 64) for i in range(6)])
    chains = [[1000 * k + j for j in range(20)] for k in range(4)]
    for i in range(6):
        idx.record(f"r{i}", chains[i % 4][: 3 + 3 * i])
    for c in chains:
        for n in (0, 1, 7, 20, 25):
            full = idx.lookup(c, n, {})
            for names in (["r0"], ["r3", "r5"], ["r1", "nope"]):
                hints = {"r3": 2, "r5": 19}
                got = idx.lookup_some(c, n, hints, names)
                assert all(got[x] == full[x] for x in names if x in full)
                assert "nope" not in got


@pytest.mark.parametrize("n", [2, 32])
def test_an_arrival_that_is_its_instants_last_event_starts_its_idle_replica_at_once(monkeypatch, n) -> None:
    """``Replica.submit(last=True)``: an idle replica starts at once, without a kick event, only
    when no other event of the instant is pending. The same simulated results as every start
    deferred to its event (fewer events), and two arrivals of one instant still share an iteration."""
    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim import node as nodemod
    from router.sim.arrivals import run_starts
    from router.sim.engine import EventLoop
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    w = Workload.from_runlog(RunLog.from_frame(generate(120, seed=5)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=n, kv_cache_gb=4.0)
    a = Simulator(w, build_policy("session-sticky"), cfg, st).run()
    submit = nodemod.Replica.submit
    monkeypatch.setattr(nodemod.Replica, "submit", lambda self, req, last=False: submit(self, req))
    b = Simulator(w, build_policy("session-sticky"), cfg, st).run()
    monkeypatch.undo()
    assert _sim_arrays(a) == _sim_arrays(b)
    assert a.events < b.events

    loop = EventLoop()
    done: list[nodemod.Request] = []
    rep = nodemod.Replica("r", load_profile(None, "a100"), loop, 64, 16, done.append)
    r1 = nodemod.Request("a", 100, 5, (), 0, 0.0, 16)
    r2 = nodemod.Request("b", 100, 5, (), 0, 0.0, 16)
    loop.schedule(0.0, lambda _: rep.submit(r1, True) and None)  # another event of this instant is pending:
    loop.schedule(0.0, lambda _: rep.submit(r2, True) and None)  # r1's start waits for it, and they batch
    loop.run()
    assert r1.first_token_t == r2.first_token_t and len(done) == 2


@pytest.mark.parametrize("scrape", [True, False])
def test_a_cached_state_refreshed_in_place_equals_a_fresh_one(monkeypatch, scrape) -> None:
    """Simulator._refresh (the replica's cached BackendState brought up to date in place) leaves it
    equal, field by field, to the state Simulator._local_state builds afresh at that moment."""
    from dataclasses import replace

    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim import simulator as simmod
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    orig = simmod.Simulator._refresh
    n = [0]

    def checked(self, st, rep, t):
        orig(self, st, rep, t)
        assert st == self._local_state(rep, t)
        n[0] += 1

    monkeypatch.setattr(simmod.Simulator, "_refresh", checked)
    w = Workload.from_runlog(RunLog.from_frame(generate(80, seed=4)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = replace(SimConfig(profile=load_profile(None, "a100"), replicas=3, kv_cache_gb=4.0), scrape=scrape)
    Simulator(w, build_policy("always-local"), cfg, st).run()
    assert n[0] > 100


def test_schedule_many_runs_events_in_the_order_schedule_would() -> None:
    """EventLoop.schedule_many keeps its events out of the heap until they are next: the same
    (time, order scheduled) order as scheduling each, ties, past times and events that handlers
    schedule while the loop runs included; ``len`` counts the waiting ones."""
    import random

    from router.sim.engine import EventLoop

    rng = random.Random(3)
    times = [float(rng.choice([0.0, 1.0, 2.5, 2.5, 4.0, rng.uniform(0, 5)])) for _ in range(200)]

    def drive(many: bool) -> list[tuple[float, int]]:
        loop = EventLoop()
        seen: list[tuple[float, int]] = []

        def h(i: int) -> None:
            seen.append((loop.now, i))
            if i % 3 == 0:  # a follow-up at the same instant or later, scheduled mid-run
                loop.schedule(loop.now + (i % 2) * 0.5, h, 1000 + i)

        loop.schedule(2.5, h, -1)  # scheduled before the batch: runs first among the 2.5 ties
        items = [(t, h, i) for i, t in enumerate(times)]
        if many:
            loop.schedule_many(items)
            assert len(loop) == len(times) + 1
        else:
            for t, hd, a in items:
                loop.schedule(t, hd, a)
        loop.schedule(2.5, h, -2)  # after it: runs after the batch's 2.5 ties
        loop.run()
        return seen

    assert drive(True) == drive(False)


def test_the_simulators_step_requests_and_step_columns_equal_their_definitions() -> None:
    """The simulator builds each step's StepRequest positionally and the result's per-step columns
    from lists: each equals the keyword construction and the loop over the workload's steps."""
    from features.generate import generate
    from features.runlog import RunLog
    from router.core.record import StepRequest
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    w = Workload.from_runlog(RunLog.from_frame(generate(40, seed=4)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=16.0)
    res = Simulator(w, build_policy("session-sticky"), cfg, st).run()
    n = 0
    cols: dict[str, list] = {
        k: [] for k in ("prompt", "upper", "short", "step_index", "run_of_step", "completion")
    }
    for i, spec in enumerate(w.runs):
        for k, s in enumerate(spec.steps):
            kw = StepRequest(
                prompt_tokens=s.prompt,
                tool_results_n=s.tool_results_n,
                tool_result_errors=s.errors,
                tool_result_tokens=s.result_tokens,
                n_tools_offered=s.n_tools,
                wants_json=s.wants_json,
                label_needs_frontier=spec.needs_frontier,
                signals=s.signals,
                chain=s.chain,
                chain_lookup=s.n_lookup,
            )
            if s.request is not None:  # built when the step arrived (every step of a run not rejected)
                n += 1
                for f in fields(StepRequest):
                    a, b = getattr(s.request, f.name), getattr(kw, f.name)
                    assert a is b or a == b, f.name
            for key, v in zip(cols, (s.prompt, s.upper, s.short, k, i, s.completion), strict=True):
                cols[key].append(v)
    assert n > 100
    for key, v in cols.items():
        assert getattr(res, key).tolist() == v, key
