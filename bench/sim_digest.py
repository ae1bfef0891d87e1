"""Simulated results' fingerprint: a hash of every step's outcome, latency, TTFT, cached tokens and
every run's completion time on 12 configurations (policies x replica counts x model elements).

Usage::

    .venv/bin/python bench/sim_digest.py [--runs 600] [--out digest.json] [--compare digest.json]
    .venv/bin/python bench/sim_digest.py --compare-tree /path/to/base/checkout

A speed change to the simulator must leave every hash equal: run it on the base tree (``--out``) and
on the changed tree (``--compare``), or pass ``--compare-tree`` to run the base tree's simulator in a
subprocess (its own ``sys.path``) and compare both in one call. Exit 1 on any difference. The
modules ``make native`` compiles (``router/native.py``) must give the same hashes as their source:
``RUNROUTE_NATIVE=0`` runs them as pure Python (``tests/test_native.py`` compares the two).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _hash(res: object) -> str:
    h = hashlib.sha256()
    for name in ("outcome", "latency", "ttft", "cached", "run_completion_s"):
        a = np.ascontiguousarray(getattr(res, name))
        h.update(name.encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def digests(n_runs: int) -> dict[str, str]:
    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.specdec import prompt_lookup
    from router.sim.whatif import SimConfig, Simulator, Workload

    prof = load_profile(None, "a100")
    w = Workload.from_runlog(RunLog.from_frame(generate(n_runs, seed=3)))
    trace = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    pois = run_starts("rate=0.5", len(w.runs), seed=2)
    base = SimConfig(profile=prof, replicas=2, kv_cache_gb=16.0)
    configs = {
        "sticky-2": ("session-sticky", base, trace),
        "sticky-8": ("session-sticky", replace(base, replicas=8), trace),
        "sticky-32": ("session-sticky", replace(base, replicas=32), trace),
        "local-2": ("always-local", base, trace),
        "local-4-poisson": ("always-local", replace(base, replicas=4), pois),
        "prefix-4": ("prefix-aware", replace(base, replicas=4), trace),
        "oracle-3": ("oracle", replace(base, replicas=3), trace),
        "stall-2": ("stall-escalation", base, trace),
        "local-4-tiers-fp8-spec": (
            "always-local",
            replace(base, replicas=4, cpu_kv_x=4.0, kv_dtype="fp8", spec=prompt_lookup()),
            trace,
        ),
        "local-4-globalpool": (
            "always-local",
            replace(base, replicas=4, cpu_kv_x=2.0, cpu_kv_global=True),
            trace,
        ),
        "sticky-4-disagg1": ("session-sticky", replace(base, replicas=4, disagg_prefill=1), trace),
        "local-2-noscrape-stz": ("always-local", replace(base, scrape=False, scale_to_zero=True), pois),
    }
    out = {}
    for label, (pol, cfg, st) in configs.items():
        res = Simulator(w, build_policy(pol), cfg, st).run()
        out[label] = _hash(res)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=600)
    ap.add_argument("--out")
    ap.add_argument("--compare")
    ap.add_argument("--compare-tree", help="a checkout of the base tree: run its simulator too and compare")
    args = ap.parse_args()
    mine = digests(args.runs)
    from router import native

    print(
        f"simulator modules: {native.status()[1]}; loaded compiled: {', '.join(native.loaded_compiled()) or 'none'}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(mine, indent=1))
    ref = None
    if args.compare:
        ref = json.loads(Path(args.compare).read_text())
    elif args.compare_tree:
        tree = Path(args.compare_tree).resolve()
        # this file's import puts its own tree first on sys.path: put the base tree back in front
        # after it, and check that the base tree's simulator is the one that ran
        code = (
            f"import sys, json; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"import sim_digest; sys.path.insert(0, {str(tree)!r}); "
            f"d = sim_digest.digests({args.runs}); import router.sim.simulator as s; "
            f"assert s.__file__.startswith({str(tree)!r}), s.__file__; print(json.dumps(d))"
        )
        p = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True)
        ref = json.loads(p.stdout.strip().splitlines()[-1])
    bad = 0
    for k, v in mine.items():
        same = "" if ref is None else ("  equal" if ref.get(k) == v else f"  DIFFERS (base {ref.get(k)})")
        bad += bool(ref is not None and ref.get(k) != v)
        print(f"{k:26s} {v}{same}")
    if ref is not None:
        print(f"{len(mine) - bad} of {len(mine)} configurations equal")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
