"""The evaluation job on logs the simulator wrote (real step engine, real tau2 trajectories): replaying
the logging policy reproduces every logged decision and feature vector, evaluation refuses logs
without propensities and candidates the logs never explored, and `runroute evaluate` prints, writes
JSON and a PNG, and fails with one line on bad logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from features.runlog import RunLog, records_to_frame, write_frame
from models.predictor import ConstantPredictor
from router.policy import build_policy
from training.eval.loop_world import World, sim_backends, sim_config
from training.eval.ope_eval import OPEError, evaluate_policies
from training.eval.ope_replay import load_logged, replay_candidate, step_costs
from training.eval.outcome import Prices, run_costs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world() -> World:
    from features.runlog import read_runlog

    return World.from_log(
        read_runlog(ROOT / "data" / "tau2bench_airline.parquet"), "gpt-oss-120b", "claude-sonnet-4-5"
    )


def logs(world: World, policy_cfg: dict, n: int = 60, seed: int = 1) -> tuple[RunLog, pd.DataFrame]:
    runs, steps, starts = world.arrivals(list(world.tasks), n, rate=0.05, seed=seed, prefix="t")
    served = world.serve(
        runs, steps, starts, build_policy(policy_cfg), ConstantPredictor(), sim_config(seed=seed)
    )
    frame = pd.concat(
        [records_to_frame(served.records), records_to_frame(world.run_records(served, seed))],
        ignore_index=True,
    )
    return RunLog.from_frame(frame), frame


def test_replaying_the_logging_policy_reproduces_the_log(world):
    base = {"kind": "stall-escalation"}
    log, _ = logs(world, {**base, "explore": {"rate": 0.4, "max_step": 30}})
    lg = load_logged(log, Prices())
    assert lg.n_runs == 60 and not lg.left_out
    rep = replay_candidate(lg, build_policy(base), ConstantPredictor(), sim_backends(sim_config()))
    explored = {
        r for r, s, e in zip(lg.run_ids, lg.ptr[:-1], lg.ptr[1:], strict=True) if lg.explore[s:e].any()
    }
    # the deterministic base deviates from the log only where exploration took another action
    assert rep.deviated_runs <= len(explored) and rep.unsupported_runs == 0
    assert rep.deviated_runs > 0
    agree = rep.pi > 0
    assert agree.sum() > 0.7 * len(agree)
    # per-step costs sum to the outcome model's run costs
    for r, s, e in zip(lg.run_ids, lg.ptr[:-1], lg.ptr[1:], strict=True):
        assert step_costs(lg.records[r], lg.a[s:e], Prices()).sum() == pytest.approx(
            run_costs(lg.records[r], lg.a[s:e], Prices())[0]
        )


def test_replayed_features_equal_the_logged_ones(world):
    """Through the engine, while the candidate agrees, the predictor sees exactly the logged vectors."""
    log, _ = logs(world, {"kind": "always-local", "explore": {"rate": 0.3}}, n=30)
    lg = load_logged(log, Prices())
    seen: list[np.ndarray] = []

    class Spy(ConstantPredictor):
        def predict_features(self, x):  # type: ignore[override]
            seen.append(np.array(x, copy=True))
            return super().predict_features(x)

    rep = replay_candidate(lg, build_policy({"kind": "always-local"}), Spy(), sim_backends(sim_config()))
    planned = []  # every step up to and including a run's first deviation
    for s, e in zip(lg.ptr[:-1], lg.ptr[1:], strict=True):
        for i in range(s, e):
            planned.append(i)
            if rep.pi[i] == 0:
                break
    assert len(seen) == len(planned)
    np.testing.assert_allclose(np.vstack(seen), lg.X[planned], rtol=1e-12, atol=1e-9)


def test_refusals(world, tmp_path):
    log, frame = logs(world, {"kind": "always-local"}, n=20)  # no exploration: every propensity is 1
    with pytest.raises(
        OPEError, match=r"candidate 'always-frontier' needs actions the logs never explored: on 20 of 20 runs"
    ):
        evaluate_policies(
            log,
            {"always-frontier": (build_policy({"kind": "always-frontier"}), ConstantPredictor())},
            n_boot=50,
        )
    bare = frame.copy()
    bare["propensity"] = None
    with pytest.raises(OPEError, match=r"^\d+ of \d+ logged steps carry no propensity"):
        evaluate_policies(RunLog.from_frame(bare), {}, n_boot=50)


def test_evaluate_cli(world, tmp_path):
    _, frame = logs(world, {"kind": "always-local", "explore": {"rate": 0.5}}, n=80)
    d = tmp_path / "logs"
    write_frame(frame, d / "runlog-1.parquet")
    cmd = [sys.executable, "-m", "runroute.cli", "evaluate", "--runs", str(d), "--boot", "100"]
    out_json, png = tmp_path / "ope.json", tmp_path / "ope.png"
    r = subprocess.run(
        cmd
        + [
            "--policy",
            "always-local",
            "--policy",
            '{"kind": "oracle", "name": "oracle-x"}',
            "--json",
            str(out_json),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "oracle-x" in r.stdout and "runs evaluated/s" in r.stdout
    rep = json.loads(out_json.read_text())
    dr = rep["candidates"]["oracle-x"]["estimates"]["dr"]["net"]
    assert dr["lo"] <= dr["value"] <= dr["hi"] and png.stat().st_size > 10_000
    assert rep["candidates"]["always-local"]["estimates"]["dr"]["aiq"]["value"] is not None
    # a corrupted log: one line, exit 2
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "runlog-x.jsonl").write_text('{"record": "step", "run_id": "a", "step": 0}\n{not json\n')
    r = subprocess.run(
        cmd[:5] + [str(bad), "--policy", "always-local"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("runroute: error: ") and "strict mode" in r.stderr
    # a propensity-less log: one line, exit 2
    nop = tmp_path / "noprop"
    f2 = frame.copy()
    f2["propensity"] = None
    write_frame(f2, nop / "runlog-1.parquet")
    r = subprocess.run(
        cmd[:5] + [str(nop), "--policy", "always-local"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("runroute: error: ")
    assert "carry no propensity" in r.stderr.strip().splitlines()[-1]
