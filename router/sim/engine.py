"""The simulator's discrete-event loop.

Algorithm: a binary heap of ``(time, seq, handler, arg)``; ``seq`` is a global counter, so events at
the same time run in the order they were scheduled and a run is deterministic. ``run()`` pops the
earliest event, sets :attr:`EventLoop.now` and calls ``handler(arg)``. A handler may return new events
as an iterable of ``(time, handler, arg)`` (or ``None``); it may also call :meth:`schedule` directly.
Events are never removed from the heap: components that need to cancel one keep a generation counter
and ignore stale events (cheaper than heap deletion).

Knobs: ``start`` (the injected clock's origin, seconds), ``seed`` (one ``random.Random`` shared by the
components that draw randomness, so a seed fixes the whole run), ``until`` in :meth:`run`.
:meth:`stop` ends ``run()`` after the current event (the simulator stops when its last run ends, so
background events such as idle reapers do not stretch the horizon). Constructing a loop is cheap; it keeps no global state and registers nothing at exit.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["EventLoop", "Handler"]

Handler = Callable[[Any], "Iterable[tuple[float, Handler, Any]] | None"]


class EventLoop:
    __slots__ = ("now", "rng", "_heap", "_seq", "events_run", "_stop", "_batches")

    def __init__(self, start: float = 0.0, seed: int = 0):
        self.now = float(start)
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._seq = 0
        self.events_run = 0
        self._stop = False
        self._batches: list[list[tuple[float, int, Handler, Any]]] = []  # schedule_many's waiting events

    def stop(self) -> None:
        """End :meth:`run` after the current event (pending events stay in the heap)."""
        self._stop = True

    def schedule(self, t: float, handler: Handler, arg: object = None) -> None:
        """Run ``handler(arg)`` at time ``t`` (never before :attr:`now`)."""
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, handler, arg))

    def schedule_many(self, items: Iterable[tuple[float, Handler, Any]]) -> None:
        """:meth:`schedule` each ``(t, handler, arg)`` of ``items``, in their order (the same
        sequence numbers, so the same event order), but keep them out of the heap until they are
        next: only the earliest of them waits in the heap at any time (the simulator's run starts,
        thousands of events known up front, no longer deepen every push and pop of the loop)."""
        now = self.now
        pending: list[tuple[float, int, Handler, Any]] = []
        for t, handler, arg in items:
            self._seq += 1
            pending.append((t if t >= now else now, self._seq, handler, arg))
        if not pending:
            return
        pending.sort(reverse=True)  # (time, seq): seq is unique, handlers are never compared
        self._batches.append(pending)
        t, seq, handler, arg = pending.pop()
        heapq.heappush(self._heap, (t, seq, self._next_of, (pending, handler, arg)))

    def _next_of(self, arg: tuple[list[tuple[float, int, Handler, Any]], Handler, Any]) -> Any:
        """Run one event of :meth:`schedule_many` after putting the next one of its batch in the heap."""
        pending, handler, real = arg
        if pending:
            t, seq, h, a = pending.pop()
            heapq.heappush(self._heap, (t, seq, self._next_of, (pending, h, a)))
        return handler(real)

    def quiet_after(self, t: float) -> bool:
        """No event is pending at or before ``t`` (a handler at ``t`` is the instant's last)."""
        heap = self._heap
        return not heap or heap[0][0] > t

    def __len__(self) -> int:
        return len(self._heap) + sum(len(b) for b in self._batches)

    def run(self, until: float | None = None) -> float:
        """Process events in (time, seq) order until the heap is empty or ``until``; returns :attr:`now`."""
        heap, pop, push = self._heap, heapq.heappop, heapq.heappush
        n = 0
        self._stop = False
        while heap and not self._stop:
            if until is not None and heap[0][0] > until:
                self.now = until
                break
            t, _, handler, arg = pop(heap)
            self.now = t
            n += 1
            out = handler(arg)
            if out:
                for te, he, ae in out:
                    self._seq += 1
                    push(heap, (te if te >= t else t, self._seq, he, ae))
        self.events_run += n
        return self.now
