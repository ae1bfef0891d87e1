"""Run-state store: where run pins and admission counters live.

Interface (all async, so the Redis implementation never blocks the event loop):
- ``get(run_id) -> RunState | None``; ``put(state)``; ``delete(run_id)``;
- ``try_admit(key, limit, ttl_s) -> bool``: atomically count one more active admitted run under
  ``key`` unless that would exceed ``limit``; ``release(key)`` gives one back.
- ``active(key) -> int``.

``InProcessStore.states()`` (not part of the protocol) lists every live run state; the Redis
fallback uses it to give pins back to a Redis that lost its data.

``InProcessStore`` is the embedded default (one router process). The Redis store (several router
replicas) lives in ``router.server.state_redis`` and implements the same interface.
Idle runs expire after ``ttl_s`` seconds without a ``put``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import replace
from typing import Protocol

from router.policy.types import RunState

__all__ = ["RunStateStore", "InProcessStore"]


class RunStateStore(Protocol):
    async def get(self, run_id: str) -> RunState | None: ...
    async def put(self, state: RunState) -> None: ...
    async def delete(self, run_id: str) -> None: ...
    async def try_admit(self, key: str, limit: int) -> bool: ...
    async def release(self, key: str) -> None: ...
    async def active(self, key: str) -> int: ...
    async def close(self) -> None: ...


class InProcessStore:
    """Dict-backed store with TTL expiry of idle runs (checked lazily, oldest first)."""

    def __init__(self, ttl_s: float = 3600.0, clock=time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._runs: OrderedDict[str, tuple[float, RunState]] = OrderedDict()
        self._counters: dict[str, int] = {}

    def _expire(self) -> None:
        now = self._clock()
        while self._runs:
            rid, (t, _) = next(iter(self._runs.items()))
            if now - t < self.ttl_s:
                break
            self._runs.pop(rid)

    async def get(self, run_id: str) -> RunState | None:
        self._expire()
        hit = self._runs.get(run_id)
        return replace(hit[1]) if hit else None

    async def put(self, state: RunState) -> None:
        self._runs.pop(state.run_id, None)
        self._runs[state.run_id] = (self._clock(), replace(state))
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

    async def states(self) -> list[RunState]:
        """Every run state not yet expired, oldest activity first (copies)."""
        self._expire()
        return [replace(st) for _, st in self._runs.values()]

    async def close(self) -> None:
        return None
