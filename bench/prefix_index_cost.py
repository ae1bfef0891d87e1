"""Prefix index cost per step: chain extension + lookup on every replica + record, vs body size.

Usage::

    .venv/bin/python bench/prefix_index_cost.py [--runs 1000] [--replicas 4] [--bodies-kb 20,200]
        [--steps 5000] [--repeats 3] [--gc on|off|freeze] [--block-chars 1024] [--kv-tokens N]

Algorithm: ``--runs`` live runs, each a chat body (OpenAI messages, no tools) that grows by one
tool result (~2 KB) per step, are first grown to ``--bodies-kb`` (the warm-up is not timed); a
shared 8 KB system prompt leads every body. Then ``--steps`` steps, round-robin over the runs,
each timed for exactly what the step engine does per step with a prefix index: the run's
:class:`~router.core.prefix_index.TextChainer` extension over the new messages, through the
sidecar's own lazy segment view of the body (:class:`router.server.protocols.chat.MessageSegments`),
every replica's match (:meth:`~router.core.prefix_index.PrefixIndex.lookup`, one pass, as the
engine), the pick of the longest match and one :meth:`~router.core.prefix_index.PrefixIndex.record`
there. A run's first timed step looks up with no hints (as a new run's first step does); later
ones with the hints its earlier steps left. Each replica's index holds its share of the live runs
(``--kv-tokens`` sets a smaller capacity: then a run whose chain was evicted re-inserts it, O(its
length), as the replica recomputes it). The whole is repeated ``--repeats`` times on fresh runs.

Printed per body size: the CPU time of one step (``thread_time_ns`` around it; the timer's own
cost, measured on an empty region, is subtracted from nothing and printed beside) as p50 / p99 /
p99.9 over all repeats, the worst repeat's p99, and the mean CPU per step over the timed loop
(``process_time`` of the loop / steps: the least sensitive to other work on the machine; it
includes the timers), and beside it the machine's own spread in the same minutes: one constant
piece of Python work sized to the steps' p50, timed as many times (its p99 / p50 is what the
machine adds to any step's tail). Target: p99 <= 30 us at 200 KB bodies and 1,000 live runs, flat
in body size. ``--gc``: the collector as is (``on``), disabled over the timed loop (``off``) or the
warm-up's objects frozen (``freeze``, what the sidecar's ``runtime.gc_freeze`` does at start).
The machine is shared with other engineers' work: the tail carries that noise (a step preempted
or sharing a core's caches costs more CPU too).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timer_cost_ns(f: Callable[[], int]) -> float:
    """The median of ``f() - f()`` over 2,000 back-to-back pairs (what one timed region adds)."""
    xs = np.empty(2000, dtype=np.int64)
    for i in range(len(xs)):
        c0 = f()
        xs[i] = f() - c0
    return float(np.median(xs))


def _constant_work(steps: int, us: float, tt: Callable[[], int]) -> tuple[float, float, float]:
    """p50 / p99 / p99.9 CPU (us) of one fixed piece of work (the same Python loop every time, sized
    to about ``us``) timed ``steps`` times as the steps are: the machine's own spread, no index."""
    n = 100
    while True:  # size the loop
        c0 = tt()
        for _ in range(20):
            sum(range(n))
        if (tt() - c0) / 20 >= us * 1000 or n > 10**7:
            break
        n *= 2
    xs = np.empty(steps, dtype=np.int64)
    for i in range(steps):
        c0 = tt()
        sum(range(n))
        xs[i] = tt() - c0
    p50, p99, p999 = np.percentile(xs / 1000.0, [50, 99, 99.9])
    return float(p50), float(p99), float(p999)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--bodies-kb", default="20,200")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gc", choices=("on", "off", "freeze"), default="on")
    ap.add_argument("--block-chars", type=int, default=1024)
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="each replica's index capacity in tokens (default: room for its share of the live runs)",
    )
    a = ap.parse_args()

    from router.core.prefix_index import CHARS_PER_TOKEN, PrefixIndex, RunChain, TextChainer
    from router.server.protocols.chat import MessageSegments

    system = "S" * 8192
    tt, pt = time.thread_time_ns, time.process_time_ns
    timer_ns = _timer_cost_ns(tt)
    print(f"gc {a.gc}; thread_time_ns pair costs {timer_ns / 1000:.2f} us (inside every figure)")
    for kb in (int(x) for x in a.bodies_kb.split(",")):
        bt = a.block_chars // CHARS_PER_TOKEN
        names = [f"local-{i}" for i in range(a.replicas)]
        live_tokens = a.runs * (kb * 1024 + 2048 * a.steps // a.runs) // CHARS_PER_TOKEN
        cap = (a.kv_tokens or int(1.25 * live_tokens / a.replicas)) // bt
        cpu_all: list[np.ndarray] = []
        mean_us: list[float] = []
        evicted = 0
        for rep in range(a.repeats):
            rng = np.random.default_rng(rep)
            idx = PrefixIndex(bt, [(n, cap) for n in names])
            tc = TextChainer(a.block_chars)
            runs = []
            for r in range(a.runs):
                msgs: list[dict[str, object]] = [{"role": "system", "content": system}]
                size = len(system)
                while size < kb * 1024:
                    t = rng.integers(0, 1 << 62).item().to_bytes(8, "little").hex() * 128  # 2 KB
                    msgs.append({"role": "tool", "content": f"run {r} {t}"})
                    size += len(t)
                rc = RunChain()
                chain = tc.extend(rc, MessageSegments({"messages": msgs}))
                idx.record(names[r % a.replicas], chain)
                runs.append((msgs, rc, {}))  # no hints yet: a run's first lookup is cold
            cpu = np.empty(a.steps, dtype=np.int64)
            if a.gc == "freeze":
                gc.collect()
                gc.freeze()
            elif a.gc == "off":
                gc.disable()
            p0 = pt()
            for s in range(a.steps):
                msgs, rc, hints = runs[s % a.runs]
                msgs.append({"role": "tool", "content": f"step {s} " + "x" * 2000})
                view = MessageSegments({"messages": msgs})
                c0 = tt()
                chain = tc.extend(rc, view)
                n = len(chain)
                idx.lookup(chain, n, hints)  # every replica's match, as the engine does
                best, best_m = names[0], -1
                for name in names:
                    m = hints[name]
                    if m > best_m:
                        best, best_m = name, m
                idx.record(best, chain, None, best_m)
                hints[best] = n
                cpu[s] = tt() - c0
            mean_us.append((pt() - p0) / a.steps / 1000.0)
            gc.enable()
            gc.unfreeze()
            cpu_all.append(cpu / 1000.0)
            evicted += sum(r.evictions for r in idx.replicas.values())
            del runs, idx
            gc.collect()
        allc = np.concatenate(cpu_all)
        p50, p99, p999 = np.percentile(allc, [50, 99, 99.9])
        k50, k99, k999 = _constant_work(a.steps, float(p50), tt)
        worst99 = max(float(np.percentile(c, 99)) for c in cpu_all)
        print(
            f"{kb:>4} KB bodies, {a.runs} live runs, {a.replicas} replicas x {cap:,} blocks of "
            f"{a.block_chars} chars, {a.repeats} x {a.steps} steps, {evicted:,} blocks evicted: CPU per "
            f"step p50 {p50:.1f} / p99 {p99:.1f} / p99.9 {p999:.1f} us (worst repeat's p99 "
            f"{worst99:.1f}); mean CPU per step over the loop {np.mean(mean_us):.1f} us "
            f"(repeats {', '.join(f'{m:.1f}' for m in mean_us)})",
            flush=True,
        )
        print(
            f"      the machine's spread, same minutes: one constant piece of work timed {a.steps} times "
            f"p50 {k50:.1f} / p99 {k99:.1f} / p99.9 {k999:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
