"""The figures of step records and the warm-prefix rule are written once (router.core.figures,
router.core.accounting) and every scorecard, the metrics and OPE read them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from features.schema import Step
from router.core.accounting import RunContext, reusable_tokens, warm_by_backend
from router.core.figures import (
    escalation_quality,
    is_short,
    percentile,
    ratio,
    run_figures,
    slo_met,
    step_figures,
    switches,
    switches_by_run,
    upper_bound_tokens,
)
from router.fakes.agent import StepResult
from router.policy.types import BackendState
from router.replay import PolicyTally
from router.server.metrics.registry import RouterMetrics
from training.eval.live import live_figures
from training.eval.ope_replay import step_costs
from training.eval.outcome import FRONTIER, LOCAL, Prices, RunRecord, policy_outcomes, run_costs, run_warm

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_by_hand():
    assert ratio(3, 4) == 0.75 and ratio(3, 0) is None
    # linear interpolation over the finite values: [1, 2, 3, 4] -> p50 2.5, p95 3.85
    assert percentile([4.0, np.nan, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert percentile([], 95) is None and percentile([np.nan], 50) is None
    assert is_short(64, False) and not is_short(65, False)
    assert is_short(500, True) and is_short(500, False, structured=True)
    assert upper_bound_tokens(900, 1000) == 900 and upper_bound_tokens(1200, 1000) == 999
    assert upper_bound_tokens(0, 0) == 0
    assert switches(["l0", "l0", "f", "l0", "l1"]) == 3 and switches([]) == 0 and switches(["f"]) == 0
    # two runs (a: L L F L -> 2 changes; b: F F -> 0)
    got = switches_by_run(np.array(["a", "a", "a", "a", "b", "b"]), np.array([0, 0, 1, 0, 1, 1]))
    assert got.tolist() == [2.0, 0.0]
    assert run_figures(np.array([0, 2, 0, 1]), np.array([0, 2, 0, 3])) == (0.5, 1.25)
    assert run_figures(np.array([]), np.array([])) == (None, None)
    # flagged/label: tp 2 (a, b), fn 1 (c), fp 1 (d), unlabelled e skipped
    eq = escalation_quality([(True, True), (True, True), (False, True), (True, False), (True, None)])
    assert (eq.recall, eq.precision, eq.needs_frontier_runs, eq.false_positive_runs) == (2 / 3, 2 / 3, 3, 1)
    assert escalation_quality([(False, False)]).recall is None
    ok = slo_met(
        np.array([True, True, False, False]),
        np.array([1.0, 3.0, 9.0, 9.0]),
        np.array([0.1, 0.1, 0.5, 2.5]),
        2.0,
        1.0,
    )
    assert ok.tolist() == [True, False, True, False]


def test_step_figures_by_hand():
    # run 0: local 1000 (step 0), local 1500 (600 cached), frontier 2000; run 1: local 800, rejected
    figs = step_figures(
        served=np.array([1, 1, 1, 1, 0], bool),
        local=np.array([1, 1, 0, 1, 0], bool),
        step=np.array([0, 1, 2, 0, 1]),
        prompt=np.array([1000, 1500, 2000, 800, 900]),
        cached=np.array([0, 600, 900, 0, 0]),
        upper=np.array([0, 1049, 1549, 0, 849]),
        latency=np.array([1.0, 2.0, 3.0, 4.0, np.nan]),
        ttft=np.array([0.2, 0.3, 1.5, 0.4, np.nan]),
        short=np.array([1, 1, 0, 0, 0], bool),
        slo_s=(1.5, 1.0),
    )
    assert figs["cache_hit_rate"] == 600 / 1500  # only local steps >= 2nd count (not the frontier's 900)
    assert figs["cache_hit_upper_bound"] == 1049 / 1500
    assert figs["step_latency_s_p50"] == 2.5  # the rejected step is not a served step
    assert figs["short_step_latency_s_p95"] == pytest.approx(1.95)
    assert figs["long_step_latency_s_p95"] == pytest.approx(3.95)
    assert figs["ttft_s_p95"] == pytest.approx(1.335)
    # short 1.0 <= 1.5 yes, short 2.0 no, long ttft 1.5 > 1.0 no, long ttft 0.4 yes
    assert figs["slo_attainment"] == 0.5


def test_warm_prefix_rule_comes_from_the_run_context_not_the_tier():
    # local -> frontier -> local: step 2 finds on the local backend what step 0 left there, capped by
    # every reuse since (the conversation's common prefix)
    prompt, completion, reuse = [1000, 1500, 2200], [100, 120, 80], [0, 1100, 1620]
    assert warm_by_backend(["L", "F", "L"], prompt, completion, reuse) == [0, 0, 1100]
    assert warm_by_backend(["L", "L", "L"], prompt, completion, reuse) == [0, 1100, 1620]
    # a compaction in between (reuse 300 at step 1) leaves only 300 of step 0's context a prefix
    assert warm_by_backend(["L", "F", "L"], prompt, completion, [0, 300, 1620]) == [0, 0, 300]
    # the cache holds no more of the run than the run put there (step 0's prompt + output)
    assert warm_by_backend(["L", "L"], [1000, 3000], [100, 50], [0, 2900]) == [0, 1100]
    assert reusable_tokens(0, 500, None, 400) == 0
    assert reusable_tokens(0, 500, 300, 0) == 300  # logged at step 0: a prefix shared across runs
    assert reusable_tokens(2, 500, None, 400) == 400 and reusable_tokens(2, 300, None, 400) == 300
    assert reusable_tokens(2, 500, 100, 400) == 100
    # block chains (a provider's cache): leading equal blocks, TTL, minimum cacheable size
    ctx = RunContext()
    ctx.served_chain("f", [1, 2, 3, 4], 4, until=100.0)
    assert ctx.warm_chain("f", [1, 2, 3, 9, 10], 5, 700, 128, now=50.0) == 3 * 128
    assert ctx.warm_chain("f", [1, 2, 3, 9, 10], 5, 300, 128, now=50.0) == 300  # at most the prompt
    assert ctx.warm_chain("f", [1, 2, 3], 3, 700, 128, now=100.5) == 0  # expired
    assert ctx.warm_chain("f", [1, 2, 3], 3, 700, 128, now=50.0, min_tokens=512) == 0
    assert ctx.warm_chain("other", [1, 2], 2, 700, 128) == 0


def test_outcome_cost_of_a_detour_reads_what_the_run_left_on_the_tier():
    rec = RunRecord.make("r", [1000, 1500, 2200], [100, 120, 80], [0, 1100, 1620])
    p = Prices()
    t = np.array([LOCAL, FRONTIER, LOCAL])
    assert run_warm(rec, t).tolist() == [0, 0, 1100]
    # local steps: cold prompt x local_in + output x local_out; frontier step 1: all 1500 fresh
    local = (1000 * p.local_in_per_m + 100 * p.local_out_per_m) + (
        (2200 - 1100) * p.local_in_per_m + 80 * p.local_out_per_m
    )
    front = 1500 * p.frontier_in_per_m + 120 * p.frontier_out_per_m
    total, lc, fc = run_costs(rec, t, p)
    assert lc == pytest.approx(local / 1e6) and fc == pytest.approx(front / 1e6)
    assert total == pytest.approx(float(step_costs(rec, t, p).sum()))


def test_policy_outcomes_read_the_shared_definitions():
    recs = {
        "a": RunRecord.make("a", [100, 200, 300], [10, 10, 10], needs_frontier=True),
        "b": RunRecord.make("b", [100, 200], [10, 10], needs_frontier=False),
        "c": RunRecord.make("c", [100, 200], [10, 10], needs_frontier=True),
        "s": RunRecord.make("s", [100], [10], needs_frontier=True),  # spilled whole
    }
    tiers = {
        "a": np.array([LOCAL, FRONTIER, LOCAL]),
        "b": np.array([FRONTIER, FRONTIER]),
        "c": np.array([LOCAL, LOCAL]),
        "s": np.array([FRONTIER]),
    }
    out = policy_outcomes(recs, tiers, Prices(), spilled=["s"])
    assert out["escalation_rate"] == 2 / 3  # a, b of the three routed runs
    assert out["frontier_step_share"] == 4 / 8
    assert out["tier_switches_per_run"] == 2 / 4
    assert out["needs_frontier_recall"] == 0.5 and out["needs_frontier_precision"] == 0.5
    assert out["spilled_runs"] == 1


def test_replay_tally_by_hand():
    t = PolicyTally("p")
    fr = BackendState(
        "f", "frontier", "strong", price_in_per_m=2.0, price_cached_in_per_m=0.5, price_out_per_m=8.0
    )
    t.step("local", "start", 1000, 0, 0, 100, None)
    t.step("frontier", "escalate", 1500, 1100, 0, 120, fr)
    t.step("local", "back", 2200, 1620, 1100, 80, None)
    t.run_done("r1", 2, True)
    t.step("local", "start", 500, 0, 0, 10, None)
    t.run_done("r2", 0, False)
    r = t.report()
    assert (r["runs"], r["steps"], r["escalation_rate"], r["frontier_step_share"]) == (2, 4, 0.5, 0.25)
    assert (r["recall"], r["precision"], r["switches_per_run"], r["tier_switches_per_run"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    assert r["runs_with_flaps"] == 1 and r["escalation_step"] == {"r1": 1}
    assert (r["warm_tokens"], r["reprefill_tokens"]) == (1100, 1100 + 520)
    assert r["warm_share"] == 1100 / 2720
    assert r["frontier_cost_usd"] == pytest.approx((1500 * 2.0 + 120 * 8.0) / 1e6)


def test_live_figures_by_hand():
    run_a = [
        StepResult(0, 200, 1.0, "local", "l0", "start", 1000, 100, 0, True),
        StepResult(1, 200, 2.0, "local", "l0", "pinned", 1500, 50, 900, True),
        StepResult(2, 200, 3.0, "frontier", "f", "escalate", 2000, 300, 0, False),
    ]
    run_b = [StepResult(0, 200, 4.0, "local", "l1", "start", 800, 10, 0, False), StepResult(1, 502, 0.1)]
    f = live_figures([run_a, run_b])
    assert (f.runs, f.steps, f.errors) == (2, 4, 1)
    assert f.cache_hit_rate == 900 / 1500 and f.cache_hit_upper_bound == 1100 / 1500
    assert f.escalation_rate == 0.5 and f.flaps_per_run == 0.5
    assert f.step_latency_s_p50 == 2.5 and f.short_step_latency_s_p95 == pytest.approx(1.95)


def test_metrics_count_the_shared_per_step_definitions():
    m = RouterMetrics(short_step_tokens=64)
    base = dict(run_id="r", tier="local", replica="l0", model="m", status=200, latency_s=0.5)
    m.step_finished(Step(step=0, prompt_tokens=1000, completion_tokens=100, **base), 0, None)
    m.step_finished(
        Step(step=1, prompt_tokens=1100, cached_tokens=1000, completion_tokens=500, structured=True, **base),
        1100,
        None,
    )
    text = m.render()[0].decode()
    # the bound is capped at prompt - 1 (the last prompt token is always computed)
    assert 'runroute_cross_turn_reusable_tokens_total{backend="l0",tier="local"} 1099.0' in text
    # a structured answer is a short step whatever its length
    assert 'runroute_step_latency_seconds_count{kind="short",tier="local"} 1.0' in text  # step 1
    assert 'runroute_step_latency_seconds_count{kind="long",tier="local"} 1.0' in text  # step 0: 100 out


# ---------------------------------------------------------------------------- no second copy
# A figure computed inline outside router/core/figures.py: recall / precision (tp + fn, tp + fp),
# a cross-turn hit rate (cached sum / prompt sum), switches of a run's sequence, a latency
# percentile written under a scorecard key, the upper-bound cap, the SLO rule, the escalation rate,
# the short-step rule.
_COPIES = [
    re.compile(r"\btp\s*\+\s*(self\.)?f[np]\b"),
    re.compile(r"/\s*ptok\b"),
    re.compile(r"cached\w*(\[[^\]]*\])?(\.sum\(\))?\)?\s*/\s*\w*p(rompt)?\w*(\[[^\]]*\])?\.sum\(\)"),
    re.compile(r"zip\((\w+),\s*\1\[1:\][^\n]*!="),
    re.compile(r"\b(?!r?ids\b|sid\b|rid\b)\w+\[1:\]\s*!=\s*\w+\[:-1\]"),
    re.compile(r'"\w*(step_latency|ttft|run_completion)_s_p\d+"\s*:\s*[^\n]*np\.percentile'),
    re.compile(r'"cache_hit_\w*"\s*:\s*[^"\n]*\s/\s'),
    re.compile(r"^[^\"#]*(upper|bound)\w*\s*[+]?=.*min\([^\n]*(prompt\w*|\bp)\s*-\s*1\b"),
    re.compile(r"\blat(ency)?\w*(\[\w+\])?\s*<=\s*[\w.]*slo_short_s"),
    re.compile(r"\(\s*[\w.]*frontier_steps\w*(\[[^\]]*\])?\s*>\s*0\s*\)\.mean\(\)"),
    re.compile(
        r"<=\s*[\w.]*(SHORT_STEP_TOKENS|short_step_tokens|\b64\b)[^\n]*tool_calls|tool_calls[^\n]*<=\s*[\w.]*short"
    ),
]
_ALLOWED = {"router/core/figures.py", "router/core/prefix_cache.py"}  # prefix_cache: vLLM's hit cap


def test_no_second_copy_of_the_figures_in_the_tree():
    copies = []
    for pkg in ("router", "training", "runroute", "models", "features", "bench"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in _ALLOWED:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if any(p.search(line) for p in _COPIES):
                    copies.append(f"{rel}:{n}: {line.strip()}")
    assert copies == []


def test_the_grep_finds_the_old_copies():
    old = [
        '"recall": _div(self.tp, self.tp + self.fn),',
        '"cache_hit_rate": round(float(res.cached[local2].sum()) / ptok, 6) if ptok else None,',
        "switches += sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)",
        "tier_switches += int((srv[1:] != srv[:-1]).sum()) if len(srv) > 1 else 0",
        '"step_latency_s_p50": float(np.percentile(lat, 50)),',
        "upper += min(a.prompt_tokens + a.completion_tokens, max(b.prompt_tokens - 1, 0))",
        "ok = np.where(short, lat <= cfg.slo_short_s, ttft <= cfg.slo_ttft_s)",
        '"escalation_rate": round(float((res.run_frontier_steps[routed] > 0).mean()), 6)',
        '"cache_hit_rate": float(c[m].sum() / p[m].sum()) if p[m].sum() else float("nan"),',
        "self.short = completion <= SHORT_STEP_TOKENS or bool(tool_calls) or bool(structured)",
        "short = bool(rec.tool_calls) or out <= self.short_step_tokens",
        'short=int(u.get("completion_tokens") or 0) <= 64 or bool(m.get("tool_calls")),',
    ]
    for line in old:
        assert any(p.search(line) for p in _COPIES), line
    assert not any(p.search("first = np.r_[True, ids[1:] != ids[:-1]]") for p in _COPIES)
