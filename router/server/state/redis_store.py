"""Run-state store in Redis: several router processes share run pins, step counters and
admission counters (:class:`router.server.state.fallback.FallbackStore` keeps a router serving while
Redis is down).

``RedisStore`` (implements ``router.server.state.store.RunStateStore``; scripts in
:mod:`router.server.state.lua`):
- A run's state is one JSON string at ``{prefix}run:{run_id}``, written with ``SET .. PX ttl``, so an
  idle run expires ``ttl_s`` after its last ``put`` (``get`` does not refresh it, like InProcessStore).
- Step numbers: ``{prefix}step:{run_id}`` is the run's next index. ``begin_step`` reads the pin and
  allocates the index in one script (``max(counter, floor, pin.steps_seen)``, then the counter moves
  past it), so concurrent steps of a run on any number of routers never share an index.
- First pins: ``claim`` is set-if-absent, so two routers that start one run at once agree on one
  pin (the loser adopts the winner's); ``put_newer`` is the resync rule (more ``steps_seen`` wins,
  a tie goes to the smaller JSON text: the same outcome whatever order routers resync in).
- Signals (``POST /v1/runs/{id}/signal``): ``{prefix}sig:{run_id}`` is a list of kinds (RPUSH,
  at most ``MAX_SIGNALS``, the pins' TTL); ``begin_step`` reads it in the same script, so the
  step's own ``signals`` call costs no round trip (the list read is kept per run until then).
- Admission counters live at ``{prefix}adm:{key}``. ``try_admit`` runs one Lua script (read, compare
  with the limit, INCR), so concurrent starts from any number of routers never push the count past
  the limit; ``release`` is a Lua DECR floored at 0. ``admit_ttl_s`` (off by default) lets a counter
  expire that long after its last change, so counts leaked by a crashed router eventually vanish.
- Router slots: ``claim_slot`` leases one of ``slots`` indices (``{prefix}router-slot:{i}``) to this
  process; the fallback store numbers degraded-mode steps in its slot's residue class.
- Connections: short socket timeouts; a connection error is retried once on a fresh connection
  (a pooled connection that died with a restarted Redis is replaced at once, no degraded period),
  timeouts are not retried (a command may have run); pooled connections idle longer than
  ``health_check_s`` are PINGed before use. An unreachable Redis raises ``StoreUnavailable`` at once
  (connection refused, twice) or within ``timeout_s``.
- Data-set epoch: ``{prefix}epoch`` holds a random token, set by the first client that finds none
  (``epoch(candidate)``). A Redis that lost its data (restart without persistence, FLUSHALL, a
  failover to an empty replica) has no token, or a new one. ``begin_step``, ``try_admit_n`` and
  ``release_n`` (and ``get``) take the epoch the caller knows (optional) and check it inside the same
  Lua script, raising ``StoreReset`` instead of acting on a data set the caller never saw.

Knobs: ``url`` (default ``$RUNROUTE_REDIS_URL``, else ``redis://127.0.0.1:6379/0``); ``key_prefix``
(``runroute:``); ``ttl_s`` idle-run expiry (3600); ``timeout_s`` connect/read timeout (0.25);
``admit_ttl_s`` counter expiry (None = never); ``max_connections`` pool size (64);
``health_check_s`` (5; 0 = off).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from router.policy.types import RunState
from router.server.state import lua

__all__ = [
    "StoreUnavailable",
    "StoreReset",
    "NoCounter",
    "RedisStore",
    "redis_url_from_env",
    "encode_state",
    "decode_state",
]

log = logging.getLogger("runroute.state")

_RUN_FIELDS = tuple(f.name for f in fields(RunState))


class StoreUnavailable(RuntimeError):
    """The shared run-state store (Redis) cannot be reached; callers fall back to local state."""


class StoreReset(RuntimeError):
    """Redis' data set is not the one the caller knew (its epoch changed: the data was lost)."""

    def __init__(self, epoch: str):
        super().__init__(f"redis data set changed (epoch now {epoch or 'unset'})")
        self.epoch = epoch


class NoCounter(RuntimeError):
    """``begin_step(hold_new=True)`` met a run without a step counter in Redis."""


def redis_url_from_env(default: str = "redis://127.0.0.1:6379/0") -> str:
    return os.environ.get("RUNROUTE_REDIS_URL") or default


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def encode_state(state: RunState) -> bytes:
    return orjson.dumps({f: getattr(state, f) for f in _RUN_FIELDS})


def decode_state(raw: bytes) -> RunState:
    d = orjson.loads(raw)
    return RunState(**{k: v for k, v in d.items() if k in _RUN_FIELDS})


_encode, _decode = encode_state, decode_state


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
        health_check_s: float = 5.0,
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
            # one retry on a fresh connection for a connection error (a pooled connection that died
            # with a restarted Redis), none for a timeout (the command may have run)
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
            retry_on_timeout=False,
            health_check_interval=health_check_s,
            max_connections=max_connections,
        )
        reg = self._r.register_script
        self._admit, self._release, self._adjust = reg(lua.ADMIT), reg(lua.RELEASE), reg(lua.ADJUST)
        self._get, self._epoch, self._begin = reg(lua.GET), reg(lua.EPOCH), reg(lua.BEGIN)
        self._advance, self._claim, self._put_newer = reg(lua.ADVANCE), reg(lua.CLAIM), reg(lua.PUT_NEWER)
        self._slot, self._unstep, self._resync = reg(lua.SLOT), reg(lua.UNSTEP), reg(lua.RESYNC)
        self._add_signal = reg(lua.ADD_SIGNAL)
        self._sig_read: dict[str, tuple[str, ...]] = {}  # run -> signals read by begin_step
        self._epoch_key = f"{key_prefix}epoch"

    def _run_key(self, run_id: str) -> str:
        return f"{self.key_prefix}run:{run_id}"

    def _adm_key(self, key: str) -> str:
        return f"{self.key_prefix}adm:{key}"

    def _step_key(self, run_id: str) -> str:
        return f"{self.key_prefix}step:{run_id}"

    def _sig_key(self, run_id: str) -> str:
        return f"{self.key_prefix}sig:{run_id}"

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

    async def begin_step(
        self, run_id: str, floor: int = 0, epoch: str | None = None, hold_new: bool = False
    ) -> tuple[RunState | None, int]:
        """The run's pin and its next step index, allocated atomically (module docstring);
        ``hold_new``: raise :class:`NoCounter` instead of numbering a run that has no counter in
        Redis (the settle after a data loss: :class:`router.server.state.fallback.FallbackStore`)."""
        keys = [self._run_key(run_id), self._epoch_key, self._step_key(run_id), self._sig_key(run_id)]
        args: list[str | int] = [epoch or "", int(floor), self._ttl_ms, "1" if hold_new else ""]
        reply = await self._call(self._begin(keys=keys, args=args))
        if int(reply[0]) == -2:
            raise NoCounter(run_id)
        self._checked(reply[:2])
        raw = reply[1]
        if len(self._sig_read) > 4096:  # callers that never asked (refused steps): forget them
            self._sig_read.clear()
        sig = reply[3] if len(reply) > 3 else []
        self._sig_read[run_id] = tuple(v.decode() if isinstance(v, bytes) else str(v) for v in sig)
        return (_decode(raw) if raw else None), int(reply[2])

    async def add_signal(self, run_id: str, kind: str, limit: int) -> int:
        """Append ``kind`` to the run's signals; the list's length, or -1 when it holds ``limit``."""
        args: list[Any] = [kind, int(limit), self._ttl_ms]
        return int(await self._call(self._add_signal(keys=[self._sig_key(run_id)], args=args)))

    async def signals(self, run_id: str) -> tuple[str, ...]:
        """Every signal kind posted on the run, oldest first (the list ``begin_step`` just read,
        else one LRANGE)."""
        hit = self._sig_read.pop(run_id, None)
        if hit is not None:
            return hit
        raw = await self._call(self._r.lrange(self._sig_key(run_id), 0, -1))
        return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in raw)

    async def advance(self, run_id: str, next_index: int) -> int:
        """Raise the run's step counter to at least ``next_index``; returns the counter now."""
        return int(
            await self._call(
                self._advance(keys=[self._step_key(run_id)], args=[int(next_index), self._ttl_ms])
            )
        )

    async def unstep(self, run_id: str, step: int) -> bool:
        """Give back ``step`` (just allocated by ``begin_step``) unless a later index was allocated."""
        self._sig_read.pop(run_id, None)  # a refused step: its signal read is not used
        return bool(await self._call(self._unstep(keys=[self._step_key(run_id)], args=[int(step)])))

    async def next_index(self, run_id: str) -> int:
        raw = await self._call(self._r.get(self._step_key(run_id)))
        return int(raw or 0)

    async def claim(self, state: RunState) -> RunState | None:
        """Set-if-absent of a first pin: None when ``state`` was stored, else the pin already there."""
        raw = await self._call(
            self._claim(keys=[self._run_key(state.run_id)], args=[_encode(state), self._ttl_ms])
        )
        return _decode(raw) if raw else None

    async def put_newer(self, state: RunState) -> bool:
        """Write ``state`` unless Redis holds a pin that wins the resync rule; True when written."""
        args: list[Any] = [_encode(state), self._ttl_ms, int(state.steps_seen)]
        return bool(await self._call(self._put_newer(keys=[self._run_key(state.run_id)], args=args)))

    async def advance_many(self, counters: dict[str, int], chunk: int = 500) -> None:
        """:meth:`advance` for many runs (pipelined, ``chunk`` per round trip)."""
        items = list(counters.items())
        for i in range(0, len(items), chunk):
            pipe = self._r.pipeline(transaction=False)
            for rid, n in items[i : i + chunk]:
                await self._advance(keys=[self._step_key(rid)], args=[int(n), self._ttl_ms], client=pipe)
            await self._call(pipe.execute())

    async def put_newer_many(self, states: list[RunState], chunk: int = 500) -> int:
        """:meth:`put_newer` for many pins (pipelined); returns how many were written."""
        written = 0
        for i in range(0, len(states), chunk):
            pipe = self._r.pipeline(transaction=False)
            for st in states[i : i + chunk]:
                args: list[Any] = [_encode(st), self._ttl_ms, int(st.steps_seen)]
                await self._put_newer(keys=[self._run_key(st.run_id)], args=args, client=pipe)
            written += sum(1 for r in await self._call(pipe.execute()) if r)
        return written

    async def resync_many(
        self, items: list[tuple[str, RunState | None, bool, int | None]], chunk: int = 500
    ) -> int:
        """Write back ``(run_id, pin, delete, next_index)`` items (pipelined, ``chunk`` per round
        trip): each run's pin (``put_newer`` rule; ``delete``: removed; neither: untouched) and its
        step counter (raised to ``next_index``; None: untouched) in one script (state_lua.RESYNC),
        so no router sees one without the other. Returns how many pins were written or deleted."""
        written = 0
        for i in range(0, len(items), chunk):
            pipe = self._r.pipeline(transaction=False)
            for rid, st, delete, n in items[i : i + chunk]:
                mode, raw, seen = ("del", b"", 0) if delete else ("", b"", 0)
                if st is not None and not delete:
                    mode, raw, seen = "put", _encode(st), int(st.steps_seen)
                args: list[Any] = [mode, raw, self._ttl_ms, seen, -1 if n is None else int(n)]
                await self._resync(keys=[self._run_key(rid), self._step_key(rid)], args=args, client=pipe)
            written += sum(1 for r in await self._call(pipe.execute()) if r)
        return written

    async def claim_slot(self, token: str, slots: int, lease_s: float, preferred: int = -1) -> int:
        """Lease a router slot in ``[0, slots)`` (keep ``preferred`` when free); -1 when all are taken."""
        args: list[Any] = [token, int(slots), max(1, int(lease_s * 1000)), int(preferred)]
        return int(await self._call(self._slot(keys=[f"{self.key_prefix}router-slot:"], args=args)))

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
