"""Redis chaos under load (issue 17, F4): two routers share one Redis while concurrent agent runs
step through them; Redis is frozen for 15 s (SIGSTOP: connections hang, every command times out)
and later killed and started again empty (no persistence: the data set is lost).

Setup: this module's own ``redis-server`` on a free port (the shared 127.0.0.1:6379 is never
touched), the fakes of tests/conftest.py, and two ``runroute serve`` processes with the
``session-sticky`` policy: a run never switches on its own, so a run served on two local replicas
is always a bug (a lost or split pin), never a policy decision. Fallback is off, so every upstream
answer reaches the client as is.

The load: ``AGENTS`` concurrent agents over real HTTP (httpx), each running runs of ``STEPS``
steps back to back; consecutive steps of a run alternate between the two routers, and the
conversation grows by the assistant's answer each step.

Checked from both routers' run logs (raw JSONL, plus ``features.runlog.read_runlog(strict=True)``,
the reader that rejects duplicates) and from the clients' responses:

- 0 duplicate (run_id, step) across both routers' logs (and in the ``x-runroute-step`` headers);
- 0 runs served on two replicas (logs and ``x-runroute-replica`` headers);
- 0 non-200 answers, 0 transport errors;
- every run started (admitted) once, except during an outage: from the freeze (the kill) until
  both routers' ``runroute_store_degraded`` gauges (sampled every 0.1 s) read 0 again, a router
  cannot know a pin only the other one holds; with both routers back on Redis no run is taken for
  new;
- every 200 answer has its step record (the logs and the clients agree on the count);
- both routers leave degraded mode and Redis holds every run's pin, on the replica that served it.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import orjson
import pytest
from multi_router_support import (
    DEGRADED_METRIC,
    REPLICAS,
    Cluster,
    gauge,
    redis_pins,
    running_cluster,
    wait_for,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

AGENTS = 12
STEPS = 8
THINK_S = 0.05  # an agent's pause between steps: uniform in [0, THINK_S] (runs straddle the phases)
WARM_S = 3.0  # load before the outage
OUTAGE_S = 15.0  # Redis frozen (SIGSTOP)
BETWEEN_S = 4.0  # load between the outage and the restart
DOWN_S = 1.0  # Redis dead (SIGKILL) before it starts again, empty
AFTER_S = 4.0  # load after the restart


def _router_errors(c: object) -> str:
    """The routers' logged errors with their tracebacks (what a failed assertion needs to be read)."""
    out: list[str] = []
    for name in ("a", "b"):
        log = getattr(getattr(c, name, None), "log", None)
        if log is None or not log.exists():
            continue
        lines = log.read_text(errors="replace").splitlines()
        for k in [k for k, line in enumerate(lines) if "Traceback" in line or "unhandled" in line][:3]:
            out.append(f"router {name}:\n" + "\n".join(lines[k : k + 30]))
    return "\n".join(out)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory, redis_proc, fakes, bundle_dir):
    tmp = tmp_path_factory.mktemp("chaos")
    with running_cluster(tmp, redis_proc, fakes, bundle_dir, policy={"kind": "session-sticky"}) as c:
        yield c, tmp / "logs"


async def _agent(
    w: int, client: httpx.AsyncClient, urls: tuple[str, str], stop: asyncio.Event, tag: str, out: list[dict]
) -> None:
    k = 0
    rng = random.Random(w)
    while not stop.is_set():
        rid = f"{tag}-{w}-{k}"
        k += 1
        msgs: list[dict] = [{"role": "system", "content": f"agent {w}"}]
        for i in range(STEPS):  # a started run is finished even after stop
            msgs.append({"role": "user", "content": f"turn {i}"})
            which = (i + w) % 2
            body = {"model": "auto", "messages": msgs, "max_tokens": 4}
            rec: dict = {"run": rid, "i": i, "router": "ab"[which], "t": time.monotonic()}
            if i:
                await asyncio.sleep(rng.uniform(0.0, THINK_S))
                rec["t"] = time.monotonic()
            try:
                resp = await client.post(
                    urls[which] + "/v1/chat/completions", json=body, headers={"X-Run-Id": rid}
                )
            except httpx.HTTPError as e:
                rec.update(status=-1, error=repr(e))
                out.append(rec)
                continue
            rec.update(
                status=resp.status_code,
                step=resp.headers.get("x-runroute-step"),
                replica=resp.headers.get("x-runroute-replica"),
                tier=resp.headers.get("x-runroute-tier"),
            )
            if resp.status_code == 200:
                content = resp.json()["choices"][0]["message"].get("content") or ""
                msgs.append({"role": "assistant", "content": content})
            else:
                rec["body"] = resp.text[:300]
            rec["done"] = time.monotonic()
            out.append(rec)


async def _sample_degraded(c: Cluster, stop: asyncio.Event, out: list[tuple[float, bool]]) -> None:
    """Every 0.1 s: (time the answers came, whether either router reports its store degraded)."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        while not stop.is_set():
            texts = await asyncio.gather(*(client.get(r.url + "/metrics") for r in (c.a, c.b)))
            out.append((time.monotonic(), any(gauge(x.text, DEGRADED_METRIC) != 0.0 for x in texts)))
            await asyncio.sleep(0.1)


async def _load_with_chaos(
    c: Cluster, tag: str, phases: dict[str, float], degraded: list[tuple[float, bool]]
) -> list[dict]:
    out: list[dict] = []
    stop, done = asyncio.Event(), asyncio.Event()
    sampler = asyncio.create_task(_sample_degraded(c, done, degraded))
    limits = httpx.Limits(max_connections=2 * AGENTS, max_keepalive_connections=2 * AGENTS)
    async with httpx.AsyncClient(timeout=20.0, limits=limits) as client:
        urls = (c.a.url, c.b.url)
        tasks = [asyncio.create_task(_agent(w, client, urls, stop, tag, out)) for w in range(AGENTS)]
        try:
            phases["start"] = time.monotonic()
            await asyncio.sleep(WARM_S)
            phases["freeze"] = time.monotonic()
            c.redis.pause()
            try:
                await asyncio.sleep(OUTAGE_S)
            finally:
                c.redis.resume()
            phases["thaw"] = time.monotonic()
            await asyncio.sleep(BETWEEN_S)
            phases["kill"] = time.monotonic()
            c.redis.kill()
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(c.redis.start)  # empty: no persistence
            phases["restart"] = time.monotonic()
            await asyncio.sleep(AFTER_S)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            done.set()
            await sampler
        phases["end"] = time.monotonic()
    return out


def _log_steps(logdir: Path) -> list[dict]:
    rows: list[dict] = []
    files = sorted(logdir.glob("*.jsonl"))
    assert files, f"no run-log files in {logdir}"
    for f in files:
        for line in f.read_bytes().splitlines():
            if line.strip():
                r = orjson.loads(line)
                if r.get("record") == "step":
                    r["_file"] = f.name
                    rows.append(r)
    return rows


def test_redis_freeze_and_restart_under_load(chaos):
    c, logdir = chaos
    tag = f"chaos-{uuid.uuid4().hex[:6]}"
    phases: dict[str, float] = {}
    degraded: list[tuple[float, bool]] = []
    recs = asyncio.run(_load_with_chaos(c, tag, phases, degraded))
    # both routers leave degraded mode (each probes about once a second while degraded)
    wait_for(lambda: all(gauge(c.metrics(w), DEGRADED_METRIC) == 0.0 for w in "ab"), "still degraded")
    runs = sorted({r["run"] for r in recs})
    pins = redis_pins(c.redis.url, runs)
    c.a.stop()  # SIGTERM: both writers flush and close their files
    c.b.stop()

    t0 = phases["start"]

    def when(r: dict) -> str:
        t = r["t"]
        ph = [p for p in ("start", "freeze", "thaw", "kill", "restart") if phases[p] <= t]
        return f"{ph[-1] if ph else 'start'}+{t - phases[ph[-1] if ph else 'start']:.1f}s"

    # enough load in every phase for the checks to mean something
    by_phase = Counter(when(r).split("+")[0] for r in recs)
    assert all(by_phase[p] >= AGENTS for p in ("start", "freeze", "thaw", "kill", "restart")), by_phase
    # clients: every answer a 200, no transport error
    bad = [
        (r["run"], r["i"], r["router"], r.get("status"), r.get("error") or r.get("body"), when(r))
        for r in recs
        if r["status"] != 200
    ]
    assert not bad, f"{len(bad)} of {len(recs)} requests not 200: {bad[:10]}\n{_router_errors(c)}"
    # clients: step indices unique per run; one replica per run
    seen = Counter((r["run"], int(r["step"])) for r in recs)
    dup_client = {k: n for k, n in seen.items() if n > 1}
    places: dict[str, set] = defaultdict(set)
    for r in recs:
        places[r["run"]].add((r["tier"], r["replica"]))
    split = {rid: p for rid, p in places.items() if len(p) > 1}

    # run logs of both routers
    rows = [r for r in _log_steps(logdir) if str(r.get("run_id", "")).startswith(tag)]
    assert len(rows) == len(recs), f"{len(rows)} step records for {len(recs)} answered steps"
    logged = Counter((r["run_id"], int(r["step"])) for r in rows)
    dup_log = {k: n for k, n in logged.items() if n > 1}
    log_places: dict[str, set] = defaultdict(set)
    for r in rows:
        log_places[r["run_id"]].add((r["tier"], r["replica"]))
    log_split = {rid: p for rid, p in log_places.items() if len(p) > 1}
    assert {r["status"] for r in rows} == {200}

    def explain(keys) -> list:
        return [
            [
                (
                    r["router"],
                    r["i"],
                    r["step"],
                    r["replica"],
                    when(r),
                    f"{r['t']:.2f}-{r.get('done', 0):.2f}",
                )
                for r in recs
                if r["run"] == k
            ]
            for k in list(keys)[:3]
        ]

    assert not dup_log, f"{len(dup_log)} duplicate (run_id, step) in the logs: {list(dup_log)[:5]}"
    assert not dup_client, (
        f"{len(dup_client)} duplicate steps seen by clients: {explain({k[0] for k in dup_client})}"
    )
    assert not log_split and not split, f"{len(split)} runs on two replicas: {explain(split)}"
    assert {rep for p in places.values() for _, rep in p} == set(REPLICAS)  # both replicas serve
    # a run is started (admitted) once; a second start is excusable only while a router is cut off
    # from Redis (it cannot know a pin only the other router holds), never with both in sync
    sent = {(r["run"], int(r["step"])): r for r in recs}
    starts: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("admission"):
            starts[r["run_id"]].append(sent[(r["run_id"], int(r["step"]))])
    assert set(starts) == set(runs), f"runs never admitted: {sorted(set(runs) - set(starts))[:5]}"

    def back(after: float) -> float:  # when the sampler first saw both routers on Redis again
        t = next((t for t, d in degraded if t >= after and not d), None)
        assert t is not None, f"a router still degraded {phases['end'] - after:.1f} s after Redis returned"
        return t

    outages = [(phases["freeze"], back(phases["thaw"])), (phases["kill"], back(phases["restart"]))]

    def cut_off(r: dict) -> bool:
        return any(r["t"] <= end and r["done"] >= start for start, end in outages)

    again = [
        (rid, x["router"], x["step"], when(x))
        for rid, xs in starts.items()
        for x in sorted(xs, key=lambda x: x["t"])[1:]
        if not cut_off(x)
    ]
    assert not again, (
        f"{len(again)} runs started again with both routers on Redis: {again[:5]} {explain(x[0] for x in again)} outages {outages}"
    )
    assert any(d for _, d in degraded) and not degraded[-1][1], "the degraded gauges never moved"
    # Redis (restarted empty) holds every run's pin again, where the run was served
    for rid in runs:
        ((tier, replica),) = places[rid]
        assert pins[rid] is not None and pins[rid][:2] == (tier, replica), (rid, pins[rid], replica)

    from features.runlog import read_runlog

    read_runlog(logdir, strict=True)  # the reader agrees: no duplicate, no invalid row
    twice = sum(1 for xs in starts.values() if len(xs) > 1)
    print(f"chaos: {twice} runs started twice, all during the outages {outages}")
    print(
        f"chaos: {len(recs)} steps in {len(runs)} runs over {phases['end'] - t0:.1f} s; by phase {dict(by_phase)}"
    )


# --------------------------------------------------------------------------- focused regressions


@pytest.mark.parametrize("outage", ["freeze", "restart-empty"])
def test_write_back_shows_each_run_pin_and_counter_together(redis_proc, outage):
    """Found by the chaos test above: after an outage a router wrote its pins and its step counters
    back to Redis in separate passes (after a data loss: counters first; otherwise pins first). In
    between, another router saw a run's counter without its pin (it started the run anew: admitted
    twice, and placed afresh) or its pin without the counter ``step_gap`` past the degraded indices
    (its own sequential indices then run into them). Every Redis call of router A's write-back is
    watched: after each one, for both runs A numbered while degraded, a raised counter comes with
    A's pin and A's pin with the raised counter."""
    import redis.asyncio as aioredis

    from router.policy.types import RunState
    from router.server.state.fallback import FallbackStore
    from router.server.state.redis_store import RedisStore, decode_state
    from router.server.state.store import InProcessStore

    async def scenario() -> None:
        prefix = f"wb-{uuid.uuid4().hex[:8]}:"

        def store(slot: int) -> FallbackStore:
            primary = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=0.3)
            return FallbackStore(primary, InProcessStore(), retry_interval_s=0.05, slot=slot)

        a, b = store(0), store(1)
        try:
            _, i = await a.begin_step("old", 0)  # a run both routers know, stepped normally
            await a.claim(RunState(run_id="old", tier="local", replica="local-1", steps_seen=i + 1))
            assert (await b.begin_step("old", 0))[0] is not None
            if outage == "freeze":
                redis_proc.pause()
            else:
                redis_proc.kill()
            try:
                pin, j_old = await a.begin_step("old", i + 1)
                assert a.degraded and pin is not None
                await a.put(RunState(run_id="old", tier="local", replica="local-1", steps_seen=j_old + 1))
                pin, j_new = await a.begin_step("new", 0)  # a run started while Redis is away
                assert pin is None
                await a.claim(RunState(run_id="new", tier="local", replica="local-1", steps_seen=j_new + 1))
            finally:
                if outage == "freeze":
                    redis_proc.resume()
                else:
                    redis_proc.start()  # empty
            raw = aioredis.Redis.from_url(redis_proc.url)
            bad: list[tuple] = []
            calls = 0
            plain_call = a.primary._call

            async def watched(aw):
                nonlocal calls
                out = await plain_call(aw)
                calls += 1
                for rid, j in (("old", j_old), ("new", j_new)):
                    p, n = await raw.get(f"{prefix}run:{rid}"), await raw.get(f"{prefix}step:{rid}")
                    seen = decode_state(p).steps_seen if p is not None else -1
                    n = int(n) if n is not None else -1
                    if (n > j and seen <= j) or (seen > j and n < j + 1 + a.step_gap):
                        bad.append((calls, rid, j, seen, n))
                return out

            a.primary._call = watched  # type: ignore[method-assign]
            for _ in range(100):
                if await a.resync_now():
                    break
                await asyncio.sleep(0.05)
            a.primary._call = plain_call  # type: ignore[method-assign]
            await raw.aclose()
            assert not a.degraded and calls > 0
            assert not bad, f"(call, run, A's index, pin steps_seen, counter) seen apart: {bad}"
            # router B, which never saw "new", finds its pin and numbers both runs past A's indices
            pin_b, k = await b.begin_step("new", 0)
            assert pin_b is not None and pin_b.replica == "local-1" and k > j_new
            assert (await b.begin_step("old", i + 1))[1] > j_old
        finally:
            for s in (a, b):
                await s.close()

    asyncio.run(scenario())


def test_changes_made_during_the_write_back_reach_redis(redis_proc):
    """Found by the chaos test above: requests served (locally) while a recovery's last calls were
    in flight (the admission write-back, the slot lease) left their pins and step counters in the
    router's memory only, and ``degraded`` cleared anyway: another router then saw no pin and no
    counter for a run started in that moment and started it again at step 0. Here a run is started
    through router A exactly while its recovery leases its slot; after the recovery Redis must hold
    its pin and a counter past its index."""
    from router.policy.types import RunState
    from router.server.state.fallback import FallbackStore
    from router.server.state.redis_store import RedisStore
    from router.server.state.store import InProcessStore

    async def scenario() -> None:
        prefix = f"late-{uuid.uuid4().hex[:8]}:"
        # no probes of its own (retry 60 s): the test drives the one recovery
        a = FallbackStore(
            RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=0.3),
            InProcessStore(),
            retry_interval_s=60,
        )
        direct = None
        try:
            assert await a.try_admit("local", 100)
            redis_proc.kill()
            assert await a.try_admit("local", 100) and a.degraded
            redis_proc.start()
            late: list[int] = []
            plain_lease = a.primary.claim_slot

            async def lease_with_a_request_meanwhile(*args, **kw):
                out = await plain_lease(*args, **kw)
                if not late:  # a new run's first step arrives while this call is in flight
                    pin, i = await a.begin_step("late", 0)
                    assert pin is None and a.degraded
                    await a.claim(RunState(run_id="late", tier="local", replica="local-0", steps_seen=i + 1))
                    assert await a.try_admit("local", 100)
                    late.append(i)
                return out

            a.primary.claim_slot = lease_with_a_request_meanwhile  # type: ignore[method-assign]
            assert await a.resync_now() and late
            direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            pin = await direct.get("late")
            assert pin is not None and pin.replica == "local-0", pin
            assert await direct.next_index("late") > late[0]
            assert await direct.active("local") == 3  # every admission of A, the late one included
        finally:
            await a.close()
            if direct is not None:
                await direct.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- data loss (issue 25, N4)

FLUSHES = 10
FLUSH_EVERY_S = 1.0


def test_flushall_under_load_never_numbers_a_step_twice(tmp_path, redis_proc, fakes, bundle_dir):
    """Redis loses its data without dropping a connection (FLUSHALL on this module's own
    redis-server, as a failover to an empty replica would) ``FLUSHES`` times under load; every
    router notices the new data set (the epoch key) and resyncs before it numbers a step in it:
    0 duplicate (run, step) in the clients' headers and in both routers' logs, every answer 200."""
    import redis.asyncio as aioredis

    tag = f"flush-{uuid.uuid4().hex[:6]}"
    flush_at: list[float] = []

    async def load(c: Cluster) -> tuple[list[dict], int]:
        out: list[dict] = []
        stop = asyncio.Event()
        raw = aioredis.Redis.from_url(redis_proc.url)
        limits = httpx.Limits(max_connections=2 * AGENTS, max_keepalive_connections=2 * AGENTS)
        flushed = 0
        flush_at.append(time.monotonic())
        async with httpx.AsyncClient(timeout=20.0, limits=limits) as client:
            urls = (c.a.url, c.b.url)
            tasks = [asyncio.create_task(_agent(w, client, urls, stop, tag, out)) for w in range(AGENTS)]
            try:
                await asyncio.sleep(1.0)
                for _ in range(FLUSHES):
                    flush_at.append(round(time.monotonic() - flush_at[0], 3))
                    await raw.flushall()
                    flushed += 1
                    await asyncio.sleep(FLUSH_EVERY_S)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
                await raw.aclose()
        return out, flushed

    with running_cluster(tmp_path, redis_proc, fakes, bundle_dir, policy={"kind": "session-sticky"}) as c:
        recs, flushed = asyncio.run(load(c))
        c.a.stop()
        c.b.stop()
    assert flushed == FLUSHES
    bad = [
        (r["run"], r["i"], r.get("status"), r.get("error") or r.get("body"))
        for r in recs
        if r["status"] != 200
    ]
    assert not bad, f"{len(bad)} of {len(recs)} requests not 200: {bad[:5]}"
    seen = Counter((r["run"], int(r["step"])) for r in recs)
    dup_client = {k: n for k, n in seen.items() if n > 1}
    rows = [r for r in _log_steps(tmp_path / "logs") if str(r.get("run_id", "")).startswith(tag)]
    logged = Counter((r["run_id"], int(r["step"])) for r in rows)
    dup_log = {k: n for k, n in logged.items() if n > 1}
    print(
        f"flushall: {len(recs)} steps, {len({r['run'] for r in recs})} runs, {flushed} flushes, "
        f"{len(dup_client)} duplicate (run, step) seen by clients, {len(dup_log)} in the logs"
    )
    assert len(rows) == len(recs)
    t0 = flush_at.pop(0) if flush_at else 0.0
    first = sorted({k[0] for k in dup_client})[:2]
    trail = [
        [(r["router"], r["i"], r["step"], round(r["t"] - t0, 3)) for r in recs if r["run"] == k]
        for k in first
    ]
    print("flushall trail", trail, flush_at)
    assert not dup_client and not dup_log, (list(dup_client)[:5], list(dup_log)[:5], trail, flush_at)
