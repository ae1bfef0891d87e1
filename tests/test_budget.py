"""The frontier budget (router.policy.budget): the conformal rank rule, catch-up, warm start, and the
leave-one-domain-out share on the shipped paired data."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.policy.budget import BudgetQuantile, FrontierBudget, conformal_threshold, tie_break

if TYPE_CHECKING:
    from training.eval.budget_eval import DomainScores


def _spend(bq: BudgetQuantile, scores: np.ndarray, domain: str = "d") -> float:
    esc = 0
    for i, s in enumerate(scores.tolist()):
        s = tie_break(s, f"r{i}")
        thr = bq.threshold(domain)
        e = thr is not None and s > thr
        esc += e
        bq.observe(domain, s, e)
    return esc / len(scores)


def test_rank_rule_is_exact_for_exchangeable_scores():
    # P(next > s_(k)) = (n + 1 - k) / (n + 1): checked by averaging over many exchangeable draws
    rng = np.random.default_rng(0)
    n, b = 19, 0.2
    for rule, lo, hi in (
        ("nearest", b - 1 / (2 * (n + 1)), b + 1 / (2 * (n + 1))),
        ("cap", b - 1 / (n + 1), b),
    ):
        hits = 0
        trials = 4000
        for _ in range(trials):
            x = rng.random(n + 1)
            hits += x[-1] > conformal_threshold(sorted(x[:-1].tolist()), b, rule)
        assert lo - 0.02 <= hits / trials <= hi + 0.02, rule
    assert conformal_threshold([], 0.2) == math.inf
    assert conformal_threshold([0.1, 0.2], 0.99) == -math.inf


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=60),
    st.floats(0.01, 0.98),
    st.floats(0.001, 0.01),
)
def test_a_larger_budget_never_raises_the_threshold(scores, share, more):
    xs = sorted(scores)
    for rule in ("nearest", "cap"):
        assert conformal_threshold(xs, min(share + more, 0.99), rule) <= conformal_threshold(xs, share, rule)


@pytest.mark.parametrize("share", [0.05, 0.2, 0.5])
def test_unseen_domain_lands_on_the_budget_whatever_its_score_scale(share):
    # the prior (training domains) scores around 0.8; the new domain's around 0.1: a fixed threshold
    # from training would escalate nothing there, the budget still spends its share
    rng = np.random.default_rng(1)
    prior = rng.beta(8, 2, size=500)
    bq = BudgetQuantile(FrontierBudget(share=share, window=200), prior)
    realised = _spend(bq, rng.beta(2, 18, size=600), "new")
    assert abs(realised - share) <= 0.03
    assert bq.realised_share("new") == pytest.approx(share, abs=0.03)
    # the fixed threshold learned on the prior escalates ~none of the new domain
    assert float((rng.beta(2, 18, size=600) > np.quantile(prior, 1 - share)).mean()) < 0.01


def test_ties_and_missing_scores():
    bq = BudgetQuantile(FrontierBudget(share=0.25, window=100), [])
    # one value for every run (a tree model out of its domain): the tie-break still spends the budget
    assert abs(_spend(bq, np.full(400, 0.3)) - 0.25) <= 0.03
    bq2 = BudgetQuantile(FrontierBudget(share=0.25, window=50, min_window=5), [])
    for _ in range(10):
        bq2.observe("d", float("nan"), False)  # no prediction: counted in the share, not the window
    assert bq2.n_scores("d") == 10 and bq2.threshold("d") is None  # no score, no prior: no threshold
    assert bq2.realised_share("d") == 0.0 and bq2.level("d") > 0.25  # catch-up: under-spent so far


def test_domains_are_walls_and_global_scope_pools():
    rng = np.random.default_rng(2)
    bq = BudgetQuantile(FrontierBudget(share=0.2, window=200), [])
    _spend(bq, rng.random(300), "a")
    _spend(bq, rng.random(300) * 0.1, "b")
    assert bq.threshold("a") > 0.5 > 0.1 > bq.threshold("b")
    g = BudgetQuantile(FrontierBudget(share=0.2, window=200, scope="global"), [])
    _spend(g, rng.random(300), "a")
    assert g.threshold("b") == g.threshold("a")


def test_leave_one_domain_out_share_on_the_shipped_pairs():
    """Budget 20% of runs on each shipped domain the escalation model never saw: the realised share is
    within 5 points of it (the issue's check; quality vs the baselines is reported by
    bench/budget_lodo.py, not asserted)."""
    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.budget_eval import domain_scores, evaluate_budget

    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    scored = domain_scores(log, n_estimators=30)
    assert [d.domain for d in scored] == ["airline", "retail", "telecom"]
    for d in scored:
        r = evaluate_budget(d, 0.2)
        assert abs(r.realised_share - 0.2) <= 0.05, (d.domain, r.realised_share)
        assert r.success["always-local"].mean <= r.success["always-frontier"].mean
        for b in ("per-step-threshold", "random-mixing"):
            assert r.diff_vs[b].low <= r.diff_vs[b].mean <= r.diff_vs[b].high


def test_the_simulator_runs_a_budgeted_learned_policy_on_its_share(small_bundle):
    """The step engine keeps the budget's state (router.core.budget): the learned policy with
    ``frontier_budget`` escalates the budget's share of runs per domain in the what-if simulator, where
    the same policy on its fixed thresholds escalates none (the small bundle's P stays low)."""
    from features.runlog import read_runlog
    from features.samples import sample_path
    from models.bundle import ModelBundle
    from router.policy.config import build_policy
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    runs = log.runs[log.runs["task_id"].astype(str).str.split("/").str[0].isin(["airline", "retail"])]
    runs = runs.groupby(runs["task_id"].astype(str).str.split("/").str[0]).head(150)
    steps = log.steps[log.steps["run_id"].isin(set(runs["run_id"]))]
    wl = Workload.from_frames(steps, runs)
    starts = np.arange(len(wl.runs)) * 20.0  # one run at a time: every run ends before the next starts
    bundle = ModelBundle.load(small_bundle)
    share = {}
    for label, extra in (("fixed", {}), ("budget", {"frontier_budget": {"share": 0.2, "window": 100}})):
        pol = build_policy({"kind": "learned", "name": label, **extra}, bundle)
        res = Simulator(
            wl, pol, SimConfig(profile=load_profile(None, "a100"), log_steps=True), starts, predictor=bundle
        ).run()
        esc: dict[str, bool] = {}
        for r in res.records:
            esc[r.run_id] = esc.get(r.run_id, False) or r.tier == "frontier"
        dom = {s.run_id: s.domain for s in wl.runs}
        share[label] = {
            d: float(np.mean([v for k, v in esc.items() if dom[k] == d])) for d in ("airline", "retail")
        }
    assert share["fixed"] == {"airline": 0.0, "retail": 0.0}
    for d, s in share["budget"].items():
        assert abs(s - 0.2) <= 0.05, (d, s)


def test_engine_state_leaves_spills_and_fallbacks_out():
    from router.core.budget import BudgetTracker

    cfg = FrontierBudget(share=0.5, window=50, min_window=1)
    bt = BudgetTracker()
    bt.threshold("p", cfg, "d")
    bt.step("p", cfg, "spilled", "d", 0.9, "frontier", "admission-spill-max-runs")
    bt.ended("spilled")  # a spilled run never enters the window
    assert bt.states["p"].n_scores("d") == 0
    bt.step("p", cfg, "failed-over", "d", 0.1, "frontier", "fallback-upstream")
    bt.ended("failed-over")
    bt.step("p", cfg, "escalated", "d", 0.2, "local", "first-local")
    bt.step("p", cfg, "escalated", "d", 0.8, "frontier", "escalate")
    bt.ended("escalated")
    st = bt.states["p"]
    assert st.n_scores("d") == 2 and bt.realised_share("p", "d") == 0.5  # the fallback is not an escalation
    assert st.threshold("d") == pytest.approx(0.8, abs=1e-6)  # k = round(3 * 0.5) = 2 of {0.1, 0.8}


@given(
    st.floats(0.0, 2.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.1, 3.0),
)
@settings(max_examples=60, deadline=None)
def test_point_aiq_is_the_hull_area_of_one_point(cost, success, q_local, span):
    """The closed form the budget bench bootstraps equals training.eval.curves.aiq on one point."""
    from training.eval.budget_eval import point_aiq
    from training.eval.curves import aiq

    c_local, c_frontier = 0.5, 0.5 + span
    want = aiq([(cost, success)], (c_local, q_local), c_local, c_frontier)
    assert want is not None
    assert float(point_aiq(cost, success, c_local, q_local, c_frontier)) == pytest.approx(want, abs=2e-3)


def test_domain_evidence_switches_only_on_evidence():
    """Step 6 of training.eval.budget_eval: a prior that ranks the domain's weak failures backwards
    is dropped once the domain's own ended runs show it (and a domain model that ranks them is
    taken); a prior that ranks them well is kept. Prequential: the share stays on the budget."""
    from training.eval.budget_eval import DomainEvidence, DomainScores, evaluate_budget
    from training.eval.outcome import RunRecord

    rng = np.random.default_rng(0)

    def domain(prior_sign: float) -> DomainScores:
        recs, scores, xs = [], {}, {}
        for i in range(240):
            fail = bool(rng.random() < 0.4)
            n = int(rng.integers(3, 8))
            rid = f"r{i}"
            recs.append(
                RunRecord.make(
                    rid, [100] * n, [10] * n, weak_success=not fail, strong_success=True, task_id=f"t{i}"
                )
            )
            signal = (1.0 if fail else 0.0) + 0.5 * rng.standard_normal(n)  # what the features show
            xs[rid] = np.column_stack([signal, rng.standard_normal(n)])
            scores[rid] = (1 / (1 + np.exp(-prior_sign * signal))).tolist()
        prior = 1 / (1 + np.exp(-rng.standard_normal(200)))
        return DomainScores("d", recs, scores, prior, 0, xs)

    ev = DomainEvidence(min_labelled=30, refit_every=30, n_estimators=30, n_boot=100)
    backwards = evaluate_budget(domain(-1.0), 0.2, evidence=ev, n_boot=100)
    assert backwards.extra["ranker"] == "domain", backwards.extra["ranker_history"]
    assert abs(backwards.realised_share - 0.2) <= 0.05
    plain = evaluate_budget(domain(-1.0), 0.2, n_boot=100)
    assert backwards.success["budgeted"].mean > plain.success["budgeted"].mean
    good = evaluate_budget(domain(1.0), 0.2, evidence=ev, n_boot=100)
    assert good.extra["ranker"] in ("prior", "domain")
    assert all(h[1] != "none" for h in good.extra["ranker_history"])


def test_knobs_are_chosen_inside_the_training_domains_only():
    """select_evidence scores each candidate on the training domains of the held-out one, each
    arriving with a prior trained on the other training domains: the held-out domain's runs enter
    neither the priors nor the scored runs."""
    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.budget_eval import (
        DomainEvidence,
        PairedRows,
        _rescue_rate,
        inner_scores,
        select_evidence,
    )

    rows = PairedRows.of(read_runlog(sample_path("paired/tau2bench_all.parquet")))
    inner = inner_scores(rows, "airline", n_estimators=20)
    assert [(d.domain, d.train_domains) for d in inner] == [
        ("retail", ("telecom",)),
        ("telecom", ("retail",)),
    ]
    held_runs = {str(r) for r, d in zip(rows.rids, rows.row_dom, strict=True) if d == "airline"}
    assert all(r.run_id not in held_runs for d in inner for r in d.records)
    small = {"min_labelled": 20, "refit_every": 20, "n_estimators": 20, "n_boot": 50}
    cands = [
        None,
        DomainEvidence(**small),
        DomainEvidence(**small, rescue_n0=2.0),
        DomainEvidence(**small, rescue_n0=2.0, rescue_space="embedding", target="no-known-loss"),
    ]
    pick, figs = select_evidence(rows, "airline", 0.2, cands, seeds=1, n_estimators=20)
    assert set(figs) == {"prior only", *(c.label() for c in cands[1:])}
    # the inner domains' rescue priors come from the other inner domain, never from airline
    assert [(d.domain, round(d.rescue_rate, 6)) for d in inner] == [
        ("retail", round(_rescue_rate(rows, ["telecom"]), 6)),
        ("telecom", round(_rescue_rate(rows, ["retail"]), 6)),
    ]
    assert pick in cands and all(0.0 <= v <= 1.0 for v in figs.values())
    assert figs["prior only" if pick is None else pick.label()] == max(figs.values())


def _synthetic_domain(seed: int, n: int = 120, *, strong_fails: float = 0.4) -> DomainScores:
    """A domain whose prior scores track the weak failures and whose strong tier fails on part of
    them (the hard tasks), with task embeddings that cluster the hard ones."""
    from training.eval.budget_eval import DomainScores
    from training.eval.outcome import RunRecord

    rng = np.random.default_rng(seed)
    recs, scores, xs, emb = [], {}, {}, {}
    for i in range(n):
        fail = bool(rng.random() < 0.5)
        hard = fail and bool(rng.random() < strong_fails)
        k = int(rng.integers(3, 8))
        rid = f"r{i}"
        recs.append(
            RunRecord.make(
                rid, [100] * k, [10] * k, weak_success=not fail, strong_success=not hard, task_id=f"t{i}"
            )
        )
        signal = (1.0 if fail else 0.0) + (1.0 if hard else 0.0) + 0.5 * rng.standard_normal(k)
        xs[rid] = np.column_stack([signal, rng.standard_normal(k)])
        scores[rid] = (1 / (1 + np.exp(-signal))).tolist()
        e = rng.standard_normal(8) + (4.0 if hard else 0.0)
        emb[rid] = e / np.linalg.norm(e)
    prior = 1 / (1 + np.exp(-rng.standard_normal(200)))
    return DomainScores("d", recs, scores, prior, 0, xs, ("a", "b"), emb, 0.95)


def _evidence_variants() -> list[Any]:
    from training.eval.budget_eval import DomainEvidence

    small = {"min_labelled": 20, "refit_every": 20, "n_estimators": 20, "n_boot": 50}
    return [
        DomainEvidence(**small),
        DomainEvidence(**small, rescue_n0=2.0),
        DomainEvidence(**small, rescue_n0=2.0, rescue_space="embedding"),
        DomainEvidence(**small, target="no-known-loss"),
    ]


@pytest.mark.parametrize("which", range(4))
def test_a_decision_reads_only_the_outcomes_of_runs_that_ended_before_it(which):
    """Prequential: flipping the outcomes (weak and strong) of every run from arrival position ``m``
    on leaves the decisions of the runs before ``m`` — and of run ``m`` itself — unchanged, for every
    kind of domain evidence (the AUC switch, the benefit factor in both kernel spaces, the wider
    label); and the flipped outcomes do change later decisions (the test can fail)."""
    from dataclasses import replace

    from training.eval.budget_eval import evaluate_budget

    ev = _evidence_variants()[which]
    d = _synthetic_domain(3)
    res = evaluate_budget(d, 0.2, evidence=ev, n_boot=20)
    decisions = res.extra["decisions"]
    moved_later = False
    for m in (25, 60, 90):
        later = {rid for rid, _ in decisions[m:]}
        flipped = replace(
            d,
            records=[
                replace(r, weak_success=not r.weak_success, strong_success=not r.strong_success)
                if r.run_id in later
                else r
                for r in d.records
            ],
        )
        again = evaluate_budget(flipped, 0.2, evidence=ev, n_boot=20).extra["decisions"]
        assert again[: m + 1] == decisions[: m + 1]
        moved_later |= again[m + 1 :] != decisions[m + 1 :]
    assert moved_later, "outcomes never changed any later decision: the evidence is not read at all"
    # what the router never sees (the strong outcome of a run that stayed local, the weak outcome of
    # one that escalated) changes no decision at all
    esc = {rid for rid, k in decisions if k is not None}
    unseen = replace(
        d,
        records=[
            replace(r, weak_success=not r.weak_success)
            if r.run_id in esc
            else replace(r, strong_success=not r.strong_success)
            for r in d.records
        ],
    )
    assert evaluate_budget(unseen, 0.2, evidence=ev, n_boot=20).extra["decisions"] == decisions


def test_benefit_ranking_steers_the_budget_away_from_runs_the_strong_tier_fails():
    """Step 6b: where the prior's top scores are runs the strong tier also fails, the rescue factor
    learnt from the ended escalated runs moves the budget to runs it can rescue; the share stays on
    the budget."""
    from training.eval.budget_eval import evaluate_budget

    d = _synthetic_domain(5, n=300, strong_fails=0.6)
    plain, score, emb = (evaluate_budget(d, 0.2, evidence=ev, n_boot=50) for ev in _evidence_variants()[:3])
    for r in (plain, score, emb):
        assert abs(r.realised_share - 0.2) <= 0.05
    assert score.success["budgeted"].mean > plain.success["budgeted"].mean
    assert emb.success["budgeted"].mean > plain.success["budgeted"].mean


def test_the_rescue_prior_reads_the_training_domains_only():
    """The Beta prior's mean (the training domains' rescue rate) of a held-out domain does not move
    when the held-out domain's strong outcomes change, and does when a training domain's do."""
    from dataclasses import replace

    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.eval.budget_eval import PairedRows, domain_scores

    rows = PairedRows.of(read_runlog(sample_path("paired/tau2bench_all.parquet")))

    def rates(rs: PairedRows) -> dict[str, float]:
        return {d.domain: d.rescue_rate for d in domain_scores(rs, n_estimators=5)}

    ref = rates(rows)
    dom_of = {str(r): str(d) for r, d in zip(rows.rids, rows.row_dom, strict=True)}

    def flip(domain: str) -> PairedRows:
        recs = {
            k: replace(r, strong_success=not r.strong_success, strong_p=None)
            if dom_of.get(k) == domain and r.quality_known
            else r
            for k, r in rows.records.items()
        }
        return replace(rows, records=recs)

    got = rates(flip("telecom"))
    assert got["telecom"] == ref["telecom"]
    assert got["airline"] != ref["airline"] and got["retail"] != ref["retail"]
