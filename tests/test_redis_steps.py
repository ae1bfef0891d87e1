"""F4 (issue 17): two routers' stores on one real Redis number a run's steps uniquely, also while
Redis is cut off and after it returns; a new run's first pin is set-if-absent; a dead pooled
connection (Redis went away and came back while idle) costs no degraded period. The step
numbering of the code before the fix (``steps_seen`` read, then written back) gave every run
duplicate indices during an outage."""

from __future__ import annotations

import uuid

import pytest
from test_state_redis import URL, TcpProxy, _cleanup, _free_port

from router.policy.types import RunState
from router.server.state.fallback import FallbackStore
from router.server.state.redis_store import RedisStore

pytestmark = pytest.mark.redis


@pytest.fixture
async def prefix():
    p = f"test-runroute:{uuid.uuid4().hex}:"
    yield p
    await _cleanup(p)


def _stores(port: int, prefix: str, n: int = 2) -> list[FallbackStore]:
    url = f"redis://127.0.0.1:{port}/0"
    return [
        FallbackStore(RedisStore(url, key_prefix=prefix, timeout_s=0.3), retry_interval_s=0.05, step_gap=64)
        for _ in range(n)
    ]


async def test_steps_unique_across_two_routers_through_an_outage(prefix):
    proxy = TcpProxy(_free_port())
    await proxy.start()
    a, b = _stores(proxy.port, prefix)
    seen: dict[str, list[int]] = {}
    runs = [f"run-{i}" for i in range(10)]

    async def step(s: FallbackStore, rid: str) -> int:
        pin, n = await s.begin_step(rid, 0)
        await s.put(RunState(run_id=rid, tier="local", replica="local-0", steps_seen=n + 1))
        seen.setdefault(rid, []).append(n)
        return n

    try:
        for k in range(4):  # healthy: alternating routers, contiguous indices
            for j, rid in enumerate(runs):
                await step((a, b)[(k + j) % 2], rid)
        assert all(v == [0, 1, 2, 3] for v in seen.values()), seen
        assert {a.slot, b.slot} == {0, 1}  # distinct leased slots

        await proxy.cut()  # Redis unreachable for both routers
        for k in range(5):
            for j, rid in enumerate(runs):
                await step((a, b)[(k + j) % 2], rid)
        assert a.degraded and b.degraded

        await proxy.start()
        assert await a.resync_now() and await b.resync_now()
        for k in range(3):
            for j, rid in enumerate(runs):
                await step((a, b)[(k + j) % 2], rid)
        for rid, idx in seen.items():
            assert len(idx) == len(set(idx)) == 12, (rid, idx)  # no (run_id, step) twice
            assert idx[-3:] == sorted(idx[-3:]) and min(idx[-3:]) > max(idx[:-3]), (rid, idx)
    finally:
        for s in (a, b):
            await s.close()


async def test_first_pin_is_set_if_absent(prefix):
    a, b = (FallbackStore(RedisStore(URL, key_prefix=prefix, timeout_s=1.0)) for _ in range(2))
    try:
        mine = RunState(run_id="new", tier="local", replica="local-0", steps_seen=1, admitted="admit-local")
        theirs = RunState(run_id="new", tier="local", replica="local-1", steps_seen=1, admitted="admit-local")
        assert await a.claim(mine) is None
        assert await b.claim(theirs) == mine  # the loser adopts the winner's pin
        assert await b.get("new") == mine
    finally:
        await a.close()
        await b.close()


async def test_dead_pooled_connection_is_replaced_without_a_degraded_period(prefix):
    proxy = TcpProxy(_free_port())
    await proxy.start()
    (s,) = _stores(proxy.port, prefix, 1)
    try:
        await s.begin_step("r", 0)
        await proxy.cut()  # every pooled connection dies; Redis is back before the next request
        await proxy.start()
        _, n = await s.begin_step("r", 0)
        assert n == 1 and not s.degraded
    finally:
        await s.close()
        await _cleanup(prefix)
