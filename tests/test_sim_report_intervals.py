"""Every figure of the report's speculative-decoding panel and break-even heatmap carries an interval
(issue 28): the JSON each panel is drawn from holds lo <= value <= hi per figure, comparisons are
paired replicate by replicate, and the drawn panels show the intervals."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from features.runlog import read_runlog
from features.samples import sample_path
from router.policy.config import build_policy
from router.sim.arrivals import run_starts
from router.sim.breakeven import (
    SweepConfig,
    breakeven_figure,
    bursty_starts,
    plot_breakeven,
    sweep,
    synthetic,
    trace_cells,
)
from router.sim.points import Point, simulate_point
from router.sim.profiles import load_profile
from router.sim.scorecard import details
from router.sim.simconfig import SimConfig
from router.sim.simulator import Simulator
from router.sim.slo import goodput_key, measure_goodput, overlap, paired
from router.sim.specdec import eagle
from router.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
PROF = load_profile(None, "a100")
BASE = SimConfig(profile=PROF, kv_cache_gb=PROF.default_kv_cache_gb() or 16.0)


def _report_module() -> Any:
    spec = importlib.util.spec_from_file_location("whatif_report", ROOT / "bench" / "whatif_report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["whatif_report"] = mod
    spec.loader.exec_module(mod)
    return mod


def _pp(x: float) -> str:
    v = 100 * x
    if abs(v) < 0.05:
        return "0"
    return f"{v:+.1f}" if abs(v) < 1 else f"{round(v):+d}"


def _within(m: dict[str, Any]) -> None:
    assert m["lo"] is not None and m["hi"] is not None, m
    assert m["lo"] <= m["value"] <= m["hi"], m


# ------------------------------------------------------------------------------------ the machinery
def test_goodput_share_measured_is_the_scorecards_and_its_replicates_pair_by_draw() -> None:
    work = synthetic(2048, 40, (100, 300), seed=1)
    starts = bursty_starts(40, 3.0, 1.0, seed=1)
    cfg = replace(BASE, replicas=1, slo_ttft_s=1.0, slo_tpot_s=0.02)
    res = Simulator(work, build_policy("always-local"), cfg, starts).run()
    m = measure_goodput(res, ((1.0, 0.02), (1.0, 10.0)), n_boot=40, boot_seed=3)
    tight, loose = m[goodput_key(1.0, 0.02)], m[goodput_key(1.0, 10.0)]
    assert tight["value"] == pytest.approx(details(res)["goodput_share"], abs=1e-6)
    assert len(tight["raw"]) == 40 and len(tight["boot"]) == 40
    # the same draws: a looser TPOT target holds at least the tight one's share in every replicate
    assert np.all(loose["raw"] >= tight["raw"] - 1e-12)
    assert 0.0 < tight["value"] < 1.0 and np.ptp(tight["raw"]) > 0  # a real spread, not a point


def test_paired_comparison_of_a_simulation_with_itself_has_no_spread_and_overlap_rules() -> None:
    a = [
        {"value": 2.0, "raw": np.array([1.5, 2.5, np.nan, 2.0])},
        {"value": 3.0, "raw": np.array([3.0, 2.0, 4.0, 1.0])},
    ]
    b = [
        {"value": 1.0, "raw": np.array([1.0, 1.0, 1.0, 2.0])},
        {"value": 1.5, "raw": np.array([1.0, 1.0, 2.0, 1.0])},
    ]
    same = paired(a, a, lambda x, y: x / y)
    assert same == {"value": 1.0, "lo": 1.0, "hi": 1.0}
    sp = paired(a, b, lambda x, y: x / y, level=1.0)  # level 1: the min and max of all ratios
    ratios = [2.0, 2.0, 1.5, 2.5, 1.0, 3.0, 2.0, 2.0, 1.0]  # the seeds' values, then the finite pairs
    assert sp == {"value": 2.0, "lo": min(ratios), "hi": max(ratios)}
    assert (
        paired([{"value": None, "raw": np.array([])}], [{"value": 1.0, "raw": np.array([])}], lambda x, y: x)[
            "value"
        ]
        is None
    )
    assert overlap({"lo": 1, "hi": 2}, {"lo": 2, "hi": 3}) is True
    assert overlap({"lo": 1, "hi": 2}, {"lo": 2.1, "hi": 3}) is False
    assert overlap({"lo": None, "hi": None}, {"lo": 1, "hi": 2}) is None


def test_a_point_keeps_each_seeds_replicates_only_when_asked() -> None:
    work = synthetic(2048, 30, (50, 100), seed=2)
    starts = bursty_starts(30, 2.0, 1.0, seed=2)
    more = (bursty_starts(30, 2.0, 1.0, seed=3),)
    pol = lambda: build_policy("always-local")  # noqa: E731
    kw = {"seed_starts": more, "n_boot": 25, "goodput": ((2.0, 0.05),)}
    kept = simulate_point(
        Point(work, replace(BASE, replicas=1), pol, "p", starts, keep_replicates=True, **kw)
    )
    plain = simulate_point(Point(work, replace(BASE, replicas=1), pol, "p", starts, **kw))
    assert len(kept.replicates) == 2 and plain.replicates == []
    assert {"ttft_p95", goodput_key(2.0, 0.05)} <= set(kept.replicates[0])
    assert all(len(s["ttft_p95"]["raw"]) == 25 for s in kept.replicates)
    assert kept.details["goodput"] == plain.details["goodput"]  # keeping replicates changes no figure
    assert kept.details["intervals"] == plain.details["intervals"]
    assert "raw" not in kept.details["goodput"][goodput_key(2.0, 0.05)]  # no replicates in the JSON


# ------------------------------------------------------------------------------- break-even heatmap
@pytest.fixture(scope="module")
def breakeven() -> dict[str, Any]:
    sc = SweepConfig(
        gpus=2, contexts=(2048, 16384), burstiness=(1.0,), link_gbps=(1.0, 50.0), requests=40,
        tpot_slo_s=(0.1, 0.02), seeds=2, n_boot=40,
    )  # fmt: skip
    be = sweep(BASE, sc)
    w = synthetic(4096, 30, (100, 200), seed=5)
    be["trace"] = trace_cells(
        w, bursty_starts(30, 2.0, 1.0, 5), replace(BASE, slo_ttft_s=2.0, slo_tpot_s=0.05), 2, [1], (1.0, 50.0),
        "synthetic-trace", n_boot=40,
    )  # fmt: skip
    return be


def test_breakeven_every_figure_has_an_interval_around_its_value(breakeven: dict[str, Any]) -> None:
    rows = breakeven["rows"]
    assert len(rows) == 2 * 1 * 2 * 2  # contexts x CV x TPOT SLOs x links
    # the TPOT rows share the simulations: (co-located + 1 split x 2 links) x 2 cells x 2 seeds
    assert breakeven["simulations"] == 3 * 2 * 2
    spread = 0
    for r in rows + breakeven["trace"]["rows"]:
        for side in (r["colocated"], r["disagg_best"]):
            for key in ("goodput_share", "ttft_s_p95", "tpot_s_p95", "step_latency_s_p95"):
                m = side["intervals"][key]
                _within(m)
                assert side[key] == m["value"]
                spread += m["hi"] > m["lo"]
        g = r["goodput_gain_interval"]
        _within(g)
        assert r["goodput_gain"] == g["value"]
        assert r["winner"] == (
            "indistinguishable"
            if g["lo"] <= 0 <= g["hi"]
            else "disaggregated"
            if g["value"] > 0
            else "co-located"
        )
        assert isinstance(r["intervals_overlap"], bool)
    assert spread > 0  # intervals measured, not value = lo = hi everywhere
    assert breakeven["trace"]["rows"][0]["seeds"] == 1


def test_breakeven_tpot_rows_score_one_simulation(breakeven: dict[str, Any]) -> None:
    for L in (2048, 16384):
        loose, tight = (
            next(r for r in breakeven["rows"] if r["context_tokens"] == L and r["slo_tpot_s"] == t and r["link_gbps"] == 1.0)
            for t in (0.1, 0.02)
        )  # fmt: skip
        assert loose["colocated"]["ttft_s_p95"] == tight["colocated"]["ttft_s_p95"]
        assert loose["colocated"]["goodput_share"] >= tight["colocated"]["goodput_share"]


def test_breakeven_picture_draws_each_cells_interval(breakeven: dict[str, Any], tmp_path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    fig = breakeven_figure(breakeven)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    for r in breakeven["rows"]:
        g = r["goodput_gain_interval"]
        assert any(f"[{_pp(g['lo'])}, {_pp(g['hi'])}]" in t for t in texts), g
    trace_ax = next(ax for ax in fig.axes if ax.get_title().startswith("synthetic-trace on 2 GPUs"))
    bars = [c for c in trace_ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2 * len(breakeven["trace"]["rows"])
    hatched = sum(1 for ax in fig.axes for p in ax.patches if p.get_hatch())
    assert hatched == sum(r["winner"] == "indistinguishable" for r in breakeven["rows"])
    plt.close(fig)
    p = plot_breakeven(breakeven, tmp_path / "be.png")
    assert p.stat().st_size > 10_000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------- speculative decoding panel
def test_spec_rows_carry_paired_speedups_with_intervals_and_the_panel_draws_them(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    rep = _report_module()
    w = Workload.from_runlog(read_runlog([sample_path("taubench_airline.parquet")]), limit_runs=25)
    st = run_starts("rate=0.05", len(w.runs), seed=0)
    more = (run_starts("rate=0.05", len(w.runs), seed=1),)
    modes = {"off": None, "eagle-0.8": eagle(0.8), "eagle-0.01": eagle(0.01)}
    from router.sim.slo import SLO, Target

    ps = [
        Point(
            w,
            replace(BASE, replicas=1, spec=m),
            lambda: build_policy("always-local"),
            name,
            st,
            tag="t",
            slo=SLO(targets=(Target("run", 50.0, 1.0),)),
            seed_starts=more,
            n_boot=40,
            keep_replicates=True,
        )  # fmt: skip
        for name, m in modes.items()
    ]
    rows = rep.spec_table("taubench_airline.parquet", 0.05, ps, [simulate_point(p) for p in ps], 0.9)
    off, fast, slow = rows
    for r in rows:
        for fig, (_, name) in rep.SPEC_FIGURES.items():
            _within(r["intervals"][fig])
            _within(r[name + "_interval"])
            assert r[name] == r[name + "_interval"]["value"]
    # plain decoding against itself: a speed-up of exactly 1 with no spread (the pairing is exact)
    assert all(
        off[n + "_interval"] == {"value": 1.0, "lo": 1.0, "hi": 1.0} for _, n in rep.SPEC_FIGURES.values()
    )
    assert fast["speedup_short_step_p95_interval"]["lo"] > 1.0 and fast["indistinguishable"] == []
    for r in (fast, slow):  # measured intervals, not value = lo = hi
        assert all(r[n + "_interval"]["hi"] > r[n + "_interval"]["lo"] for _, n in rep.SPEC_FIGURES.values())
        assert all(r["intervals"][f]["hi"] > r["intervals"][f]["lo"] for f in rep.SPEC_FIGURES)
    for r in (fast, slow):
        assert r["indistinguishable"] == [
            f
            for f, (_, n) in rep.SPEC_FIGURES.items()
            if r[n + "_interval"]["lo"] <= 1.0 <= r[n + "_interval"]["hi"]
        ]
    fig, ax = plt.subplots()
    rep.plot_spec(ax, {"rows": rows, "seeds": 2, "interval_level": 0.9})
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2 * 2  # per non-plain mode: the short-step bars' and the run p50 markers' errors
    lo, hi = bars[0].lines[2][0].get_segments()[0][:, 1]  # the first bar's error segment
    i = fast["speedup_short_step_p95_interval"]
    assert (lo, hi) == pytest.approx((i["lo"], i["hi"]))
    plt.close(fig)


# ------------------------------------------------------------------------------------ the grid plot
def test_grid_plot_draws_the_latency_and_hit_rate_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from router.sim.report import plot

    cards, dets = [], []
    for n in (1, 2):
        cards.append(
            {"policy": "p", "replicas": n, "kv_cache_gb": 8.0, "short_step_latency_s_p95": 4.0 / n,
             "cost_usd": 1.0 * n, "cache_hit_rate": 0.5, "cache_hit_upper_bound": 0.8}
        )  # fmt: skip
        dets.append(
            {"interval_level": 0.9, "intervals": {"short_step_latency_s_p95": {"value": 4.0 / n, "lo": 3.0 / n, "hi": 6.0 / n},
             "cache_hit_rate": {"value": 0.5, "lo": 0.4, "hi": 0.55}}}
        )  # fmt: skip
    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to read it back
    p = plot({"scorecards": cards, "details": dets, "answers": {"slo_short_step_s": 2.0}}, tmp_path / "g.png")
    assert p.stat().st_size > 10_000
    ax1, _, ax3 = kept[0].axes
    (lat,) = [c for c in ax1.containers if isinstance(c, ErrorbarContainer)]
    segs = lat.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segs] == [pytest.approx((3.0, 6.0)), pytest.approx((1.5, 3.0))]
    (hit,) = [c for c in ax3.containers if isinstance(c, ErrorbarContainer)]
    assert tuple(hit.lines[2][0].get_segments()[0][:, 1]) == pytest.approx((40.0, 55.0))
    assert "90% interval" in ax1.get_ylabel()
