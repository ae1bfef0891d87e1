"""Simulator cost in instructions per simulated step (callgrind), this tree and optionally another.

Usage::

    .venv/bin/python bench/sim_instructions.py [--runs 300] [--replicas 2 32] [--compare-tree DIR]

Workload as ``bench/bench_sim.py`` (``features.generate.generate(--runs, seed=1)`` replayed on its
own start times, session-sticky, the A100 profile, 16 GB of KV per replica). Each simulation runs
under ``valgrind --tool=callgrind --toggle-collect=starmap_next``: the simulation is called through
``itertools.starmap`` (used nowhere else on its path), so only ``Simulator.run`` is counted, not the
imports or the workload build. Printed per tree and replica count: instructions, steps, events and
instructions per step; then the ratio of the replica counts and, with ``--compare-tree`` (a checkout
of the base tree, run with this interpreter and its own ``sys.path``), base / this per replica count.
Instruction counts repeat to within a fraction of a percent; CPU time on the shared machine does not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(tree: str, runs: int, replicas: int) -> None:
    sys.path.insert(0, tree)
    from itertools import starmap

    import router.sim.simulator as simmod
    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    assert simmod.__file__.startswith(tree), simmod.__file__
    w = Workload.from_runlog(RunLog.from_frame(generate(runs, seed=1)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=replicas, kv_cache_gb=16.0)
    sim = Simulator(w, build_policy("session-sticky"), cfg, st)
    r = next(starmap(sim.run, [()]))  # the only starmap on the path: what callgrind counts
    print(f"steps {len(r.outcome)} events {r.events}")


def _measure(tree: Path, runs: int, replicas: int) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cg.out"
        p = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--toggle-collect=starmap_next",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                str(tree),
                "--runs",
                str(runs),
                "--replicas",
                str(replicas),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    ir = int(re.search(r"Collected : (\d+)", p.stderr).group(1))  # type: ignore[union-attr]
    m = re.search(r"steps (\d+) events (\d+)", p.stdout)
    assert m is not None, p.stdout
    return ir, int(m.group(1)), int(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 32])
    ap.add_argument("--compare-tree", help="a checkout of the base tree: measured too")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.runs, args.replicas[0])
        return
    trees = {"this": ROOT}
    if args.compare_tree:
        trees["base"] = Path(args.compare_tree).resolve()
    per: dict[tuple[str, int], float] = {}
    for label, tree in trees.items():
        for n in args.replicas:
            ir, steps, events = _measure(tree, args.runs, n)
            per[label, n] = ir / steps
            print(
                f"{label} ({tree}): {n} replicas, {args.runs} runs: {ir:,} instructions, {steps:,} steps, "
                f"{events:,} events: {ir / steps:,.0f} per step",
                flush=True,
            )
        if len(args.replicas) > 1:
            lo, hi = min(args.replicas), max(args.replicas)
            print(
                f"{label}: {hi} vs {lo} replicas {per[label, hi] / per[label, lo]:.3f}x instructions per step"
            )
    if "base" in trees:
        for n in args.replicas:
            print(f"{n} replicas: base / this {per['base', n] / per['this', n]:.3f}x instructions per step")


if __name__ == "__main__":
    main()
