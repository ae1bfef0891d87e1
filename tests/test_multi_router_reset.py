"""Redis loses its data (restart without persistence, a wipe): each router restores its share once."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from router.policy.types import RunState
from router.server.state.fallback import FallbackStore
from router.server.state.redis_store import RedisStore
from router.server.state.store import InProcessStore

pytestmark = pytest.mark.redis

# --------------------------------------------------------------------------- 5. Redis loses its data


def test_redis_restart_without_persistence_keeps_admission_count_and_pins(redis_proc):
    """Two routers' stores hold admissions and pins; Redis dies and comes back empty. After the
    resync the shared counter again equals the admissions still held (before, during and after the
    outage, on either router), and a pin only one router knew is visible to the other."""

    async def scenario() -> None:
        prefix = f"reset-{uuid.uuid4().hex[:8]}:"

        def router_store() -> FallbackStore:
            primary = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            return FallbackStore(primary, InProcessStore(), retry_interval_s=0.05)

        a, b = router_store(), router_store()
        direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
        try:
            assert all([await a.try_admit("local", 10) for _ in range(3)])
            assert all([await b.try_admit("local", 10) for _ in range(2)])
            pin = RunState(run_id="seen-by-a", tier="frontier", replica="frontier", steps_seen=2)
            await a.put(pin)
            assert await direct.active("local") == 5

            redis_proc.kill()
            assert await a.try_admit("local", 10)  # degraded: counted locally
            await b.release("local")
            assert a.degraded and b.degraded
            redis_proc.start()  # empty

            for s in (a, b):
                for _ in range(100):
                    if await s.resync_now():
                        break
                    await asyncio.sleep(0.05)
                assert not s.degraded
            await direct.close()  # its pooled connection died with the old server
            direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            held = 3 + 2 + 1 - 1
            assert await direct.active("local") == held
            assert await b.get("seen-by-a") == pin
            # and the budget is enforced on the restored count by both routers
            results = await asyncio.gather(*(s.try_admit("local", 10) for s in (a, b) for _ in range(5)))
            assert sum(results) == 10 - held and await direct.active("local") == 10
        finally:
            for s in (a, b, direct):
                await s.close()

    asyncio.run(scenario())


def test_data_loss_without_an_outage_is_healed_once_per_router(redis_proc):
    """Redis is wiped while connected (FLUSHALL, failover to an empty replica): the next operations
    find the epoch changed, each router restores its share exactly once, even with concurrent
    admissions in flight, and no admission is counted against the wiped counter before that."""

    async def scenario() -> None:
        import redis.asyncio as aioredis

        prefix = f"wipe-{uuid.uuid4().hex[:8]}:"

        def router_store() -> FallbackStore:
            primary = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            return FallbackStore(primary, InProcessStore(), retry_interval_s=0.05)

        a, b = router_store(), router_store()
        direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
        raw = aioredis.Redis.from_url(redis_proc.url)
        try:
            assert all([await a.try_admit("local", 30) for _ in range(4)])
            assert all([await b.try_admit("local", 30) for _ in range(3)])
            await b.release("local")
            pin = RunState(run_id="pinned-by-b", tier="local", replica="local-1", steps_seen=4)
            await b.put(pin)
            keys = [k async for k in raw.scan_iter(match=prefix + "*")]
            assert len(keys) >= 3
            await raw.delete(*keys)
            results = await asyncio.gather(
                *(s.try_admit("local", 30) for s in (a, b) for _ in range(5)), b.get("pinned-by-b")
            )
            assert results[:-1] == [True] * 10 and results[-1] == pin
            assert await direct.active("local") == 4 + 2 + 10
            assert (a.resets, b.resets) == (1, 1) and not a.degraded and not b.degraded
            assert await a.get("pinned-by-b") == pin
        finally:
            for s in (a, b, direct):
                await s.close()
            await raw.aclose()

    asyncio.run(scenario())
