"""The sidecar's background run-log writer: no blocking, no drops, fsync cadence, Parquet roll."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from features.runlog import read_runlog
from router.server.runs.log_writer import RunLogWriter


def step(run_id: str, k: int, **extra) -> dict:
    return {
        "record": "step",
        "run_id": run_id,
        "step": k,
        "prompt_tokens": 100 + k,
        "completion_tokens": 5,
        "cached_tokens": 50,
        "tier": "local",
        "replica": "local-0",
        "latency_s": 0.02,
        "status": 200,
        "predictions": {"p_frontier": 0.1},
        "features": [1.0, 2.0],
        **extra,
    }


def test_full_queue_spills_to_overflow_and_nothing_is_lost(tmp_path):
    w = RunLogWriter(tmp_path, queue_max=3)
    for k in range(20):  # writer not started yet (nothing drains): the queue fills after 3
        assert w.submit(step("r", k)) is None  # batched: returns at once, no future to wait on
    assert w.overflowed == 17
    w.start()
    w.close()
    steps = read_runlog(w.rolled).steps
    assert sorted(steps["step"].tolist()) == list(range(20))
    assert w.written == 20 and not list(tmp_path.glob("*.jsonl"))


def test_written_by_the_thread_and_no_prompt_text(tmp_path):
    w = RunLogWriter(tmp_path, flush_s=0.5).start()
    try:
        w.submit(step("r", 0, prompt_text="secret prompt"))
        assert w.path is not None
        deadline = time.monotonic() + 10.0  # a bound for the poll, not a speed target (bench/)
        lines: list[bytes] = []
        while time.monotonic() < deadline and not lines:
            lines = w.path.read_bytes().splitlines()
            time.sleep(0.02)
        assert len(lines) == 1
        rec = orjson.loads(lines[0])
        assert rec["run_id"] == "r" and "prompt_text" not in rec
        assert f"-{os.getpid()}-" in w.path.name
    finally:
        w.close()


def test_log_prompts_keeps_text(tmp_path):
    w = RunLogWriter(tmp_path, log_prompts=True).start()
    w.submit(step("r", 0, prompt_text="kept"))
    w.close()
    assert read_runlog(w.rolled).steps["prompt_text"].tolist() == ["kept"]


def test_bad_record_is_quarantined_not_dropped(tmp_path):
    w = RunLogWriter(tmp_path).start()
    w.submit(step("r", 0))
    w.submit(step("r", 1, cached_tokens=10_000))  # cached > prompt: invalid
    w.close()  # validated when rolled into Parquet: the bad row is quarantined with its reason
    rej = list(tmp_path.glob("*.rejected.jsonl"))
    assert len(rej) == 1 and "cached_tokens" in rej[0].read_text()
    assert read_runlog(w.rolled).steps["step"].tolist() == [0]


def test_rotation_rolls_parquet_files(tmp_path):
    w = RunLogWriter(tmp_path, rotate_bytes=2000, flush_s=0.2).start()
    for k in range(40):
        w.submit(step("r", k))
    time.sleep(0.5)
    w.close()
    assert len(w.rolled) >= 2
    assert sorted(read_runlog(w.rolled).steps["step"].tolist()) == list(range(40))


def test_leftover_jsonl_of_dead_process_is_rolled(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    left = tmp_path / f"runlog-{pid}-20260101T000000-0001.jsonl"
    left.write_bytes(orjson.dumps({**step("old", 0), "schema_version": 1}) + b"\n")  # as the writer writes it
    w = RunLogWriter(tmp_path).start()
    rolled = w.roll_leftovers()
    w.close()
    assert [p.name for p in rolled] == [left.with_suffix(".parquet").name]
    assert read_runlog(rolled).steps["run_id"].tolist() == ["old"]


def test_flush_interval_is_at_most_one_second(tmp_path):
    with pytest.raises(ValueError):
        RunLogWriter(tmp_path, flush_s=2.0)


def test_sigkill_keeps_every_record_older_than_one_second(tmp_path: Path):
    """A writer process submits a record every 20 ms, printing when; SIGKILL it; check the file."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from router.server.runs.log_writer import RunLogWriter
        w = RunLogWriter({str(tmp_path)!r}, flush_s=0.5).start()
        k = 0
        while True:
            w.submit({{"record": "step", "run_id": "kill", "step": k, "prompt_tokens": 1, "completion_tokens": 1}})
            print(k, time.time(), flush=True)
            k += 1
            time.sleep(0.02)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        sent: list[tuple[int, float]] = []
        assert proc.stdout is not None
        while len(sent) < 120:  # ~2.4 s of records
            line = proc.stdout.readline()
            if not line:
                break
            k, t = line.split()
            sent.append((int(k), float(t)))
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
    finally:
        proc.kill()
        proc.wait(10)
    files = list(tmp_path.glob("runlog-*.jsonl"))
    assert len(files) == 1
    have = {orjson.loads(x)["step"] for x in files[0].read_bytes().splitlines() if x.strip().endswith(b"}")}
    must = {k for k, t in sent if t < killed_at - 1.0}
    assert len(must) > 50
    assert must <= have, sorted(must - have)[:5]


def test_ack_durability_resolves_after_fsync_with_group_commit(tmp_path):
    import asyncio

    async def go() -> None:
        w = RunLogWriter(tmp_path, durability="ack", parquet=False).start()
        try:
            futs = [w.submit(step("r", k)) for k in range(200)]
            assert all(isinstance(f, asyncio.Future) for f in futs)
            await asyncio.gather(*futs)  # type: ignore[arg-type]
            assert w.path is not None
            on_disk = [orjson.loads(x)["step"] for x in w.path.read_bytes().splitlines()]
            assert on_disk == list(range(200))  # every acknowledged record is in the file
            assert 1 <= w.syncs < 200  # group commit: many records per fsync
        finally:
            w.close()

    asyncio.run(go())
