"""Simulator invariants (hypothesis): conservation of steps, fast-forward == iteration stepping, determinism."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.runlog import records_to_frame
from features.schema import Run, Step
from router.policy.admission import AdmissionConfig, AdmissionController, AdmissionDecision
from router.policy.types import Decision, Snapshot
from router.sim.arrivals import run_starts
from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.whatif import (
    REJECTED,
    SERVED_FRONTIER,
    SERVED_LOCAL,
    SPILLED,
    SimConfig,
    Simulator,
    Workload,
    scorecard,
)

PROF = NodeProfile(
    name="t",
    a=0.005,
    b=5e-5,
    c=2e-9,
    d=2e-7,
    e=1e-4,
    kv_bytes_per_token=100_000,
    token_budget=2048,
    max_num_seqs=8,
)


class Scatter:
    """Stand-in policy: a pseudo-random backend per (run, step), stable across processes."""

    name = "scatter"

    def __init__(self, salt: int):
        self.salt = salt

    def decide(self, snap: Snapshot) -> Decision:
        h = zlib.crc32(f"{snap.run.run_id}/{snap.step_index}/{self.salt}".encode())
        b = snap.backends[h % len(snap.backends)]
        return Decision(tier=b.tier, backend=b.name, model=b.model, reason="scatter")


class Local0:
    name = "local0"

    def decide(self, snap: Snapshot) -> Decision:
        locs = [b for b in snap.backends if b.tier == "local"]
        b = locs[zlib.crc32(snap.run.run_id.encode()) % len(locs)]
        return Decision(tier="local", backend=b.name, model=b.model, reason="pin")


step_st = st.tuples(st.integers(0, 6000), st.integers(0, 300), st.floats(0, 20, allow_nan=False))
runs_st = st.lists(st.lists(step_st, min_size=1, max_size=6), min_size=1, max_size=12)


def workload(runs, starts) -> tuple[Workload, np.ndarray]:
    recs: list = []
    for i, steps in enumerate(runs):
        rid = f"r{i}"
        recs.append(Run(run_id=rid, source="t", started_at=float(starts[i % len(starts)])))
        for k, (p, c, pause) in enumerate(steps):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    prompt_tokens=p,
                    completion_tokens=c,
                    tool_pause_s=pause if k else None,
                )
            )
    df = records_to_frame(recs)
    w = Workload.from_frames(df[df.record == "step"], df[df.record == "run"], block_tokens=64)
    return w, run_starts("trace", len(w.runs), logged_starts=w.logged_starts())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=runs_st,
    starts=st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=12),
    replicas=st.integers(0, 3),
    kv_gb=st.sampled_from([0.3, 1.0, 5.0]),
    salt=st.integers(0, 9),
    admit=st.sampled_from(["none", "mixed"]),
    s2z=st.booleans(),
)
def test_every_step_is_served_spilled_or_rejected_exactly_once(
    runs, starts, replicas, kv_gb, salt, admit, s2z
):
    w, t0 = workload(runs, starts)

    class Mixed(AdmissionController):
        """A stand-in controller: admit / spill / reject in a seeded pseudo-random mix."""

        def __init__(self) -> None:
            super().__init__(AdmissionConfig())
            self.i = salt

        def decide(self, load, priority="interactive", tenant=None):  # type: ignore[no-untyped-def]
            self.i += 1
            v = ("admit-local", "spill", "reject")[zlib.crc32(f"{self.i}".encode()) % 3]
            return AdmissionDecision(v, v, 0.0, 0.0, 1.0 if v == "reject" else None)  # type: ignore[arg-type]

    admission = Mixed()

    cfg = SimConfig(
        profile=PROF,
        replicas=replicas,
        kv_cache_gb=kv_gb,
        block_tokens=64,
        scale_to_zero=s2z,
        wake_s=(5.0, 9.0),
        idle_reap_s=30.0,
        frontier=FrontierConfig(rpm_limit=120.0),
        seed=salt,
    )
    res = Simulator(w, Scatter(salt), cfg, t0, admission=admission if admit == "mixed" else None).run()
    oc = res.outcome
    assert len(oc) == w.n_steps
    assert set(np.unique(oc)) <= {SERVED_LOCAL, SERVED_FRONTIER, SPILLED, REJECTED}
    served = (oc == SERVED_LOCAL) | (oc == SERVED_FRONTIER) | (oc == SPILLED)
    assert np.all(np.isfinite(res.latency[served])) and np.all(res.latency[served] >= res.ttft[served])
    assert np.all(np.isnan(res.latency[oc == REJECTED]))
    g = 0
    for i, spec in enumerate(w.runs):
        codes = oc[g : g + len(spec.steps)].tolist()
        g += len(spec.steps)
        if res.run_status[i] == 1:
            assert codes == [SPILLED] * len(codes)
        elif res.run_status[i] == 2:
            j = codes.index(REJECTED)  # a rejected run: served steps, then all rejected
            assert codes[j:] == [REJECTED] * (len(codes) - j) and REJECTED not in codes[:j]
            assert np.isnan(res.run_completion_s[i])
        else:
            assert REJECTED not in codes and SPILLED not in codes
            assert res.run_completion_s[i] >= 0
    card = scorecard(res)
    assert card["runs_completed"] + card["runs_rejected"] == len(w.runs)
    if replicas == 0:
        assert SERVED_LOCAL not in oc
    hit = card["cache_hit_rate"]
    assert hit is None or 0 <= hit <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=runs_st,
    starts=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=12),
    replicas=st.integers(1, 2),
    kv_gb=st.sampled_from([0.5, 2.0]),
)
def test_fast_forward_equals_stepping_every_iteration(runs, starts, replicas, kv_gb):
    w, t0 = workload(runs, starts)
    out = []
    for ff in (True, False):
        cfg = SimConfig(profile=PROF, replicas=replicas, kv_cache_gb=kv_gb, block_tokens=64, fast_forward=ff)
        out.append(Simulator(w, Local0(), cfg, t0).run())
    a, b = out
    assert a.outcome.tolist() == b.outcome.tolist()
    assert np.allclose(a.latency, b.latency, atol=1e-9, equal_nan=True)
    assert np.allclose(a.ttft, b.ttft, atol=1e-9, equal_nan=True)
    assert a.cached.tolist() == b.cached.tolist()
    assert a.iterations == b.iterations


def test_same_seed_same_result_and_seed_changes_frontier_draws():
    runs = [[(1500, 40, 2.0), (2500, 10, 1.0), (3000, 80, 4.0)] for _ in range(20)]
    w, t0 = workload(runs, [float(i) for i in range(20)])

    def go(seed):
        cfg = SimConfig(profile=PROF, replicas=2, kv_cache_gb=1.0, block_tokens=64, seed=seed)
        return Simulator(w, Scatter(1), cfg, t0).run()

    a, b, c = go(7), go(7), go(8)
    assert a.outcome.tolist() == b.outcome.tolist()
    assert np.array_equal(a.latency, b.latency) and scorecard(a) == scorecard(b)
    fr = a.outcome == SERVED_FRONTIER
    assert fr.any() and not np.array_equal(a.latency[fr], c.latency[fr])
