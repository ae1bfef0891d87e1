"""The wheel ships the samples as package data and works outside a source checkout.

Builds the wheel with pip (as `pip install .` does), checks that every package directory of the
checkout and every shipped sample is inside, installs it with --no-deps into a temporary target and,
from a working directory outside the checkout, with sys.path = that target + this venv's
site-packages (the checkout and the editable install's path hook are not on it), reads a sample
through the accessor and imports the parts that read package data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ("features", "models", "router", "training", "runroute")

pytestmark = pytest.mark.slow


def _pip(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy of the tracked files: setuptools writes build/ and *.egg-info into the
    # source tree it builds, which must stay clean
    import shutil
    import subprocess

    src = tmp_path_factory.mktemp("src") / "runroute"
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True)
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    _pip("wheel", "--no-deps", "-q", str(src), "-w", str(out), cwd=out)
    (whl,) = out.glob("runroute-*.whl")
    return whl


def test_wheel_holds_every_package_and_every_sample(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for d in CODE:
        for init in (ROOT / d).rglob("__init__.py"):
            rel = init.relative_to(ROOT).as_posix()
            assert rel in names, f"{rel} is not in the wheel: add its package to pyproject's packages list"
    samples = sorted(p.name for p in (ROOT / "data").glob("*.parquet"))
    assert samples, "no samples in data/"
    for name in [*samples, "README.md", "__init__.py"]:
        assert f"runroute/data/{name}" in names
    assert not any(n.startswith("data/") for n in names)  # no top-level package called "data"
    for asset in ("index.html", "ui.js", "ui.css"):  # the live page /ui ships its files (no CDN)
        assert f"router/server/ui_assets/{asset}" in names


def test_installed_wheel_reads_samples_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    _pip("install", "--no-deps", "-q", "--target", str(target), str(wheel), cwd=tmp_path)
    site = sysconfig.get_paths()["purelib"]
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path[:] = [{str(target)!r}, {site!r}] + [p for p in sys.path if p and "site-packages" not in p]
        # the checkout is not on the path (this venv may live inside it: its site-packages is allowed)
        assert not any(p.startswith({str(ROOT)!r}) and p != {site!r} for p in sys.path), sys.path
        import features.samples as fs
        from features.runlog import read_runlog
        d = fs.samples_dir()
        log = read_runlog([str(fs.sample_path("tau2bench_airline.parquet"))])
        from features.generate import generate  # reads features/generator_calibration.json
        from router.sim.profiles import load_profile  # reads router/sim/profiles/*.json
        import runroute.demo, training.eval.report  # the demo pipeline imports from the wheel
        print(json.dumps({{
            "dir": str(d),
            "files": [p.name for p in fs.sample_files()],
            "module": fs.__file__,
            "demo": runroute.demo.__file__,
            "runs": len(log.runs),
            "steps": len(log.steps),
            "profile": load_profile(None, "a100").name,
            "generated": int(len(generate(3, seed=1))),
        }}))
        """
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("dir", "module", "demo"):
        assert got[key].startswith(str(target)), (key, got[key])
    assert got["files"] == sorted(p.name for p in (ROOT / "data").glob("*.parquet"))
    assert got["runs"] > 0 and got["steps"] > 0 and got["generated"] > 0 and got["profile"]
