"""Added latency of the Redis run-state store over the in-process store, per routing step.

A routing step touches the store twice: ``get(run_id)`` (the run's pin) and ``put(state)`` (the
updated pin). For each store this script times get+put per step: first one step at a time
(sequential: pure round-trip cost, ``--runs`` runs x ``--steps`` steps), then open-loop at ``--rate``
steps per second for ``--seconds`` over ``--runs`` interleaved runs (what a router serving that rate
sees), plus the admission Lua script (try_admit + release). It prints p50/p99 in microseconds, the
added p50/p99 over in-process, and the client CPU time per step (the event loop's cost).

Run: ``.venv/bin/python bench/bench_state.py [--url redis://127.0.0.1:6379/0] [--runs 200]
[--steps 20] [--rate 400] [--seconds 3]``. Needs a Redis server; exits 2 with a message if none
answers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.policy.types import RunState  # noqa: E402
from router.server.state.fallback import FallbackStore  # noqa: E402
from router.server.state.redis_store import RedisStore, StoreUnavailable, redis_url_from_env  # noqa: E402
from router.server.state.store import InProcessStore  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def steps(store, runs: int, n_steps: int, concurrency: int) -> list[float]:
    """Per-step get+put latencies (seconds), ``concurrency`` runs at a time."""
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    tag = uuid.uuid4().hex[:8]

    async def run(i: int) -> None:
        rid = f"bench-{tag}-{i}"
        async with sem:
            for k in range(n_steps):
                t0 = time.perf_counter()
                st = await store.get(rid) or RunState(run_id=rid, tier="local", replica="local-0")
                st.steps_seen = k + 1
                await store.put(st)
                lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(run(i) for i in range(runs)))
    return lat


async def open_loop(store, runs: int, rate: float, seconds: float) -> list[float]:
    """Steps arriving every 1/rate s (round-robin over runs); per-step get+put latencies."""
    lat: list[float] = []
    tag = uuid.uuid4().hex[:8]
    loop = asyncio.get_running_loop()

    async def one(rid: str, k: int) -> None:
        t0 = time.perf_counter()
        st = await store.get(rid) or RunState(run_id=rid, tier="local", replica="local-0")
        st.steps_seen = k + 1
        await store.put(st)
        lat.append(time.perf_counter() - t0)

    tasks = []
    start = loop.time()
    n = int(rate * seconds)
    for i in range(n):
        wait = start + i / rate - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(one(f"bench-{tag}-{i % runs}", i // runs)))
    await asyncio.gather(*tasks)
    return lat


async def admissions(store, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        await store.try_admit("bench", 1_000_000)
        await store.release("bench")
        lat.append(time.perf_counter() - t0)
    return lat


async def main(args: argparse.Namespace) -> int:
    prefix = f"bench-runroute:{uuid.uuid4().hex}:"
    probe = RedisStore(args.url, key_prefix=prefix)
    try:
        await probe.ping()
    except StoreUnavailable as e:
        print(f"bench_state: {e}; start redis-server or pass --url", file=sys.stderr)
        return 2
    finally:
        await probe.close()
    stores = {
        "in-process": lambda: InProcessStore(),
        "redis": lambda: RedisStore(args.url, key_prefix=prefix, timeout_s=2.0),
        "fallback(redis)": lambda: FallbackStore(RedisStore(args.url, key_prefix=prefix, timeout_s=2.0)),
    }
    print(
        f"run-state store latency per step (get+put), {args.runs} runs x {args.steps} steps, "
        f"redis {args.url}, loop {type(asyncio.get_running_loop()).__module__}"
    )
    print(
        f"{'store':<17} {'mode':<16} {'p50 us':>8} {'p99 us':>8} {'+p50 us':>8} {'+p99 us':>8} {'CPU us':>7}"
    )
    base: dict[str, tuple[float, float]] = {}
    modes = (("sequential", None), (f"open {args.rate:g}/s", args.rate))
    for mode, rate in modes:
        for name, make in stores.items():
            store = make()
            try:
                await steps(store, min(20, args.runs), 3, 1)  # warm the pool
                c0 = time.process_time()
                if rate is None:
                    lat = await steps(store, args.runs, args.steps, 1)
                else:
                    lat = await open_loop(store, args.runs, rate, args.seconds)
                cpu = (time.process_time() - c0) / len(lat) * 1e6
            finally:
                await store.close()
            p50, p99 = pct(lat, 0.5) * 1e6, pct(lat, 0.99) * 1e6
            if name == "in-process":
                base[mode] = (p50, p99)
            b50, b99 = base[mode]
            print(f"{name:<17} {mode:<16} {p50:8.1f} {p99:8.1f} {p50 - b50:8.1f} {p99 - b99:8.1f} {cpu:7.1f}")
    for name in ("in-process", "redis"):
        store = stores[name]()
        try:
            await admissions(store, 200)
            lat = await admissions(store, 2000)
        finally:
            await store.close()
        print(
            f"{name:<17} {'admit+release':<16} {statistics.median(lat) * 1e6:8.1f} {pct(lat, 0.99) * 1e6:8.1f}"
        )
    cleanup = RedisStore(args.url, key_prefix=prefix)
    keys = [k async for k in cleanup._r.scan_iter(match=prefix + "*", count=1000)]
    if keys:
        await cleanup._r.delete(*keys)
    await cleanup.close()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=redis_url_from_env())
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    try:
        import uvloop

        sys.exit(uvloop.run(main(a)))
    except ImportError:
        sys.exit(asyncio.run(main(a)))
