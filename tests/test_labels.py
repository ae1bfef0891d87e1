"""Outcomes after the fact: a run's later run records update it (last label wins), `runroute label`
reports every bad row and writes all or nothing, a SIGKILL during labelling loses no earlier label,
and a repeated `POST /v1/runs/{id}/end` updates the logged outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pandas as pd
import pytest

from features.labels import label_runs
from features.runlog import conform, read_records, read_runlog, records_to_frame, write_frame
from features.schema import Run, Step
from models.predictor import ConstantPredictor
from router.server.app import create_app
from router.server.hotpath.upstream import FakeCall, FakeReply, FakeUpstream
from router.server.settings import RouterSettings


def _log(d: Path, n: int = 3, name: str = "runlog-1-a-0001.parquet") -> Path:
    recs: list = []
    for i in range(n):
        recs.append(Run(run_id=f"r{i}", source="runroute", started_at=1.0, outcome="unknown"))
        recs += [Step(run_id=f"r{i}", step=k, prompt_tokens=10 + k, completion_tokens=2) for k in range(2)]
    recs.append(Step(run_id="steps-only", step=0, prompt_tokens=5, completion_tokens=1))
    d.mkdir(parents=True, exist_ok=True)
    return write_frame(records_to_frame(recs), d / name)


def _outcomes(log_dir: Path) -> dict[str, tuple]:
    runs = read_runlog(log_dir).runs
    return {
        r.run_id: (r.outcome, None if pd.isna(r.reward) else r.reward, r.started_at)
        for r in runs.itertuples()
    }


def test_last_run_record_wins_in_one_file_and_a_repeated_step_is_still_bad(tmp_path):
    rows = [
        {
            "record": "run",
            "run_id": "a",
            "source": "s",
            "started_at": 1.0,
            "outcome": "failure",
            "reward": 0.0,
        },
        {"record": "step", "run_id": "a", "step": 0, "prompt_tokens": 4, "completion_tokens": 1},
        {"record": "step", "run_id": "a", "step": 0, "prompt_tokens": 4, "completion_tokens": 1},
        {"record": "run", "run_id": "a", "source": "s", "outcome": "success", "reward": 1.0},
        {"record": "run", "run_id": "a", "source": "s", "ended_at": 9.0},  # no outcome: label kept
    ]
    p = tmp_path / "log.jsonl"
    p.write_bytes(b"".join(orjson.dumps({"schema_version": 1, **r}) + b"\n" for r in rows))
    res = read_records(p)
    assert [(b.row, b.reason) for b in res.bad_rows] == [(3, "duplicate (run_id, step)")]
    runs = res.frame[res.frame.record == "run"]
    assert len(runs) == 1
    r = runs.iloc[0]
    assert (r.outcome, r.reward, r.started_at, r.ended_at) == ("success", 1.0, 1.0, 9.0)
    # an explicit later "unknown" retracts the label, reward with it
    rows.append({"record": "run", "run_id": "a", "source": "s", "outcome": "unknown"})
    p.write_bytes(b"".join(orjson.dumps({"schema_version": 1, **r}) + b"\n" for r in rows))
    r = read_records(p, quarantine=False).frame.query("record == 'run'").iloc[0]
    assert r.outcome == "unknown" and pd.isna(r.reward)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_label_twice_keeps_the_last_label(tmp_path, fmt):
    d = tmp_path / "logs"
    _log(d)

    def write(rows: list[dict], name: str) -> Path:
        p = tmp_path / f"{name}.{fmt}"
        df = pd.DataFrame(rows)
        if fmt == "csv":
            df.to_csv(p, index=False)
        elif fmt == "jsonl":
            p.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
        else:
            df.to_parquet(p)
        return p

    first = label_runs(write([{"run_id": "r0", "outcome": "failure", "reward": 0.0}], "a"), d)
    assert first.written == 1 and first.relabelled == 0 and not first.bad_rows
    second = label_runs(
        write(
            [
                {"run_id": "r0", "outcome": "success", "reward": 0.5},
                {"run_id": "steps-only", "outcome": "failure", "reward": 0.0},
            ],
            "b",
        ),
        d,
    )
    assert second.written == 2 and second.relabelled == 1
    assert second.path is not None and second.path.name > first.path.name  # type: ignore[union-attr]
    got = _outcomes(d)
    assert got["r0"] == ("success", 0.5, 1.0)  # the last label, the logged start kept
    assert got["steps-only"][:2] == ("failure", 0.0)
    assert got["r1"][0] == "unknown"


def test_bad_rows_each_reported_and_nothing_written(tmp_path):
    d = tmp_path / "logs"
    _log(d)
    p = tmp_path / "o.csv"
    p.write_text(
        "run_id,outcome,reward\n"
        "r0,success,1\n"
        "r1,great,1\n"
        ",failure,0\n"
        "r2,failure,abc\n"
        "nope,success,1\n"
        "r2,failure,inf\n"
    )
    before = sorted(x.name for x in d.iterdir())
    res = label_runs(p, d)
    assert res.path is None and res.written == 0
    assert [(b.row, b.reason.split(" (")[0]) for b in res.bad_rows] == [
        (3, "outcome must be success, failure or unknown"),
        (4, "missing or empty run_id"),
        (5, "reward must be a finite number"),
        (6, "unknown run id 'nope'"),
        (7, "reward must be a finite number"),
    ]
    assert sorted(x.name for x in d.iterdir()) == before  # nothing half-written, no temp file left
    res = label_runs(p, d, skip_bad=True)
    assert res.written == 1 and len(res.bad_rows) == 5
    assert _outcomes(d)["r0"][0] == "success"


def test_label_cli_one_line_errors(tmp_path):
    d = tmp_path / "logs"
    _log(d)
    bad = tmp_path / "o.jsonl"
    bad.write_text('{"run_id": "r0", "outcome": "success"}\n{"run_id": "zz", "outcome": "success"}\n')
    cmd = [sys.executable, "-m", "runroute.cli", "label", "--outcomes", str(bad), "--runs", str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0].endswith(":2: unknown run id 'zz' (not in the run log at " + str(d) + ")")
    assert (
        lines[-1]
        == f"runroute: error: 1 bad row(s) in {bad}; nothing written (fix them, or --skip-bad to write the good rows)"
    )
    extra = tmp_path / "x.csv"
    extra.write_text("run_id,outcome,score\nr0,success,1\n")
    r = subprocess.run(cmd[:-3] + [str(extra), "--runs", str(d)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"runroute: error: {extra}: unknown column(s) score; expected run_id, outcome[, reward]"
    ]


@pytest.mark.slow
def test_sigkill_during_label_loses_no_earlier_label(tmp_path):
    """A big label file is killed (SIGKILL) while it is being labelled; the earlier label stays and
    the killed command's labels are all there or none of them (never a partial file)."""
    d = tmp_path / "logs"
    _log(d, n=3)
    n_big = 150_000
    big_ids = [f"big-{i}" for i in range(n_big)]
    cols = {"record": "step", "run_id": big_ids, "step": 0, "prompt_tokens": 1, "completion_tokens": 1}
    write_frame(conform(pd.DataFrame({"schema_version": 1, **cols})), d / "runlog-2-b-0001.parquet")
    early = tmp_path / "early.csv"
    early.write_text("run_id,outcome,reward\nr0,failure,0\nr1,success,1\n")
    assert label_runs(early, d).written == 2
    big = tmp_path / "big.csv"
    big.write_text(
        "run_id,outcome,reward\n" + "".join(f"{r},success,1\n" for r in big_ids) + "r0,success,1\n"
    )
    cmd = [sys.executable, "-m", "runroute.cli", "label", "--outcomes", str(big), "--runs", str(d)]
    killed_during_write = 0
    for attempt in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # poll (bounded) for the command's temporary label file, then kill it mid-write; a later
        # attempt kills it earlier (while it reads), which must be harmless too
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if attempt == 1 or any(x.name.startswith(".labels-") for x in d.iterdir()):
                break
            time.sleep(0.001)
        killed_during_write += any(x.name.startswith(".labels-") for x in d.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for x in d.iterdir():  # what a killed writer leaves: only its hidden temporary file
            if x.name.startswith(".labels-"):
                x.unlink()
        got = _outcomes(d)
        n_big_labelled = sum(1 for r in big_ids[:: n_big // 100] if got.get(r, ("unknown",))[0] == "success")
        assert n_big_labelled in (0, 100), n_big_labelled  # all or nothing
        if n_big_labelled == 0:
            assert got["r0"][:2] == ("failure", 0.0)  # the earlier label survives
        else:
            assert got["r0"][:2] == ("success", 1.0)
        assert got["r1"][:2] == ("success", 1.0)
        labels = [x for x in d.iterdir() if x.name.startswith("labels-")]
        for x in labels:  # every published label file is complete
            assert x.read_bytes().endswith(b"\n")
    assert killed_during_write >= 1


# ---------------------------------------------------------------- the sidecar's end endpoint


def _reply(call: FakeCall) -> FakeReply:
    body = orjson.loads(call.body)
    return FakeReply(
        body=orjson.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 3},
            }
        )
    )


async def test_a_second_end_updates_the_outcome(tmp_path):
    settings = RouterSettings.load(
        None,
        local={"urls": ["http://127.0.0.1:9"]},
        frontier={"url": "http://127.0.0.1:11", "allow_no_key": True},
        policy={"kind": "always-local"},
        scrape={"interval_s": 0},
        bundle={"watch_s": 0},
        runlog={"dir": str(tmp_path / "logs")},
    )
    app = create_app(settings, upstream=FakeUpstream(_reply), bundle=ConstantPredictor())
    msgs = [{"role": "user", "content": "hello"}]
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
            for rid in ("e1", "e2"):
                r = await c.post("/v1/chat/completions", json={"messages": msgs}, headers={"x-run-id": rid})
                assert r.status_code == 200
            assert (
                await c.post("/v1/runs/e1/end", json={"outcome": "failure", "reward": 0})
            ).status_code == 200
            r = await c.post("/v1/runs/e1/end", json={"outcome": "success", "reward": 1.0})
            assert r.status_code == 200 and r.json()["outcome"] == "success"
            assert (await c.post("/v1/runs/e1/end")).status_code == 200  # no outcome: label kept
            assert (await c.post("/v1/runs/e2/end", json={"outcome": "success"})).status_code == 200
            assert (await c.post("/v1/runs/e2/end", json={"outcome": "failure"})).status_code == 200
            assert (await c.post("/v1/runs/e2/end", json={"outcome": "bad"})).status_code == 422
    log = read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))
    assert not log.bad_rows
    runs = log.runs.set_index("run_id")
    assert runs.loc["e1", "outcome"] == "success" and runs.loc["e1", "reward"] == 1.0
    assert runs.loc["e1", "n_steps"] == 1 and runs.loc["e1", "started_at"] is not None
    assert runs.loc["e2", "outcome"] == "failure"
