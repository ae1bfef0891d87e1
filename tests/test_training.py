"""Training: dataset labels, cache replay, grouped splits, calibration, thresholds, the job + MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from features.runlog import RunLog, read_runlog, records_to_frame, write_frame
from features.schema import Run, Step
from training.calibration import choose_thresholds, expected_calibration_error, reliability_curve
from training.dataset import build_dataset, lru_replay
from training.evaluate import assign_folds, binary_metrics
from training.train import TrainConfig, holdout_mask, run_training


def _log(n_runs: int = 40, seed: int = 0) -> list:
    """Small run log with a planted signal: failing runs hit tool errors and repeat calls."""
    rng = np.random.default_rng(seed)
    recs: list = []
    t = 0.0
    for r in range(n_runs):
        task = f"task{r % 12}"
        bad = bool(rng.random() < 0.45)
        n = int(rng.integers(3, 8)) + (3 if bad else 0)
        recs.append(
            Run(
                run_id=f"run{r}",
                source="toy",
                task_id=task,
                model="weak",
                outcome="failure" if bad else "success",
                needs_frontier=bad,
            )
        )
        prompt = 1000
        for k in range(n):
            err = bad and rng.random() < 0.5
            key = "same" if (bad and k % 2) else f"k{k}"
            recs.append(
                Step(
                    run_id=f"run{r}",
                    step=k,
                    arrival_s=t,
                    tool_pause_s=None if k == 0 else 1.0,
                    prompt_tokens=prompt,
                    completion_tokens=20,
                    tool_calls=["lookup"],
                    tool_call_keys=[key],
                    tool_results_n=0 if k == 0 else 1,
                    tool_result_errors=[] if k == 0 else [err],
                    tool_result_tokens=[] if k == 0 else [50],
                    structured=True,
                    hash_ids=list(range(r * 100, r * 100 + prompt // 512 + 1)),
                )
            )
            prompt += 300
            t += 2.0
    return recs


@pytest.fixture(scope="module")
def log_path(tmp_path_factory) -> Path:
    return write_frame(records_to_frame(_log()), tmp_path_factory.mktemp("logs") / "toy.parquet")


def test_dataset_labels_come_from_the_whole_run(log_path):
    log = read_runlog(log_path)
    ds = build_dataset(log, cache_capacity_blocks=64)
    m = ds.meta
    assert len(ds) == len(log.steps) and ds.X.shape[1] > 40 and ds.n_runs == 40
    one = m[m["run_id"] == "run0"]
    n = len(one)
    assert one["y_rem_steps"].tolist() == [float(n - k) for k in range(n)]
    steps0 = log.steps[log.steps["run_id"] == "run0"]
    tok = (steps0["prompt_tokens"] + steps0["completion_tokens"]).to_numpy(dtype=float)
    np.testing.assert_allclose(one["y_rem_tokens"].to_numpy(), np.cumsum(tok[::-1])[::-1])
    assert set(m["y_frontier"].unique()) <= {0.0, 1.0}
    assert (m.groupby("run_id")["y_frontier"].nunique() == 1).all()
    assert m["group"].str.startswith("task").all()
    assert m["y_cache"].notna().all()  # replayed from hash_ids
    assert ds.sha256() == build_dataset(log, cache_capacity_blocks=64).sha256()


def test_lru_replay_depends_on_cache_pressure():
    # run A: two steps sharing blocks 1-3; between them run B writes blocks 10-19
    hashes = [[1, 2, 3], list(range(10, 20)), [1, 2, 3, 4]]
    runs = ["A", "B", "A"]
    prompt = np.array([1536, 5120, 2048])
    big_hits, big_p = lru_replay(hashes, runs, prompt, capacity_blocks=100, block_tokens=512)
    small_hits, small_p = lru_replay(hashes, runs, prompt, capacity_blocks=8, block_tokens=512)
    assert big_hits.tolist() == [0, 0, 3 * 512]
    assert small_hits.tolist() == [0, 0, 0]  # evicted by B's 10 blocks
    assert np.isnan(big_p[0]) and big_p[2] == pytest.approx(10 / 100) and small_p[2] == 1.0
    with pytest.raises(ValueError, match=">= 1 block"):
        lru_replay(hashes, runs, prompt, capacity_blocks=0, block_tokens=512)


def test_logged_cached_tokens_win_over_replay_and_logged_request_fields_are_used():
    from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, N_FEATURES

    feats = [0.0] * N_FEATURES
    feats[FEATURE_NAMES.index("new_n_tools_offered")] = 7
    feats[FEATURE_NAMES.index("local_cache_pressure")] = 0.25
    recs = [
        Run(run_id="a", source="router", needs_frontier=False),
        Step(
            run_id="a",
            step=0,
            prompt_tokens=100,
            completion_tokens=5,
            cached_tokens=60,
            hash_ids=[1],
            feature_spec_version=FEATURE_SPEC_VERSION,
            features=feats,
        ),
        Run(run_id="b", source="router", needs_frontier=True),
        Step(
            run_id="b",
            step=0,
            prompt_tokens=100,
            completion_tokens=5,
            features=feats,
            feature_spec_version="fs-0",
        ),
    ]
    ds = build_dataset(RunLog.from_frame(records_to_frame(recs)))
    assert ds.meta["y_cache"].tolist()[0] == 60
    assert np.isnan(ds.meta["y_cache"].tolist()[1])
    x = ds.X[ds.meta["run_id"] == "a"][0]
    assert x[FEATURE_NAMES.index("new_n_tools_offered")] == 7
    assert x[FEATURE_NAMES.index("local_cache_pressure")] == 0.25
    xb = ds.X[ds.meta["run_id"] == "b"][0]  # another spec's vector is ignored
    assert xb[FEATURE_NAMES.index("new_n_tools_offered")] == 0


def test_grouped_splits_and_holdout_are_by_group():
    groups = np.repeat(np.array([f"g{i}" for i in range(30)], dtype=object), 5)
    y = np.repeat(np.arange(30) % 2, 5)
    fold = assign_folds(groups, y, 5, 0)
    for g in np.unique(groups):
        assert len(set(fold[groups == g])) == 1
    h = holdout_mask(groups, 0.3)
    for g in np.unique(groups):
        assert len(set(h[groups == g])) == 1
    assert 0 < h.mean() < 0.7
    np.testing.assert_array_equal(h, holdout_mask(groups[::-1], 0.3)[::-1])  # stable, order-free
    assert not holdout_mask(groups, 0.0).any()
    with pytest.raises(ValueError, match=">= 2 groups"):
        assign_folds(np.array(["a", "a"], dtype=object), np.array([0, 1]), 5, 0)


def test_calibration_metrics_and_thresholds():
    y = np.array([0, 0, 1, 1] * 25, dtype=float)
    assert expected_calibration_error(y, y) == 0.0
    assert expected_calibration_error(y, np.full(100, 0.5)) == pytest.approx(0.0)
    assert expected_calibration_error(y, np.full(100, 0.9)) == pytest.approx(0.4)
    rc = reliability_curve(y, np.full(100, 0.9))
    assert rc["count"].tolist() == [100] and rc["frac_pos"].tolist() == [0.5]
    m = binary_metrics(y, y * 0.8 + 0.1)
    assert m["auc"] == 1.0 and m["brier"] == pytest.approx(0.01)
    rng = np.random.default_rng(0)
    runs = np.repeat(np.arange(200), 4)
    p = rng.uniform(size=len(runs))
    th = {
        s: choose_thresholds(runs, np.tile(np.arange(4), 200), p, target_frontier_share=s)
        for s in (0.1, 0.3, 0.6)
    }
    for s, t in th.items():
        assert t["p_frontier_down"] <= t["p_frontier_up"]
        assert t["expected_frontier_share"] == pytest.approx(s, abs=0.02)
    assert th[0.1]["p_frontier_up"] >= th[0.3]["p_frontier_up"] >= th[0.6]["p_frontier_up"]
    with pytest.raises(ValueError, match="share"):
        choose_thresholds(runs, runs, p, target_frontier_share=1.5)


def test_train_job_logs_registers_and_promotes(log_path, tmp_path, monkeypatch):
    """The whole job on a tiny log, with MLflow in tmp_path: report, bundle, registry, alias."""
    from mlflow import MlflowClient

    from models.bundle import ModelBundle

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    common = dict(
        runs=[log_path],
        n_folds=3,
        calibration_cv=3,
        n_estimators=20,
        escalation_n_estimators=20,
        escalation_min_child_samples=10,
        min_child_samples=5,
        holdout_share=0.25,
    )
    cfg = TrainConfig(out=tmp_path / "b1", report_json=tmp_path / "r1.json", **common)
    res = run_training(cfg)
    rep = json.loads((tmp_path / "r1.json").read_text())
    for key in ("auc", "brier", "ece", "pr_auc"):
        assert 0 <= rep["escalation"][key] <= 1
    assert set(rep["escalation"]["baselines"]) == {"constant", "logreg_steps", "stall"}
    assert set(rep["escalation"]["per_step"]) == {"1", "3", "5"}
    assert rep["cache_reuse"]["mae_tokens"] >= 0 and "pinball_p50" in rep["remaining_steps"]
    assert rep["n_runs"] == 40 and rep["n_steps"] == len(res.dataset) + len(res.holdout)
    assert rep["feature_spec_version"] == "fs-2"
    assert rep["escalation"]["auc"] > 0.7  # the planted signal (errors, repeats) is learnable
    assert ModelBundle.load(tmp_path / "b1").version == rep["bundle_version"]
    mf = rep["mlflow"]
    assert mf["tracking_uri"] == uri and mf["promoted"] and mf["champion"] == "1"
    client = MlflowClient(tracking_uri=uri)
    assert str(client.get_model_version_by_alias("runroute-bundle", "champion").version) == "1"
    run = client.get_run(mf["run_id"])
    assert "escalation.auc" in run.data.metrics and "escalation.per_step.3.stall.brier" in run.data.metrics
    arts = {a.path for a in client.list_artifacts(mf["run_id"])}
    assert {"calibration.png", "feature_importance.png", "report.json"} <= arts
    reg = ModelBundle.load_registered("models:/runroute-bundle@champion", uri)
    assert reg.version == rep["bundle_version"]

    # a much weaker model (1 tree, no signal usable) must not take the alias with --promote-if-better
    weak = TrainConfig(
        out=tmp_path / "b2",
        promote_if_better=True,
        evaluate=False,
        **{**common, "escalation_n_estimators": 1, "escalation_num_leaves": 2, "calibration": "none"},
    )
    res2 = run_training(weak)
    assert res2.mlflow["version"] == "2"
    # refused by the baseline gate (issue 14): it must beat every baseline on held-out tasks by > SE
    assert not res2.mlflow["promoted"] and "does not beat every baseline" in res2.mlflow["promotion_reason"]
    assert all(b in res2.mlflow["promotion_reason"] for b in ("constant", "logreg_steps", "stall"))
    assert str(client.get_model_version_by_alias("runroute-bundle", "champion").version) == "1"
    # the champion's own config again (deterministic): an exact tie on the same holdout is not "better"
    res3 = run_training(TrainConfig(out=tmp_path / "b3", promote_if_better=True, evaluate=False, **common))
    assert res3.mlflow["champion_holdout"] == res3.report["holdout"]
    assert not res3.mlflow["promoted"]
    # without --promote-if-better a new version is registered and the alias stays (moves only on promotion)
    res4 = run_training(
        TrainConfig(out=tmp_path / "b4", evaluate=False, **{**common, "escalation_n_estimators": 1})
    )
    assert res4.mlflow["version"] == "4" and not res4.mlflow["promoted"]
    assert "--promote-if-better" in res4.mlflow["promotion_reason"]
    assert str(client.get_model_version_by_alias("runroute-bundle", "champion").version) == "1"


def test_cli_train_writes_bundle_and_report(log_path, tmp_path):
    from typer.testing import CliRunner

    from runroute.cli import _typer_app

    out, rep = tmp_path / "bundle", tmp_path / "report.json"
    r = CliRunner().invoke(
        _typer_app,
        [
            "train",
            "--runs",
            str(log_path),
            "-o",
            str(out),
            "--report-json",
            str(rep),
            "--no-mlflow",
            "--folds",
            "3",
            "--n-estimators",
            "20",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(rep.read_text())
    assert {
        "escalation",
        "cache_reuse",
        "remaining_steps",
        "n_runs",
        "n_steps",
        "feature_spec_version",
    } <= set(data)
    assert "bundle fs-2-" in r.output and (out / "manifest.json").exists()
    bad = CliRunner().invoke(
        _typer_app,
        ["train", "--runs", str(log_path), "-o", str(out), "--no-mlflow", "--target-frontier-share", "2"],
    )
    from runroute.cli import CliError

    assert isinstance(bad.exception, CliError) and bad.exception.exit_code == 2
    assert "target_frontier_share" in str(bad.exception) and "\n" not in str(bad.exception)


def test_threshold_slice_only_above_the_cap_and_the_same_groups_each_time():
    from training.calibration import threshold_slice

    g = np.array([f"t{i % 50}" for i in range(1000)], dtype=object)
    assert threshold_slice(g, 1000, None, 0.2, 0) is None
    assert threshold_slice(g, 1000, 1000, 0.2, 0) is None  # folds not capped: out-of-fold scores
    assert threshold_slice(g, 1000, 100, 0.0, 0) is None
    a = threshold_slice(g, 1000, 100, 0.2, 0)
    assert a is not None and len(a) == 5  # 50 groups x min(100 / 1000, 0.2)
    assert a.tolist() == sorted(a.tolist()) and set(a) <= set(g)
    # rows or distinct groups, in any order: the same slice (serial passes rows, Dask groups)
    np.testing.assert_array_equal(a, threshold_slice(np.unique(g)[::-1], 1000, 100, 0.2, 0))
    assert len(threshold_slice(g, 1000, 900, 0.2, 0)) == 10  # at most the share


def test_thresholds_from_a_calibration_slice_above_the_cap(tmp_path):
    """Above calibration_max_rows the final escalation model is fit without a slice of the groups and
    the thresholds are set on its scores of them (its out-of-fold scores came from folds fit on at
    most the cap, sharper final scores escalated more runs than asked); below, out-of-fold as before."""
    from training.calibration import run_share_at, threshold_slice

    path = tmp_path / "runs.parquet"
    write_frame(records_to_frame(_log(120, seed=3)), path)
    base = dict(runs=[path], mlflow=False, evaluate=False, n_estimators=20, escalation_n_estimators=20)
    off = run_training(TrainConfig(out=tmp_path / "a", calibration_max_rows=None, **base))
    assert off.report["thresholds"]["source"] == "out-of-fold"
    lab = off.dataset.meta["y_frontier"].notna().to_numpy()
    assert len(off.bundle.escalation.oof_raw_) == lab.sum()

    res = run_training(TrainConfig(out=tmp_path / "b", calibration_max_rows=200, **base))
    th, esc, m = res.report["thresholds"], res.bundle.escalation, res.dataset.meta
    g = m["group"].to_numpy(dtype=object)[lab]
    cut = threshold_slice(g, int(lab.sum()), 200, 0.2, 0)
    assert cut is not None
    inside = np.isin(g, cut)
    assert th["source"] == "calibration slice" and 0 < inside.sum() < len(g)
    assert len(esc.oof_raw_) == (~inside).sum()  # fit without the slice
    rows = np.flatnonzero(lab)[inside]
    X = res.dataset.escalation_X()[rows]
    p = esc.predict_proba(X)[:, 1]
    ids = m["run_id"].to_numpy()[rows]
    assert th["slice_runs"] == len(set(ids.tolist()))
    again = choose_thresholds(ids, m["step"].to_numpy()[rows], p, target_frontier_share=0.3)
    assert th["p_frontier_up"] == again["p_frontier_up"]
    assert th["expected_frontier_share"] == pytest.approx(run_share_at(ids, p, th["p_frontier_up"]))
    assert th["slice_share_at_oof_up"] == pytest.approx(run_share_at(ids, p, th["oof_p_frontier_up"]))
