"""Smoke test of the demo pipeline on a tiny slice (no live segment, no MLflow), and of `runroute bench`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from features.runlog import read_runlog
from runroute.demo import DemoConfig, LiveSettings, SimSettings, run_demo
from training.eval.compare import POLICIES
from training.eval.loop import LoopStage
from training.eval.scorecard import Scorecard


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "report"
    cfg = DemoConfig(
        out=out,
        synthetic_train_runs=120,
        synthetic_holdout_runs=40,
        limit_tau2_tasks=12,
        limit_taubench_runs=30,
        n_estimators=10,
        mlflow=False,
        sweep_thresholds=[0.0, 0.5, 1.0],
        sweep_train_quantiles=1,
        live=LiveSettings(enabled=False),
        loop=LoopStage(days=1, runs_per_day=20, mlflow=False),
        sim=SimSettings(arrival_rate=0.2),
        busy_arrival_rate=1.0,
    )
    card = run_demo(cfg)
    return out, card


def test_demo_writes_report_scorecard_and_plots(demo_out):
    out, card = demo_out
    for name in ("report.md", "scorecard.json"):
        assert (out / name).stat().st_size > 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 10 and all((out / p).stat().st_size > 5000 for p in pngs)
    assert "budget_curve.png" in pngs  # the budget stage's curve (training.eval.budget_plot)
    budget = json.loads((out / "budget.json").read_text())
    assert set(budget["domains"]) == {"airline", "retail", "telecom"}
    assert all(abs(d["realised_share"] - 0.2) <= 0.05 for d in budget["domains"].values())
    on_disk = json.loads((out / "scorecard.json").read_text())
    assert set(on_disk["sets"]) == {"tau2-airline-heldout", "synthetic-heldout", "synthetic-heldout-busy"}
    assert on_disk["sets"]["synthetic-heldout-busy"]["sim"]["arrival_rate"] == 1.0
    md = (out / "report.md").read_text()
    for heading in (
        "## What was run",
        "## Outcome model",
        "### Sensitivity",
        "vs always-local",
        "## scorecard.json keys",
    ):
        assert heading in md
    assert "skipped: disabled" in md  # the live segment says why it is missing
    for t in on_disk["split"]["tau2_heldout_tasks"]:
        assert t in md  # the report names exactly what was held out


def test_scorecard_on_disk_is_exactly_the_typed_model(demo_out):
    out, card = demo_out
    on_disk = json.loads((out / "scorecard.json").read_text())
    assert on_disk == card
    # every key written is a typed, documented field (extra keys are refused) and nothing is lost
    assert Scorecard.model_validate(on_disk).to_json_dict() == on_disk
    assert {"split", "run_level_pairs", "import_summary", "config"} <= set(
        on_disk
    ) and "bad_rows" not in on_disk
    for s in on_disk["sets"].values():
        assert "model_scores" in s
        rows = {r["policy"]: r for r in s["policies"]}
        assert "thresholds" in rows["learned"] and "thresholds" not in rows["always-local"]


def test_split_is_by_task_and_never_leaks(demo_out):
    out, card = demo_out
    held = set(card["split"]["tau2_heldout_tasks"])
    assert held and not held & set(card["split"]["tau2_train_tasks"])
    train = read_runlog([str(out / "data" / "train.parquet")]).runs
    tau = train[train["source"].isin(["tau2bench", "taubench"])]
    assert not set(tau["task_id"].astype(str)) & held
    hold = read_runlog([str(out / "data" / "holdout_tau2.parquet")]).runs
    assert set(hold["task_id"].astype(str)) == held
    assert hold["strong_outcome"].notna().all()
    assert not set(hold["run_id"]) & set(train["run_id"])


def test_every_policy_is_scored_with_sane_invariants(demo_out):
    out, card = demo_out
    for s in card["sets"].values():
        rows = {r["policy"]: r for r in s["policies"]}
        assert list(rows) == list(POLICIES)
        assert rows["always-local"]["escalation_rate"] == 0.0
        assert rows["session-sticky"]["escalation_rate"] == 0.0
        assert rows["always-frontier"]["escalation_rate"] == 1.0
        assert rows["always-frontier"]["needs_frontier_recall"] in (1.0, None)
        assert rows["oracle"]["needs_frontier_precision"] in (1.0, None)
        assert rows["always-local"]["cost_usd"] < rows["always-frontier"]["cost_usd"]
        # the oracle never loses success against either end (base model: escalating only needs-frontier runs)
        assert rows["oracle"]["success_rate"] >= max(rows["always-local"]["success_rate"] - 1e-9, 0)
        assert rows["always-local"]["aiq"] == pytest.approx(rows["always-local"]["success_rate"], abs=1e-3)
        for r in rows.values():
            assert 0 <= r["success_rate"] <= 1 and r["cost_usd"] >= 0
            assert set(r["success_by_variant"]) == set(card["outcome_variants"])
        swept = [p["threshold"] for p in s["sweeps"]["learned"]]
        assert swept == card["training"]["sweep_thresholds"] and {0.0, 0.5, 1.0} <= set(swept)
        assert len(swept) == 5  # + the training median of per-run max P and a point just above it
        # raising the threshold never raises the learned policy's escalation rate
        esc = [p["escalation_rate"] for p in s["sweeps"]["learned"]]
        assert all(a >= b - 1e-12 for a, b in zip(esc, esc[1:], strict=False))


def test_always_local_success_equals_the_weak_models_logged_rate(demo_out):
    out, card = demo_out
    hold = read_runlog([str(out / "data" / "holdout_tau2.parquet")]).runs
    weak = float((hold["outcome"] == "success").mean())
    strong = float((hold["strong_outcome"] == "success").mean())
    rows = {r["policy"]: r for r in card["sets"]["tau2-airline-heldout"]["policies"]}
    assert rows["always-local"]["success_rate"] == pytest.approx(weak)
    assert rows["always-frontier"]["success_rate"] == pytest.approx(strong)


def test_bench_cli_on_the_held_out_log(demo_out, tmp_path):
    from runroute.cli import _typer_app

    out, _ = demo_out
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    res = CliRunner().invoke(
        _typer_app,
        [
            "bench",
            "--runs",
            str(out / "data" / "holdout_tau2.parquet"),
            "--bundle",
            str(out / "bundle"),
            "--json",
            str(js),
            "--plot",
            str(png),
            "--sweep",
            "0,1",
        ],
    )
    assert res.exit_code == 0, res.output
    card = json.loads(js.read_text())
    assert Scorecard.model_validate(card).to_json_dict() == card
    assert card["command"] == "runroute bench" and card["bad_rows"] == 0 and "split" not in card
    (s,) = card["sets"].values()
    assert [r["policy"] for r in s["policies"]] == list(POLICIES)
    assert png.stat().st_size > 5000
    assert np.isfinite(s["policies"][0]["cost_usd"])
    # bench --json scores the bundle's predictors on the set (the README documents it; issue 14)
    assert 0.0 <= s["model_scores"]["escalation"]["brier"] <= 1.0 and s["model_scores"]["n_steps"] > 0


def test_bench_cli_refuses_bad_input_in_one_line(tmp_path):
    from runroute.cli import _typer_app

    res = CliRunner().invoke(
        _typer_app,
        [
            "bench",
            "--runs",
            str(tmp_path / "nope.parquet"),
            "--bundle",
            str(tmp_path),
            "--json",
            str(tmp_path / "x.json"),
        ],
    )
    assert res.exit_code != 0
    assert "run log not found" in str(res.exception or res.output)


@pytest.mark.slow
def test_live_segment_through_the_sidecar(demo_out, tmp_path):
    from training.eval.live import live_segment
    from training.eval.outcome import Prices

    out, _ = demo_out
    log = read_runlog([str(out / "data" / "holdout_synthetic.parquet")])
    live = live_segment(
        log.runs,
        log.steps,
        bundle_dir=out / "bundle",
        prices=Prices(),
        live=LiveSettings(runs_per_policy=2, max_steps=3, budget_s=30),
        log_dir=tmp_path / "logs",
        policies=["always-local", "always-frontier", "session-sticky", "learned", "oracle"],
    )
    seg = live.model_dump()  # a typed LiveSegment (a Skipped would have no "policies")
    pol = seg["policies"]
    assert "oracle" not in pol  # no labels on the live request path
    assert pol["always-local"]["escalation_rate"] == 0.0 and pol["always-local"]["errors"] == 0
    assert pol["always-frontier"]["escalation_rate"] == 1.0
    assert pol["always-local"]["steps"] == 6
    # session-sticky keeps a run on one replica, so its growing prompt hits that replica's prefix cache
    assert pol["session-sticky"]["cache_hit_rate"] > 0.5
    assert pol["session-sticky"]["cache_hit_rate"] <= pol["session-sticky"]["cache_hit_upper_bound"] + 1e-9
    assert not seg["driver_errors"]
