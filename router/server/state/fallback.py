"""``FallbackStore``: Redis first, the router's own in-process state while Redis is down, resync after.

A write-through mirror (implements ``router.server.state.store.RunStateStore``). Normally every read goes
to Redis (so a pin changed by another router is seen) and every result is mirrored into the
in-process ``local`` store (pins and each run's step counter). When Redis raises
``StoreUnavailable`` the store turns ``degraded``: operations are served from ``local`` (pins this
router has seen; admission counted locally, starting from the last count Redis reported for the
key), writes and deletes are remembered, and a warning is logged at most once per
``log_interval_s``. Every ``retry_interval_s`` a background probe pings Redis; when it answers, the
store recovers (below) and ``degraded`` clears, only once nothing served locally is left to write
back (requests served while the write-back ran are written back in another round). (A Redis that restarted while this router was idle
is picked up without a degraded period: the Redis client retries a dead pooled connection once.)

Step numbers while degraded (router-scoped, so two routers cut off from Redis never number one
step twice): each router leases a slot ``r`` of ``slots`` in Redis (``claim_slot``, renewed every
``slot_lease_s / 3`` on the request path; ``slot`` pins it in config; a router that never reached
Redis uses ``crc32(host, pid) % slots`` and logs it). While degraded it numbers a run's steps only
with indices ``= r (mod slots)``, and the first such index of a run in an outage lies at least
``step_gap`` above the highest index the router knew for the run. After the outage it raises the
run's Redis counter to ``its last index + 1 + step_gap``. So indices never collide as long as, for
any run, fewer than ``step_gap`` steps were numbered by other routers that this router had not
seen (before the outage, or while it was still degraded and another router was not). Indices jump
by ``step_gap`` (and step in ``slots``) around an outage; they stay increasing in time per router.

Recovery (one at a time per router, under a lock; after an outage, after ``StoreReset`` from an
epoch-checked operation, or when ``get`` finds a pin missing in Redis that ``local`` holds):

- data loss (the epoch changed): this router puts back its own share of what Redis lost, once: its
  net admissions over its lifetime (admits minus releases in both modes) are added to each counter,
  every step counter it holds is raised to ``its value + step_gap``, every pin it holds is written
  with the deterministic rule (``put_newer``: more ``steps_seen`` wins, a tie goes to the smaller
  JSON text), and its slot is leased again. Summed over routers that restores the counters exactly
  (up to the floor at 0) and every pin some live router still holds;
- outage write-back: remembered pins (``put_newer``; deletions as deletes), step counters numbered
  while degraded (``+ step_gap``), admission deltas (added, floored at 0).

Pins and step counters go back per run in one script (``RedisStore.resync_many``): written in
separate passes, another router could see a run's raised counter without its pin (and start the
run anew) or its pin without the raised counter (and number into this router's degraded indices).

Settle after a data loss: for ``reset_settle_s`` seconds from when this router noticed it, a step
of a run that has no step counter in Redis waits (until the settle ends) before it is numbered:
the router that served the run's latest steps may not have written its counter back yet (every
router notices a loss at its next operation, or within ``epoch_check_s`` by the background epoch
watch, and writes back at once), and numbering from this router's own, older knowledge would reuse
its indices. Steps of runs whose counter is back go on at once; a new run's first step in that
window waits at most ``reset_settle_s``. The router's known epoch moves to the new data set only
once its own write-back is done (its share of admissions is added once per data set), so its
concurrent steps wait for the write-back instead of numbering in a half-restored data set.

``resyncs`` counts recoveries after outages, ``resets`` recoveries after data loss. The epoch key has
no TTL; keep it out of eviction (``maxmemory-policy`` ``noeviction`` or ``volatile-*``).

Knobs: ``retry_interval_s`` (1), ``log_interval_s`` (60), ``slots`` (16: the most routers sharing a
Redis), ``slot`` (None = leased), ``slot_lease_s`` (60), ``step_gap`` (1024), ``epoch_check_s``
(0.25: the background epoch watch; 0 = off), ``reset_settle_s`` (1.5: longer than ``epoch_check_s``
plus another router's write-back), ``clock``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from router.policy.types import RunState
from router.server.state.redis_store import NoCounter, RedisStore, StoreReset, StoreUnavailable
from router.server.state.store import InProcessStore

__all__ = ["FallbackStore"]

T = TypeVar("T")

log = logging.getLogger("runroute.state")

_CLEAN = object()  # "no pin change to write back" (None in ``_dirty`` means: deleted)


def _host_slot(slots: int) -> int:
    return zlib.crc32(f"{socket.gethostname()}-{os.getpid()}".encode()) % slots


class FallbackStore:
    """See the module docstring."""

    _RECOVER_ROUNDS = 8  # write-back rounds per probe before it gives up until the next one

    def __init__(
        self,
        primary: RedisStore,
        local: InProcessStore | None = None,
        *,
        retry_interval_s: float = 1.0,
        log_interval_s: float = 60.0,
        slots: int = 16,
        slot: int | None = None,
        slot_lease_s: float = 60.0,
        step_gap: int = 1024,
        epoch_check_s: float = 0.25,
        reset_settle_s: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        if slots < 1 or step_gap < 1 or (slot is not None and not 0 <= slot < slots):
            raise ValueError("need slots >= 1, step_gap >= 1 and 0 <= slot < slots")
        self.primary = primary
        self.local: InProcessStore = local if local is not None else InProcessStore(ttl_s=primary.ttl_s)
        self.retry_interval_s = retry_interval_s
        self.log_interval_s = log_interval_s
        self.slots, self.step_gap, self.slot_lease_s = slots, step_gap, slot_lease_s
        self._slot_fixed = slot is not None
        self.slot = slot if slot is not None else _host_slot(slots)
        self._slot_leased = False
        self._slot_due = 0.0
        self._slot_token = uuid.uuid4().hex
        self._clock = clock
        self._degraded = False
        self._since = 0.0
        self._next_probe = 0.0
        self._last_log = float("-inf")
        self._local_ops = 0
        self._probe_task: asyncio.Task[None] | None = None
        self._dirty: dict[str, RunState | None] = {}  # run_id -> state to write back (None = delete)
        self._dirty_steps: dict[str, int] = {}  # run_id -> next index numbered while degraded
        self._outage_runs: set[str] = set()  # runs this router numbered in the current outage
        self._last_count: dict[str, int] = {}  # last admission count Redis reported per key
        self._counts: dict[str, int] = {}  # admission counts while degraded
        self._delta: dict[str, int] = {}  # admissions - releases while degraded, to add back
        self._held: dict[str, int] = {}  # admissions - releases by this router, over its lifetime
        self._epoch: str | None = None  # the Redis data set this router's state was written to
        self._restored: str | None = None  # the data set this router's admission share went to
        self._loss_at = float("-inf")  # when this router last noticed a data loss
        self.epoch_check_s, self.reset_settle_s = epoch_check_s, reset_settle_s
        self._watch_task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
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
            for _ in range(self._RECOVER_ROUNDS):
                await self._recover()
                # requests served while the recovery's last calls were in flight were still served
                # locally: their pins, indices and admissions go back too before `degraded` clears
                # (no await between this check and the flag, so nothing can slip in between)
                if not (self._dirty or self._dirty_steps or self._delta):
                    break
            else:
                log.debug("run-state store probe: local changes keep arriving; still degraded")
                return
        except Exception as e:  # noqa: BLE001 - any failure keeps us degraded; the next probe retries
            log.debug("run-state store probe failed: %s", e)
            return
        self._degraded = False
        self._counts.clear()
        self._outage_runs.clear()
        self.resyncs += 1
        log.info(
            "run-state store recovered after %.1f s; state resynced to redis", self._clock() - self._since
        )

    # --- recovery ----------------------------------------------------------------------------------

    async def _learn(self) -> None:
        """At first contact: the data set's epoch; every ``slot_lease_s / 3``: this router's slot."""
        if self._epoch is None:
            self._epoch = await self.primary.epoch(uuid.uuid4().hex)
        if self._watch_task is None and self.epoch_check_s > 0:
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_epoch())
        if not self._slot_fixed and self._clock() >= self._slot_due:
            await self._lease_slot()

    async def _lease_slot(self) -> None:
        self._slot_due = self._clock() + self.slot_lease_s / 3
        pref = self.slot if self._slot_leased else -1
        got = await self.primary.claim_slot(self._slot_token, self.slots, self.slot_lease_s, pref)
        if got < 0:
            log.warning(
                "all %d router slots are leased; numbering degraded steps in slot %d", self.slots, self.slot
            )
        else:
            if self._slot_leased and got != self.slot:
                log.warning("router slot %d was taken; now slot %d", self.slot, got)
            self.slot, self._slot_leased = got, True

    async def _watch_epoch(self) -> None:
        """Every ``epoch_check_s``: a data set that changed is noticed (and this router's state
        written back) even while this router serves nothing (module docstring)."""
        while True:
            await asyncio.sleep(self.epoch_check_s)
            if self._degraded or self._epoch is None:
                continue
            try:
                if await self.primary.epoch(uuid.uuid4().hex) != self._epoch:
                    await self._recover()
            except Exception as e:  # noqa: BLE001 - the request path notices an outage itself
                log.debug("epoch watch: %s", e)

    async def _recover(self) -> None:
        """Write this router's state back to Redis (module docstring); one recovery at a time."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now_epoch = await self.primary.epoch(uuid.uuid4().hex)
            lost = self._epoch is not None and now_epoch != self._epoch
            if lost:
                self._loss_at = self._clock()
                if self._restored != now_epoch:  # the share goes back once per data set
                    await self._restore_share()
                    self._restored = now_epoch
            await self._write_back(lost)
            # only now: this router's steps number in the new data set once its state is back
            self._epoch = now_epoch
            while self._delta:
                key, d = next(iter(self._delta.items()))
                self._last_count[key] = await self.primary.adjust(key, d)
                left = self._delta.get(key, 0) - d
                if left:
                    self._delta[key] = left
                else:
                    self._delta.pop(key, None)
            if lost:
                self._slot_due = 0.0
            if not self._slot_fixed:
                await self._lease_slot()

    async def _write_back(self, lost: bool) -> None:
        """Pins and step counters back to Redis, each run's pin and counter in one script
        (``resync_many``): a router that sees a run's counter raised also sees its pin, so it never
        starts a run anew that this router is writing back, and a pin is never visible with a
        counter that does not yet lie ``step_gap`` past this router's indices (degraded numbering).

        After a data loss every run this router holds; otherwise the runs it changed while degraded
        (also those changed while this write-back runs: it loops until none is left)."""
        if lost:
            counters = self.local.counters()
            states = {st.run_id: st for st in await self.local.states()}
            items = [
                (rid, states.get(rid), False, counters[rid] + self.step_gap if rid in counters else None)
                for rid in {**counters, **states}
                if rid not in self._dirty and rid not in self._dirty_steps
            ]
            await self.primary.resync_many(items)
        while self._dirty or self._dirty_steps:
            batch = {**dict.fromkeys(self._dirty_steps), **dict.fromkeys(self._dirty)}
            snap = {rid: (self._dirty.get(rid, _CLEAN), self._dirty_steps.get(rid)) for rid in batch}
            items = []
            for rid, (st, n) in snap.items():
                if lost:  # every index this router knows for the run, not only the degraded ones
                    n = max(n or 0, self.local.next_index(rid)) or None
                pin = st if isinstance(st, RunState) else None
                items.append((rid, pin, st is None, None if n is None else n + self.step_gap))
            await self.primary.resync_many(items)
            for rid, (st, n) in snap.items():  # unless changed meanwhile (then written next round)
                if st is not _CLEAN and self._dirty.get(rid, _CLEAN) is st:
                    del self._dirty[rid]
                if n is not None and self._dirty_steps.get(rid) == n:
                    del self._dirty_steps[rid]

    async def _restore_share(self) -> None:
        """Add this router's net admissions to a wiped Redis' counters (deltas pending are included)."""
        share = {k: n for k, n in self._held.items() if n}
        self._delta.clear()  # synchronously with the snapshot: later changes land in _delta again
        for key, n in share.items():
            self._last_count[key] = await self.primary.adjust(key, n)
        self.resets += 1
        log.warning(
            "redis lost its data (epoch changed); restored this router's admissions %s, pins, steps", share
        )

    async def _on_primary(self, op: Callable[[str | None], Awaitable[T]]) -> T:
        """Run ``op(epoch)`` against Redis; learn the epoch first, and recover on StoreReset."""
        await self._learn()
        for _ in range(3):
            try:
                return await op(self._epoch)
            except StoreReset:
                await self._recover()
        raise StoreUnavailable("redis data set keeps changing (epoch); serving local state")

    async def resync_now(self) -> bool:
        """Probe and resync immediately (tests, admin); returns True when no longer degraded."""
        if self._degraded:
            await self._probe()
        return not self._degraded

    # --- RunStateStore -----------------------------------------------------------------------------

    async def begin_step(self, run_id: str, floor: int) -> tuple[RunState | None, int]:
        floor = max(floor, self.local.next_index(run_id))
        if not self._degraded:
            try:
                pin, step = await self._settled_begin(run_id, floor)
            except StoreUnavailable as e:
                self._enter_degraded(e)
            else:
                self.local.advance(run_id, step + 1)
                if pin is not None:
                    await self.local.put(pin)
                    return pin, step
                mine = await self.local.get(run_id)
                if mine is not None:  # redis lost it (expiry): heal from our copy
                    try:
                        await self.primary.put_newer(mine)
                    except StoreUnavailable as e:
                        self._enter_degraded(e)
                        self._dirty[run_id] = mine
                return mine, step
        self._local()
        pin = await self.local.get(run_id)
        base = max(floor, pin.steps_seen if pin is not None else 0)
        if run_id not in self._outage_runs:
            self._outage_runs.add(run_id)
            base += self.step_gap
        step = base + (self.slot - base) % self.slots
        self.local.advance(run_id, step + 1)
        self._dirty_steps[run_id] = step + 1
        return pin, step

    async def _settled_begin(self, run_id: str, floor: int) -> tuple[RunState | None, int]:
        """``primary.begin_step``, except that in the settle after a data loss a run without a
        counter in Redis waits for the settle to end first (module docstring)."""

        def settling() -> float:  # read when the script is sent: a loss noticed by this very call counts
            return self._loss_at + self.reset_settle_s - self._clock()

        while True:
            try:
                return await self._on_primary(
                    lambda e: self.primary.begin_step(run_id, floor, e, hold_new=settling() > 0)
                )
            except NoCounter:
                await asyncio.sleep(max(0.0, min(settling(), self.reset_settle_s)))

    async def unstep(self, run_id: str, step: int) -> bool:
        await self.local.unstep(run_id, step)
        if not self._degraded:
            try:
                return await self.primary.unstep(run_id, step)
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        if self._dirty_steps.get(run_id) == step + 1:
            del self._dirty_steps[run_id]
        return False

    async def claim(self, state: RunState) -> RunState | None:
        if not self._degraded:
            try:
                other = await self.primary.claim(state)
            except StoreUnavailable as e:
                self._enter_degraded(e)
            else:
                await self.local.put(other if other is not None else state)
                return other
        self._local()
        other = await self.local.claim(state)
        if other is None:
            self._dirty[state.run_id] = replace(state)
        return other

    async def get(self, run_id: str) -> RunState | None:
        if not self._degraded:
            try:
                await self._learn()
                st = await self.primary.get(run_id)  # plain GET: the hot path uses begin_step
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
                            await self._recover()  # the whole data set is gone: restore our share
                        else:
                            await self.primary.put_newer(mine)
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

    async def add_signal(self, run_id: str, kind: str, limit: int) -> int:
        """On Redis; while degraded, on this router only (not resynced: a signal posted during an
        outage is seen by the next step this router serves)."""
        if not self._degraded:
            try:
                return await self.primary.add_signal(run_id, kind, limit)
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        return await self.local.add_signal(run_id, kind, limit)

    async def signals(self, run_id: str) -> tuple[str, ...]:
        if not self._degraded:
            try:
                return await self.primary.signals(run_id)
            except StoreUnavailable as e:
                self._enter_degraded(e)
        self._local()
        return await self.local.signals(run_id)

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except (asyncio.CancelledError, StoreUnavailable):
                pass
        if self._probe_task is not None and not self._probe_task.done():
            self._probe_task.cancel()
            try:
                await self._probe_task
            except (asyncio.CancelledError, StoreUnavailable):
                pass
        await self.primary.close()
        await self.local.close()
