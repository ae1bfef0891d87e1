"""The decision layer: config union, learned run-stable rules, baselines, placement, shadow, snapshot."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from features.prefix import RunPrefix, StepView
from models.types import Predictions
from router.policy import (
    POLICY_KINDS,
    BackendState,
    PolicyConfigError,
    RunState,
    ShadowPolicy,
    Snapshot,
    apply_decision,
    build_policy,
    build_snapshot,
)
from router.policy.config import LearnedConfig, parse_policy_config


def backends(**frontier_kw) -> list[BackendState]:
    f = dict(price_in_per_m=2.0, price_cached_in_per_m=0.5, price_out_per_m=8.0)
    f.update(frontier_kw)
    return [
        BackendState("local-0", "local", "weak", prefill_s_per_token=1e-4),
        BackendState("local-1", "local", "weak", prefill_s_per_token=1e-4),
        BackendState("frontier", "frontier", "strong", **f),
    ]


def snap(run: RunState, step: int, p: float, *, bks=None, ctx=20000, boundary=True, **pred_kw) -> Snapshot:
    pk = dict(remaining_steps_p50=0.0, remaining_tokens_p50=0.0)
    pk.update(pred_kw)
    return Snapshot(
        run=run,
        step_index=step,
        features={},
        predictions=Predictions(p_frontier=p, **pk),
        backends=bks if bks is not None else backends(),
        context_tokens=ctx,
        at_tool_boundary=boundary,
    )


def learned(**kw):
    cfg = {"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.2, "min_dwell_steps": 3}
    cfg.update(kw)
    return build_policy(cfg)


def pinned(tier="local", replica="local-0", **kw) -> RunState:
    return RunState("run-a", tier=tier, replica=replica, **kw)


# ----------------------------------------------------------------------------- config


def test_every_kind_builds_from_a_dict_and_names_itself():
    for kind in POLICY_KINDS:
        cfg = {"kind": kind}
        if kind == "learned":
            cfg.update(p_frontier_up=0.6, p_frontier_down=0.3)
        if kind == "per-step-threshold":
            cfg["threshold"] = 0.5
        pol = build_policy(cfg)
        assert pol.name == kind
        d = pol.decide(snap(RunState("r"), 0, 0.1))
        assert d.backend in {"local-0", "local-1", "frontier"}


def test_union_members_match_policy_kinds():
    from typing import get_args

    from router.policy.config import PolicyConfig

    members = get_args(get_args(PolicyConfig)[0])
    assert tuple(m.model_fields["kind"].default for m in members) == POLICY_KINDS


def test_learned_thresholds_come_from_the_bundle_unless_overridden():
    bundle = SimpleNamespace(thresholds={"p_frontier_up": 0.7, "p_frontier_down": 0.4})
    pol = build_policy({"kind": "learned"}, bundle)
    assert (pol.up, pol.down) == (0.7, 0.4)
    pol = build_policy({"kind": "learned", "p_frontier_up": 0.9}, bundle)
    assert (pol.up, pol.down) == (0.9, 0.4)
    assert build_policy("per-step-threshold", bundle).threshold == 0.7


def test_learned_without_bundle_or_thresholds_is_a_clear_error():
    with pytest.raises(PolicyConfigError, match="p_frontier_up.*bundle"):
        build_policy({"kind": "learned"})
    with pytest.raises(PolicyConfigError, match="threshold"):
        build_policy({"kind": "per-step-threshold"})
    bundle = SimpleNamespace(thresholds={"p_frontier_up": 0.2, "p_frontier_down": 0.1})
    with pytest.raises(PolicyConfigError, match="p_frontier_down"):
        build_policy({"kind": "learned", "p_frontier_down": 0.5}, bundle)  # down above the bundle's up


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"kind": "nope"}, "unknown policy kind 'nope'"),
        ({"sticky": True}, "needs 'kind'"),
        ({"kind": "always-local", "stickyy": True}, "stickyy"),
        ({"kind": "learned", "p_frontier_up": 0.2, "p_frontier_down": 0.5}, "p_frontier_down must be <="),
        ({"kind": "learned", "p_frontier_up": 1.5}, "p_frontier_up"),
        ({"kind": "learned", "min_dwell_steps": -1}, "min_dwell_steps"),
    ],
)
def test_bad_configs_fail_in_one_line(cfg, match):
    with pytest.raises(PolicyConfigError, match=match) as e:
        build_policy(cfg)
    assert "\n" not in str(e.value)


def test_parse_accepts_config_objects_and_bare_kinds():
    cfg = LearnedConfig(p_frontier_up=0.5, p_frontier_down=0.1)
    assert parse_policy_config(cfg) is cfg
    assert parse_policy_config("oracle").kind == "oracle"


# ----------------------------------------------------------------------------- learned: tier rules


def test_first_step_local_when_unlikely_frontier_when_likely_and_worth_it():
    pol = learned()
    assert pol.decide(snap(RunState("r"), 0, 0.1)).reason == "first-local"
    d = pol.decide(snap(RunState("r"), 0, 0.9))
    assert (d.tier, d.reason, d.switched) == ("frontier", "first-frontier", False)
    # likely, but the remaining work costs more on the frontier than success is worth
    d = pol.decide(snap(RunState("r"), 0, 0.9, remaining_tokens_p50=5e6))
    assert d.tier == "local" and d.scores["benefit"] < 0


def test_escalates_at_a_tool_boundary_when_benefit_beats_switch_cost():
    pol = learned(value_of_success_usd=0.1)  # gain 0.06 vs cold prefill 20k x $2/M = 0.04
    d = pol.decide(snap(pinned(), 5, 0.6, boundary=True))
    assert (d.tier, d.reason, d.switched) == ("frontier", "escalate", True)
    assert d.scores["switch_cost"] == pytest.approx(0.04, rel=0.01)
    assert d.scores["net"] == pytest.approx(0.02, rel=0.05)


def test_off_boundary_needs_a_much_larger_benefit():
    pol = learned(value_of_success_usd=0.1, off_boundary_ratio=4.0)
    d = pol.decide(snap(pinned(), 5, 0.6, boundary=False))
    assert (d.tier, d.backend, d.reason, d.switched) == ("local", "local-0", "hold-not-boundary", False)
    big = learned(value_of_success_usd=1.0, off_boundary_ratio=4.0)  # gain 0.6 >= 4 x 0.04
    assert big.decide(snap(pinned(), 5, 0.6, boundary=False)).reason == "escalate"


def test_hold_cost_when_the_switch_costs_more_than_it_gains():
    pol = learned(value_of_success_usd=0.05)  # gain 0.03 < cold prefill 0.04
    d = pol.decide(snap(pinned(), 5, 0.6))
    assert (d.tier, d.reason) == ("local", "hold-cost")
    assert d.scores["net"] < 0


def test_cached_tokens_lost_on_the_local_replica_raise_the_switch_cost():
    pol = learned()
    cheap = pol.decide(snap(pinned(), 5, 0.6)).scores["switch_cost"]
    bks = backends()
    bks[0] = replace(bks[0], gpu_usd_per_hour=3600.0)  # $3600/GPU-h: 1e-4 s/token -> $1e-4/token
    dear = pol.decide(snap(pinned(), 5, 0.6, bks=bks, cache_reuse_tokens=10000)).scores["switch_cost"]
    assert dear == pytest.approx(cheap + 10000 * 1e-4, rel=1e-6)


def test_hysteresis_band_holds_and_de_escalates_below_down():
    pol = learned(value_of_success_usd=1.0)
    run = pinned("frontier", "frontier")
    assert pol.decide(snap(run, 5, 0.35)).reason == "pinned"  # inside the band
    # below down, the saving must beat p x value + the local cold prefill: needs remaining work
    d = pol.decide(snap(run, 5, 0.1, remaining_tokens_p50=2e6))
    assert (d.tier, d.reason, d.switched) == ("local", "de-escalate", True)
    assert pol.decide(snap(run, 5, 0.1)).reason == "hold-cost"  # nothing left to save


def test_dwell_and_cap_block_switches():
    pol = learned(min_dwell_steps=3, max_switches=2)
    run = pinned("frontier", "frontier", switches=1, last_switch_step=4)
    s = dict(remaining_tokens_p50=2e6)
    assert pol.decide(snap(run, 6, 0.1, **s)).reason == "hold-dwell"
    assert pol.decide(snap(run, 7, 0.1, **s)).reason == "de-escalate"
    capped = pinned("frontier", "frontier", switches=2, last_switch_step=0)
    assert pol.decide(snap(capped, 9, 0.1, **s)).reason == "hold-cap"


def test_decide_is_pure():
    pol = learned()
    run = pinned()
    before = replace(run)
    s = snap(run, 5, 0.9)
    pol.decide(s)
    assert run == before and s.run is run


# ----------------------------------------------------------------------------- placement and fallbacks


def test_pinned_replica_failover_and_missing_tiers():
    pol = learned()
    bks = backends()
    bks[0].healthy = False
    d = pol.decide(snap(pinned(), 5, 0.1, bks=bks))
    assert (d.backend, d.reason, d.switched) == ("local-1", "failover", True)
    for b in bks[:2]:
        b.healthy = False
    d = pol.decide(snap(pinned(), 5, 0.1, bks=bks))
    assert (d.tier, d.reason) == ("frontier", "no-healthy-local")
    bks = backends()
    bks[2].healthy = False
    d = pol.decide(snap(RunState("r"), 0, 0.99, bks=bks))
    assert (d.tier, d.reason) == ("local", "no-healthy-frontier")
    for b in bks:
        b.healthy = False
    d = pol.decide(snap(pinned(replica="local-1"), 5, 0.1, bks=bks))
    assert (d.backend, d.reason) == ("local-1", "no-healthy-backend")


def test_context_too_long_goes_to_the_largest_healthy_context():
    bks = backends()
    for b in bks:
        b.max_context = 8000
    bks[1].max_context = 16000
    d = learned().decide(snap(RunState("r"), 0, 0.1, bks=bks, ctx=50000))
    assert (d.backend, d.reason) == ("local-1", "context-too-long")


def test_frontier_only_when_the_context_fits_there():
    bks = backends()
    for b in bks[:2]:
        b.max_context = 8000
    d = build_policy("session-sticky").decide(snap(RunState("r"), 0, 0.0, bks=bks, ctx=20000))
    assert (d.tier, d.reason) == ("frontier", "no-healthy-local")


def test_requested_model_bypasses_the_policy():
    for kind in ("always-local", "always-frontier", "oracle"):
        s = snap(RunState("r"), 0, 0.0)
        s.requested_model = "strong"
        d = build_policy(kind).decide(s)
        assert (d.backend, d.reason) == ("frontier", "requested-model")
    s = snap(pinned(replica="local-1"), 3, 0.99)
    s.requested_model = "weak"
    assert learned().decide(s).backend == "local-1"  # the pinned replica serves it: kept
    s.requested_model = "unknown-model"
    assert learned().decide(s).reason != "requested-model"  # nobody serves it: the policy decides


def test_first_pick_spreads_runs_and_is_stable_per_run():
    pol = build_policy("session-sticky")
    picks = {f"run-{i}": pol.decide(snap(RunState(f"run-{i}"), 0, 0.0)).backend for i in range(40)}
    assert set(picks.values()) == {"local-0", "local-1"}
    counts = list(picks.values()).count("local-0")
    assert 8 <= counts <= 32
    again = {r: pol.decide(snap(RunState(r), 0, 0.0)).backend for r in picks}
    assert again == picks


def test_first_pick_prefers_the_less_loaded_and_the_warm_replica():
    pol = learned()
    bks = backends()
    bks[0].waiting, bks[0].running, bks[0].kv_usage = 10, 20, 0.9
    assert {pol.decide(snap(RunState(f"r{i}"), 0, 0.0, bks=bks)).backend for i in range(20)} == {"local-1"}
    bks = backends()
    bks[1].warm_prefix_tokens = 20000
    assert pol.decide(snap(RunState("r0"), 0, 0.0, bks=bks)).backend == "local-1"


# ----------------------------------------------------------------------------- baselines


def test_per_step_threshold_flips_with_each_step():
    pol = build_policy({"kind": "per-step-threshold", "threshold": 0.5})
    run = RunState("r")
    tiers = []
    for k, p in enumerate([0.1, 0.6, 0.4, 0.7]):
        d = pol.decide(snap(run, k, p))
        apply_decision(run, d, k)
        tiers.append(d.tier)
    assert tiers == ["local", "frontier", "local", "frontier"]
    assert run.switches == 3


def test_session_sticky_never_escalates_and_keeps_the_replica_under_load():
    pol = build_policy("session-sticky")
    run = RunState("r")
    apply_decision(run, pol.decide(snap(run, 0, 1.0)), 0)
    first = run.replica
    bks = backends()
    for b in bks:
        if b.name == first:
            b.waiting, b.kv_usage = 50, 0.99
    d = pol.decide(snap(run, 1, 1.0, bks=bks))
    assert (d.tier, d.backend, d.reason) == ("local", first, "sticky")


def test_always_local_balances_load_without_affinity():
    pol = build_policy("always-local")
    bks = backends()
    bks[0].waiting = 5
    d = pol.decide(snap(pinned(replica="local-0"), 3, 0.0, bks=bks))
    assert (d.backend, d.reason) == ("local-1", "always-local")
    sticky = build_policy({"kind": "always-local", "sticky": True})
    assert sticky.decide(snap(pinned(replica="local-0"), 3, 0.0, bks=bks)).backend == "local-0"


def test_stall_escalation_escalates_while_the_newest_tool_call_repeats_or_errors():
    pol = build_policy("stall-escalation")
    s = snap(pinned(), 4, 0.0)
    assert pol.decide(s).reason == "stall-local"
    s.last_tool_repeated = True
    assert (pol.decide(s).tier, pol.decide(s).reason) == ("frontier", "stall-escalate")
    s.last_tool_repeated, s.last_tool_errored = False, True
    assert pol.decide(s).tier == "frontier"
    s.last_tool_errored = False
    s.run = pinned("frontier", "frontier")
    assert pol.decide(s).tier == "local"


def test_oracle_reads_the_label():
    pol = build_policy("oracle")
    s = snap(RunState("r"), 0, 0.0)
    assert pol.decide(s).reason == "oracle-unknown"
    s.label_needs_frontier = True
    assert (pol.decide(s).tier, pol.decide(s).reason) == ("frontier", "oracle-frontier")
    s.label_needs_frontier = False
    assert pol.decide(s).tier == "local"


def test_always_frontier():
    assert build_policy("always-frontier").decide(snap(RunState("r"), 0, 0.0)).tier == "frontier"


# ----------------------------------------------------------------------------- shadow


def test_shadow_records_the_second_policy_without_changing_the_live_one():
    live, other = build_policy("session-sticky"), build_policy("always-frontier")
    pol = ShadowPolicy(live, other)
    s = snap(RunState("r"), 0, 0.9)
    d = pol.decide(s)
    assert pol.name == "session-sticky" and d.tier == "local"
    assert d.shadow is not None and d.shadow.tier == "frontier" and d.shadow.reason == "always-frontier"


def test_a_failing_shadow_never_breaks_the_live_decision():
    class Boom:
        name = "boom"

        def decide(self, snapshot):
            raise RuntimeError("shadow bug")

    d = ShadowPolicy(build_policy("session-sticky"), Boom()).decide(snap(RunState("r"), 0, 0.1))
    assert d.tier == "local" and d.shadow is None and d.scores["shadow_error"] == 1.0


# ----------------------------------------------------------------------------- snapshot


def test_build_snapshot_derives_boundary_loop_and_error_signals():
    from features.extract import FEATURE_NAMES

    steps = [
        StepView(100, 10, tool_calls=("search",), tool_call_keys=("k1",)),
        StepView(150, 10, tool_calls=("book",), tool_call_keys=("k2",), tool_results_n=1),
        StepView(200, 10, tool_calls=("search",), tool_call_keys=("k1",), tool_results_n=1),
    ]
    prefix = RunPrefix(
        "r", steps=steps, new_prompt_tokens=260, new_tool_results_n=1, new_tool_result_errors=(True,)
    )
    s = build_snapshot(RunState("r"), prefix, Predictions(0.3), backends(), label_needs_frontier=True)
    assert s.step_index == 3 and s.context_tokens == 260
    assert s.at_tool_boundary and s.last_tool_repeated and s.last_tool_errored
    assert s.label_needs_frontier is True
    assert list(s.features) == list(FEATURE_NAMES)

    fresh = RunPrefix("r", steps=steps[:2], new_prompt_tokens=200)
    s = build_snapshot(
        RunState("r"), fresh, Predictions(0.3), backends(), features={"x": 1.0}, requested_model="m"
    )
    assert not s.at_tool_boundary and not s.last_tool_repeated and not s.last_tool_errored
    assert s.features == {"x": 1.0} and s.requested_model == "m"
