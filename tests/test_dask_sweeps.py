"""What-if grids and bench sweeps on Dask (issue 19): one task per point, results identical to the
serial run; without --dask, Dask is never imported.

Real parts: a real ``distributed.LocalCluster`` (2 worker processes x 1 thread, started by the CLI's
``--dask local``), real simulations on a generated workload, a real bundle trained by the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# per-process timing figures: the only fields two runs of the same point may differ in
TIMING_KEYS = {"sim_wall_s", "sim_cpu_s", "sim_steps_per_cpu_s", "generated_at", "timings", "total_s"}


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "runroute", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def strip_timings(doc: Any) -> Any:
    """``doc`` without the per-process timing fields (everything else must be byte-identical)."""
    if isinstance(doc, dict):
        return {k: strip_timings(v) for k, v in doc.items() if k not in TIMING_KEYS}
    if isinstance(doc, list):
        return [strip_timings(v) for v in doc]
    return doc


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dask-sweeps") / "runs.parquet"
    r = _cli("generate", "-o", str(out), "--runs", "400", "--seed", "3")
    assert r.returncode == 0, r.stderr
    return out


def whatif_args(runs: Path, out: Path, kv_gb: str = "4", seed: str = "5", *extra: str) -> list[str]:
    """A small what-if grid (2 policies x replicas 1, 2 at ``kv_gb``) written to ``out``."""
    grid = ["--replicas", "1,2", "--kv-cache-gb", kv_gb, "--policy", "always-local,session-sticky"]
    return ["whatif", "--runs", str(runs), *grid, *extra, "--seed", seed, "--json", str(out)]


def test_whatif_on_a_local_cluster_matches_the_serial_run(workload: Path, tmp_path: Path) -> None:
    serial, dask = tmp_path / "serial.json", tmp_path / "dask.json"
    r1 = _cli(*whatif_args(workload, serial))
    assert r1.returncode == 0, r1.stderr
    r2 = _cli(*whatif_args(workload, dask), "--dask", "local", "--workers", "2")
    assert r2.returncode == 0, r2.stderr
    said = r2.stdout + r2.stderr
    assert "LocalCluster with 2 workers" in said and "dashboard http://127.0.0.1:" in said
    a, b = json.loads(serial.read_text()), json.loads(dask.read_text())
    assert len(a["scorecards"]) == 2 * 2 * 2  # kv 4 and its doubling
    # scorecards (and answers, checks, inputs) byte-identical; details differ only in timings
    for key in ("scorecards", "answers", "capacity_check", "inputs"):
        assert json.dumps(a[key]) == json.dumps(b[key]), key
    assert json.dumps(strip_timings(a)) == json.dumps(strip_timings(b))


def test_bench_sweep_on_a_local_cluster_matches_the_serial_run(workload: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    r0 = _cli("train", "--runs", str(workload), "-o", str(bundle), "--no-mlflow", "--no-eval")
    assert r0.returncode == 0, r0.stderr
    base = ["bench", "--runs", str(workload), "--bundle", str(bundle), "--sweep", "0,0.5,1", "--seed", "2"]
    r1 = _cli(*base, "--json", str(tmp_path / "s.json"))
    assert r1.returncode == 0, r1.stderr
    r2 = _cli(*base, "--json", str(tmp_path / "d.json"), "--dask", "local", "--workers", "2")
    assert r2.returncode == 0, r2.stderr
    assert "dashboard http://127.0.0.1:" in r2.stdout + r2.stderr
    a = json.loads((tmp_path / "s.json").read_text())
    b = json.loads((tmp_path / "d.json").read_text())
    name, sa = next(iter(a["sets"].items()))
    assert {p["policy"] for p in sa["policies"]} >= {"learned", "per-step-threshold", "oracle"}
    assert [len(v) for v in sa["sweeps"].values()] == [3, 3]
    assert json.dumps(strip_timings(a)) == json.dumps(strip_timings(b)), name


def test_without_dask_the_cli_never_imports_dask(workload: Path, tmp_path: Path) -> None:
    """whatif and train in one process without --dask: 'dask' and 'distributed' stay unloaded."""
    code = f"""
import sys
from typer.testing import CliRunner
from runroute.cli import _typer_app
r = CliRunner().invoke(_typer_app, {whatif_args(workload, tmp_path / "w.json")!r})
assert r.exit_code == 0, r.output
r = CliRunner().invoke(_typer_app, ["train", "--runs", {str(workload)!r}, "-o", {str(tmp_path / "b")!r},
                                    "--no-mlflow", "--no-eval"])
assert r.exit_code == 0, r.output
print(sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed")))
"""
    r = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "w.json").exists() and (tmp_path / "b" / "manifest.json").exists()


def test_bad_dask_address_is_one_line(workload: Path, tmp_path: Path) -> None:
    r = _cli(*whatif_args(workload, tmp_path / "x.json"), "--dask", "nonsense")
    assert r.returncode == 2
    assert "--dask: expected 'local' or a scheduler address" in r.stderr
    assert "Traceback" not in r.stderr
