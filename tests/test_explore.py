"""Exploration with logged propensities (router.policy.explore, router.core.explore): the product of a
run's logged propensities is the probability of its tier sequence under the logging policy, draws
depend only on (seed, run id, step), exploring runs switch tier at most once, the budget stops new
exploration, and the step engine logs propensity and explore flag in every step record."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.predictor import ConstantPredictor
from models.types import Predictions
from router.core.engine import StepEngine
from router.core.explore import ExploreBudget
from router.core.record import StepRequest, StepResult
from router.core.runs import RunTrack
from router.policy import BackendState, RunState, Snapshot, apply_decision, build_policy
from router.policy.explore import ExploreConfig, ExplorePolicy, draw

CFG = {"rate": 0.3, "start_frontier_share": 0.5, "escalate_hazard": 0.25, "max_step": 3, "seed": 7}


def backends() -> list[BackendState]:
    return [
        BackendState("local-0", "local", "weak", prefill_s_per_token=1e-5),
        BackendState("local-1", "local", "weak", prefill_s_per_token=1e-5),
        BackendState(
            "frontier", "frontier", "strong", price_in_per_m=3, price_cached_in_per_m=0.3, price_out_per_m=15
        ),
    ]


class EscalateAt:
    """A deterministic base: local until step ``k``, then the frontier (and back at ``back``)."""

    name = "esc"

    def __init__(self, k: int, back: int | None = None):
        self.k, self.back = k, back
        self.inner = build_policy({"kind": "always-frontier"})
        self.local = build_policy({"kind": "always-local", "sticky": True})

    def decide(self, snap: Snapshot):
        on = snap.step_index >= self.k and (self.back is None or snap.step_index < self.back)
        return (self.inner if on else self.local).decide(snap)


def walk(policy, run_id: str, n_steps: int, allowed: bool = True) -> list:
    run = RunState(run_id=run_id)
    out = []
    for k in range(n_steps):
        snap = Snapshot(
            run, k, {}, Predictions(p_frontier=0.0), backends(), context_tokens=100, explore_allowed=allowed
        )
        d = policy.decide(snap)
        apply_decision(run, d, k)
        out.append(d)
    return out


def schedule_prob(tiers: tuple[str, ...], cfg: ExploreConfig) -> float:
    """q(tiers): the exploration schedule's probability of a tier sequence."""
    p = cfg.start_frontier_share if tiers[0] == "frontier" else 1 - cfg.start_frontier_share
    for k in range(1, len(tiers)):
        prev, cur = tiers[k - 1], tiers[k]
        if prev == "frontier":
            p *= 1.0 if cur == "frontier" else 0.0
        else:
            h = cfg.escalate_hazard if k <= cfg.max_step else 0.0
            p *= h if cur == "frontier" else 1 - h
    return p


@pytest.mark.parametrize(
    "base", [EscalateAt(99), EscalateAt(2), EscalateAt(1, back=3)], ids=["local", "esc2", "flap"]
)
def test_propensity_product_is_the_logging_probability_of_the_tier_sequence(base):
    cfg = ExploreConfig(**CFG)
    pol = ExplorePolicy(base, cfg)
    n, steps = 6000, 6
    base_tiers = tuple(d.tier for d in walk(base, "x", steps))
    seen: Counter[tuple[str, ...]] = Counter()
    for i in range(n):
        ds = walk(pol, f"run-{i}", steps)
        tiers = tuple(d.tier for d in ds)
        seen[tiers] += 1
        want = (1 - cfg.rate) * (tiers == base_tiers) + cfg.rate * schedule_prob(tiers, cfg)
        assert math.prod(d.propensity for d in ds) == pytest.approx(want, rel=1e-9), tiers
        explores = draw(cfg.seed, f"run-{i}", "run") < cfg.rate
        assert all(d.explore == explores for d in ds)
        if explores:  # at most one tier switch, never back to local
            assert sum(a.tier != b.tier for a, b in itertools.pairwise(ds)) <= 1
            assert tiers == tuple(sorted(tiers, key=lambda t: t == "frontier"))
    # the empirical frequencies match the logged probabilities (binomial 5-sigma bands)
    for tiers, count in seen.items():
        p = (1 - cfg.rate) * (tiers == base_tiers) + cfg.rate * schedule_prob(tiers, cfg)
        assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (tiers, count, n * p)


def test_draws_depend_only_on_seed_run_and_step():
    pol = build_policy({"kind": "always-local", "explore": CFG})
    a = [(d.tier, d.propensity, d.explore) for d in walk(pol, "same", 6)]
    b = [
        (d.tier, d.propensity, d.explore)
        for d in walk(build_policy({"kind": "always-local", "explore": CFG}), "same", 6)
    ]
    assert a == b
    assert draw(7, "same", 3) != draw(8, "same", 3) and 0 <= draw(7, "same", 3) < 1
    assert draw(7, "same", 3) == draw(7, "same", 3) != draw(7, "same", 4)


def test_off_by_default_and_deterministic_decisions_have_propensity_one():
    assert not isinstance(build_policy({"kind": "always-local"}), ExplorePolicy)
    assert not isinstance(build_policy({"kind": "always-local", "explore": {"rate": 0}}), ExplorePolicy)
    ds = walk(build_policy({"kind": "always-local"}), "r", 4)
    assert all(d.propensity == 1.0 and not d.explore for d in ds)
    # a closed budget at the run's start: the run cannot explore, every propensity is 1
    pol = build_policy({"kind": "always-local", "explore": {**CFG, "rate": 1.0}})
    ds = walk(pol, "r", 5, allowed=False)
    assert all(d.propensity == 1.0 and not d.explore and d.tier == "local" for d in ds)


def test_requested_model_is_never_explored():
    pol = build_policy({"kind": "always-local", "explore": {**CFG, "rate": 1.0, "start_frontier_share": 1.0}})
    run = RunState(run_id="r")
    snap = Snapshot(
        run, 0, {}, Predictions(p_frontier=0.0), backends(), context_tokens=10, requested_model="weak"
    )
    d = pol.decide(snap)
    assert d.reason == "requested-model" and d.tier == "local" and d.propensity == 1.0


def test_unhealthy_frontier_makes_the_choice_deterministic():
    pol = build_policy({"kind": "always-local", "explore": {**CFG, "rate": 1.0}})
    bks = backends()
    bks[2].healthy = False
    run = RunState(run_id="r")
    d = pol.decide(Snapshot(run, 0, {}, Predictions(p_frontier=0.0), bks, context_tokens=10))
    assert d.tier == "local" and d.propensity == 1.0


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.01, 1.0),
    share=st.floats(0.0, 1.0),
    hazard=st.floats(0.0, 1.0),
    max_step=st.integers(0, 8),
    run_id=st.text(min_size=1, max_size=6),
    up=st.floats(0.05, 0.95),
    ps=st.lists(st.floats(0, 1), min_size=1, max_size=12),
)
def test_exploration_adds_at_most_one_switch(rate, share, hazard, max_step, run_id, up, ps):
    cfg = {"rate": rate, "start_frontier_share": share, "escalate_hazard": hazard, "max_step": max_step}
    base_cfg = {"kind": "learned", "p_frontier_up": up, "p_frontier_down": up / 2, "min_dwell_steps": 0}
    pol = build_policy({**base_cfg, "explore": cfg})
    run = RunState(run_id=run_id)
    tiers = []
    for k, p in enumerate(ps):
        snap = Snapshot(
            run,
            k,
            {},
            Predictions(p_frontier=p, remaining_tokens_p50=10),
            backends(),
            context_tokens=10,
            at_tool_boundary=True,
        )
        d = pol.decide(snap)
        assert 0.0 < d.propensity <= 1.0 and (d.explore_post is None or 0.0 <= d.explore_post <= 1.0)
        apply_decision(run, d, k)
        tiers.append(d.tier)
    if draw(0, run_id, "run") < rate:
        assert sum(a != b for a, b in itertools.pairwise(tiers)) <= 1


def test_budget_drains_on_the_clock():
    b = ExploreBudget(1.0, 100.0)
    assert b.open(0.0)
    b.charge(1.5, 0.0)
    assert not b.open(10.0)  # 1.5 - 0.1
    assert b.open(60.0)  # 1.5 - 0.6 < 1
    assert b.spent_usd == 1.5 and b.closed_starts == 1
    assert not ExploreBudget(0.0, 1.0).open(None)


def test_engine_charges_exploring_frontier_steps_and_logs_propensities():
    """Through the step engine: step records carry propensity and explore flag; once exploring
    runs have spent the budget, later runs start without exploration (propensity 1)."""
    pol = build_policy(
        {
            "kind": "always-local",
            "explore": {
                **CFG,
                "rate": 1.0,
                "start_frontier_share": 1.0,
                "budget_usd": 0.001,
                "budget_window_s": 1e9,
            },
        }
    )
    eng = StepEngine()
    recs = []
    for i in range(6):
        run, track = RunState(run_id=f"r{i}"), RunTrack.new(f"r{i}", float(i))
        for _k in range(3):
            turn = eng.begin(run, track)
            turn.plan(
                StepRequest(prompt_tokens=200),
                backends(),
                now=float(i),
                policy=pol,
                predictor=ConstantPredictor(),
            )
            b = turn.commit()
            assert b is not None
            recs.append(
                turn.finish(
                    StepResult(status=200, prompt_tokens=200, completion_tokens=20),
                    now=float(i) + 0.5,
                    tier=b.tier,
                    replica=b.name,
                    model=b.model,
                )
            )
    budget = eng.explore_budgets["always-local"]
    assert budget.spent_usd > 0.001 and budget.closed_starts >= 1
    first = [r for r in recs if r.run_id == "r0"]
    assert all(r.explore and r.tier == "frontier" for r in first)
    last = [r for r in recs if r.run_id == "r5"]
    assert all(r.tier == "local" and r.propensity == 1.0 and not r.explore for r in last)
    assert all(r.propensity is not None for r in recs)
    n_charged = sum(1 for r in recs if r.explore and r.tier == "frontier")
    assert np.isclose(budget.spent_usd, n_charged * (200 * 3.0 + 20 * 15.0) * 1e-6)
