"""Invariants of the decision layer, checked with hypothesis over random backends and runs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.types import Predictions
from router.policy import POLICY_KINDS, BackendState, RunState, Snapshot, apply_decision, build_policy

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(kind: str, **kw):
    cfg: dict = {"kind": kind}
    if kind == "learned":
        cfg.update(p_frontier_up=0.5, p_frontier_down=0.2)
    if kind == "per-step-threshold":
        cfg["threshold"] = 0.5
    cfg.update(kw)
    return build_policy(cfg)


ALL = [make(k) for k in POLICY_KINDS] + [make("always-local", sticky=True, name="always-local-sticky")]


@st.composite
def backend_lists(draw, min_healthy: int = 0):
    n_local = draw(st.integers(0, 4))
    n_frontier = draw(st.integers(0 if n_local else 1, 2))
    out = []
    for i in range(n_local + n_frontier):
        tier = "local" if i < n_local else "frontier"
        out.append(
            BackendState(
                name=f"{tier}-{i}",
                tier=tier,
                model=f"{tier}-model",
                healthy=draw(st.booleans()),
                max_context=draw(st.sampled_from([4096, 32768, 131072])),
                running=draw(st.integers(0, 64)),
                waiting=draw(st.integers(0, 64)),
                kv_usage=draw(st.floats(0, 1)),
                warm_prefix_tokens=draw(st.integers(0, 50000)),
                price_in_per_m=draw(st.floats(0, 20)),
                price_cached_in_per_m=draw(st.floats(0, 5)),
                price_out_per_m=draw(st.floats(0, 60)),
                prefill_s_per_token=draw(st.floats(0, 1e-3)),
                ttft_base_s=draw(st.floats(0, 2)),
            )
        )
    for b in out[:min_healthy]:
        b.healthy = True
    return out


predictions = st.builds(
    Predictions,
    p_frontier=st.floats(0, 1),
    cache_reuse_tokens=st.floats(0, 50000),
    remaining_steps_p50=st.floats(0, 50),
    remaining_tokens_p50=st.floats(0, 2e6),
)


@st.composite
def snapshots(draw):
    bks = draw(backend_lists())
    names = [b.name for b in bks]
    pin = draw(st.sampled_from([None, *names, "gone-replica"]))
    tier = None
    if pin is not None:
        tier = next((b.tier for b in bks if b.name == pin), draw(st.sampled_from(["local", "frontier"])))
    step = draw(st.integers(0, 40))
    run = RunState(
        run_id=draw(st.text(min_size=1, max_size=8)),
        tier=tier,
        replica=pin,
        switches=draw(st.integers(0, 5)),
        last_switch_step=draw(st.one_of(st.none(), st.integers(0, step))),
    )
    return Snapshot(
        run=run,
        step_index=step,
        features={},
        predictions=draw(predictions),
        backends=bks,
        context_tokens=draw(st.integers(0, 140000)),
        at_tool_boundary=draw(st.booleans()),
        last_tool_repeated=draw(st.booleans()),
        last_tool_errored=draw(st.booleans()),
        label_needs_frontier=draw(st.one_of(st.none(), st.booleans())),
        requested_model=draw(st.sampled_from([None, None, "local-model", "frontier-model", "other"])),
    )


@SETTINGS
@given(snapshots())
def test_a_decision_names_an_existing_backend_and_a_healthy_one_when_one_exists(s):
    healthy = {b.name for b in s.backends if b.healthy}
    for pol in ALL:
        d = pol.decide(s)
        assert d.backend in {b.name for b in s.backends}, (pol.name, d)
        if healthy:
            assert d.backend in healthy, (pol.name, d)
            assert d.reason != "no-healthy-backend"
        else:
            assert d.reason == "no-healthy-backend"
        chosen = next(b for b in s.backends if b.name == d.backend)
        assert (d.tier, d.model) == (chosen.tier, chosen.model)
        assert d.switched == (s.run.tier is not None and (d.tier != s.run.tier or d.backend != s.run.replica))


# ----------------------------------------------------------------------------- run sequences


def _healthy_backends() -> list[BackendState]:
    return [
        BackendState("local-0", "local", "weak", prefill_s_per_token=1e-4),
        BackendState("local-1", "local", "weak", prefill_s_per_token=1e-4),
        BackendState(
            "frontier",
            "frontier",
            "strong",
            price_in_per_m=2.0,
            price_cached_in_per_m=0.5,
            price_out_per_m=8.0,
        ),
    ]


def run_sequence(pol, run_id, ps, boundaries, label=None, ctx=5000, remaining=0.0):
    """Decide every step of one run; returns the decisions and the final run state."""
    run = RunState(run_id)
    bks = _healthy_backends()
    out = []
    for k, (p, boundary) in enumerate(zip(ps, boundaries, strict=True)):
        s = Snapshot(
            run=run,
            step_index=k,
            features={},
            predictions=Predictions(p_frontier=p, remaining_tokens_p50=remaining, remaining_steps_p50=0.0),
            backends=bks,
            context_tokens=ctx,
            at_tool_boundary=boundary,
            label_needs_frontier=label,
        )
        d = pol.decide(s)
        apply_decision(run, d, k)
        out.append(d)
    return out, run


@st.composite
def run_sets(draw, min_p: float = 0.0):
    n = draw(st.integers(1, 8))
    runs = []
    for i in range(n):
        length = draw(st.integers(1, 25))
        ps = draw(st.lists(st.floats(min_p, 1), min_size=length, max_size=length))
        bs = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        runs.append((f"run-{i}", ps, bs, draw(st.booleans())))
    return runs


def shares(pol, runs, **kw):
    ever = steps = frontier = 0
    for rid, ps, bs, _ in runs:
        ds, _ = run_sequence(pol, rid, ps, bs, **kw)
        ever += any(d.tier == "frontier" for d in ds)
        steps += len(ds)
        frontier += sum(d.tier == "frontier" for d in ds)
    return ever / len(runs), frontier / steps


@SETTINGS
@given(run_sets(), st.floats(0.2, 1), st.floats(0, 1), st.integers(0, 5), st.integers(0, 3), st.floats(0, 2))
def test_raising_the_up_threshold_never_raises_the_frontier_share(runs, up1, bump, dwell, cap, value):
    up2 = min(1.0, up1 + bump)
    kw = dict(p_frontier_down=0.2, min_dwell_steps=dwell, max_switches=cap, value_of_success_usd=value)
    low, high = make("learned", p_frontier_up=up1, **kw), make("learned", p_frontier_up=up2, **kw)
    # share of runs that reach the frontier: monotone whatever the dwell, cap and down threshold
    assert shares(high, runs)[0] <= shares(low, runs)[0]
    # share of steps on the frontier: monotone once the down threshold cannot fire (p < 0 never)
    kw["p_frontier_down"] = 0.0
    low, high = make("learned", p_frontier_up=up1, **kw), make("learned", p_frontier_up=up2, **kw)
    assert shares(high, runs)[1] <= shares(low, runs)[1]
    # and for the per-step baseline, step by step
    t_low, t_high = make("per-step-threshold", threshold=up1), make("per-step-threshold", threshold=up2)
    assert shares(t_high, runs)[1] <= shares(t_low, runs)[1]


@SETTINGS
@given(
    st.integers(1, 6),
    st.integers(2, 40),
    st.floats(0.0, 0.3),
    st.lists(st.booleans(), min_size=40, max_size=40),
    st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_predictions_oscillating_around_the_thresholds_switch_at_most_once_per_dwell_window(
    dwell, length, amp, above, boundaries
):
    pol = make("learned", p_frontier_up=0.5, p_frontier_down=0.4, min_dwell_steps=dwell, max_switches=100)
    # p jumps across the whole band; big remaining work makes both directions worth a switch
    ps = [0.45 + (0.05 + amp) * (1 if a else -1) for a in above[:length]]
    ds, run = run_sequence(pol, "osc", ps, boundaries[:length], remaining=1e5)
    switch_steps = [k for k, d in enumerate(ds) if d.switched]
    assert all(b - a >= dwell for a, b in zip(switch_steps, switch_steps[1:], strict=False))
    for start in range(length):
        assert sum(1 for k in switch_steps if start <= k < start + dwell) <= 1
    assert run.switches == len(switch_steps)


@st.composite
def load_sequences(draw):
    length = draw(st.integers(1, 20))
    seq = []
    for _ in range(length):
        seq.append(
            (
                draw(st.floats(0, 1)),  # p
                draw(st.booleans()),  # boundary
                draw(st.booleans()),  # repeated tool call
                draw(
                    st.lists(
                        st.tuples(st.integers(0, 50), st.floats(0, 1), st.booleans()), min_size=3, max_size=3
                    )
                ),
            )
        )
    return seq


@SETTINGS
@given(load_sequences(), st.booleans())
def test_a_pinned_replica_never_moves_while_healthy_and_the_tier_is_kept(seq, label):
    # the plain load balancer and prefix-aware (placed afresh by prefix cost each step) have no pin
    pols = [p for p in ALL if p.name not in ("always-local", "prefix-aware")]
    for pol in pols:
        run = RunState("pin-run")
        for k, (p, boundary, repeated, loads) in enumerate(seq):
            bks = _healthy_backends()
            for b, (waiting, kv, healthy) in zip(bks, loads, strict=True):
                b.waiting, b.kv_usage = waiting, kv
                # other replicas may fail; the pinned one stays healthy
                b.healthy = healthy or b.name == run.replica
            s = Snapshot(
                run=run,
                step_index=k,
                features={},
                predictions=Predictions(p_frontier=p),
                backends=bks,
                context_tokens=3000,
                at_tool_boundary=boundary,
                last_tool_repeated=repeated,
                label_needs_frontier=label,
            )
            d = pol.decide(s)
            if run.tier is not None and d.tier == run.tier:
                assert d.backend == run.replica, (pol.name, k, d)
            apply_decision(run, d, k)


@SETTINGS
@given(run_sets(), st.floats(0, 1), st.floats(0, 3))
def test_the_oracle_is_never_beaten_on_recall_by_the_learned_policy(runs, up, value):
    learned = make("learned", p_frontier_up=up, p_frontier_down=min(up, 0.2), value_of_success_usd=value)
    oracle = make("oracle")

    def recall(pol):
        pos = hit = 0
        for rid, ps, bs, label in runs:
            if not label:
                continue
            ds, _ = run_sequence(pol, rid, ps, bs, label=label)
            pos += 1
            hit += any(d.tier == "frontier" for d in ds)
        return hit / pos if pos else 1.0

    assert recall(oracle) >= recall(learned)
