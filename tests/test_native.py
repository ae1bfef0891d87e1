"""The compiled (mypyc) simulator modules: used only while built from the current source, and
bit-identical to the pure-Python form (``router/native.py``, ``scripts/build_native.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router import native

ROOT = Path(__file__).resolve().parents[1]


def _write_build(d: Path, **over: object) -> Path:
    m: dict[str, object] = {
        "cache_tag": sys.implementation.cache_tag,
        "modules": {mod: native.source_digest(mod) for mod in native.MODULES},
    }
    m.update(over)
    d.mkdir(parents=True, exist_ok=True)
    (d / native.MANIFEST).write_text(json.dumps(m))
    return d


def test_a_build_serves_only_while_it_matches_the_sources_and_this_interpreter(tmp_path: Path) -> None:
    assert "no build" in (native.unusable(tmp_path / "none") or "")
    assert native.unusable(_write_build(tmp_path / "ok")) is None
    assert "cpython-0" in (native.unusable(_write_build(tmp_path / "tag", cache_tag="cpython-0")) or "")
    fewer = {mod: native.source_digest(mod) for mod in native.MODULES[1:]}
    assert "module list" in (native.unusable(_write_build(tmp_path / "list", modules=fewer)) or "")
    edited = {mod: native.source_digest(mod) for mod in native.MODULES}
    edited["router.sim.node"] = "0" * 64
    assert native.unusable(_write_build(tmp_path / "stale", modules=edited)) == (
        "router.sim.node changed since the build; run `make native`"
    )
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / native.MANIFEST).write_text('{"cache_tag": ')  # a half-written manifest
    assert "no build" in (native.unusable(tmp_path / "torn") or "")


def test_prefer_puts_the_build_first_only_when_it_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    path = ["/src/router/sim"]
    monkeypatch.setattr(native, "status", lambda: (False, "pure Python (stale)"))
    native.prefer("router.sim", path)
    assert path == ["/src/router/sim"]
    monkeypatch.setattr(native, "status", lambda: (True, "compiled"))
    monkeypatch.setattr(native, "BUILD_DIR", ROOT)  # any tree that holds router/sim
    native.prefer("router.sim", path)
    native.prefer("router.sim", path)  # once only
    assert path == [str(ROOT / "router" / "sim"), "/src/router/sim"]


def test_make_test_builds_the_compiled_simulator_and_processes_it_starts_use_it() -> None:
    """``make test`` depends on ``make native``: the processes the suite starts (the CLI, bench
    scripts) import the build; the suite's own process runs the source (tests/conftest.py)."""
    if os.environ.get("RUNROUTE_NATIVE", "1") == "0":
        pytest.skip("RUNROUTE_NATIVE=0: the compiled modules are turned off for this run")
    assert native.loaded_compiled() == []  # this process: the source
    probe = (
        "import router.core.prefix_cache, router.sim.simulator; from router import native; "
        "print(native.status()[1]); print(','.join(native.loaded_compiled()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == [f"compiled ({len(native.MODULES)} modules, mypyc)", ",".join(native.MODULES)], out


def test_compiled_and_pure_simulations_are_bit_identical(tmp_path: Path) -> None:
    """12 configurations (policies, replica counts, KV tiers, fp8, speculative decoding,
    disaggregation, scale-to-zero): every step's outcome, latency, TTFT and cached tokens hash equal."""
    env = {k: v for k, v in os.environ.items() if k != "RUNROUTE_NATIVE"}
    script = str(ROOT / "bench" / "sim_digest.py")
    ref = tmp_path / "pure.json"
    pure = subprocess.run(
        [sys.executable, script, "--runs", "150", "--out", str(ref)],
        env={**env, "RUNROUTE_NATIVE": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pure.returncode == 0, pure.stderr[-2000:]
    assert "loaded compiled: none" in pure.stdout
    comp = subprocess.run(
        [sys.executable, script, "--runs", "150", "--compare", str(ref)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert comp.returncode == 0, comp.stdout[-3000:] + comp.stderr[-2000:]
    assert f"compiled ({len(native.MODULES)} modules" in comp.stdout
    assert "12 of 12 configurations equal" in comp.stdout
