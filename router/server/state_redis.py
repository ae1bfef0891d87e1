"""Run-state store in Redis (several router processes share run pins and admission counters),
plus ``FallbackStore``, which keeps a router serving from local pins while Redis is down.

``RedisStore`` (implements ``router.server.state.RunStateStore``):
- A run's state is one JSON string at ``{prefix}run:{run_id}``, written with ``SET .. PX ttl``, so an
  idle run expires ``ttl_s`` after its last ``put`` (``get`` does not refresh it, like InProcessStore).
- Admission counters live at ``{prefix}adm:{key}``. ``try_admit`` runs one Lua script (read, compare
  with the limit, INCR), so concurrent starts from any number of routers never push the count past
  the limit; ``release`` is a Lua DECR floored at 0. ``admit_ttl_s`` (off by default) lets a counter
  expire that long after its last change, so counts leaked by a crashed router eventually vanish.
- Every operation uses short socket timeouts and no retries; an unreachable or timing-out Redis
  raises ``StoreUnavailable`` at once (connection refused) or within ``timeout_s``.
- Data-set epoch: ``{prefix}epoch`` holds a random token, set by the first client that finds none
  (``epoch(candidate)``). A Redis that lost its data (restart without persistence, FLUSHALL, a
  failover to an empty replica) has no token, or a new one. ``try_admit_n`` and ``release_n`` (and
  ``get``) take the epoch the caller knows (optional) and check it inside the same Lua script,
  raising ``StoreReset`` instead of acting on a data set the caller never saw, so no admission is
  ever counted against a wiped counter before the caller has put its own share back.

Knobs: ``url`` (default ``$RUNROUTE_REDIS_URL``, else ``redis://127.0.0.1:6379/0``); ``key_prefix``
(``runroute:``); ``ttl_s`` idle-run expiry (3600); ``timeout_s`` connect/read timeout (0.25);
``admit_ttl_s`` counter expiry (None = never); ``max_connections`` pool size (64).

``FallbackStore(primary, local)`` (same interface): a write-through mirror. Normally every read goes to
Redis (so a pin changed by another router is seen) and every result is mirrored into the in-process
``local`` store. When Redis raises ``StoreUnavailable`` it turns ``degraded``: operations are served
from ``local`` (pins this router has seen; admission counted locally, starting from the last count
Redis reported for the key), writes and deletes are remembered, and a warning is logged at most once
per ``log_interval_s``. Every ``retry_interval_s`` a background probe pings Redis; when it answers,
the remembered pins are written back (local wins: this router served those steps), the admission
deltas are added to Redis' counters (floored at 0), and ``degraded`` clears. A pin Redis has lost
(e.g. a Redis restart without persistence) but ``local`` still holds is written back on ``get``.

Data loss (the epoch changed; found by the probe after an outage, by ``StoreReset`` from an
admission operation, or by ``get`` when Redis lacks a pin ``local`` holds; ``get`` itself stays a
plain GET, measured ~40 us cheaper per step than the epoch-checking script): each
router puts back its own share of what Redis lost, once (a lock serialises this router's heals, and
its admission operations carry the old epoch, so none succeeds on the new data set first): its net
admissions over its lifetime (admits minus releases it made, in both
modes) are added to each counter, its remembered pins are written (local wins), and every other pin
in ``local`` is written only where Redis has none (``SET NX``: a newer pin from another router
stays). Summed over routers that restores the counters exactly (up to the floor at 0 applied after
each router's addition when some router released more than it admitted) and every pin some live
router still holds. ``resets`` counts these recoveries. The epoch key has no TTL; keep it out of
eviction (``maxmemory-policy`` ``noeviction`` or ``volatile-*``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import orjson

from router.policy.types import RunState
from router.server.state import InProcessStore, RunStateStore

__all__ = ["StoreUnavailable", "StoreReset", "RedisStore", "FallbackStore", "redis_url_from_env"]

T = TypeVar("T")

log = logging.getLogger("runroute.state")

_RUN_FIELDS = tuple(f.name for f in fields(RunState))

# Every epoch-checking script starts like this: KEYS[2] = the epoch key, ARGV[1] = the epoch the
# caller knows ('' = do not check); a mismatch answers {-1, current epoch or ''} and changes nothing.
_CHECK = """
if ARGV[1] ~= '' then
  local e = redis.call('GET', KEYS[2])
  if e ~= ARGV[1] then return {-1, e or ''} end
end
"""
_GET_LUA = (
    _CHECK
    + """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
return {0, ''}
"""
)
_EPOCH_LUA = """
local e = redis.call('GET', KEYS[1])
if e then return e end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""
_ADMIT_LUA = (
    _CHECK
    + """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[2]) then return {0, n} end
n = redis.call('INCR', KEYS[1])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, n}
"""
)
_RELEASE_LUA = (
    _CHECK
    + """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n <= 0 then return {1, 0} end
n = redis.call('DECR', KEYS[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, n}
"""
)
_ADJUST_LUA = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1])
if n < 0 then n = 0 end
redis.call('SET', KEYS[1], n)
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return n
"""


class StoreUnavailable(RuntimeError):
    """The shared run-state store (Redis) cannot be reached; callers fall back to local state."""


class StoreReset(RuntimeError):
    """Redis' data set is not the one the caller knew (its epoch changed: the data was lost)."""

    def __init__(self, epoch: str):
        super().__init__(f"redis data set changed (epoch now {epoch or 'unset'})")
        self.epoch = epoch


def redis_url_from_env(default: str = "redis://127.0.0.1:6379/0") -> str:
    return os.environ.get("RUNROUTE_REDIS_URL") or default


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _encode(state: RunState) -> bytes:
    return orjson.dumps({f: getattr(state, f) for f in _RUN_FIELDS})


def _decode(raw: bytes) -> RunState:
    d = orjson.loads(raw)
    return RunState(**{k: v for k, v in d.items() if k in _RUN_FIELDS})


class RedisStore:
    """RunStateStore on Redis (redis.asyncio); see the module docstring."""

    def __init__(
        self,
        url: str | None = None,
        *,
        key_prefix: str = "runroute:",
        ttl_s: float = 3600.0,
        timeout_s: float = 0.25,
        admit_ttl_s: float | None = None,
        max_connections: int = 64,
    ):
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.url = url or redis_url_from_env()
        self.key_prefix = key_prefix
        self.ttl_s = ttl_s
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._admit_ttl_ms = int(admit_ttl_s * 1000) if admit_ttl_s else 0
        self._errors: tuple[type[BaseException], ...] = (
            RedisConnectionError,
            RedisTimeoutError,
            OSError,
            asyncio.TimeoutError,
        )
        self._r = aioredis.Redis.from_url(
            self.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            max_connections=max_connections,
        )
        self._admit = self._r.register_script(_ADMIT_LUA)
        self._release = self._r.register_script(_RELEASE_LUA)
        self._adjust = self._r.register_script(_ADJUST_LUA)
        self._get = self._r.register_script(_GET_LUA)
        self._epoch = self._r.register_script(_EPOCH_LUA)
        self._epoch_key = f"{key_prefix}epoch"

    def _run_key(self, run_id: str) -> str:
        return f"{self.key_prefix}run:{run_id}"

    def _adm_key(self, key: str) -> str:
        return f"{self.key_prefix}adm:{key}"

    async def _call(self, aw: Any) -> Any:
        try:
            return await aw
        except self._errors as e:
            raise StoreUnavailable(
                f"redis unreachable at {_redact(self.url)}: {type(e).__name__}: {e}"
            ) from None

    async def ping(self) -> bool:
        return bool(await self._call(self._r.ping()))

    async def epoch(self, candidate: str) -> str:
        """The data set's epoch token; ``candidate`` becomes it when Redis has none (atomically)."""
        raw = await self._call(self._epoch(keys=[self._epoch_key], args=[candidate]))
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    @staticmethod
    def _checked(reply: Any) -> Any:
        ok, value = reply
        if int(ok) == -1:
            raise StoreReset(value.decode() if isinstance(value, bytes) else str(value))
        return reply

    async def get(self, run_id: str, epoch: str | None = None) -> RunState | None:
        if epoch is None:
            raw = await self._call(self._r.get(self._run_key(run_id)))
            return None if raw is None else _decode(raw)
        found, raw = self._checked(
            await self._call(self._get(keys=[self._run_key(run_id), self._epoch_key], args=[epoch]))
        )
        return _decode(raw) if int(found) else None

    async def put(self, state: RunState) -> None:
        await self._call(self._r.set(self._run_key(state.run_id), _encode(state), px=self._ttl_ms))

    async def put_if_absent(self, states: list[RunState], chunk: int = 500) -> int:
        """Write each state only where Redis has none for its run (pipelined ``SET NX``, ``chunk``
        per round trip); returns how many were written."""
        written = 0
        for i in range(0, len(states), chunk):
            pipe = self._r.pipeline(transaction=False)
            for st in states[i : i + chunk]:
                pipe.set(self._run_key(st.run_id), _encode(st), px=self._ttl_ms, nx=True)
            written += sum(1 for r in await self._call(pipe.execute()) if r)
        return written

    async def delete(self, run_id: str) -> None:
        await self._call(self._r.delete(self._run_key(run_id)))

    async def try_admit_n(self, key: str, limit: int, epoch: str | None = None) -> tuple[bool, int]:
        """Atomically admit one more under ``key`` unless at ``limit``; returns (admitted, count now).

        With ``epoch``, raises ``StoreReset`` (admitting nothing) when Redis' epoch differs."""
        ok, n = self._checked(
            await self._call(
                self._admit(
                    keys=[self._adm_key(key), self._epoch_key],
                    args=[epoch or "", int(limit), self._admit_ttl_ms],
                )
            )
        )
        return bool(ok), int(n)

    async def try_admit(self, key: str, limit: int) -> bool:
        return (await self.try_admit_n(key, limit))[0]

    async def release_n(self, key: str, epoch: str | None = None) -> int:
        """Give one back under ``key`` (floored at 0); returns the count now. ``epoch`` as above."""
        _, n = self._checked(
            await self._call(
                self._release(
                    keys=[self._adm_key(key), self._epoch_key], args=[epoch or "", self._admit_ttl_ms]
                )
            )
        )
        return int(n)

    async def release(self, key: str) -> None:
        await self.release_n(key)

    async def adjust(self, key: str, delta: int) -> int:
        """Add ``delta`` to a counter, floored at 0 (used to resync admissions made while degraded)."""
        return int(
            await self._call(self._adjust(keys=[self._adm_key(key)], args=[int(delta), self._admit_ttl_ms]))
        )

    async def active(self, key: str) -> int:
        raw = await self._call(self._r.get(self._adm_key(key)))
        return int(raw or 0)

    async def close(self) -> None:
        try:
            await self._r.aclose()
        except self._errors:  # closing a pool whose server is gone is not an error
            pass


class FallbackStore:
    """Redis first, in-process when Redis is down, resync when it returns; see the module docstring."""

    def __init__(
        self,
        primary: RedisStore,
        local: InProcessStore | RunStateStore | None = None,
        *,
        retry_interval_s: float = 1.0,
        log_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.primary = primary
        self.local: Any = local if local is not None else InProcessStore(ttl_s=primary.ttl_s)
        self.retry_interval_s = retry_interval_s
        self.log_interval_s = log_interval_s
        self._clock = clock
        self._degraded = False
        self._since = 0.0
        self._next_probe = 0.0
        self._last_log = float("-inf")
        self._local_ops = 0
        self._probe_task: asyncio.Task[None] | None = None
        self._dirty: dict[str, RunState | None] = {}  # run_id -> state to write back (None = delete)
        self._last_count: dict[str, int] = {}  # last admission count Redis reported per key
        self._counts: dict[str, int] = {}  # admission counts while degraded
        self._delta: dict[str, int] = {}  # admissions - releases while degraded, to add back
        self._held: dict[str, int] = {}  # admissions - releases by this router, over its lifetime
        self._epoch: str | None = None  # the Redis data set this router's state was written to
        self._heal_lock: asyncio.Lock | None = None
        self._pins_pending = False  # a data loss was found and local pins are not all written back
        self.resyncs = 0
        self.resets = 0

    @property
    def degraded(self) -> bool:
        return self._degraded

    # --- degraded-mode bookkeeping ---------------------------------------------------------------

    def _enter_degraded(self, err: Exception) -> None:
        now = self._clock()
        if not self._degraded:
            self._degraded = True
            self._since = now
            self._next_probe = now + self.retry_interval_s
        self._log(str(err))

    def _log(self, why: str) -> None:
        now = self._clock()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            log.warning(
                "run-state store degraded for %.0f s (%s); serving local pins (%d local ops so far)",
                now - self._since,
                why,
                self._local_ops,
            )

    def _local(self) -> None:
        """Called on every operation served locally: count it, log (rate-limited), maybe probe."""
        self._local_ops += 1
        self._log("redis unreachable")
        if self._clock() >= self._next_probe and (self._probe_task is None or self._probe_task.done()):
            self._next_probe = self._clock() + self.retry_interval_s
            self._probe_task = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        try:
            await self.primary.ping()
            await self._resync()
        except Exception as e:  # noqa: BLE001 - any failure keeps us degraded; the next probe retries
            log.debug("run-state store probe failed: %s", e)
            return
        self._degraded = False
        self._counts.clear()
        self.resyncs += 1
        log.info(
            "run-state store recovered after %.1f s; pins resynced to redis", self._clock() - self._since
        )

    async def _resync(self) -> None:
        lost = False
        if self._epoch is not None:
            now_epoch = await self.primary.epoch(uuid.uuid4().hex)
            lost = now_epoch != self._epoch
            if lost:
                # Redis lost everything: give back this router's whole share, not just the outage's
                await self._restore_share()
                self._epoch = now_epoch
                self._pins_pending = True
        while self._dirty:
            rid, st = next(iter(self._dirty.items()))
            if st is None:
                await self.primary.delete(rid)
            else:
                await self.primary.put(st)
            if self._dirty.get(rid, ...) is st:
                del self._dirty[rid]
        await self._restore_pins()
        while self._delta:
            key, d = next(iter(self._delta.items()))
            self._last_count[key] = await self.primary.adjust(key, d)
            left = self._delta.get(key, 0) - d
            if left:
                self._delta[key] = left
            else:
                self._delta.pop(key, None)

    async def _restore_share(self) -> None:
        """Add this router's net admissions to a wiped Redis' counters (deltas pending are included)."""
        share = {k: n for k, n in self._held.items() if n}
        self._delta.clear()  # synchronously with the snapshot: later changes land in _delta again
        for key, n in share.items():
            self._last_count[key] = await self.primary.adjust(key, n)
        self.resets += 1
        log.warning(
            "redis lost its data (epoch changed); restored this router's admissions %s and pins", share
        )

    async def _restore_pins(self) -> None:
        """After a data loss: every pin ``local`` holds goes back where Redis has none (SET NX)."""
        states = getattr(self.local, "states", None)
        if not self._pins_pending or states is None:
            return
        await self.primary.put_if_absent([st for st in await states() if st.run_id not in self._dirty])
        self._pins_pending = False

    async def _on_primary(self, op: Callable[[str | None], Awaitable[T]]) -> T:
        """Run ``op(epoch)`` against Redis; learn the epoch first, and recover once on StoreReset."""
        if self._epoch is None:
            self._epoch = await self.primary.epoch(uuid.uuid4().hex)
        for _ in range(3):
            try:
                return await op(self._epoch)
            except StoreReset:
                await self._heal()
        raise StoreUnavailable("redis data set keeps changing (epoch); serving local state")

    async def _heal(self) -> None:
        """Redis lost its data while this router was connected: restore this router's share, once."""
        if self._heal_lock is None:
            self._heal_lock = asyncio.Lock()
        async with self._heal_lock:
            now_epoch = await self.primary.epoch(uuid.uuid4().hex)
            if now_epoch == self._epoch:  # another task of this router already healed
                return
            await self._restore_share()
            self._epoch = now_epoch  # the share is back: never add it twice, even if pins fail below
            self._pins_pending = True
            await self._restore_pins()

    async def resync_now(self) -> bool:
        """Probe and resync immediately (tests, admin); returns True when no longer degraded."""
        if self._degraded:
            await self._probe()
        return not self._degraded

    # --- RunStateStore -----------------------------------------------------------------------------

    async def get(self, run_id: str) -> RunState | None:
        if not self._degraded:
            try:
                if self._epoch is None:
                    self._epoch = await self.primary.epoch(uuid.uuid4().hex)
                st = await self.primary.get(run_id)  # plain GET: the hot path stays one cheap call
            except StoreUnavailable as e:
                self._enter_degraded(e)
            else:
                if st is not None:
                    await self.local.put(st)
                    return st
                mine = await self.local.get(run_id)
                if mine is not None:  # redis lost it (restart/flush, or expiry): heal from our copy
                    try:
                        if await self.primary.epoch(uuid.uuid4().hex) != self._epoch:
                            await self._heal()  # the whole data set is gone: restore our share
                        await self.primary.put(mine)
                    except StoreUnavailable as e:
                        self._enter_degraded(e)
                        self._dirty[run_id] = mine
                return mine
        self._local()
        return await self.local.get(run_id)

    async def put(self, state: RunState) -> None:
        await self.local.put(state)
        if not self._degraded:
            try:
                await self.primary.put(state)
                return
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        self._dirty[state.run_id] = replace(state)

    async def delete(self, run_id: str) -> None:
        await self.local.delete(run_id)
        if not self._degraded:
            try:
                await self.primary.delete(run_id)
                return
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        self._dirty[run_id] = None

    async def try_admit(self, key: str, limit: int) -> bool:
        if not self._degraded:
            try:
                ok, n = await self._on_primary(lambda e: self.primary.try_admit_n(key, limit, e))
                self._last_count[key] = n
                if ok:
                    self._held[key] = self._held.get(key, 0) + 1
                return ok
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        n = self._counts.get(key, self._last_count.get(key, 0))
        if n >= limit:
            self._counts[key] = n
            return False
        self._counts[key] = n + 1
        self._delta[key] = self._delta.get(key, 0) + 1
        self._held[key] = self._held.get(key, 0) + 1
        return True

    async def release(self, key: str) -> None:
        if not self._degraded:
            try:
                self._last_count[key] = await self._on_primary(lambda e: self.primary.release_n(key, e))
                self._held[key] = self._held.get(key, 0) - 1
                return
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        self._counts[key] = max(0, self._counts.get(key, self._last_count.get(key, 0)) - 1)
        self._delta[key] = self._delta.get(key, 0) - 1
        self._held[key] = self._held.get(key, 0) - 1

    async def active(self, key: str) -> int:
        if not self._degraded:
            try:
                n = await self.primary.active(key)
                self._last_count[key] = n
                return n
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        return self._counts.get(key, self._last_count.get(key, 0))

    async def close(self) -> None:
        if self._probe_task is not None and not self._probe_task.done():
            self._probe_task.cancel()
            try:
                await self._probe_task
            except (asyncio.CancelledError, StoreUnavailable):
                pass
        await self.primary.close()
        await self.local.close()
