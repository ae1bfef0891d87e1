"""The overhead benches stop what they started on every exit path (bench/sut_procs.py, bench/realistic.py).

A sidecar that fails to start (here: a "tree" whose runroute package raises at import) is stopped by
its launcher; the systems started before it are in the caller's list when the failure propagates, so
the caller's ``finally`` stops them; a child of a bench that is SIGKILLed gets SIGTERM from the kernel.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@pytest.fixture()
def realistic(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import realistic as mod

    return mod


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    st = Path(f"/proc/{pid}/stat")
    return not (st.exists() and st.read_text().split(") ", 1)[1].startswith("Z"))


def _broken_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "broken"
    for pkg in ("runroute", "router", "features", "models"):
        (tree / pkg).mkdir(parents=True)
        (tree / pkg / "__init__.py").write_text("")
    (tree / "runroute" / "__init__.py").write_text("raise RuntimeError('this tree cannot start')\n")
    (tree / "runroute" / "cli.py").write_text("")
    return tree


def test_a_sidecar_that_fails_to_start_is_stopped(realistic, tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []
    real = realistic.start_runroute

    def spy(*args, **kwargs):
        p = real(*args, **kwargs)
        started.append(p)
        return p

    monkeypatch.setattr(realistic, "start_runroute", spy)
    a = argparse.Namespace(max_body=204800)
    with pytest.raises(SystemExit):
        realistic._start_sidecar(
            a, tmp_path, "ref", _broken_tree(tmp_path), sys.executable, tmp_path / "b", 1, {}
        )
    assert len(started) == 1 and started[0].poll() is not None


def test_systems_started_before_a_failure_reach_the_callers_list(realistic, tmp_path, monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        calls: list[str] = []

        def fake_start(a, work, label, tree, python, bundle, bport, ov):
            calls.append(label)
            if label.startswith("ref@"):
                raise SystemExit("ref did not start")
            return realistic.System(label, "runroute", "http://x", "auto", sleeper.pid, sleeper)

        monkeypatch.setattr(realistic, "_start_sidecar", fake_start)
        tree = _broken_tree(tmp_path)
        a = argparse.Namespace(
            no_mini=True, variant=[], ref_tree=tree, ref_bundle=None, bundle=tmp_path / "b"
        )
        a.ref_python, a.workers = sys.executable, 1
        systems: list = []
        with pytest.raises(SystemExit):
            realistic._start_all(a, tmp_path, 1, systems)
        assert [s.label for s in systems] == ["direct", "runroute"]  # the caller's finally stops these
        for s in systems:
            if s.proc is not None:
                realistic.stop(s.proc)
        assert sleeper.poll() is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_children_die_with_a_killed_bench(tmp_path):
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(BENCH)!r})
        from sut_procs import die_with_parent
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent)
        print(p.pid, flush=True)
        time.sleep(60)
        """
    )
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None
        child = int(bench.stdout.readline())
        assert _alive(child)
        bench.send_signal(signal.SIGKILL)
        bench.wait(5)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if bench.poll() is None:
            bench.kill()


@pytest.fixture()
def workers_scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import workers_scale as mod

    return mod


def _fake_probe(mod, limit: float):
    def probe(rate: float):
        ok = rate <= limit
        return mod.Probe(
            rate,
            rate if ok else limit,
            ok,
            0,
            1.0,
            2.0,
            1.0,
            0.0,
            0.1,
            [0.5, 0.5],
            False,
            {"send_lag_p99_ms": 0.0},
        )

    return probe


@pytest.mark.parametrize("limit", [37.0, 123.0, 400.0])
def test_saturation_search_brackets_the_limit(workers_scale, limit):
    a = argparse.Namespace(start=60.0, growth=1.25, bisect=3, max_probes=20)
    probes = workers_scale._search(a, _fake_probe(workers_scale, limit))
    sat = workers_scale._saturation(probes)
    assert sat is not None and sat.rate <= limit
    fails = [p.rate for p in probes if not p.passed]
    assert fails and min(fails) > limit
    # bisected: the answer is within one growth step / 2^bisect of the limit
    assert sat.rate >= limit / (1 + 0.25 / 2**2)


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/cpu", os.W_OK), reason="needs a writable cgroup v1 cpu")
def test_cpu_budget_holds_its_quota_and_is_removed(workers_scale):
    budget = workers_scale.CpuBudget(f"runroute-test-{os.getpid()}", 0.25)
    try:
        assert (budget.path / "cpu.cfs_quota_us").read_text().strip() == str(int(0.25 * 100_000))
        spin = subprocess.Popen([*budget.wrap(), sys.executable, "-c", "while True: pass"])
        time.sleep(1.5)
        st = Path(f"/proc/{spin.pid}/stat").read_text().split(") ", 1)[1].split()
        used = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
        assert budget.stat()["nr_throttled"] > 0 and used < 0.7  # 1.5 s at most 0.25 of a core
        spin.kill()
        spin.wait()
    finally:
        budget.remove()
    assert not budget.path.exists()
