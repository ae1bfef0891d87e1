"""Run tracking: what the step engine remembers about each run between its steps.

A :class:`RunTrack` holds one run's finished steps as :class:`~features.prefix.StepView` (with the
running feature aggregate, grown only through ``RunPrefix.append`` so feature extraction is O(1) per
step), the step counter, the run's last served context size (the router's belief of the prefix
left warm on the backend it last ran on) and the prefix-cache bookkeeping behind
``local_cache_pressure``. The pin itself (tier, replica, switches, admission verdict) is not here:
it is the :class:`~router.policy.types.RunState` the caller keeps in its run-state store, shared by
router replicas.

:class:`RunTracker` bounds memory: at most ``max_runs`` runs (least recently used dropped first) and
at most ``max_steps`` steps per run (a longer run drops its oldest quarter at once, so the running
aggregate is rebuilt once per ``max_steps / 4`` steps: O(1) amortised).

Prefix-cache turnover (``local_cache_pressure``): a :class:`CacheReading` of a local replica is a
monotone counter of tokens newly computed into its prefix cache, the cache's capacity in tokens and
an ``epoch`` that changes when the cache was lost (restart, scale-to-zero). At a step's end the
track remembers the reading of the run's local replica (the last one that served it), advanced by
the step's own computed tokens when the counter lags behind them (a scraped counter does); at the
run's next step the pressure is the counter's growth since then over the capacity, clipped to
[0, 1] (:func:`router.core.prefix_cache.turnover`, the one definition training uses too), and 1
when the epoch changed or the counter went backwards; None (a NaN feature) before
the run was served locally or when the counter is unknown.

Run context (``domain``, ``task_embedding``, ``signals``; contract C2): set by the adapter (the
sidecar resolves the domain and computes the embedding at a run's first step; the simulator and
replay take them from the logged run) and, for signals, grown by the engine from each step's
:attr:`router.core.record.StepRequest.signals`.

Knobs: ``RunTracker(max_runs, max_steps)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from features.prefix import RunPrefix, StepView
from router.core.prefix_cache import turnover

__all__ = ["CacheReading", "RunTrack", "RunTracker"]

T = TypeVar("T", bound="RunTrack")


@dataclass(frozen=True, slots=True)
class CacheReading:
    """One local replica's prefix-cache counter as the adapter sees it now."""

    computed_tokens: float  # tokens newly computed into the cache so far (monotone per epoch)
    capacity_tokens: float | None  # the cache's size in tokens (None: unknown)
    epoch: int = 0  # changes whenever the whole cache was lost
    lags: bool = True  # the counter may not yet include a step that just ended (a scraped counter)


@dataclass(slots=True)
class RunTrack:
    """The engine's memory of one run (see the module docstring)."""

    run_id: str
    started_s: float | None  # None: the run's clock is unknown (a log without timestamps)
    base: RunPrefix  # finished steps + running aggregate; ``new_*`` fields unused
    next_step: int = 0
    last_end_s: float | None = None
    last_tokens: int = 0  # prompt + completion of the last served step
    cache_replica: str | None = None
    cache_mark: float | None = None
    cache_seen: float = 0.0
    cache_epoch: int = 0
    # tool-call keys produced so far and whether the newest call repeats an earlier one (the stall
    # signal of router.policy.snapshot.tool_repeated, kept here in O(calls) per step)
    call_keys: dict[str, int] = field(default_factory=dict)
    newest_call_repeated: bool = False
    # run context (contract C2): the run's domain, its task embedding (once known) and every signal
    # posted on it so far; the engine copies them into each step's RunPrefix
    domain: str | None = None
    task_embedding: Any = None
    signals: tuple[str, ...] = ()
    # the run's text block chain so far (router.core.prefix_index.RunChain; None: none yet)
    prefix_chain: Any = None
    # per local replica, the run's prefix-index match at its last step (a search hint only)
    prefix_hints: dict[str, int] = field(default_factory=dict)

    @classmethod
    def new(cls, run_id: str, started_s: float | None) -> RunTrack:
        # no aggregate yet: the first feature extraction builds it (one scan) and later steps fold
        # into it; a run whose features nobody extracts never pays for one
        return cls(run_id, started_s, RunPrefix(run_id=run_id))

    def claim_step(self, store_count: int) -> int:
        """The next step index: the store's count (shared by router replicas) or this process's,
        whichever is ahead; claimed at once so concurrent steps of one run never share an index."""
        step = max(store_count, self.next_step)
        self.next_step = step + 1
        return step

    def cache_pressure(self, reading: CacheReading | None) -> float | None:
        """``local_cache_pressure`` for the run's next step (module docstring)."""
        if self.cache_mark is None or reading is None:
            return None
        cap = reading.capacity_tokens
        if not cap:
            return None
        now = reading.computed_tokens
        if reading.epoch != self.cache_epoch or now < self.cache_seen:
            return 1.0  # the cache was lost (wipe, restart) since the run's previous step
        if now <= self.cache_mark:
            return 0.0  # a lagging counter has not caught up with the run's own last step yet
        if cap > 0:  # turnover(now, self.cache_mark, cap), inline (now > mark: no wipe, no clip at 0)
            d = (now - self.cache_mark) / cap
            return d if d < 1.0 else 1.0
        return turnover(now, self.cache_mark, cap)

    def mark_cache(
        self,
        replica: str | None,
        local: bool,
        reading: CacheReading | None,
        start: CacheReading | None,
        own_tokens: int,
    ) -> None:
        """At a step's end: remember the run's local replica and its counter (module docstring).

        ``replica``/``local``: the backend that served the step; ``start``: that backend's reading
        when the step was sent; ``own_tokens``: the step's own newly computed tokens (prompt -
        cached of a served step, 0 of a failed one)."""
        if local and replica:
            self.cache_replica = replica
        if reading is None:
            self.cache_mark = None
            return
        seen = reading.computed_tokens
        mark = seen
        if (
            start is not None
            and reading.lags
            and self.cache_replica == replica
            and start.epoch == reading.epoch
            and start.computed_tokens <= seen
        ):
            mark = max(mark, start.computed_tokens + max(0, own_tokens))
        self.cache_mark, self.cache_seen, self.cache_epoch = mark, seen, reading.epoch

    def append(self, view: StepView, max_steps: int) -> None:
        """Add a finished step; beyond ``max_steps`` drop the oldest quarter (O(1) amortised)."""
        keys = view.tool_call_keys
        if keys:
            seen = self.call_keys
            newest = keys[-1]
            self.newest_call_repeated = seen.get(newest, 0) > 0 or newest in keys[:-1]
            for k in keys:
                seen[k] = seen.get(k, 0) + 1
        base = self.base
        base.append(view)
        if len(base.steps) > max_steps:
            del base.steps[: max(1, max_steps // 4)]


class RunTracker(Generic[T]):
    """The bounded set of runs an adapter tracks (LRU over runs, bounded history per run).

    ``factory(run_id, now)`` makes a new track (an adapter may subclass :class:`RunTrack`)."""

    def __init__(
        self,
        max_runs: int = 10000,
        max_steps: int = 1000,
        factory: Callable[[str, float], T] = RunTrack.new,  # type: ignore[assignment]
    ):
        if max_runs < 1 or max_steps < 1:
            raise ValueError("max_runs and max_steps must be >= 1")
        self.max_runs = max_runs
        self.max_steps = max_steps
        self.factory = factory
        self.runs: OrderedDict[str, T] = OrderedDict()

    def get(self, run_id: str) -> T | None:
        return self.runs.get(run_id)

    def track(self, run_id: str, now: float) -> tuple[T, bool]:
        """The run's track (created when new); returns ``(track, created)``."""
        t = self.runs.get(run_id)
        if t is not None:
            self.runs.move_to_end(run_id)
            return t, False
        t = self.factory(run_id, now)
        self.runs[run_id] = t
        while len(self.runs) > self.max_runs:
            self.runs.popitem(last=False)
        return t, True

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def __len__(self) -> int:
        return len(self.runs)
