"""A real Dask deployment the way a user runs one: ``dask scheduler`` + two ``dask worker`` processes
on 127.0.0.1, started here; the CLI pointed at the scheduler's address (issue 19).

- the what-if grid through ``--dask tcp://...`` gives the serial JSON (timings aside);
- a worker process killed with SIGKILL (by PID) while it runs a point loses nothing: the scheduler
  runs the point again (the nanny restarts the worker) and the result is still the serial one. The
  test checks the kill landed mid-job: the worker was processing a point when it died, and points
  were still outstanding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dask_sweeps import ROOT, _cli, strip_timings, whatif_args

PY = sys.executable
DASK = Path(PY).parent / "dask"


def _dask_cmd(*args: str) -> list[str]:
    return [str(DASK), *args] if DASK.exists() else [PY, "-m", "distributed.cli.dask_" + args[0], *args[1:]]


class DaskDeployment:
    """A scheduler and N workers (each with its nanny) as subprocesses; ``address`` once up."""

    def __init__(self, tmp: Path, n_workers: int = 2) -> None:
        self.tmp, self.n, self.procs = tmp, n_workers, []  # type: list[subprocess.Popen[bytes]]
        self.file = tmp / "scheduler.json"
        self.address = ""

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        log = (self.tmp / "scheduler.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                _dask_cmd(
                    "scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--no-dashboard",
                    "--scheduler-file",
                    str(self.file),
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
        deadline = time.monotonic() + 60
        while not self.file.exists() or not self.file.read_text().strip():
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.2)
        self.address = json.loads(self.file.read_text())["address"]
        for i in range(self.n):
            wlog = (self.tmp / f"worker{i}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    _dask_cmd(
                        "worker",
                        self.address,
                        "--host",
                        "127.0.0.1",
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--no-dashboard",
                        "--memory-limit",
                        "4GB",
                    ),
                    stdout=wlog,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )

    def client(self) -> Any:
        from distributed import Client

        c = Client(self.address, timeout=60)
        c.wait_for_workers(self.n, timeout=90)
        return c

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[DaskDeployment]:
    d = DaskDeployment(tmp_path_factory.mktemp("dask-deploy"))
    d.start()
    try:
        d.client().close()  # both workers joined
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def slow_workload(tmp_path_factory) -> Path:
    """A workload whose points take a second or two each (a kill can land while one runs)."""
    out = tmp_path_factory.mktemp("dask-deploy-runs") / "runs.parquet"
    r = _cli("generate", "-o", str(out), "--runs", "2500", "--seed", "9")
    assert r.returncode == 0, r.stderr
    return out


def _grid(runs: Path, out: Path) -> list[str]:
    return whatif_args(runs, out, "8", "1", "--no-kv-double")


@pytest.fixture(scope="module")
def serial_result(slow_workload: Path, tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("dask-deploy-serial") / "serial.json"
    r = _cli(*_grid(slow_workload, out))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_cli_on_a_scheduler_address_matches_serial(deployment, slow_workload, serial_result, tmp_path):
    out = tmp_path / "dask.json"
    r = _cli(*_grid(slow_workload, out), "--dask", deployment.address, "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert f"scheduler {deployment.address} with 2 workers" in r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert json.dumps(got["scorecards"]) == json.dumps(serial_result["scorecards"])
    assert json.dumps(strip_timings(got)) == json.dumps(strip_timings(serial_result))


def test_worker_killed_mid_job_loses_nothing(deployment, slow_workload, serial_result, tmp_path):
    client = deployment.client()
    try:
        pids = client.run(os.getpid)  # worker address -> worker process PID (the nanny's child)
        out = tmp_path / "dask.json"
        cli = subprocess.Popen(
            [PY, "-m", "runroute", *_grid(slow_workload, out), "--dask", deployment.address],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        victim, outstanding = None, 0
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline and cli.poll() is None:
            busy = {w: ks for w, ks in client.processing().items() if any("_apply" in str(k) for k in ks)}
            if busy:
                victim = next(iter(busy))
                outstanding = sum(len(ks) for ks in busy.values())
                os.kill(pids[victim], signal.SIGKILL)
                break
            time.sleep(0.05)
        assert victim is not None, "no point was ever seen running: nothing was killed"
        stdout, stderr = cli.communicate(timeout=240)
        assert cli.returncode == 0, stderr
        with pytest.raises(ProcessLookupError):
            os.kill(pids[victim], 0)  # the worker that ran a point is gone
        assert outstanding >= 1
        got = json.loads(out.read_text())
        assert json.dumps(got["scorecards"]) == json.dumps(serial_result["scorecards"])
        assert json.dumps(strip_timings(got)) == json.dumps(strip_timings(serial_result))
        # the nanny brought a fresh worker back: the deployment still has two
        client.wait_for_workers(2, timeout=60)
        assert pids[victim] not in client.run(os.getpid).values()
    finally:
        client.close()
