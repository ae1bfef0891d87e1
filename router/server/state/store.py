"""Run-state store: where run pins and admission counters live.

Interface (all async, so the Redis implementation never blocks the event loop):
- ``get(run_id) -> RunState | None``; ``put(state)``; ``delete(run_id)``;
- ``begin_step(run_id, floor) -> (RunState | None, step)``: the run's pin and its next step index,
  allocated atomically: ``max(the store's counter, floor, pin.steps_seen)``, and the counter moves
  past it, so two steps of one run never get one index, whichever router numbers them;
- ``unstep(run_id, step)``: give back the index ``begin_step`` just handed out (a rejected new run:
  its retry is again step 0) unless a later one was handed out meanwhile;
- ``claim(state) -> RunState | None``: set-if-absent for a new run's first pin: None when ``state``
  was stored, else the pin another router stored first (the caller adopts it);
- ``try_admit(key, limit, ttl_s) -> bool``: atomically count one more active admitted run under
  ``key`` unless that would exceed ``limit``; ``release(key)`` gives one back.
- ``active(key) -> int``.
- ``add_signal(run_id, kind, limit) -> int``: append a signal kind to the run's list (at most
  ``limit``: -1 when full, else the list's length); ``signals(run_id) -> tuple[str, ...]``: the
  run's signals, oldest first (``POST /v1/runs/{id}/signal``; the next step's features see them).
  They expire with the run (``ttl_s`` after the last signal or step).

``InProcessStore.states()`` (not part of the protocol) lists every live run state; the Redis
fallback uses it to give pins back to a Redis that lost its data.

``InProcessStore`` is the embedded default (one router process). The Redis store (several router
replicas) lives in ``router.server.state.redis_store`` and implements the same interface.
Idle runs expire after ``ttl_s`` seconds without a ``put``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import fields
from operator import attrgetter
from typing import Protocol

from router.policy.types import RunState

__all__ = ["RunStateStore", "InProcessStore"]


class RunStateStore(Protocol):
    async def get(self, run_id: str) -> RunState | None: ...
    async def put(self, state: RunState) -> None: ...
    async def delete(self, run_id: str) -> None: ...
    async def begin_step(self, run_id: str, floor: int) -> tuple[RunState | None, int]: ...
    async def unstep(self, run_id: str, step: int) -> bool: ...
    async def claim(self, state: RunState) -> RunState | None: ...
    async def try_admit(self, key: str, limit: int) -> bool: ...
    async def release(self, key: str) -> None: ...
    async def active(self, key: str) -> int: ...
    async def add_signal(self, run_id: str, kind: str, limit: int) -> int: ...
    async def signals(self, run_id: str) -> tuple[str, ...]: ...
    async def close(self) -> None: ...


_RUN_FIELDS = attrgetter(*(f.name for f in fields(RunState)))
assert all(f.init for f in fields(RunState)), "copy_run passes every field to RunState()"


def copy_run(state: RunState) -> RunState:
    """A copy of ``state`` (what ``dataclasses.replace(state)`` gives: every field through
    ``__init__``), with the fields read in one C call: the store copies a pin twice per step."""
    return RunState(*_RUN_FIELDS(state))


class InProcessStore:
    """Dict-backed store with TTL expiry of idle runs (checked lazily, oldest first)."""

    def __init__(self, ttl_s: float = 3600.0, clock=time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._runs: OrderedDict[str, tuple[float, RunState]] = OrderedDict()
        self._counters: dict[str, int] = {}
        self._steps: OrderedDict[str, tuple[float, int]] = OrderedDict()  # run -> (touched, next index)
        self._signals: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()  # run -> (touched, kinds)
        self._oldest = float("-inf")  # _expire: no entry was touched before this

    def _expire(self) -> None:
        """Drop the runs idle for ``ttl_s``. Each dict is ordered by its entries' last touch (an
        entry is re-inserted at the end with the clock's time), so only a head can be due, and no
        entry is older than the oldest head seen at the last walk (``_oldest``; an entry added
        since has a later time): until that one is due, nothing is walked (this runs 3-4 times
        per step)."""
        now = self._clock()
        if now - self._oldest < self.ttl_s:
            return
        oldest = now
        for d in (self._runs, self._steps, self._signals):
            while d:
                rid, (t, _) = next(iter(d.items()))
                if now - t < self.ttl_s:
                    oldest = min(oldest, t)
                    break
                d.pop(rid)
        self._oldest = oldest

    def next_index(self, run_id: str) -> int:
        """The run's step counter (the next index it would hand out; 0 when unknown)."""
        hit = self._steps.get(run_id)
        return hit[1] if hit else 0

    def advance(self, run_id: str, next_index: int) -> None:
        """Move the run's step counter to at least ``next_index`` (never back)."""
        n = max(next_index, self.next_index(run_id))
        self._steps.pop(run_id, None)
        self._steps[run_id] = (self._clock(), n)

    def counters(self) -> dict[str, int]:
        """Every live step counter (run -> next index)."""
        self._expire()
        return {rid: n for rid, (_, n) in self._steps.items()}

    async def begin_step(self, run_id: str, floor: int) -> tuple[RunState | None, int]:
        pin = await self.get(run_id)
        step = max(floor, self.next_index(run_id), pin.steps_seen if pin is not None else 0)
        self.advance(run_id, step + 1)
        return pin, step

    async def unstep(self, run_id: str, step: int) -> bool:
        if self.next_index(run_id) != step + 1:
            return False
        t, _ = self._steps.pop(run_id)
        if step:
            self._steps[run_id] = (t, step)
        return True

    async def claim(self, state: RunState) -> RunState | None:
        hit = await self.get(state.run_id)
        if hit is not None:
            return hit
        await self.put(state)
        return None

    async def get(self, run_id: str) -> RunState | None:
        self._expire()
        hit = self._runs.get(run_id)
        return copy_run(hit[1]) if hit else None

    async def put(self, state: RunState) -> None:
        self._runs.pop(state.run_id, None)
        self._runs[state.run_id] = (self._clock(), copy_run(state))
        self._expire()

    async def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    async def try_admit(self, key: str, limit: int) -> bool:
        n = self._counters.get(key, 0)
        if n >= limit:
            return False
        self._counters[key] = n + 1
        return True

    async def release(self, key: str) -> None:
        self._counters[key] = max(0, self._counters.get(key, 0) - 1)

    async def active(self, key: str) -> int:
        return self._counters.get(key, 0)

    async def add_signal(self, run_id: str, kind: str, limit: int) -> int:
        self._expire()
        hit = self._signals.pop(run_id, None)
        kinds = hit[1] if hit else []
        n = -1
        if len(kinds) < limit:
            kinds.append(kind)
            n = len(kinds)
        self._signals[run_id] = (self._clock(), kinds)
        return n

    async def signals(self, run_id: str) -> tuple[str, ...]:
        self._expire()
        hit = self._signals.get(run_id)
        if hit is None:
            return ()
        self._signals.move_to_end(run_id)
        self._signals[run_id] = (self._clock(), hit[1])  # a step keeps them alive like the pin
        return tuple(hit[1])

    async def states(self) -> list[RunState]:
        """Every run state not yet expired, oldest activity first (copies)."""
        self._expire()
        return [copy_run(st) for _, st in self._runs.values()]

    async def close(self) -> None:
        return None
