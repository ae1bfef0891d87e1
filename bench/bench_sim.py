"""Simulator speed: simulated steps/s for a 2-replica configuration, and a 10,000-run replay.

Usage::

    .venv/bin/python bench/bench_sim.py [--runs 2000] [--big-runs 10000] [--policy session-sticky]
                                        [--repeat 3] [--gpu a100] [--kv-cache-gb 16]

Workload: ``features.generate.generate`` (seeded synthetic agent runs calibrated to tau/tau2 traces:
growing prompts with block hashes, tool pauses), replayed closed-loop on their own start times
(``--arrivals trace``) through ``router.policy.config.build_policy(--policy)`` with the constant
predictor, against 2 simulated local replicas (default A100 profile) and the frontier.

Printed: steps, simulated steps per CPU-second of this process and per wall second (best of
``--repeat``; the machine is shared, so CPU time is the steadier figure), events and node iterations;
then the same with the optional model elements on (issue 20; reported, no target): a CPU KV tier of
4x the GPU KV + fp8 KV + prompt-lookup speculative decoding (measured rates), and prefill/decode
disaggregation (1 prefill + 1 decode replica); then the replica-count scaling: CPU-s of the same
workload on 2 and on ``--many`` (32) replicas, best of ``--repeat`` each, the two interleaved
(target: within 1.3x; ``bench/sim_instructions.py`` gives the same ratio in instructions); then
the 10,000-run replay: workload build time,
simulation time and total wall time (target < 60 s), and the same for always-local (``--big-runs 0``
skips it). The simulator's per-step modules run compiled (mypyc, ``make native``; ``router/native.py``)
when built from the current source; ``RUNROUTE_NATIVE=0`` runs them as pure Python (the line after
the first figure says which). Targets:
>= 30,000 steps/s (2 replicas, elements off), 32 vs 2 replicas within 1.3x CPU, 10,000 runs < 1 minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--big-runs", type=int, default=10_000)
    ap.add_argument("--policy", default="session-sticky")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--kv-cache-gb", type=float, default=16.0)
    ap.add_argument("--many", type=int, default=32, help="the replica count of the scaling check")
    args = ap.parse_args()

    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload, details, scorecard

    prof = load_profile(None, args.gpu)
    cfg = SimConfig(profile=prof, replicas=2, kv_cache_gb=args.kv_cache_gb)

    def build(n: int) -> tuple[Workload, object, float]:
        t = time.perf_counter()
        w = Workload.from_runlog(RunLog.from_frame(generate(n, seed=1)))
        st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
        return w, st, time.perf_counter() - t

    w, st, t_build = build(args.runs)
    print(
        f"workload: {len(w.runs)} runs, {w.n_steps} steps (built in {t_build:.2f} s); profile {prof.name}; "
        f"policy {args.policy}; 2 replicas x {args.kv_cache_gb:g} GB KV"
    )
    best_cpu = best_wall = 0.0
    res = None
    for _ in range(args.repeat):
        res = Simulator(w, build_policy(args.policy), cfg, st).run()
        best_cpu = max(best_cpu, len(res.outcome) / res.cpu_s)
        best_wall = max(best_wall, len(res.outcome) / res.wall_s)
    assert res is not None
    d = details(res)
    print(
        f"steps/s: {best_cpu:,.0f} per CPU-second, {best_wall:,.0f} per wall second "
        f"(events {d['events']:,}, node iterations {d['node_iterations']:,}; target >= 30,000)"
    )
    c = scorecard(res)
    from router import native

    compiled = native.loaded_compiled()
    print(
        f"  simulator modules: {native.status()[1]}; loaded compiled: {len(compiled)} of {len(native.MODULES)}"
    )
    print(
        f"  p95 short-step {c['short_step_latency_s_p95']} s, cache hit {c['cache_hit_rate']}, "
        f"upper bound {c['cache_hit_upper_bound']}, cost ${c['cost_usd']}"
    )
    from dataclasses import replace

    from router.sim.specdec import prompt_lookup

    on = {
        "cpu tier 4x + fp8 + prompt lookup": replace(cfg, cpu_kv_x=4.0, kv_dtype="fp8", spec=prompt_lookup()),
        "disaggregated 1:1": replace(cfg, disagg_prefill=1),
    }
    for label, cfg_on in on.items():
        best_on = 0.0
        for _ in range(args.repeat):
            r_on = Simulator(w, build_policy(args.policy), cfg_on, st).run()
            best_on = max(best_on, len(r_on.outcome) / r_on.cpu_s)
        c_on = scorecard(r_on)
        print(
            f"steps/s with {label}: {best_on:,.0f} per CPU-second (p95 short-step "
            f"{c_on['short_step_latency_s_p95']} s, cache hit {c_on['cache_hit_rate']})"
        )

    cpu_n: dict[int, float] = {}
    for _ in range(args.repeat):  # interleaved, so a change of the machine's load hits both counts
        for n in (2, args.many):
            r_n = Simulator(w, build_policy(args.policy), replace(cfg, replicas=n), st).run()
            cpu_n[n] = min(cpu_n.get(n, float("inf")), r_n.cpu_s)
    print(
        f"replica scaling: {cpu_n[2]:.3f} CPU-s on 2 replicas, {cpu_n[args.many]:.3f} on {args.many} "
        f"({cpu_n[args.many] / cpu_n[2]:.2f}x; target within 1.3x)"
    )

    if args.big_runs <= 0:  # --big-runs 0: the speed and scaling figures only
        return
    t0 = time.perf_counter()
    big, bst, t_build = build(args.big_runs)
    for pol in (args.policy, "always-local"):
        t1 = time.perf_counter()
        r = Simulator(big, build_policy(pol), cfg, bst).run()
        t_sim = time.perf_counter() - t1
        total = t_build + t_sim
        print(
            f"replay of {len(big.runs):,} runs / {big.n_steps:,} steps with {pol}: build {t_build:.1f} s + "
            f"simulate {t_sim:.1f} s (CPU {r.cpu_s:.1f} s) = {total:.1f} s wall (target < 60 s)"
        )
    print(f"total bench wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
