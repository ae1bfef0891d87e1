"""The serving process's event loop: a stall monitor and the garbage collector's tuning.

Stall monitor (:class:`StallMonitor`, off by default):

1. On the event loop a heartbeat callback runs every ``beat_ms`` (``loop.call_later``). Each time it
   runs it measures the *lateness* of its own scheduling: (now - previous beat) - ``beat_ms``. A
   callback can only run between loop iterations, so the lateness is the longest stretch in which
   the loop's thread did not come back to the loop: one callback (a step's synchronous work, a
   JSON encode) or the GIL held by another thread.
2. A watchdog thread wakes every ``check_ms``; when the last beat is older than ``beat_ms +
   threshold_ms`` the loop is stalled *now*, and it samples the loop thread's Python stack
   (``sys._current_frames``, innermost ``depth`` frames) for that stall: the stack that ran. It keeps
   the first sample of a stall and counts the samples (a stall seen by 5 samples lasted about
   5 x ``check_ms``). A stall the watchdog never caught (shorter than ``check_ms``) has no stack.
3. When the heartbeat next runs and its lateness is at least ``threshold_ms`` it records the stall:
   its length, the wall time it ended, its stack, and the CPU time the loop's thread used meanwhile
   (``time.thread_time``) beside the CPU of the process's other threads (``time.process_time``
   minus it): a stall the loop thread spent on the CPU is its own work; one where it used little
   while other threads used much is the GIL held elsewhere; one where neither ran is the OS giving
   the core to other processes. The longest ``top`` stalls are kept (a min-heap);
   per stack *site* (the innermost frame inside this project, else the innermost frame) a count and
   the total milliseconds, so the shares of the sources add up. Lateness below the threshold feeds a
   small histogram (``lag_ms`` buckets) so p50/p99 of the loop's lag are there too.
4. :meth:`StallMonitor.report` is the snapshot; with ``stall_path`` it is written as JSON when the
   sidecar stops (the bench reads it) and every ``stall_write_s`` seconds.

Cost when on: one loop callback per ``beat_ms`` (default 5 ms: 200 a second, ~2 us each) and one
thread wake-up per ``check_ms`` (default 10 ms) that reads two floats; the stack is only formatted
during a stall. Off: nothing runs.

Garbage collector (:func:`tune_gc`): after start-up the live objects (bundle, settings, modules) are
moved out of the collector's generations (``gc.freeze()``; ``gc_freeze``), so a full collection under
load does not walk them, and the generation-0 threshold can be raised (``gc_threshold0``; Python's
default 700 collects every 700 net allocations of containers, which a 200 KB JSON body passes many
times over) so that young collections run less often.

Survivors refrozen (:class:`Refreezer`, ``gc_refreeze``): the state that grows under load (the parse
cache's kept messages, the runs' histories, the Responses store: hundreds of thousands of containers
with 1,000 live runs) is created after start-up, so the start-up freeze does not cover it and every
automatic full collection walked all of it: one 200-600 ms pause of the loop each time the heap had
grown by a quarter (``bench/hotpath_profile.py --runs 1000``: the longest pause of each generation).
Instead, right after each full collection (the collector's ``stop`` callback for generation 2, when
every tracked object has just been examined, so no unreachable cycle is left to freeze) the
survivors are frozen too: the next full collection walks only what survived since, and the pause
stays proportional to the recent growth, not to the heap. Frozen objects are still freed by
reference counting (an evicted cache entry, an ended run's history); only a reference *cycle* among
them that becomes garbage after its freeze waits for the periodic full collection: every
``gc_full_s`` seconds (a background task) everything is unfrozen, collected once and frozen again,
so such garbage lives at most that long (one long pause per period instead of one per 25% growth).

Collection in steps (``gc_step_s``): Python starts a full collection only once the survivors since
the last one outnumber a quarter of that one's survivors, so while the heap grows (runs getting
longer, caches filling) each automatic full collection still walked seconds of growth at once: a
40-70 ms pause with 1,000 live runs, the stall monitor's largest site. Every ``gc_step_s`` seconds
(a background task, the same as the periodic full collection's) the sidecar instead collects what
is not frozen (``gc.collect()`` without unfreezing) and the callback freezes its survivors: each
step walks only what survived since the previous one, so the pause is bounded by the growth of
``gc_step_s`` seconds, and Python's own full collections find little left to walk. Measured in
docs/performance.md ("Collection in steps").

Knobs (``runtime.*`` in the sidecar's settings): ``stall_monitor`` (bool, False), ``stall_threshold_ms``
(20), ``stall_beat_ms`` (5), ``stall_check_ms`` (10), ``stall_top`` (20), ``stall_depth`` (12 frames),
``stall_path`` (JSON file, None; ``{pid}`` in it becomes the process id: one file per
``serve --workers`` process), ``stall_write_s`` (30; 0 = only at stop), ``gc_freeze`` (True),
``gc_threshold0`` (None = Python's default), ``gc_threshold1`` / ``gc_threshold2`` (None = default),
``gc_refreeze`` (True), ``gc_full_s`` (600; 0 = never: cyclic garbage among refrozen objects is
then kept until the process ends), ``gc_step_s`` (0.5; 0 = leave full collections to Python; needs
``gc_refreeze``).
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Refreezer", "RuntimeSettings", "StallMonitor", "refreezer", "tune_gc", "untune_gc"]

log = logging.getLogger("runroute.loopwatch")

_PROJECT = ("runroute", "router", "features", "models", "training")
LAG_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class RuntimeSettings(BaseModel):
    """``runtime``: the serving process's loop and collector (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    stall_monitor: bool = False
    stall_threshold_ms: float = Field(default=20.0, gt=0)
    stall_beat_ms: float = Field(default=5.0, gt=0)
    stall_check_ms: float = Field(default=10.0, gt=0)
    stall_top: int = Field(default=20, ge=1)
    stall_depth: int = Field(default=12, ge=1, le=100)
    stall_path: Path | None = None
    stall_write_s: float = Field(default=30.0, ge=0)
    gc_freeze: bool = True
    gc_threshold0: int | None = Field(default=None, ge=1)
    gc_threshold1: int | None = Field(default=None, ge=1)
    gc_threshold2: int | None = Field(default=None, ge=1)
    gc_refreeze: bool = True
    gc_full_s: float = Field(default=600.0, ge=0)
    gc_step_s: float = Field(default=0.5, ge=0)


class Refreezer:
    """Freeze the survivors of every full collection; a full collection of everything every
    ``full_s`` and of what is not frozen every ``step_s`` (module docstring). One per process (:func:`refreezer`): apps of one process share it
    (``start`` / ``stop`` count them); the callback is in ``gc.callbacks`` while any is started."""

    def __init__(self) -> None:
        self.users = 0
        self.refreezes = 0  # full collections whose survivors were frozen
        self.full_runs = 0  # periodic full collections of everything
        self.steps = 0  # periodic full collections of what is not frozen (``step_s``)
        self._task: asyncio.Task[None] | None = None

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            t = self._task
            if t is not None and t.get_loop().is_closed():  # its app's loop ended without a stop
                self.users = 1
                self.stop()
                return
            gc.freeze()
            self.refreezes += 1

    def start(self, full_s: float, step_s: float = 0.0) -> None:
        """Install the callback; with ``full_s`` > 0 (the periodic collection of everything) or
        ``step_s`` > 0 (the periodic collection of what is not frozen) their task on the running loop."""
        self.users += 1
        if self._cb not in gc.callbacks:
            gc.callbacks.append(self._cb)
        t = self._task
        if t is not None and (t.done() or t.get_loop().is_closed()):
            t = self._task = None
        if (full_s > 0 or step_s > 0) and t is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no running loop (a script, a test): no periodic collection
                return
            self._task = loop.create_task(self._periodic(full_s, step_s))

    def stop(self) -> None:
        """One user fewer; the last removes the callback and the periodic task."""
        self.users = max(0, self.users - 1)
        if self.users:
            return
        if self._cb in gc.callbacks:
            gc.callbacks.remove(self._cb)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def full(self) -> None:
        """Unfreeze everything and collect it once; the callback freezes the survivors again."""
        gc.unfreeze()
        gc.collect()
        self.full_runs += 1

    def step(self) -> None:
        """Collect what is not frozen (the survivors since the last freeze and the young
        generations); the callback freezes the survivors. A pause proportional to what survived
        since the last one, not to the heap."""
        gc.collect()
        self.steps += 1

    async def _periodic(self, full_s: float, step_s: float) -> None:
        loop = asyncio.get_running_loop()
        next_full = loop.time() + full_s if full_s > 0 else math.inf
        while True:
            now = loop.time()
            next_step = now + step_s if step_s > 0 else math.inf
            await asyncio.sleep(max(0.0, min(next_full, next_step) - now))
            if loop.time() >= next_full:
                self.full()
                next_full = loop.time() + full_s
            else:
                self.step()


_REFREEZER = Refreezer()


def refreezer() -> Refreezer:
    """The process's :class:`Refreezer`."""
    return _REFREEZER


def tune_gc(cfg: RuntimeSettings) -> dict[str, Any]:
    """Apply the collector knobs (call once start-up is done); returns what was set."""
    t = list(gc.get_threshold())
    for i, v in enumerate((cfg.gc_threshold0, cfg.gc_threshold1, cfg.gc_threshold2)):
        if v is not None:
            t[i] = v
    gc.set_threshold(*t)
    frozen = 0
    if cfg.gc_freeze:
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    if cfg.gc_refreeze:  # needs a running loop for the periodic full collection (the lifespan's)
        _REFREEZER.start(cfg.gc_full_s, cfg.gc_step_s)
    return {"threshold": tuple(t), "frozen": frozen, "refreeze": cfg.gc_refreeze}


def untune_gc(cfg: RuntimeSettings) -> None:
    """Undo what :func:`tune_gc` started (the refreeze callback and its task) at shutdown."""
    if cfg.gc_refreeze:
        _REFREEZER.stop()


def _site(stack: list[str]) -> str:
    """The innermost frame of this project's code in ``stack`` below the process's entry (the CLI
    that started the server); else the innermost frame (the loop's own or a library's code: with no
    project frame running, the loop thread was waiting for the GIL or for the CPU)."""
    for line in reversed(stack):
        path = line.split('"', 2)[1] if line.count('"') >= 2 else line
        parts = Path(path).parts
        if "commands" in parts[-2:-1] or parts[-1:] == ("cli.py",):
            break  # the entry: everything inside it is the server's loop
        if any(p in _PROJECT for p in parts[-3:-1]):
            return line.split("\n", 1)[0].strip()
    return stack[-1].split("\n", 1)[0].strip() if stack else "(no sample: shorter than stall_check_ms)"


class StallMonitor:
    """The stall monitor of the module docstring. ``start()`` on the running loop, ``stop()`` on it."""

    def __init__(self, cfg: RuntimeSettings):
        self.cfg = cfg
        self.beat_s = cfg.stall_beat_ms / 1000.0
        self.threshold_s = cfg.stall_threshold_ms / 1000.0
        self._last = 0.0  # perf_counter of the last beat (written by the loop thread)
        self._sample: tuple[float, list[str], int] | None = None  # (beat it belongs to, stack, samples)
        self._top: list[tuple[float, int, dict[str, Any]]] = []  # min-heap on the stall's length
        self._seq = 0
        self.sites: dict[str, list[float]] = {}  # site -> [count, total ms]
        self.lag_counts = [0] * (len(LAG_BUCKETS_MS) + 1)
        self.beats = 0
        self.stalls = 0
        self.stalled_ms = 0.0
        self.loop_cpu_ms = 0.0  # CPU the loop's thread used during the stalls
        self.other_cpu_ms = 0.0  # CPU the process's other threads used during the stalls
        self._cpu = self._pcpu = 0.0
        self.started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._tid = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_write = 0.0

    # ------------------------------------------------------------------ loop side
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tid = threading.get_ident()
        self.started_at = time.time()
        self._last = time.perf_counter()
        self._cpu, self._pcpu = time.thread_time(), time.process_time()
        self._last_write = self._last
        self._handle = self._loop.call_later(self.beat_s, self._beat)
        self._thread = threading.Thread(target=self._watch, name="runroute-stallwatch", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        now = time.perf_counter()
        cpu, pcpu = time.thread_time(), time.process_time()
        late = now - self._last - self.beat_s
        prev = self._last
        self._last = now
        d_cpu, d_pcpu = cpu - self._cpu, pcpu - self._pcpu
        self._cpu, self._pcpu = cpu, pcpu
        self.beats += 1
        ms = max(0.0, late) * 1000.0
        k = 0
        while k < len(LAG_BUCKETS_MS) and ms > LAG_BUCKETS_MS[k]:
            k += 1
        self.lag_counts[k] += 1
        if late >= self.threshold_s:
            sample = self._sample
            stack, n = (sample[1], sample[2]) if sample is not None and sample[0] == prev else ([], 0)
            self._record(ms, stack, n, d_cpu * 1000.0, max(0.0, d_pcpu - d_cpu) * 1000.0)
        if self._loop is not None:
            self._handle = self._loop.call_later(self.beat_s, self._beat)
        if self.cfg.stall_path is not None and self.cfg.stall_write_s > 0:
            if now - self._last_write >= self.cfg.stall_write_s:
                self._last_write = now
                self.write()

    def _record(
        self, ms: float, stack: list[str], samples: int, loop_cpu_ms: float = 0.0, other_cpu_ms: float = 0.0
    ) -> None:
        self.stalls += 1
        self.stalled_ms += ms
        self.loop_cpu_ms += loop_cpu_ms
        self.other_cpu_ms += other_cpu_ms
        site = _site(stack)
        s = self.sites.setdefault(site, [0, 0.0])
        s[0] += 1
        s[1] += ms
        self._seq += 1
        item = {"ms": round(ms, 2), "ended_at": round(time.time(), 3), "samples": samples, "site": site}
        item["loop_cpu_ms"], item["other_threads_cpu_ms"] = round(loop_cpu_ms, 2), round(other_cpu_ms, 2)
        item["stack"] = stack
        if len(self._top) < self.cfg.stall_top:
            heapq.heappush(self._top, (ms, self._seq, item))
        elif ms > self._top[0][0]:
            heapq.heapreplace(self._top, (ms, self._seq, item))

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None
        if self.cfg.stall_path is not None:
            self.write()

    # ------------------------------------------------------------------ watchdog thread
    def _watch(self) -> None:
        check = self.cfg.stall_check_ms / 1000.0
        limit = self.beat_s + self.threshold_s
        depth = self.cfg.stall_depth
        while not self._stop.wait(check):
            last = self._last
            if time.perf_counter() - last < limit:
                continue
            cur = self._sample
            if cur is not None and cur[0] == last:
                self._sample = (last, cur[1], cur[2] + 1)
                continue
            frame = sys._current_frames().get(self._tid)
            stack = traceback.format_stack(frame, limit=depth) if frame is not None else []
            del frame
            self._sample = (last, [s.rstrip() for s in stack], 1)

    # ------------------------------------------------------------------ output
    def report(self) -> dict[str, Any]:
        """Totals, the lag histogram, the top stalls (longest first) and the per-site shares."""
        top = [it for _, _, it in sorted(self._top, key=lambda t: -t[0])]
        total = self.stalled_ms or 1.0
        sites = sorted(self.sites.items(), key=lambda kv: -kv[1][1])
        return {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "seconds": round(time.time() - self.started_at, 1) if self.started_at else 0.0,
            "threshold_ms": self.cfg.stall_threshold_ms,
            "beat_ms": self.cfg.stall_beat_ms,
            "beats": self.beats,
            "stalls": self.stalls,
            "stalled_ms": round(self.stalled_ms, 1),
            "stalled_loop_cpu_ms": round(self.loop_cpu_ms, 1),
            "stalled_other_threads_cpu_ms": round(self.other_cpu_ms, 1),
            "lag_ms_buckets": [*LAG_BUCKETS_MS, "inf"],
            "lag_counts": list(self.lag_counts),
            "lag_p50_ms": self.lag_quantile(0.5),
            "lag_p99_ms": self.lag_quantile(0.99),
            "sites": [
                {"site": k, "count": int(v[0]), "ms": round(v[1], 1), "share": round(v[1] / total, 3)}
                for k, v in sites
            ],
            "top": top,
        }

    def lag_quantile(self, q: float) -> float | None:
        """Upper bucket bound (ms) under which a share ``q`` of the beats' lateness fell."""
        n = sum(self.lag_counts)
        if n == 0:
            return None
        acc = 0
        for k, c in enumerate(self.lag_counts):
            acc += c
            if acc >= q * n:
                return float(LAG_BUCKETS_MS[k]) if k < len(LAG_BUCKETS_MS) else float("inf")
        return float("inf")

    def write(self) -> None:
        """Write :meth:`report` to ``stall_path`` (atomically: a temp file, then a rename)."""
        if self.cfg.stall_path is None:
            return
        path = Path(str(self.cfg.stall_path).replace("{pid}", str(os.getpid())))  # one file per worker
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.report(), indent=1, default=str))
            tmp.replace(path)
        except OSError as e:  # a full disk must not stop the sidecar
            log.warning("stall monitor: could not write %s: %s", path, e)
