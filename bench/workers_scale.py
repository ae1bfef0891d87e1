"""``runroute serve --workers N``: the saturation rate of N workers against one, each worker on a CPU budget.

Why a budget: on a 2-core machine the load generator, the fake backend and Redis need CPU beside the
sidecar, so "two workers on two cores" cannot be measured there. Instead each sidecar runs in its own
cgroup (v1 ``cpu`` controller) with a quota of ``--budget`` cores *per worker* (``cpu.cfs_quota_us`` =
N x budget x period) and a high ``cpu.shares``, so the kernel gives it up to that quota before anything
else, and never more; the load side (load generator, fake backend, Redis) gets the rest of the machine.
If the workers scale, N workers on N x budget cores saturate at N times one worker's rate; what they
share (Redis round trips, the one listening socket, the metrics view) is what keeps them below it.

Algorithm:

1. Start the peers' ``fake_backend.py`` (20 ms per request) unpinned. For each N in ``--workers``: start
   ``runroute serve --workers N`` (learned policy with a real bundle, run log, metrics; run state in
   Redis under a key prefix of this bench's own, for N = 1 too, so the store is the same) inside its
   cgroup, then prime ``--runs`` runs (``realistic_load.py --prime``: each run's history up to its
   position, so the sidecar holds 1,000 runs of real history).
2. Saturation search, open loop (``realistic_load.py``: Poisson arrivals, bodies 2-200 KB growing over
   the run, latency from the scheduled time): from ``--start`` req/s the offered rate grows by
   ``--growth`` until a probe fails, then ``--bisect`` bisections between the last pass and the first
   fail. A probe passes when the achieved rate (requests answered 200 / time to the last answer) is at
   least ``--pass-share`` (0.98) of the rate as sent (requests sent / the last scheduled send time: a
   few seconds of Poisson arrivals vary by several per cent around the nominal rate). Before each probe the bench waits until the
   sidecar and the backend are idle. The saturation rate is the highest passing offered rate.
3. Per probe: the sidecar's CPU (its process tree, /proc), the cgroup's throttling (``cpu.stat``:
   periods throttled), the load side's CPU (client, backend, redis-server), each core's busy share, and
   the load generator's send lag (scheduled -> sent, p99): a probe whose client sent more than
   ``--lag-max`` ms late at p99 is marked ``client_lagged`` (the load side could not keep the schedule:
   a failure there may be the client's, and a saturation rate above it is then a lower bound).
4. Report: a rich table per N (saturation rate, CPU ms per request and throttled share at that rate,
   load-side cores), the ratio of N workers' saturation rate to one worker's, JSON to ``--out``.

Knobs: ``--workers`` (1,2), ``--budget`` (cores per worker, 0.45), ``--start`` (req/s, 60; 100 suits this machine),
``--growth`` (1.25), ``--bisect`` (3), ``--pass-share`` (0.98), ``--lag-max`` (ms, 50), ``--duration`` (s per probe, 10), ``--drain`` (5),
``--max-probes`` (14), ``--runs`` (1000), ``--steps`` (50), ``--stream``, ``--redis-url``, ``--bundle``,
``--out``, ``--peers``, ``--seed``.
Needs: Linux cgroup v1 ``cpu`` controller writable at ``/sys/fs/cgroup/cpu`` (root), ``taskset``.
Cleanup: every child dies with the bench (``die_with_parent``), SIGTERM/SIGHUP run the ``finally``
blocks, the cgroups are removed and the bench's Redis keys deleted on every exit path.

Usage: ``.venv/bin/python bench/workers_scale.py [--budget 0.45] [--workers 1,2]``; about 5 minutes per N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from realistic import ensure_bundle, sidecar_config  # noqa: E402
from realistic_report import cell_stats  # noqa: E402
from sut_procs import (  # noqa: E402
    core_busy,
    cpu_seconds,
    die_with_parent,
    exit_on_signals,
    free_port,
    start_backend,
    start_runroute,
    stop,
    wait_idle,
    wait_ready,
)

ROOT = HERE.parent
PEERS = ROOT.parent / "shared" / "bench-peers"
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
console = Console(width=None if sys.stdout.isatty() else 160)


class CpuBudget:
    """A cgroup (v1 ``cpu``) with a quota of ``cores`` CPUs and high shares; processes join it by
    ``wrap``-ping their command (the shell writes its own pid, then execs the command)."""

    def __init__(self, name: str, cores: float | None) -> None:
        self.path = CGROUP_CPU / name
        self.cores = cores
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        quota = -1 if cores is None else int(cores * PERIOD_US)  # -1: no quota
        (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        (self.path / "cpu.shares").write_text("262144")  # the maximum: ahead of every other group

    def join(self, pid: int) -> None:
        """Move a running process (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def wrap(self) -> tuple[str, ...]:
        return ("sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path))

    def stat(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
        return out

    def remove(self) -> None:
        """Move anything left back to the root group, then remove the group (every exit path)."""
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (CGROUP_CPU / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            self.path.rmdir()
        except OSError:
            pass


@dataclass
class Probe:
    rate: float
    achieved: float | None
    passed: bool
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    cpu_ms_per_req: float | None
    throttled_share: float
    load_side_cores: float
    core_busy: list[float]
    client_lagged: bool
    extra: dict[str, Any] = field(default_factory=dict)


def _redis_pids() -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if Path(f"/proc/{d}/comm").read_text().strip() == "redis-server":
                    out.append(int(d))
            except OSError:
                continue
    return out


def _config(a: argparse.Namespace, bport: int, work: Path, label: str, prefix: str) -> Path:
    store = {"store.kind": "redis", "store.redis_url": a.redis_url, "store.key_prefix": prefix}
    path = work / f"{label}.yaml"
    path.write_text(yaml.safe_dump(sidecar_config(a, bport, a.bundle, work / f"logs-{label}", store)))
    return path


def _loadgen(
    a: argparse.Namespace, load: CpuBudget, url: str, label: str, state: Path, extra: list[str]
) -> list[str]:
    cmd = [*load.wrap(), sys.executable, str(HERE / "realistic_load.py"), "--url", url, "--model", "auto"]
    cmd += ["--label", label, "--state", str(state), "--runs", str(a.runs), "--steps", str(a.steps)]
    cmd += ["--min-body", "2048", "--max-body", str(a.max_body)]
    return cmd + extra


def _run(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    cp = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=die_with_parent, check=False
    )
    result: dict[str, Any] = {}
    for line in cp.stdout.splitlines():
        if line.startswith("result "):
            result = json.loads(line[7:])
    if cp.returncode != 0:
        raise SystemExit(f"workers_scale: load generator failed (rc {cp.returncode}): {cp.stderr[-600:]}")
    return result


@dataclass
class Bench:
    """What every probe shares: the arguments, the load side's group, the fake backend, the folders."""

    a: argparse.Namespace
    load: CpuBudget
    backend: subprocess.Popen
    bport: int
    work: Path
    out: Path


def _probe(
    b: Bench,
    url: str,
    label: str,
    state: Path,
    sut: subprocess.Popen,
    budget: CpuBudget,
    rate: float,
    seed: int,
) -> Probe:
    a, load, out, backend_pid = b.a, b.load, b.out, b.backend.pid
    wait_idle([sut.pid, backend_pid], a.idle_max)
    rec = out / f"rec-{label}-{rate:g}.jsonl"
    extra = ["--rate", f"{rate:g}", "--duration", str(a.duration), "--drain", str(a.drain)]
    extra += ["--seed", str(seed), "--out", str(rec)] + (["--stream"] if a.stream else [])
    redis = _redis_pids()
    c_sut, c_back = cpu_seconds(sut.pid), cpu_seconds(backend_pid)
    c_redis = sum(cpu_seconds(p) for p in redis)
    st0, busy0, t0 = budget.stat(), core_busy(), time.monotonic()
    res = _run(_loadgen(a, load, url, label, state, extra), a.duration + a.drain + 120)
    wall = time.monotonic() - t0
    st1, busy1 = budget.stat(), core_busy()
    sut_s = cpu_seconds(sut.pid) - c_sut
    load_s = (cpu_seconds(backend_pid) - c_back) + (sum(cpu_seconds(p) for p in redis) - c_redis)
    load_s += float(res.get("client_cpu_s", 0.0))
    records = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    stats = cell_stats(records, a.stream)
    achieved = stats["achieved_rate"]
    # the offered rate as sent (Poisson counts over a few seconds vary by several per cent around
    # the nominal rate): requests sent / the last scheduled send time
    last = max((r["t_sched"] for r in records), default=0.0)
    offered = round(len(records) / last, 1) if last > 0 else None
    periods = max(1, st1.get("nr_periods", 0) - st0.get("nr_periods", 0))
    busy = [round((busy1[c] - busy0[c]) / wall, 3) for c in sorted(busy1)]
    return Probe(
        rate=rate,
        achieved=achieved,
        passed=achieved is not None and offered is not None and achieved >= a.pass_share * offered,
        errors=stats["errors"],
        p50_ms=stats["p50_ms"],
        p99_ms=stats["p99_ms"],
        cpu_ms_per_req=round(1000 * sut_s / stats["sent"], 3) if stats["sent"] else None,
        throttled_share=round((st1.get("nr_throttled", 0) - st0.get("nr_throttled", 0)) / periods, 3),
        load_side_cores=round(load_s / wall, 3),
        core_busy=busy,
        client_lagged=(stats["send_lag_p99_ms"] or 0.0) > a.lag_max,
        extra={
            "offered_as_sent": offered,
            "send_lag_p99_ms": stats["send_lag_p99_ms"],
            "sut_cores": round(sut_s / wall, 3),
            "wall_s": round(wall, 1),
        },
    )


def _search(a: argparse.Namespace, probe: Any) -> list[Probe]:
    """Grow the rate until a probe fails, then bisect between the highest pass below the lowest fail
    and that fail (``--bisect`` bisections, or until they are 3% apart)."""
    probes: list[Probe] = []
    rate, bisections = a.start, 0
    while len(probes) < a.max_probes:
        p = probe(rate)
        probes.append(p)
        console.print(
            f"  {rate:7.1f} req/s (sent {p.extra.get('offered_as_sent')}) -> achieved {p.achieved} "
            f"({'pass' if p.passed else 'FAIL'}), "
            f"p99 {p.p99_ms} ms, {p.cpu_ms_per_req} CPU ms/req, throttled {p.throttled_share:.0%} of periods, "
            f"load side {p.load_side_cores} cores, cores busy {p.core_busy}"
            + (f" [client lagged: send lag p99 {p.extra['send_lag_p99_ms']} ms]" if p.client_lagged else "")
        )
        fails = [q.rate for q in probes if not q.passed]
        if not fails:
            rate = round(rate * a.growth, 1)
            continue
        bad = min(fails)
        good = max((q.rate for q in probes if q.passed and q.rate < bad), default=None)
        if good is None:  # the first probe failed: go down
            rate = round(rate / a.growth, 1)
            continue
        if bisections >= a.bisect or (bad - good) / good < 0.03:
            break
        rate, bisections = round((good + bad) / 2, 1), bisections + 1
    return probes


def _saturation(probes: list[Probe]) -> Probe | None:
    passed = [p for p in probes if p.passed]
    return max(passed, key=lambda p: p.rate) if passed else None


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="workers_scale.py", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--budget", type=float, default=0.45, help="CPU cores per worker (cgroup quota)")
    ap.add_argument("--start", type=float, default=60.0)
    ap.add_argument("--growth", type=float, default=1.25)
    ap.add_argument("--bisect", type=int, default=3)
    ap.add_argument("--max-probes", type=int, default=14)
    ap.add_argument("--pass-share", type=float, default=0.98)
    ap.add_argument("--lag-max", type=float, default=50.0, help="ms: client send lag p99 marking a probe")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--drain", type=float, default=5.0)
    ap.add_argument("--idle-max", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--max-body", type=int, default=204800)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--bundle", type=Path, default=ROOT / "runroute-bundle")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--peers", type=Path, default=PEERS)
    a = ap.parse_args(argv)
    if not os.access(CGROUP_CPU, os.W_OK):
        raise SystemExit(f"workers_scale: needs a writable cgroup v1 cpu controller at {CGROUP_CPU} (root)")
    return a


def _drop_keys(redis_url: str, prefix: str) -> None:
    try:
        import redis

        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
    except Exception as e:  # cleanup only: say so, do not hide the result
        console.print(f"[yellow]could not delete the bench's Redis keys {prefix}*: {e}[/]")


def _one(b: Bench, n: int) -> dict:
    a, load, work, out = b.a, b.load, b.work, b.out
    label = f"w{n}"
    prefix = f"rrscale-{os.getpid()}-{label}:"
    budget = CpuBudget(f"runroute-bench-{os.getpid()}-{label}", n * a.budget)
    sut: subprocess.Popen | None = None
    try:
        port = free_port()
        cfg = _config(a, b.bport, work, label, prefix)
        extra = ("--workers", str(n)) if n > 1 else ()
        sut = start_runroute(
            sys.executable,
            ROOT,
            cfg,
            port,
            work / f"{label}.err",
            cwd=work,
            cores="0,1",
            extra=extra,
            wrap=budget.wrap(),
        )
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/ready", 120, sut)
        state = out / f"state-{label}.json"
        console.print(
            f"[bold]{label}[/]: {n} worker(s), budget {budget.cores:g} cores; priming {a.runs} runs"
        )
        t0 = time.monotonic()
        prime = _run(_loadgen(a, load, url, label, state, ["--prime", "--concurrency", "32"]), 3600)
        console.print(f"  primed {prime.get('sent')} steps in {time.monotonic() - t0:.0f} s")
        seeds = iter(range(a.seed * 1000, a.seed * 1000 + 1000))
        probes = _search(a, lambda r: _probe(b, url, label, state, sut, budget, r, next(seeds)))
        sat = _saturation(probes)
        return {
            "workers": n,
            "budget_cores": budget.cores,
            "saturation_rate": sat.rate if sat else None,
            "at_saturation": sat.__dict__ if sat else None,
            "probes": [p.__dict__ for p in probes],
            "lower_bound": bool(sat and any(p.client_lagged for p in probes if p.rate > sat.rate)),
        }
    finally:
        if sut is not None:
            stop(sut)
        budget.remove()
        _drop_keys(a.redis_url, prefix)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    exit_on_signals()
    work = Path(tempfile.mkdtemp(prefix="runroute-workers-"))
    out = a.out or work
    out.mkdir(parents=True, exist_ok=True)
    ensure_bundle(a.bundle)
    bport = free_port()
    load = CpuBudget(f"runroute-bench-{os.getpid()}-load", None)
    backend = start_backend(sys.executable, a.peers, bport, cores="0,1")
    redis = _redis_pids()
    results: list[dict] = []
    try:
        load.join(backend.pid)
        for pid in redis:  # the store serves the load; back to the root group below
            load.join(pid)
        wait_ready(f"http://127.0.0.1:{bport}/health", 30, backend)
        b = Bench(a, load, backend, bport, work, out)
        for n in (int(x) for x in a.workers.split(",")):
            results.append(_one(b, n))
    finally:
        stop(backend)
        load.remove()  # moves Redis (and anything left) back to the root group
    base = next((r["saturation_rate"] for r in results if r["workers"] == 1), None)
    table = Table(
        title=f"serve --workers N, {a.budget:g} cores per worker ({'streaming' if a.stream else 'plain'})"
    )
    for col in (
        "workers",
        "budget cores",
        "saturation req/s",
        "x one worker",
        "CPU ms/req",
        "p99 ms",
        "throttled",
        "load side cores",
        "note",
    ):
        table.add_column(col)
    for r in results:
        s = r["at_saturation"] or {}
        ratio = round(r["saturation_rate"] / base, 2) if base and r["saturation_rate"] else None
        r["ratio_to_one"] = ratio
        table.add_row(
            str(r["workers"]),
            f"{r['budget_cores']:g}",
            str(r["saturation_rate"]),
            str(ratio),
            str(s.get("cpu_ms_per_req")),
            str(s.get("p99_ms")),
            f"{s.get('throttled_share', 0):.0%}",
            str(s.get("load_side_cores")),
            "lower bound: the client lagged" if r["lower_bound"] else "",
        )
    console.print(table)
    path = out / "workers_scale.json"
    path.write_text(
        json.dumps({"config": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1)
    )
    console.print(f"JSON and records: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
