"""Admission control: priority order, Retry-After, hysteresis, capacity recommendations."""

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.capacity import ArrivalForecaster, capacity_plan, recommend_replicas
from router.policy.admission import (
    AdmissionConfig,
    AdmissionController,
    LoadSnapshot,
    predict_short_step_latency,
)

CFG = AdmissionConfig(
    slo_short_step_s=1.0, base_short_step_s=0.2, replica_tokens_per_s=10000, default_run_token_rate=500
)  # 20 runs saturate one replica


def load(active, replicas=1, frontier=True):
    return LoadSnapshot(
        healthy_replicas=replicas,
        active_local_runs=active,
        frontier_healthy=frontier,
        mean_remaining_run_s=60.0,
    )


def test_idle_node_admits_and_latency_grows_with_load():
    ctl = AdmissionController(CFG)
    assert ctl.decide(load(0)).verdict == "admit-local"
    lat = [predict_short_step_latency(CFG, load(n))[0] for n in range(0, 19)]
    assert lat == sorted(lat)


def test_batch_sheds_before_interactive():
    ctl = AdmissionController(CFG)
    first_shed = {}
    for n in range(0, 25):
        for prio in ("interactive", "batch"):
            d = AdmissionController(CFG).decide(load(n), prio)
            if d.verdict != "admit-local" and prio not in first_shed:
                first_shed[prio] = n
    assert first_shed["batch"] < first_shed["interactive"]
    assert ctl.decide(load(0), "batch").verdict == "admit-local"


def test_spill_when_frontier_healthy_else_reject_with_sensible_retry_after():
    d = AdmissionController(CFG).decide(load(30))
    assert d.verdict == "spill" and d.reason.startswith("spill-")
    r = AdmissionController(CFG).decide(load(30, frontier=False))
    assert r.verdict == "reject"
    assert CFG.retry_after_min_s <= r.retry_after_s <= CFG.retry_after_max_s
    # more overload -> no shorter wait
    r2 = AdmissionController(CFG).decide(load(60, frontier=False))
    assert r2.retry_after_s >= r.retry_after_s


def test_budget_hook_can_refuse_a_spill():
    ctl = AdmissionController(CFG, budget_hook=lambda tenant: tenant != "broke")
    assert ctl.decide(load(30), tenant="rich").verdict == "spill"
    assert ctl.decide(load(30), tenant="broke").verdict == "reject"


def test_disabled_admission_always_admits():
    cfg = CFG.model_copy(update={"enabled": False})
    assert AdmissionController(cfg).decide(load(1000)).verdict == "admit-local"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=1), min_size=20, max_size=60))
def test_load_hovering_at_threshold_does_not_flap(jitter):
    """Active runs oscillating by +-1 around the shedding point change the verdict at most once."""
    ctl = AdmissionController(CFG)
    # find the first load level that sheds interactive
    n0 = next(n for n in range(100) if AdmissionController(CFG).decide(load(n)).verdict != "admit-local")
    verdicts = [ctl.decide(load(n0 + j)).verdict for j in jitter]
    changes = sum(1 for a, b in zip(verdicts, verdicts[1:], strict=False) if a != b)
    assert changes <= 1


def test_capacity_recommends_more_replicas_as_load_rises_and_fewer_as_it_falls():
    recs = [recommend_replicas(CFG, active, None) for active in (5, 20, 40, 80, 40, 5)]
    assert recs[0] <= recs[1] <= recs[2] <= recs[3]
    assert recs[3] >= recs[4] >= recs[5]
    assert recs[3] > recs[0]


def test_forecaster_tracks_rate_and_plan_follows():
    f = ArrivalForecaster(bucket_s=10, alpha=0.5, min_history_s=1e9)
    t = 0.0
    for _ in range(300):  # 1 run/s for 300 s
        f.observe(t)
        t += 1.0
    assert abs(f.forecast(t, 300) - 1.0) < 0.15
    low = capacity_plan(CFG, f, t, 300, mean_run_s=10, run_token_rate=None, current_replicas=1)
    for _ in range(600):  # then 5 runs/s
        f.observe(t, 5)
        t += 1.0
    high = capacity_plan(CFG, f, t, 300, mean_run_s=10, run_token_rate=None, current_replicas=1)
    assert high.forecast_runs_per_s > 4 * low.forecast_runs_per_s
    assert high.recommended_replicas > low.recommended_replicas
    assert high.expected_shed_share > low.expected_shed_share


def test_forecaster_daily_profile_raises_busy_hours():
    f = ArrivalForecaster(bucket_s=600, alpha=0.3, min_history_s=86400)
    t = 0.0
    while t < 2 * 86400:
        hour = (t % 86400) // 3600
        f.observe(t, 10 if 9 <= hour < 17 else 1)
        t += 60
    night = 2 * 86400 + 2 * 3600  # 02:00
    assert f.forecast(night, 8 * 3600) > f.forecast(night, 600)  # the next 8 h reach the busy hours
