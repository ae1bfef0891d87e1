"""Helpers of the registry tests (tests/test_registry_follow.py): a small run log with a planted
signal, training into a tracking store, an MLflow tracking server process on PostgreSQL the way
teams run it, and corrupting a registered version's artifacts on disk."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from features.runlog import records_to_frame, write_frame
from features.schema import Run, Step

__all__ = [
    "toy_log",
    "train",
    "mlflow_server",
    "postgres_database",
    "corrupt_version",
    "wait_for",
    "free_port",
]

PG_DSN = "postgresql://root@127.0.0.1:5432"


def toy_log(path: Path, n_runs: int = 48, seed: int = 0) -> Path:
    """Runs that fail hit tool errors and repeat calls (learnable), as in tests/test_training.py."""
    rng = np.random.default_rng(seed)
    recs: list = []
    t = 0.0
    for r in range(n_runs):
        bad = bool(rng.random() < 0.45)
        n = int(rng.integers(3, 8)) + (3 if bad else 0)
        recs.append(
            Run(
                run_id=f"run{r}",
                source="toy",
                task_id=f"task{r % 12}",
                model="weak",
                outcome="failure" if bad else "success",
                needs_frontier=bad,
            )
        )
        prompt = 1000
        for k in range(n):
            err = bad and rng.random() < 0.5
            recs.append(
                Step(
                    run_id=f"run{r}",
                    step=k,
                    arrival_s=t,
                    tool_pause_s=None if k == 0 else 1.0,
                    prompt_tokens=prompt,
                    completion_tokens=20,
                    tool_calls=["lookup"],
                    tool_call_keys=["same" if (bad and k % 2) else f"k{k}"],
                    tool_results_n=0 if k == 0 else 1,
                    tool_result_errors=[] if k == 0 else [err],
                    tool_result_tokens=[] if k == 0 else [50],
                    structured=True,
                    hash_ids=list(range(r * 100, r * 100 + prompt // 512 + 1)),
                )
            )
            prompt += 300
            t += 2.0
    return write_frame(records_to_frame(recs), path)


def train(log: Path, out: Path, tracking_uri: str, *, weak: bool = False, promote_if_better: bool = False):
    """One ``runroute train`` job (no CV: quick); ``weak`` = a one-split, uncalibrated model."""
    from training.train import TrainConfig, run_training

    knobs = dict(n_estimators=20, escalation_n_estimators=20, escalation_min_child_samples=10)
    if weak:
        knobs.update(escalation_n_estimators=1, escalation_num_leaves=2, calibration="none")
    cfg = TrainConfig(
        runs=[log],
        out=out,
        tracking_uri=tracking_uri,
        evaluate=False,
        calibration_cv=3,
        min_child_samples=5,
        holdout_share=0.25,
        promote_if_better=promote_if_better,
        **knobs,
    )
    return run_training(cfg)


def wait_for(check, what: str, timeout_s: float = 60.0, every_s: float = 0.1):
    """Poll ``check()`` until it returns a truthy value (bounded); returns that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL (dropped afterwards); yields its URI."""
    import psycopg

    name = f"runroute_test_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(f"{PG_DSN}/postgres", connect_timeout=5, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_DSN}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``mlflow server --backend-store-uri ... --artifacts-destination ...`` on a free loopback
    port (one worker); yields its URL once ``/health`` answers (bounded), stops it afterwards."""
    import httpx

    port = free_port()
    log = open(artifacts.parent / "mlflow-server.log", "wb")  # noqa: SIM115 - closed below
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(artifacts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ}, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited {proc.returncode}: {_tail(artifacts)}")
        try:
            return httpx.get(url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, "the MLflow tracking server", timeout_s, every_s=0.25)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)
        log.close()


def _tail(artifacts: Path) -> str:
    p = artifacts.parent / "mlflow-server.log"
    return p.read_text(errors="replace")[-2000:] if p.exists() else ""


def corrupt_version(tracking_uri: str, name: str, version: str, artifact_root: Path) -> Path:
    """Flip bytes of the registered version's ``bundle.joblib`` where the store keeps it on disk
    (what a bad copy or a partial upload leaves); returns the file."""
    from mlflow import MlflowClient

    mv = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version(name, version)
    model_id = mv.model_id or str(mv.source).rsplit("/", 1)[-1]  # source: models:/m-<id>
    hits = [p for p in artifact_root.rglob("bundle.joblib") if model_id in p.parts]
    assert len(hits) == 1, (model_id, hits)
    data = bytearray(hits[0].read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    hits[0].write_bytes(bytes(data))
    return hits[0]
