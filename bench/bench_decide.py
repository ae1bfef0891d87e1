"""Decision cost: ``decide()`` latency of each policy with predictions given (no model call).

Algorithm: build one realistic snapshot per scenario (2 local replicas + frontier, a run pinned
locally at a tool boundary; a first step; a pinned frontier run), call ``decide`` ``--n`` times per
scenario after a warm-up, time each call with ``perf_counter_ns`` and print p50 / p99 / max in
microseconds. The target for the learned policy is p99 < 100 us; ``--check`` exits 1 if missed.

Usage: ``.venv/bin/python bench/bench_decide.py [--n 50000] [--check]``
"""

from __future__ import annotations

import argparse
import sys
import time

from models.types import Predictions
from router.policy import POLICY_KINDS, BackendState, RunState, Snapshot, build_policy

TARGET_P99_US = 100.0


def backends() -> list[BackendState]:
    return [
        BackendState(
            "local-0",
            "local",
            "weak",
            running=12,
            waiting=2,
            kv_usage=0.4,
            warm_prefix_tokens=9000,
            prefill_s_per_token=1e-4,
            ttft_base_s=0.02,
        ),
        BackendState(
            "local-1",
            "local",
            "weak",
            running=9,
            waiting=0,
            kv_usage=0.3,
            prefill_s_per_token=1e-4,
            ttft_base_s=0.02,
        ),
        BackendState(
            "frontier",
            "frontier",
            "strong",
            price_in_per_m=2.0,
            price_cached_in_per_m=0.5,
            price_out_per_m=8.0,
            ttft_base_s=0.4,
        ),
    ]


def scenarios() -> dict[str, Snapshot]:
    pred = Predictions(
        p_frontier=0.62,
        cache_reuse_tokens=8800,
        remaining_steps_p50=6,
        remaining_steps_p90=14,
        remaining_tokens_p50=60000,
        remaining_tokens_p90=150000,
    )
    feats = {f"f{i}": float(i) for i in range(44)}
    mk = lambda run, k: Snapshot(run, k, feats, pred, backends(), context_tokens=9500, at_tool_boundary=True)  # noqa: E731
    return {
        "first-step": mk(RunState("run-1"), 0),
        "pinned-local": mk(RunState("run-2", tier="local", replica="local-0", switches=0), 5),
        "pinned-frontier": mk(
            RunState("run-3", tier="frontier", replica="frontier", switches=1, last_switch_step=2), 7
        ),
    }


def measure(policy, snap: Snapshot, n: int) -> tuple[float, float, float]:
    decide = policy.decide
    for _ in range(2000):
        decide(snap)
    clock = time.perf_counter_ns
    ts = [0] * n
    for i in range(n):
        t0 = clock()
        decide(snap)
        ts[i] = clock() - t0
    ts.sort()
    return ts[n // 2] / 1e3, ts[int(n * 0.99)] / 1e3, ts[-1] / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50000, help="timed calls per policy and scenario")
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if the learned policy's p99 misses the target"
    )
    args = ap.parse_args()
    worst = 0.0
    print(f"{'policy':<20} {'scenario':<16} {'p50 us':>8} {'p99 us':>8} {'max us':>9}")
    for kind in POLICY_KINDS:
        cfg: dict = {"kind": kind}
        if kind == "learned":
            cfg.update(p_frontier_up=0.55, p_frontier_down=0.3)
        if kind == "per-step-threshold":
            cfg["threshold"] = 0.55
        pol = build_policy(cfg)
        for name, snap in scenarios().items():
            p50, p99, mx = measure(pol, snap, args.n)
            if kind == "learned":
                worst = max(worst, p99)
            print(f"{kind:<20} {name:<16} {p50:8.2f} {p99:8.2f} {mx:9.1f}")
    ok = worst < TARGET_P99_US
    print(
        f"learned policy decide() p99 (worst scenario) = {worst:.2f} us; target < {TARGET_P99_US:.0f} us: "
        f"{'OK' if ok else 'MISSED'}"
    )
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
