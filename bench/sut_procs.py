"""Process helpers for the overhead benches: ports, readiness, stopping, CPU time from /proc, launchers.

Algorithm: each system under test (SUT) is a child process started with ``taskset -c CORES`` so that it
runs alone on its core; the fake backend and the load generator share the other core. CPU time of a
process tree is the sum of ``utime + stime`` (fields 14 and 15 of ``/proc/<pid>/stat``, clock ticks)
over the process and its descendants (found through the ``ppid`` field of every ``/proc/<pid>/stat``);
the benches read it before and after each cell, so a cell's CPU is the difference. Per-core busy time
(``/proc/stat``) over the same cell, minus the bench's processes pinned there, is what *other*
processes (and hypervisor steal) took from that core: a shared machine's noise, measured.

A runroute sidecar is launched through a one-line bootstrap (``python -c``) that prints, on stderr, the
files its ``runroute``, ``router``, ``features`` and ``models`` packages were imported from, then runs
the CLI (``runroute serve --config ... --port ...``). The tree comes first on ``PYTHONPATH`` and the
child's working directory is a scratch folder, so another checkout's code (``--ref-tree``) is what runs,
not this checkout's editable install; :func:`check_modules` refuses a child whose packages came from
elsewhere.

Cleanup on every exit path: every launcher starts its child with ``PR_SET_PDEATHSIG`` (Linux: the
kernel sends the child SIGTERM when the bench process dies, even by SIGKILL), and
:func:`exit_on_signals` turns SIGTERM / SIGHUP into ``SystemExit`` so that the benches' ``finally``
blocks stop what they started (the default action would end the bench with its children running).

Knobs: every launcher takes the interpreter, the port, the cores (``taskset -c``) and a file for stderr.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = [
    "BOOT_TAG",
    "check_modules",
    "core_busy",
    "cpu_seconds",
    "die_with_parent",
    "exit_on_signals",
    "free_port",
    "start_backend",
    "start_mini",
    "start_runroute",
    "stop",
    "thread_cpu",
    "wait_idle",
    "wait_ready",
]

TICK = os.sysconf("SC_CLK_TCK")
BOOT_TAG = "runroute-bench-modules:"
PACKAGES = ("runroute", "router", "features", "models")
_BOOT = (
    "import sys\n"
    "import runroute, router, features, models\n"
    f"print({BOOT_TAG!r}, *(m.__file__ for m in (runroute, router, features, models)), "
    "file=sys.stderr, flush=True)\n"
    "from runroute.cli import app\n"
    "sys.argv = ['runroute', *sys.argv[1:]]\n"
    "app()\n"
)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` of the benches' children: SIGTERM to the child when the bench dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the finally blocks are the only cleanup
        pass


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``SystemExit`` in the bench, so its ``finally`` blocks run."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200 (bounded); stop early when ``proc`` has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"bench: process exited (rc {proc.returncode}) before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"bench: not ready after {timeout_s:.0f} s: {url}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s; only this process (started by us), by its pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(st[st.rindex(")") + 2 :].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    return kids


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants, in seconds (0 for a process that is gone)."""
    kids, todo, total = _children(), [pid], 0.0
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, []))
        try:
            st = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def thread_cpu(pid: int) -> dict[str, float]:
    """utime + stime of each thread of ``pid`` by thread name (``/proc/<pid>/task/*/stat``; threads
    of one name summed, a trailing ``_<n>`` of a pool's thread dropped), in seconds; {} when gone."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            st = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = st[st.index("(") + 1 : st.rindex(")")]
        name = (
            "main (event loop)"
            if tid == str(pid)
            else name.rsplit("_", 1)[0]
            if name[-1:].isdigit()
            else name
        )
        fields = st[st.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def core_busy() -> dict[int, float]:
    """Busy seconds of each CPU since boot from /proc/stat: user, nice, system and steal.

    Over a cell, a core's busy time minus the bench's own processes on it is the load of *other*
    processes there (other helpers on a shared machine) plus hypervisor steal. irq and softirq are
    left out: they are mostly the bench's own loopback traffic, which no process is charged for."""
    out: dict[int, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *vals = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            v = [int(x) for x in vals]
            out[int(name[3:])] = (v[0] + v[1] + v[2] + v[7]) / TICK
    return out


def wait_idle(pids: list[int], max_s: float, below: float = 0.05, window_s: float = 0.5) -> float:
    """Wait (at most ``max_s``) until ``pids`` together use less than ``below`` of a core over ``window_s``.

    Returns the seconds waited, so a backlog left by an overloaded cell (or a sidecar still writing
    its run log after priming) does not leak into the next cell."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        c0 = sum(cpu_seconds(p) for p in pids)
        time.sleep(window_s)
        if sum(cpu_seconds(p) for p in pids) - c0 < below * window_s:
            break
    return time.monotonic() - t0


def start_backend(python: str, peers: Path, port: int, cores: str = "0") -> subprocess.Popen:
    """The peers' fake_backend.py (20 ms per request), run from its own folder."""
    return subprocess.Popen(
        ["taskset", "-c", cores, python, str(peers / "fake_backend.py"), "--port", str(port)],
        cwd=peers,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


def start_mini(python: str, peers: Path, port: int, upstream: str, cores: str = "1") -> subprocess.Popen:
    """The peers' bare FastAPI + aiohttp pass-through (mini_proxy_aiohttp.py), from its own folder."""
    cmd = [python, "-m", "uvicorn", "mini_proxy_aiohttp:app", "--app-dir", str(peers)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    cmd += ["--workers", "1", "--no-access-log", "--log-level", "warning"]
    return subprocess.Popen(
        ["taskset", "-c", cores, *cmd],
        cwd=peers,
        env={**os.environ, "UPSTREAM": upstream},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


def start_runroute(
    python: str,
    tree: Path,
    config: Path,
    port: int,
    err: Path,
    cwd: Path,
    cores: str = "1",
    extra: tuple[str, ...] = (),
    wrap: tuple[str, ...] = (),
) -> subprocess.Popen:
    """``runroute serve`` from ``tree`` (first on PYTHONPATH, cwd a scratch folder), stderr to ``err``;
    ``extra``: more ``serve`` arguments (``--workers N``); ``wrap``: a command prefix that ends by
    exec-ing the rest (e.g. joining a cgroup first)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [*wrap, "taskset", "-c", cores, python, "-c", _BOOT, "serve", "--config", str(config)]
    cmd += ["--port", str(port), *extra]
    with open(err, "w") as fh:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=fh, preexec_fn=die_with_parent
        )


def check_modules(err: Path, tree: Path) -> list[str]:
    """The package files the child printed; SystemExit when any is not under ``tree``."""
    for line in err.read_text().splitlines():
        if line.startswith(BOOT_TAG):
            files = line[len(BOOT_TAG) :].split()
            root = tree.resolve()
            bad = [f for f in files if not Path(f).resolve().is_relative_to(root)]
            if bad or len(files) != len(PACKAGES):
                raise SystemExit(f"bench: the sidecar for {tree} imported {bad or files} (expected {root})")
            return files
    raise SystemExit(f"bench: the sidecar for {tree} printed no module files (see {err})")
