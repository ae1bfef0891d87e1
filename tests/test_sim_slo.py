"""SLOs by step class (parsing, measuring, floors with their cause), intervals over seeds and a run
bootstrap, the search's upper-bound answer, and the refitted A100 node profile against its cited figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_helpers import FRONT, PROF, Fixed, frame, simulate

from router.policy.config import build_policy
from router.sim.arrivals import run_starts
from router.sim.points import Point, simulate_point
from router.sim.profiles import load_profile, profile_table
from router.sim.search import find, indistinguishable
from router.sim.slo import SLO, Target, floor_lines, floors, measure, parse_slo, pool, prefill_s
from router.sim.whatif import SimConfig, SimError, Workload


def test_parse_slo_classes_units_and_errors() -> None:
    s = parse_slo("ttft_p95@<=8k=2s,ttft_p99@>32k=30s,itl_p95@8k-32k=80ms,run_p50=10min,short_p95=5")
    keys = {t.key: t.value_s for t in s.all_targets()}
    assert keys == {
        "short_p95": 5.0,
        "ttft_p95@<=8k": 2.0,
        "ttft_p99@>32k": 30.0,
        "itl_p95@8k-32k": 0.08,
        "run_p50": 600.0,
    }
    t = next(t for t in s.all_targets() if t.key == "itl_p95@8k-32k")
    assert list(t.in_class(np.array([8192, 8193, 32768, 32769]))) == [False, True, True, False]
    assert "of 8,193-32,768 tokens" in t.describe()
    for bad in (
        "ttft_p95@<=8x=2s",
        "run_p95@<=8k=1s",
        "ttft_p100=1s",
        "ttft@<=8k=2s",
        "ttft_p95@9k-8k=1s",
        "",
    ):
        with pytest.raises(SimError, match="--slo"):
            parse_slo(bad)


def _runs(n: int, long_every: int = 4) -> list[list[tuple]]:
    # every `long_every`-th run has a 40k-token first prompt; the rest short prompts
    return [
        [((40_000 if i % long_every == 0 else 2_000), 20, 0.0, None, None), (2_500, 40, 1.0, None, None)]
        for i in range(n)
    ]


def test_measure_splits_ttft_by_prompt_class_and_bootstraps_over_runs() -> None:
    res, w = simulate(
        _runs(12), Fixed("local-0"), replicas=1, kv_cache_gb=1.0, starts=[30.0 * i for i in range(12)]
    )
    slo = parse_slo("ttft_p95@<=8k=1s,ttft_p95@>32k=1s,run_p95=100s")
    m = measure(res, slo, n_boot=50)
    short_ttft = res.ttft[res.prompt <= 8192]
    long_ttft = res.ttft[res.prompt > 32768]
    assert m["ttft_p95@<=8k"]["value"] == pytest.approx(np.percentile(short_ttft, 95))
    assert m["ttft_p95@>32k"]["value"] == pytest.approx(np.percentile(long_ttft, 95))
    assert m["ttft_p95@>32k"]["n"] == 3 and m["ttft_p95@<=8k"]["n"] == 21
    assert m["ttft_p95@>32k"]["value"] > 10 * m["ttft_p95@<=8k"]["value"]  # prefill of 40k tokens
    b = np.array(m["ttft_p95@<=8k"]["boot"])
    assert len(b) == 50 and b.min() >= short_ttft.min() and b.max() <= short_ttft.max()
    p = pool([m, measure(res, slo, n_boot=50, boot_seed=1)], level=0.9)
    e = p["ttft_p95@<=8k"]
    assert e["lo"] <= e["value"] <= e["hi"] and e["per_seed"][0] == e["per_seed"][1]
    assert slo.holds(_card(), {"slo": p}) is (
        all(x["hi"] <= 1.0 for x in p.values() if x["hi"] is not None) and p["run_p95"]["hi"] <= 100
    )


def _card(rejected: int = 0) -> dict:
    return {"short_step_latency_s_p95": None, "ttft_s_p95": None, "runs_rejected": rejected}


def test_slo_holds_on_the_upper_bound_and_an_empty_class_is_vacuous() -> None:
    slo = parse_slo("ttft_p95@<=8k=2s,ttft_p95@>32k=30s")
    det = {
        "slo": {
            "ttft_p95@<=8k": {"value": 1.5, "lo": 1.2, "hi": 2.4, "n": 10},
            "ttft_p95@>32k": {"value": None, "lo": None, "hi": None, "n": 0},
        }
    }
    assert not slo.holds(_card(), det)  # the median meets 2 s, the upper bound does not
    det["slo"]["ttft_p95@<=8k"]["hi"] = 1.9
    assert slo.holds(_card(), det) and not slo.holds(_card(rejected=1), det)
    assert slo.score(_card(), det) == pytest.approx(1.9 / 2)
    assert slo.worst(_card(), det)[0].key == "ttft_p95@<=8k"


def test_floors_name_the_prefill_of_the_longest_prompts_and_the_levers() -> None:
    steps, runs = frame(_runs(8))
    w = Workload.from_frames(steps, runs)
    slo = parse_slo("ttft_p95=2s,ttft_p95@<=8k=2s,itl_p95=1ms,run_p95=1000s")
    rows = {r["target"]: r for r in floors(w, PROF, slo)}
    cold_40k = prefill_s(PROF, np.array([40_000]), np.array([0]))[0]
    assert rows["ttft_p95"]["floor_s"] == pytest.approx(cold_40k, rel=1e-9)
    assert rows["ttft_p95"]["above_target"] and "40,000 tokens" in rows["ttft_p95"]["cause"]
    assert not rows["ttft_p95@<=8k"]["above_target"]
    assert rows["itl_p95"]["above_target"] and "batch-1 decode" in rows["itl_p95"]["cause"]
    assert not rows["run_p95"]["above_target"]
    lines = floor_lines(list(rows.values()))
    assert len(lines) == 2 and any("the frontier for prompts above" in x for x in lines)
    # chunked prefill cost = the node's own iteration sum (two chunks of 8192 and one of 3616)
    p = PROF
    quad = 8192 * 8192 + 8192 * (8192 + 8192) + 3616 * (16384 + 3616)
    assert prefill_s(p, np.array([20_000]), np.array([0]))[0] == pytest.approx(
        3 * (p.a + p.e) + p.b * 20_000 + p.c * quad
    )


def test_point_with_seeds_and_bootstrap_gives_intervals_and_keeps_the_first_seeds_scorecard() -> None:
    steps, runs = frame(_runs(10))
    w = Workload.from_frames(steps, runs)
    st = [run_starts("rate=0.5", len(w.runs), seed=k) for k in range(3)]
    cfg = SimConfig(profile=PROF, frontier=FRONT, replicas=1, kv_cache_gb=1.0)
    slo = parse_slo("ttft_p95@<=8k=1s")
    one = simulate_point(Point(w, cfg, lambda: Fixed("local-0"), "x", st[0]))
    many = simulate_point(
        Point(w, cfg, lambda: Fixed("local-0"), "x", st[0], slo=slo, seed_starts=tuple(st[1:]), n_boot=40)
    )
    assert many.scorecard == one.scorecard and "intervals" not in one.details
    iv = many.details["intervals"]["ttft_s_p95"]
    assert many.details["seeds"] == 3 and iv["lo"] <= iv["value"] <= iv["hi"] and len(iv["per_seed"]) == 3
    assert len(set(iv["per_seed"])) > 1  # different arrivals, different p95
    assert many.details["slo"]["ttft_p95@<=8k"]["n"] == 17  # 20 steps less 3 of 40k tokens
    json.dumps(many.details, allow_nan=False)


def test_find_answers_on_the_upper_bound_and_reports_the_noise() -> None:
    steps, runs = frame([[(1500, 30, 0.0, None, None), (2500, 8, 0.5, None, None)] for _ in range(24)])
    w = Workload.from_frames(steps, runs)
    st = run_starts("rate=5", len(w.runs), seed=0)
    extra = tuple(run_starts("rate=5", len(w.runs), seed=k) for k in (1, 2))
    base = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0)
    pols = {"always-local": lambda: build_policy("always-local")}
    plain = find(w, pols, base, st, parse_slo("ttft_p95=0.6s"), max_replicas=8, start=1)
    unc = find(
        w, pols, base, st, parse_slo("ttft_p95=0.6s"), max_replicas=8, start=1, seed_starts=extra, n_boot=50
    )
    (a,), (b,) = plain["results"], unc["results"]
    assert b["replicas"] is not None and a["replicas"] is not None
    assert b["replicas"] >= (b["optimistic"] or b["replicas"])
    ans = next(p for p in b["probes"] if p["value"] == b["replicas"])
    assert ans["holds"] and ans["slo"]["ttft_p95"]["hi"] <= 0.6
    below = [p for p in b["probes"] if p["value"] == b["replicas"] - 1]
    assert not below or below[0]["slo"]["ttft_p95"]["hi"] > 0.6
    assert unc["seeds"] == 3 and unc["interval_level"] == 0.9
    json.dumps(unc, allow_nan=False)


def test_indistinguishable_pairs_overlapping_ranges_only() -> None:
    def r(pol, n, opt):
        return {"policy": pol, "kv_cache_gb": 16.0, "replicas": n, "optimistic": opt, "found": "replicas"}

    assert len(indistinguishable([r("a", 17, 15), r("b", 18, 16)])) == 1
    assert indistinguishable([r("a", 12, 12), r("b", 18, 16)]) == []


def test_frontier_only_needs_zero_replicas_in_the_search() -> None:
    steps, runs = frame([[(1500, 30, 0.0, None, None)] for _ in range(6)])
    w = Workload.from_frames(steps, runs)
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    base = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0)
    out = find(
        w, {"af": lambda: build_policy("always-frontier")}, base, st, SLO(ttft_p95_s=5.0), max_replicas=4
    )
    (e,) = out["results"]
    assert e["replicas"] == 0 and e["simulations"] == 1


def test_a100_profile_is_fitted_term_by_term_and_within_20pct_of_its_cited_figures() -> None:
    p = load_profile(None, "a100")
    assert p.name == "a100-llama-3-8b"
    terms = p.provenance["terms"]
    assert all(str(terms[k]).startswith("fitted") for k in "abcde")
    err = p.fit_error
    for key in (
        "a_b_vidur_mlp_rows_mape_pct",
        "d_e_vidur_decode_attention_rows_mape_pct",
        "c_prefill_attention_rows_mape_pct",
    ):
        assert key in err
    refs = {r["figure"]: r for r in p.references}
    floor = refs["batch-1 decode, 1k context vs the bandwidth floor"]
    assert floor["model_s"] >= floor["reference_s"]  # never faster than reading 16 GB of weights
    for fig in (
        "batch-1 decode, 1k context (s/token)",
        "prefill of an 8k prompt (s)",
        "prefill of a 32k prompt (s)",
    ):
        assert abs(refs[fig]["error_pct"]) <= 20, refs[fig]
    # the reference table is the profile itself: recomputing the model's figure gives the same number
    dec = p.a + p.e + p.d * 1088
    assert refs["batch-1 decode, 1k context (s/token)"]["model_s"] == pytest.approx(dec, abs=1e-5)
    assert refs["prefill of an 8k prompt (s)"]["model_s"] == pytest.approx(
        float(prefill_s(p, np.array([8192]), np.array([0]))[0]), abs=1e-5
    )
    kv = p.default_kv_cache_gb()
    assert kv is not None and 45 <= kv <= 65  # 80 GiB x 0.9 - 16 GB weights - reserve
    rows = {r["name"]: r for r in profile_table()}
    assert rows["a100-llama-3-8b"]["default_for"] == "a100" and rows["a100-llama-3-8b"]["sources"]


def test_target_key_round_trips() -> None:
    for text in ("ttft_p95@<=8k", "ttft_p95@>32k", "itl_p90@8k-32k", "run_p95", "short_p95"):
        t = next(iter(parse_slo(f"{text}=1s").all_targets()))
        assert t.key == text and isinstance(t, Target)


@pytest.mark.parametrize("policy", ["always-local", "session-sticky"])
def test_cached_backend_states_equal_a_full_rebuild_at_every_step(policy) -> None:
    """The change list (router.sim.node) must never leave a stale replica state for the policy,
    also when pin-only steps (session-sticky) read one replica and leave the others on the list."""
    from router.sim.simulator import Simulator

    steps, runs = frame(_runs(30, long_every=5), starts=[0.3 * i for i in range(30)])
    w = Workload.from_frames(steps, runs)
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=PROF, frontier=FRONT, replicas=6, kv_cache_gb=1.0)
    sim = Simulator(w, build_policy(policy), cfg, st)
    orig = sim.engine._plan
    checked = []

    def plan(run, track, req, backends, now, *args):  # the states each step is planned on
        reps = [sim.by_name[b.name] for b in backends[:-1]]
        assert backends[:-1] == [sim._local_state(r, now) for r in reps]
        checked.append(len(reps) == len(sim.replicas))  # every replica's (else the pinned one's)
        return orig(run, track, req, backends, now, *args)

    sim.engine._plan = plan  # type: ignore[method-assign]
    res = sim.run()
    assert len(checked) == len(res.outcome) == 60
    if policy == "session-sticky":  # both kinds of step were checked
        assert 0 < sum(checked) < len(checked)


def test_cli_lists_profiles_and_warns_on_an_slo_below_its_floor(tmp_path) -> None:
    from typer.testing import CliRunner

    from features.samples import sample_path
    from runroute.cli import _typer_app

    r = CliRunner().invoke(_typer_app, ["whatif", "--profile"])
    assert r.exit_code == 0, r.output
    assert "a100-llama-3-8b" in r.output and "johnmusgrave.com" in r.output and "58.2" in r.output
    out = tmp_path / "g.json"
    args = ["whatif", "--runs", str(sample_path("mooncake_20min.parquet")), "--limit-runs", "60"]
    args += ["--replicas", "2", "--policy", "always-local", "--no-kv-double", "--boot", "20"]
    args += ["--slo", "ttft_p95@>32k=2s,ttft_p95@<=8k=30s", "--json", str(out)]
    r = CliRunner().invoke(_typer_app, args)
    assert r.exit_code == 0, r.output
    assert "ttft_p95@>32k=2s cannot be met by any number of replicas" in r.output
    assert "note: KV cache 58.2 GB per replica: derived from a100-llama-3-8b" in r.output
    data = json.loads(out.read_text())
    (det,) = data["details"]
    iv = det["slo"]["ttft_p95@<=8k"]
    assert iv["lo"] <= iv["value"] <= iv["hi"] and det["intervals"]["ttft_s_p95"]["n"] > 0
    assert {f["target"] for f in data["slo_floors"]} == {"ttft_p95@>32k", "ttft_p95@<=8k"}


def test_hit_rates_carry_the_seed_and_run_bootstrap_interval_incl_the_global_cpu_pool() -> None:
    """Every point with intervals also gets the hit rates' (overall, GPU, the global CPU pool's):
    the first seed's value equals the scorecard's and the details' figure, and the interval brackets
    the median over seeds."""
    from features.generate import generate
    from features.runlog import RunLog
    from router.sim.slo import measure_hit_rates
    from router.sim.whatif import Simulator

    w = Workload.from_runlog(RunLog.from_frame(generate(40, seed=3)))
    st = [run_starts("rate=0.2", len(w.runs), seed=k) for k in range(2)]
    cfg = SimConfig(
        profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=1.0, cpu_kv_x=4.0, cpu_kv_global=True
    )
    pt = simulate_point(
        Point(w, cfg, lambda: build_policy("always-local"), "x", st[0], seed_starts=(st[1],), n_boot=60)
    )
    iv = pt.details["intervals"]
    for key in ("cache_hit_rate", "cache_hit_rate_gpu", "cache_hit_rate_cpu"):
        assert iv[key]["lo"] <= iv[key]["value"] <= iv[key]["hi"] and len(iv[key]["per_seed"]) == 2
        assert iv[key]["lo"] < iv[key]["hi"]  # a real interval, not a point
    assert iv["cache_hit_rate"]["per_seed"][0] == pytest.approx(pt.scorecard["cache_hit_rate"], abs=1e-6)
    assert iv["cache_hit_rate_cpu"]["per_seed"][0] == pytest.approx(
        pt.details["cache_hit_rate_cpu"], abs=1e-6
    )
    assert pt.details["cache_hit_rate_cpu"] > 0  # the shared pool served hits the GPU cache had lost
    res = Simulator(w, build_policy("always-local"), cfg, st[0]).run()
    m = measure_hit_rates(res, n_boot=0)
    assert m["cache_hit_rate"]["boot"] == [] and set(m) == {
        "cache_hit_rate",
        "cache_hit_rate_gpu",
        "cache_hit_rate_cpu",
    }
    gpu, cpu = m["cache_hit_rate_gpu"]["value"], m["cache_hit_rate_cpu"]["value"]
    assert gpu + cpu == pytest.approx(m["cache_hit_rate"]["value"])
    json.dumps(pt.details, allow_nan=False)
