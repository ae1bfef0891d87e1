"""Answers by search: SLO parsing, the ladder bisection, find() against the brute-force grid, the
capacity pre-check's analytic figures and warnings, the point loop's ``map`` seam, the CLI, and the
prompt-lookup measurement on a known text."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sim_helpers import FRONT, PROF, Fixed, frame, prefill_s

from features.samples import sample_path
from router.policy.config import build_policy
from router.sim.arrivals import run_starts
from router.sim.points import Point, run_points, simulate_point
from router.sim.precheck import capacity_check, warning_lines
from router.sim.search import SLO, Ladder, find, parse_slo
from router.sim.spec_measure import Sim, measure, measure_step, pretokens
from router.sim.whatif import SimConfig, SimError, Workload, run_grid


def card(p95: float | None, ttft: float | None = 0.1, rejected: int = 0) -> dict:
    return {"short_step_latency_s_p95": p95, "ttft_s_p95": ttft, "runs_rejected": rejected}


def test_parse_slo_units_and_errors() -> None:
    s = parse_slo("short_p95=2s,ttft_p95=500ms")
    assert (s.short_p95_s, s.ttft_p95_s) == (2.0, 0.5)
    assert parse_slo("short_p95=3").short_p95_s == 3.0
    for bad in ("short=2s", "short_p95=fast", "", "ttft_p95=0s"):
        with pytest.raises(SimError, match="--slo"):
            parse_slo(bad)
    assert s.holds(card(1.9, 0.4)) and not s.holds(card(2.1, 0.4)) and not s.holds(card(1.0, 0.6))
    assert not s.holds(card(None)) and not s.holds(card(1.0, 0.1, rejected=1))


@pytest.mark.parametrize("answer,start", [(23, 13), (1, 13), (64, 1), (None, 40), (5, 5)])
def test_ladder_finds_the_lowest_holding_value_in_log_steps(answer, start) -> None:
    values = list(range(1, 65))
    lad = Ladder(values, start - 1)
    while (i := lad.next()) is not None:
        v = values[i]
        lad.record(i, answer is not None and v >= answer, card(1.0 if answer and v >= answer else 100.0 / v))
    assert lad.answer == answer
    probed = {p["value"]: p["holds"] for p in lad.probes}
    if answer is not None and answer > 1:
        assert probed[answer - 1] is False  # the answer's lower neighbour was simulated and failed
    assert len(lad.probes) <= 2 * math.ceil(math.log2(64)) + 1
    assert lad.non_monotone == []


def test_ladder_stops_at_a_floor_and_reports_non_monotone_probes() -> None:
    lad = Ladder(list(range(1, 65)), 12)
    while (i := lad.next()) is not None:
        lad.record(i, False, card(8.0))  # p95 never improves: the steps' own service time
    assert lad.answer is None and lad.floor == 8.0 and len(lad.probes) == 2
    lad = Ladder([1, 2, 3, 4], 0)
    lad.record(0, True, card(1.0))
    lad.record(2, False, card(9.0))
    assert lad.non_monotone == [1]


def many_runs(n: int = 24):
    steps, runs = frame(
        [[(1500, 30, 0.0, None, None), (2500, 8, 0.5, None, None)] for _ in range(n)],
        starts=[0.05 * i for i in range(n)],
    )
    w = Workload.from_frames(steps, runs)
    return w, run_starts("trace", len(w.runs), logged_starts=w.logged_starts())


def test_find_agrees_with_the_brute_force_grid_in_fewer_simulations() -> None:
    w, st = many_runs()
    base = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0)
    pols = {"always-local": lambda: build_policy("always-local")}
    grid = run_grid(w, pols, list(range(1, 9)), [1.0], base, st)
    p95 = {c["replicas"]: c["short_step_latency_s_p95"] for c in grid["scorecards"]}
    slo_s = sorted(p95.values())[3]  # a target some but not all counts hold
    brute = min(n for n, v in p95.items() if v <= slo_s)
    calls: list[int] = []

    def counting_map(f, xs):
        xs = list(xs)
        calls.append(len(xs))
        return map(f, xs)

    out = find(w, pols, base, st, SLO(short_p95_s=slo_s), max_replicas=8, start=1, map=counting_map)
    (e,) = out["results"]
    assert e["replicas"] == brute and e["short_step_latency_s_p95"] == pytest.approx(p95[brute])
    assert out["simulations"] == e["simulations"] == sum(calls) < 8
    json.dumps(out, allow_nan=False)


def test_point_is_a_pure_function_of_its_inputs() -> None:
    w, st = many_runs(6)
    pt = Point(w, SimConfig(profile=PROF, frontier=FRONT, replicas=1), lambda: Fixed("local-0"), "x", st)
    a, b = simulate_point(pt), simulate_point(pt)
    assert a.scorecard == b.scorecard
    seen: list = []
    assert [r.scorecard for r in run_points([pt, pt], progress=seen.append)] == [a.scorecard] * 2
    assert len(seen) == 2


def test_capacity_check_figures_are_the_cost_model_over_the_horizon() -> None:
    steps, runs = frame([[(3000, 51, 0.0, None, None)], [(3000, 51, 0.0, None, None)]], starts=[0.0, 100.0])
    w = Workload.from_frames(steps, runs)
    st = run_starts("trace", 2, logged_starts=w.logged_starts())
    cfg = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0)
    chk = capacity_check(w, st, cfg, [1, 2])
    assert chk["horizon_s"] == 100.0
    assert chk["offered_prefill_tokens_per_s"] == pytest.approx(60.0)
    assert chk["offered_decode_tokens_per_s"] == pytest.approx(1.0)
    pre = prefill_s(PROF, [(3000, 0)]) - PROF.a - PROF.e
    assert chk["capacity_prefill_tokens_per_s"] == pytest.approx(3000 / pre, rel=1e-6)
    n = min(PROF.max_num_seqs, int(cfg.kv_blocks() * 512 // 3025))
    per_tok = PROF.d * 3025 + (PROF.a + PROF.e * n) / n
    assert chk["decode_batch_at_full_kv"] == n
    assert chk["load_factor_1_replica"] == pytest.approx((2 * pre + 100 * per_tok) / 100, abs=1e-4)
    assert warning_lines(chk) == []  # far below capacity
    hot = capacity_check(w, st * 1e-4, cfg, [1, 2])  # the same work in 10 ms
    lines = warning_lines(hot, slo_short_s=0.01)
    assert any("capacity of 1 replica" in x for x in lines) and any("out of reach" in x for x in lines)


MOONCAKE = sample_path("mooncake_20min.parquet")


def test_cli_find_prints_fewest_replicas_simulations_and_the_overload_warning(tmp_path) -> None:
    from typer.testing import CliRunner

    from runroute.cli import _typer_app

    out_json, out_png = tmp_path / "f.json", tmp_path / "f.png"
    args = ["whatif", "--runs", str(MOONCAKE), "--limit-runs", "150", "--speedup", "4", "--gpu", "h100"]
    args += ["--replicas", "1", "--policy", "always-local,always-frontier", "--slo", "short_p95=30s"]
    args += ["--find", "replicas", "--max-replicas", "16", "--json", str(out_json), "--plot", str(out_png)]
    r = CliRunner().invoke(_typer_app, args)
    assert r.exit_code == 0, r.output
    assert "capacity pre-check" in r.output and "WARNING: offered load is" in r.output
    assert "simulations" in r.output and "fewest replicas" in r.output
    data = json.loads(out_json.read_text())
    by = {e["policy"]: e for e in data["results"]}
    assert by["always-frontier"]["replicas"] == 0 and by["always-frontier"]["frontier_only"]
    assert by["always-local"]["simulations"] >= 1 and data["capacity_check"]["per_replicas"][0]["overloaded"]
    assert out_png.read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(_typer_app, ["whatif", "--runs", str(MOONCAKE), "--find", "replicas"])
    assert "--find needs --slo" in str(bad.exception)  # the CLI's one-line error (exit 2 via runroute.cli)


def test_prompt_lookup_measurement_follows_vllm_ngram_semantics(tmp_path) -> None:
    sim = Sim(3, {})
    sim.extend([1, 2, 3, 4, 2])
    assert sim.matches()[2] == -1 and sim.matches()[1] == 1  # "2" first ended at index 1
    # vLLM's docstring example: [1,2,3,4,2,3] min 2 max 3 k 4 proposes [4,2,3]
    r = measure_step(Sim(3, {}), [1, 2, 3, 4, 2, 3, 4, 2, 3, 4], [(2, 3, 4)])
    assert r == [{"iterations": 6, "drafted": 1, "proposed": 3, "accepted": 3}]
    assert pretokens('{"user_id": "mia_li_3668"}')[:4] == ['{"', "user", "_id", '":']
    traj = [
        {
            "traj": [
                {"role": "system", "content": "policy"},
                {"role": "user", "content": "my id is abc_def_123 please"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "get", "arguments": '{"id": "abc_def_123"}'}}],
                },
                {"role": "tool", "content": "ok"},
                {"role": "assistant", "content": "done"},
            ]
        }
    ]
    f = tmp_path / "taubench" / "x-airline.json"
    f.parent.mkdir()
    f.write_text(json.dumps(traj))
    m = measure([f], [(1, 3, 4)])
    kinds = m["totals"][0]
    assert kinds["tool_call"]["steps"] == 1 and kinds["free_text"]["steps"] == 1
    assert kinds["tool_call"]["accepted"] > 0  # the id is copied from the user's message
    assert kinds["tool_call"]["accepted"] <= kinds["tool_call"]["proposed"]
    assert kinds["tool_call"]["iterations"] < kinds["tool_call"]["output_tokens"] - 1


def test_shipped_acceptance_file_has_provenance_and_both_kinds() -> None:
    from router.sim.specdec import ACCEPTANCE_FILE, load_acceptance

    obj = load_acceptance()
    assert ACCEPTANCE_FILE.name in str(ACCEPTANCE_FILE) and obj["provenance"]["data"]
    c = obj["configs"][obj["default"]]
    for kd in ("tool_call", "free_text"):
        k = c["kinds"][kd]
        assert k["steps"] > 100 and 0 < k["accepted"] <= k["proposed"]
        assert k["tokens_per_iteration"] == pytest.approx(
            (k["output_tokens"] - k["steps"]) / k["iterations"], abs=1e-3
        )
    assert np.isfinite(c["kinds"]["tool_call"]["acceptance_rate"])


def test_find_replicas_then_kv_shrinks_the_kv_to_the_smallest_that_still_holds() -> None:
    w, st = many_runs(12)
    base = SimConfig(profile=PROF, frontier=FRONT)
    pols = {"always-local": lambda: build_policy("always-local")}
    ladder = [0.001, 0.002, 0.004, 0.008, 0.016, 1.0]  # GB: 2 .. 1953 blocks of 512 tokens
    out = find(
        w, pols, base, st, SLO(short_p95_s=30.0), dimension="replicas,kv", kv_cache_gb=[1.0],
        max_replicas=4, start=1, kv_values=ladder,
    )  # fmt: skip
    (rep,) = out["results"]
    (kv,) = out["kv_at_fewest_replicas"]
    assert rep["replicas"] == kv["replicas"] == 1 and kv["found"] == "kv"
    assert kv["kv_cache_gb"] is not None and kv["kv_cache_gb"] < 1.0
    probes = {p["value"]: p["holds"] for p in kv["probes"]}
    lower = [v for v in ladder if v < kv["kv_cache_gb"]]
    assert not lower or probes[lower[-1]] is False  # the next smaller size was simulated and failed
    assert out["simulations"] == rep["simulations"] + kv["simulations"]


def test_find_with_disaggregation_searches_the_total_above_the_prefill_pool_and_matches_the_grid() -> None:
    """--find replicas with P prefill replicas: probes only P+1.., the answer equals the brute-force
    grid's fewest disaggregated count holding an ITL target, and each result says its P."""
    from dataclasses import replace

    w, st = many_runs()
    base = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0, replicas=2, disagg_prefill=1)
    pols = {"always-local": lambda: build_policy("always-local")}
    itl = {}
    for n in range(2, 9):
        pt = Point(
            w,
            replace(base, replicas=n),
            pols["always-local"],
            "x",
            st,
            slo=parse_slo("itl_p95=3600s"),
            n_boot=20,
        )
        itl[n] = simulate_point(pt).details["slo"]["itl_p95"]["hi"]  # the search answers on the upper bound
    target = sorted(itl.values())[3]
    brute = min(n for n, v in itl.items() if v <= target)
    out = find(w, pols, base, st, parse_slo(f"itl_p95={target}s"), max_replicas=8, start=1, n_boot=20)
    (e,) = out["results"]
    assert e["disagg_prefill"] == 1 and e["searched"] == [2, 8]
    assert all(p["value"] >= 2 for p in e["probes"])
    assert e["replicas"] == brute and e["interval_at_answer"]["itl_p95"]["hi"] <= target
    with pytest.raises(SimError, match="prefill"):
        find(w, pols, base, st, parse_slo("itl_p95=1s"), max_replicas=1)


def test_disaggregated_and_co_located_are_variants_of_one_search() -> None:
    """--disagg-prefill 0,1: each variant searched in the same call gives the answer its own search
    gives, names its variant, and a pair whose ranges overlap (or that answer alike) is reported."""
    from dataclasses import replace

    from router.sim.search import indistinguishable

    w, st = many_runs()
    base = SimConfig(profile=PROF, frontier=FRONT, kv_cache_gb=1.0, replicas=2)
    pols = {"always-local": lambda: build_policy("always-local")}
    slo = parse_slo("ttft_p95=0.6s")
    both = find(w, pols, base, st, slo, max_replicas=8, start=1, n_boot=20, disagg_variants=(0, 1))
    co, dis = both["results"]
    assert (co["variant"], dis["variant"]) == ("co-located", "disaggregated P=1")
    assert both["disagg_variants"] == [0, 1]
    for e, p in ((co, 0), (dis, 1)):
        alone = find(w, pols, replace(base, disagg_prefill=p), st, slo, max_replicas=8, start=1, n_boot=20)
        (a,) = alone["results"]
        assert (a["replicas"], a["optimistic"], a["disagg_prefill"]) == (e["replicas"], e["optimistic"], p)

    # the pairs: across variants, an equal answer is a pair; within one variant it is not
    def r(n, opt, p):
        return {"policy": "a", "kv_cache_gb": 1.0, "replicas": n, "optimistic": opt, "found": "replicas",
                "disagg_prefill": p}  # fmt: skip

    (pair,) = indistinguishable([r(8, 7, 0), r(8, 8, 2)])
    assert pair["same_answer"] and (pair["a"]["disagg_prefill"], pair["b"]["disagg_prefill"]) == (0, 2)
    assert indistinguishable([r(8, 7, 0), r(8, 8, 0)]) == []
    assert indistinguishable([r(6, 6, 0), r(8, 8, 2)]) == []
    assert not indistinguishable([r(7, 6, 0), r(8, 7, 2)])[0]["same_answer"]


def test_cli_disagg_variants_need_find_and_are_named_in_the_answer(tmp_path) -> None:
    from typer.testing import CliRunner

    from runroute.cli import _typer_app

    base = ["whatif", "--runs", str(MOONCAKE), "--limit-runs", "60", "--policy", "always-local"]
    for flag, msg in (("0,2", "needs --find"), ("x", "integers")):
        r = CliRunner().invoke(_typer_app, [*base, "--disagg-prefill", flag])
        assert r.exit_code != 0 and msg in str(r.exception)
    out = tmp_path / "v.json"
    args = [*base, "--slo", "ttft_p95@<=8k=5s", "--find", "replicas", "--max-replicas", "12"]
    r = CliRunner().invoke(_typer_app, [*args, "--disagg-prefill", "0,1", "--boot", "20", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "always-local (co-located)" in r.output and "always-local (disaggregated P=1)" in r.output
    data = json.loads(out.read_text())
    assert [e["variant"] for e in data["results"]] == ["co-located", "disaggregated P=1"]
    assert data["inputs"]["disagg_prefill"] == [0, 1]
