"""``bench/overhead.py --realistic``: the sidecar's added latency under many concurrent, growing agent runs.

Algorithm:

1. Start the peers' ``fake_backend.py`` (../shared/bench-peers, run from its folder; 20 ms per request,
   16 SSE chunks when streaming) pinned to core 0. Start every system under test pinned to core 1:
   the peers' bare FastAPI + aiohttp pass-through (``mini``, their ``mini_proxy_aiohttp.py``), this
   checkout's sidecar (``runroute``: ``runroute serve`` with a generated config: learned policy with
   a real bundle, admission, /metrics scraper, run-log writer and metrics on, as in the default
   overhead run, and ``server.max_body_bytes`` above the largest body), each ``--variant`` (the same
   sidecar with config overrides) and, with ``--ref-tree``, the sidecar of another checkout
   (``ref@<commit>``), each launched so that its packages come from its own tree (the child prints
   their files; a mismatch stops the bench). ``direct`` sends to the fake itself.
2. Prime each sidecar (``realistic_load.py --prime``): every one of the ``--runs`` runs is sent its
   steps up to where the measured cells pick it up, so each sidecar holds 1,000 runs of real history
   (run positions are spread evenly over the run's life: the measured cells see every step index).
3. Cells = reps x modes x rates; within a cell every system runs back to back (order rotated per cell), each
   one ``realistic_load.py`` process pinned to core 0 sending the *same* schedule (Poisson, same seed)
   of (run, step) bodies from 2 KB to 200 KB, open loop, latency from the scheduled send time. Before
   each system's turn the bench waits until all systems and the backend are idle (< 5 % of a core
   together), so one's backlog does not land in another's cell; its CPU over the cell is
   read from /proc (:mod:`sut_procs`) and divided by the requests sent (a runroute sidecar's also per
   thread: the event loop's vs the embedding, run-log and stall-watchdog threads').
4. Report (:mod:`realistic_report`): per (mode, rate, system) p50/p99 and added p50/p99 over direct,
   TTFB, errors, achieved rate, CPU ms per request; ``runroute`` against ``ref`` (the old code, same
   session); per-step growth: added p50 around step 5 vs around step 40 (``--compare-steps``, pooled
   over +-``--step-window`` steps) of the same population of runs; a rich table, JSON and a PNG of
   added p50 vs step index.

Knobs: ``--rates`` (50,200,400), ``--modes`` (ns,s), ``--duration`` (s per cell, 5), ``--drain`` (5),
``--reps`` (1: the whole matrix again, the runs continuing; issue 13 asks for "one of two runs"),
``--runs`` (1000), ``--steps`` (50), ``--min-body`` (2048), ``--max-body`` (204800), ``--id-via``
(header | metadata), ``--ref-tree PATH`` (``--ref-python``: that tree's .venv when present, else this
interpreter with the tree first on PYTHONPATH; ``--ref-bundle``), ``--variant LABEL:key=value[,...]``
(dotted config keys, YAML values, e.g. ``noadm:admission.enabled=false``), ``--no-mini``, ``--bundle``,
``--prime-concurrency`` (32), ``--idle-max`` (s, 20), ``--pyspy DIR`` (py-spy records each runroute
sidecar during each cell, raw stacks per cell: ``bench/pyspy_shares.py`` tabulates them; needs
``py-spy`` installed; a profiled run's latencies are not comparable), ``--seed``, ``--out`` (folder: records, JSON,
PNG; default a temp dir), ``--peers``, ``--report-from DIR/realistic.json`` (re-render a finished run's
tables, JSON and PNG from its records without running anything). The protocol axis: ``--protocol``
(chat | responses | messages: the load generator's bodies, the same conversations in each protocol)
with ``--backend proto`` (:mod:`proto_backend`: the peers' backend model for all three protocols;
implied for responses/messages, where ``mini``, a chat-only proxy, is left out); a translated run
is the variant ``--variant xlate:local.protocols=[chat]`` (the sidecar translates to chat). Planned
axes (issues 17-18: ``runlog.durability``, tracing) fit as ``--variant``.

Usage: ``.venv/bin/python bench/overhead.py --realistic [--duration 5] [--ref-tree ../wt-oldmain]``;
about 4-5 minutes with the defaults and a ref tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import realistic_report  # noqa: E402
import stall_report  # noqa: E402
from sut_procs import (  # noqa: E402
    check_modules,
    core_busy,
    cpu_seconds,
    die_with_parent,
    exit_on_signals,
    free_port,
    start_backend,
    start_mini,
    start_runroute,
    stop,
    thread_cpu,
    wait_idle,
    wait_ready,
)

__all__ = ["System", "ensure_bundle", "main", "sidecar_config"]

ROOT = HERE.parent
PEERS = ROOT.parent / "shared" / "bench-peers"
console = Console(width=None if sys.stdout.isatty() else 200)


@dataclass
class System:
    label: str
    kind: str  # direct | mini | runroute
    url: str
    model: str
    pid: int | None = None
    proc: subprocess.Popen | None = None
    tree: str | None = None
    python: str | None = None
    modules: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    prime: dict[str, Any] | None = None

    @property
    def stateful(self) -> bool:
        return self.kind == "runroute"


def _parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    label, _, rest = spec.partition(":")
    if not label or not rest:
        raise SystemExit(f"realistic: --variant wants LABEL:key=value[,key=value], got {spec!r}")
    out: dict[str, Any] = {}
    for kv in rest.split(","):
        k, eq, v = kv.partition("=")
        if not eq:
            raise SystemExit(f"realistic: --variant item {kv!r} is not key=value")
        out[k.strip()] = yaml.safe_load(v)
    return label, out


def sidecar_config(
    a: argparse.Namespace, bport: int, bundle: Path, logs: Path, overrides: dict[str, Any]
) -> dict:
    """The benches' sidecar config (``a.max_body`` sizes the body limit); ``overrides``: dotted keys."""
    backend = f"http://127.0.0.1:{bport}"
    cfg: dict[str, Any] = {
        "local": {"urls": [backend], "model": "fake-model"},
        "frontier": {"url": backend, "model": "fake-model-frontier", "allow_no_key": True},
        "policy": {"kind": "learned"},
        "bundle": {"path": str(bundle.resolve()), "watch_s": 2},
        "runlog": {"dir": str(logs)},
        "scrape": {"interval_s": 1},
        "server": {"max_body_bytes": max(1 << 20, 4 * a.max_body)},
    }
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def ensure_bundle(path: Path) -> None:
    """Train the default bundle at ``path`` once when it is missing."""
    if path.exists():
        return
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from runroute.commands.serve import train_default_bundle

    train_default_bundle(path)


def _ref_python(a: argparse.Namespace) -> str:
    if a.ref_python:
        return a.ref_python
    own = a.ref_tree / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def _commit(tree: Path) -> str:
    cp = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return cp.stdout.strip() or "?"


def _start_sidecar(
    a: argparse.Namespace,
    work: Path,
    label: str,
    tree: Path,
    python: str,
    bundle: Path,
    bport: int,
    ov: dict,
    workers: int = 1,
) -> System:
    port = free_port()
    if tree.resolve() == ROOT and not a.no_stalls:  # this checkout's sidecars: the stall monitor on
        ov = {"runtime.stall_monitor": True, "runtime.stall_path": str(work / f"stalls-{label}.json"), **ov}
    cfg = work / f"{label}.yaml"
    cfg.write_text(yaml.safe_dump(sidecar_config(a, bport, bundle, work / f"logs-{label}", ov)))
    err = work / f"{label}.err"
    if workers > 1:
        proc = start_runroute(
            python, tree, cfg, port, err, cwd=work, cores=a.workers_cores, extra=("--workers", str(workers))
        )
    else:
        proc = start_runroute(python, tree, cfg, port, err, cwd=work)
    sysm = System(label, "runroute", f"http://127.0.0.1:{port}", "auto", proc.pid, proc, str(tree), python)
    sysm.overrides = ov
    try:
        wait_ready(f"{sysm.url}/ready", 90, proc)
        sysm.modules = check_modules(err, tree)
    except BaseException:  # a sidecar that failed to start (or the wrong tree's) is stopped here
        stop(proc)
        raise
    return sysm


def _loadgen(a: argparse.Namespace, s: System, state: Path, extra: list[str]) -> list[str]:
    cmd = ["taskset", "-c", "0", sys.executable, str(HERE / "realistic_load.py"), "--url", s.url]
    cmd += ["--model", s.model, "--label", s.label, "--state", str(state), "--runs", str(a.runs)]
    cmd += ["--steps", str(a.steps), "--min-body", str(a.min_body), "--max-body", str(a.max_body)]
    return cmd + ["--id-via", a.id_via, "--protocol", a.protocol, *extra]


def _run_lines(cmd: list[str], timeout_s: float, on_line: Any = None) -> dict[str, Any]:
    """Run a load-generator process; feed its 'progress' lines to ``on_line``; return its result."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent
    )
    result: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("progress ") and on_line is not None:
                on_line(*map(int, line.split()[1:3]))
            elif line.startswith("result "):
                result = json.loads(line[7:])
            if time.monotonic() > deadline:
                proc.kill()
                break
    except BaseException:  # interrupted: the load generator goes with the bench
        proc.kill()
        proc.wait(5)
        raise
    _out, err = proc.communicate(timeout=30)
    if proc.returncode != 0:
        result["loadgen_rc"] = proc.returncode
        result["loadgen_stderr"] = err[-800:]
    return result


def _decisions(s: System) -> list[str]:
    try:
        with urllib.request.urlopen(f"{s.url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return [f"(metrics unavailable: {e})"]
    return [ln for ln in text.splitlines() if ln.startswith("runroute_decisions_total")]


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="overhead.py --realistic", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,200,400")
    ap.add_argument("--modes", default="ns,s")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--drain", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--min-body", type=int, default=2048)
    ap.add_argument("--max-body", type=int, default=204800)
    ap.add_argument("--id-via", choices=["header", "metadata"], default="header")
    ap.add_argument("--protocol", choices=["chat", "responses", "messages"], default="chat")
    ap.add_argument("--backend", choices=["peers", "proto"], default="peers")
    ap.add_argument("--ref-tree", type=Path, default=None)
    ap.add_argument("--ref-python", default=None)
    ap.add_argument("--ref-bundle", type=Path, default=None)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--no-mini", action="store_true")
    ap.add_argument("--no-stalls", action="store_true", help="leave the sidecars' stall monitor off")
    ap.add_argument(
        "--pyspy",
        type=Path,
        default=None,
        help="folder: py-spy records each runroute sidecar during each cell (raw stacks; profile runs only)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="also run this checkout's sidecar as `serve --workers N` (store: Redis at --redis-url)",
    )
    ap.add_argument("--workers-cores", default="0,1", help="taskset cores of the --workers sidecar")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--bundle", type=Path, default=ROOT / "runroute-bundle")
    ap.add_argument("--prime-concurrency", type=int, default=32)
    ap.add_argument("--idle-max", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compare-steps", default="5,40")
    ap.add_argument("--step-window", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--peers", type=Path, default=PEERS)
    ap.add_argument("--report-from", type=Path, default=None, help="re-render from a run's realistic.json")
    a = ap.parse_args(argv)
    cmp_steps = [int(x) for x in a.compare_steps.split(",")]
    if max(cmp_steps) + a.step_window >= a.steps:
        raise SystemExit(f"realistic: --steps {a.steps} is too short for --compare-steps {a.compare_steps}")
    if a.ref_tree is not None:  # absolute: the sidecar runs with a scratch folder as its cwd
        a.ref_tree = a.ref_tree.resolve()
    if a.ref_tree is not None and not (a.ref_tree / "runroute" / "cli.py").exists():
        raise SystemExit(f"realistic: --ref-tree {a.ref_tree} is not a runroute checkout")
    if a.protocol != "chat":
        a.backend, a.no_mini = "proto", True
    if shutil.which("taskset") is None:
        raise SystemExit("realistic: needs taskset (util-linux) for CPU pinning")
    if a.pyspy is not None and _pyspy_exe() is None:
        raise SystemExit("realistic: --pyspy needs py-spy (.venv/bin/python -m pip install py-spy)")
    return a


def _start_all(a: argparse.Namespace, work: Path, bport: int, systems: list[System]) -> list[System]:
    """Start every system, appending each to ``systems`` as soon as its process exists, so that the
    caller's ``finally`` stops the ones already started when a later one fails to start."""
    backend_url = f"http://127.0.0.1:{bport}"
    systems.append(System("direct", "direct", backend_url, "fake-model"))
    if not a.no_mini:
        mport = free_port()
        mini = start_mini(sys.executable, a.peers, mport, backend_url)
        s = System("mini", "mini", f"http://127.0.0.1:{mport}", "fake-model", mini.pid, mini)
        systems.append(s)
        wait_ready(f"{s.url}/v1/models", 30, mini)
    systems.append(_start_sidecar(a, work, "runroute", ROOT, sys.executable, a.bundle, bport, {}))
    for spec in a.variant:
        label, ov = _parse_variant(spec)
        systems.append(_start_sidecar(a, work, label, ROOT, sys.executable, a.bundle, bport, ov))
    if a.workers > 1:  # serve --workers N: run state in Redis under a key prefix of this bench run's own
        ov = {
            "store.kind": "redis",
            "store.redis_url": a.redis_url,
            "store.key_prefix": f"rrbench-{os.getpid()}:",
        }
        label = f"w{a.workers}"
        ov["runtime.stall_path"] = str(work / f"stalls-{label}-pid{{pid}}.json")  # one per worker
        systems.append(_start_sidecar(a, work, label, ROOT, sys.executable, a.bundle, bport, ov, a.workers))
    if a.ref_tree is not None:
        label = f"ref@{_commit(a.ref_tree)}"
        bundle = a.ref_bundle or a.bundle
        systems.append(_start_sidecar(a, work, label, a.ref_tree, _ref_python(a), bundle, bport, {}))
    return systems


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.report_from is not None:
        return _report_from(a.report_from)
    exit_on_signals()  # SIGTERM/SIGHUP run the finally below: no sidecar outlives the bench
    work = Path(tempfile.mkdtemp(prefix="runroute-realistic-"))
    out = a.out or work
    out.mkdir(parents=True, exist_ok=True)
    ensure_bundle(a.bundle)
    rates, modes = [float(r) for r in a.rates.split(",")], a.modes.split(",")
    bport = free_port()
    if a.backend == "proto":
        backend = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, str(HERE / "proto_backend.py"), "--port", str(bport)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    else:
        backend = start_backend(sys.executable, a.peers, bport)
    systems: list[System] = []
    cells: list[dict[str, Any]] = []
    decisions: dict[str, list[str]] = {}
    crashed: dict[str, str] = {}
    t_start = time.monotonic()
    try:
        wait_ready(f"http://127.0.0.1:{bport}/health", 30, backend)
        _start_all(a, work, bport, systems)
        for s in systems:
            where = f"packages from {Path(s.modules[0]).parents[1]}" if s.modules else ""
            console.print(f"[bold]{s.label}[/] {s.url} pid={s.pid or '-'} {where}", soft_wrap=True)
        n_cells = a.reps * len(modes) * len(rates) * len(systems)
        cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        with Progress(*cols, console=console) as progress:
            for s in systems:
                if not s.stateful:
                    continue
                task = progress.add_task(f"prime {s.label}", total=None)
                s.prime = _run_lines(
                    _loadgen(
                        a,
                        s,
                        out / f"state-{s.label}.json",
                        ["--prime", "--concurrency", str(a.prime_concurrency)],
                    ),
                    3600,
                    lambda done, total, task=task: progress.update(task, completed=done, total=total),
                )
                progress.update(task, completed=s.prime.get("sent", 0), total=s.prime.get("total", 0))
            task = progress.add_task("cells", total=n_cells)
            plan = [(rep, m, r) for rep in range(1, a.reps + 1) for m in modes for r in rates]
            for ci, (rep, mode, rate) in enumerate(plan):
                order = systems[ci % len(systems) :] + systems[: ci % len(systems)]
                for s in order:
                    progress.update(task, description=f"rep {rep} {s.label} {mode} {rate:g} req/s")
                    if s.proc is not None and s.proc.poll() is not None:  # crashed: report, do not hide
                        crashed.setdefault(s.label, _crash_note(s, work))
                    else:
                        cells.append(_cell(a, s, systems, backend.pid, (rep, mode, rate), a.seed + ci, out))
                    progress.advance(task)
        for s in systems:
            if s.stateful and s.label not in crashed:
                decisions[s.label] = _decisions(s)
    finally:
        for s in systems:
            if s.proc is not None:
                stop(s.proc)
        stop(backend)
    for label, note in crashed.items():
        console.print(f"[red]{label} exited during the run[/]: {note}", soft_wrap=True)
        decisions[label] = [f"(exited during the run: {note})"]
    rc = _report(a, systems, cells, out, decisions, round(time.monotonic() - t_start, 1))
    stalls: dict[str, Any] = {}
    for s in systems:
        if s.stateful:  # one file per sidecar; per worker process for serve --workers
            stalls[s.label] = stall_report.load(work / f"stalls-{s.label}.json")
            for f in sorted(work.glob(f"stalls-{s.label}-pid*.json")):
                stalls[f"{s.label}/{f.stem.rsplit('-', 1)[1]}"] = stall_report.load(f)
    found = {k: v for k, v in stalls.items() if v is not None}
    if found:  # written by each sidecar at its shutdown (priming included)
        stall_report.show(found, console)
        (out / "stalls.json").write_text(json.dumps(found, indent=1))
    return rc


def _crash_note(s: System, work: Path) -> str:
    err = work / f"{s.label}.err"
    tail = err.read_text()[-600:] if err.exists() else ""
    return f"rc {s.proc.returncode if s.proc else '?'}; stderr tail: {tail!r}"


def _report(
    a: argparse.Namespace, systems: list[System], cells: list[dict], out: Path, decisions: dict, wall: float
) -> int:
    rates, modes = [float(r) for r in a.rates.split(",")], a.modes.split(",")
    summary = realistic_report.build(a, systems, cells, out, rates, modes, decisions)
    summary["wall_s"], summary["raw_cells"] = wall, cells
    realistic_report.show(summary, console)
    json_path, png_path = out / "realistic.json", out / "realistic_added_p50_by_step.png"
    json_path.write_text(json.dumps(summary, indent=1))
    realistic_report.plot(summary, png_path)
    console.print(f"records, JSON and PNG: {out} ({json_path.name}, {png_path.name}); wall {wall} s")
    return 0


def _report_from(path: Path) -> int:
    """Re-render tables, JSON and PNG from a finished run's realistic.json and records (same folder)."""
    saved = json.loads(path.read_text())
    a = argparse.Namespace(**saved["config"])
    keep = ("label", "kind", "tree", "python", "modules", "overrides", "prime")
    systems = [System(url="", model="", **{k: d[k] for k in keep}) for d in saved["systems"]]
    return _report(a, systems, saved["raw_cells"], path.parent, saved["decisions"], saved["wall_s"])


def _pyspy_exe() -> str | None:
    own = Path(sys.executable).parent / "py-spy"
    return str(own) if own.exists() else shutil.which("py-spy")


def _pyspy(a: argparse.Namespace, s: System, name: str) -> subprocess.Popen | None:
    """``--pyspy``: py-spy sampling a runroute sidecar's threads (on-CPU only, ``--nonblocking``: the
    sidecar is never paused) for one cell, raw collapsed stacks to ``DIR/<name>.txt``. py-spy is not
    a child of the sidecar, so the cell's CPU figure does not include it, but it takes CPU from the
    machine: read a profiled run's shares, not its latencies."""
    if a.pyspy is None or s.kind != "runroute" or not s.pid:
        return None
    exe = _pyspy_exe()
    assert exe is not None  # checked with the arguments
    a.pyspy.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "record", "--pid", str(s.pid), "--rate", "250", "--nonblocking", "--threads"]
    cmd += ["--format", "raw", "--output", str(a.pyspy / f"{name}.txt")]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
    )


def _cell(
    a: argparse.Namespace,
    s: System,
    systems: list[System],
    backend_pid: int,
    key: tuple[int, str, float],
    seed: int,
    out: Path,
) -> dict:
    """One system's turn in a cell: wait until every system is idle, run the load, read CPU from /proc."""
    suts = [x.pid for x in systems if x.pid]  # every SUT is pinned to core 1, idle ones included
    idle = wait_idle([*suts, backend_pid], a.idle_max)
    rep, mode, rate = key
    rec_path = out / f"rec-{s.label}-{mode}-{rate:g}-r{rep}.jsonl"
    extra = ["--rate", str(rate), "--duration", str(a.duration), "--drain", str(a.drain), "--seed", str(seed)]
    extra += ["--out", str(rec_path)] + (["--stream"] if mode == "s" else [])
    c0 = {p: cpu_seconds(p) for p in [*suts, backend_pid]}
    th0 = thread_cpu(s.pid) if s.pid and s.kind == "runroute" else {}
    cell: dict[str, Any] = {}
    ch0, busy0 = os.times(), core_busy()
    spy = _pyspy(a, s, f"{s.label}-{mode}-{rate:g}-r{rep}")
    t0 = time.monotonic()
    try:
        res = _run_lines(_loadgen(a, s, out / f"state-{s.label}.json", extra), a.duration + a.drain + 90)
    finally:
        wall, busy1, ch1 = time.monotonic() - t0, core_busy(), os.times()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                stop(spy)
    used = {p: cpu_seconds(p) - c for p, c in c0.items()}
    if th0:  # the sidecar's CPU by thread (the event loop vs embedding, run log, stall watchdog)
        th1 = thread_cpu(s.pid)
        cell["cpu_threads_s"] = {
            k: round(v - th0.get(k, 0.0), 3) for k, v in th1.items() if v - th0.get(k, 0.0) > 0
        }
    cell.update(system=s.label, rep=rep, mode=mode, rate=rate, seed=seed, records=rec_path.name, **res)
    cell["wall_s"], cell["idle_wait_s"] = round(wall, 2), round(idle, 2)
    cell["cpu_sut_s"] = round(used[s.pid], 3) if s.pid else None
    cell["cpu_other_suts_s"] = round(sum(v for p, v in used.items() if p not in (s.pid, backend_pid)), 3)
    cell["cpu_backend_s"] = round(used[backend_pid], 3)
    client = (ch1.children_user + ch1.children_system) - (ch0.children_user + ch0.children_system)
    # what processes outside this bench (and steal) took from each core, as a share of the cell
    ours = {0: used[backend_pid] + client, 1: sum(v for p, v in used.items() if p != backend_pid)}
    cell["other_share"] = {
        c: round(max(0.0, busy1[c] - busy0[c] - ours[c]) / wall, 3) for c in ours if c in busy1
    }
    return cell


if __name__ == "__main__":
    raise SystemExit(main())
