"""The event-loop stall monitor (router/server/loopwatch.py) and the collector knobs."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import pytest

from router.server.loopwatch import RuntimeSettings, StallMonitor, refreezer, tune_gc, untune_gc


def _blocking_step_work(seconds: float) -> None:
    time.sleep(seconds)  # stands in for synchronous work on the loop (it holds the loop's thread)


async def _serve_with_a_stall(mon: StallMonitor, seconds: float) -> None:
    mon.start()
    await asyncio.sleep(0.05)
    _blocking_step_work(seconds)
    await asyncio.sleep(0.05)
    mon.stop()


def test_a_blocking_callback_is_caught_with_its_stack(tmp_path: Path) -> None:
    path = tmp_path / "stalls.json"
    cfg = RuntimeSettings(stall_monitor=True, stall_threshold_ms=30, stall_check_ms=5, stall_path=path)
    mon = StallMonitor(cfg)
    asyncio.run(_serve_with_a_stall(mon, 0.15))
    rep = json.loads(path.read_text())  # written at stop
    assert rep["stalls"] >= 1
    top = rep["top"][0]
    assert 140 <= top["ms"] < 1000
    assert top["samples"] >= 2  # the watchdog saw it while it lasted
    assert any("_blocking_step_work" in line for line in top["stack"])
    assert "_blocking_step_work" in top["site"] or "time.sleep" in top["site"]
    assert rep["sites"][0]["ms"] >= 140 and rep["sites"][0]["share"] > 0.5
    assert rep["beats"] > 5
    assert top["loop_cpu_ms"] < 50  # a sleeping loop thread used no CPU: it was waiting


def _spin_cpu(seconds: float) -> None:
    t = time.thread_time()
    while time.thread_time() - t < seconds:  # CPU time, not wall time: the same on a loaded machine
        pass


def test_a_busy_stall_shows_the_loop_threads_cpu() -> None:
    mon = StallMonitor(RuntimeSettings(stall_monitor=True, stall_threshold_ms=30, stall_check_ms=5))

    async def busy() -> None:
        mon.start()
        await asyncio.sleep(0.05)
        _spin_cpu(0.1)
        await asyncio.sleep(0.05)
        mon.stop()

    asyncio.run(busy())
    top = mon.report()["top"][0]
    assert top["loop_cpu_ms"] >= 95 and top["ms"] >= top["loop_cpu_ms"] - 5
    assert mon.report()["stalled_loop_cpu_ms"] >= 95


def test_an_idle_loop_records_no_stall() -> None:
    mon = StallMonitor(RuntimeSettings(stall_monitor=True, stall_threshold_ms=50))

    async def idle() -> None:
        mon.start()
        await asyncio.sleep(0.2)
        mon.stop()

    asyncio.run(idle())
    rep = mon.report()
    assert rep["stalls"] == 0 and rep["top"] == []
    assert rep["beats"] >= 10 and rep["lag_p50_ms"] is not None and rep["lag_p50_ms"] < 50


def test_top_keeps_the_longest(tmp_path: Path) -> None:
    mon = StallMonitor(RuntimeSettings(stall_monitor=True, stall_top=2))
    for ms in (25.0, 80.0, 40.0, 200.0, 30.0):
        mon._record(ms, [], 0)
    assert [t["ms"] for t in mon.report()["top"]] == [200.0, 80.0]
    assert mon.report()["stalls"] == 5


def test_tune_gc_sets_threshold_and_freezes() -> None:
    before = gc.get_threshold()
    try:
        cfg = RuntimeSettings(gc_threshold0=5000)
        got = tune_gc(cfg)
        assert gc.get_threshold()[0] == 5000 and got["frozen"] > 0
    finally:
        untune_gc(cfg)
        gc.unfreeze()
        gc.set_threshold(*before)


async def _more_steps(n: int) -> None:
    """Until the process's Refreezer has run ``n`` more collection steps (5 s at most)."""
    r = refreezer()
    target = r.steps + n
    for _ in range(1000):
        if r.steps >= target:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{r.steps} steps, {target} expected")


def test_tune_gc_starts_the_collection_steps_on_the_running_loop() -> None:
    """``tune_gc`` inside the app's loop starts the periodic steps at ``gc_step_s``; ``untune_gc``
    ends them."""
    r = refreezer()
    before = gc.get_threshold()
    cfg = RuntimeSettings(gc_step_s=0.01, gc_full_s=0)

    async def main() -> None:
        tune_gc(cfg)
        try:
            assert r._task is not None
            await _more_steps(2)
        finally:
            untune_gc(cfg)
        assert r._task is None

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.other: object = None


def test_refreeze_freezes_full_collection_survivors_and_the_periodic_full_collects_frozen_cycles() -> None:
    """Survivors of a full collection are frozen (the next one does not walk them); an acyclic
    frozen object is still freed by reference counting; a cycle that became garbage after its
    freeze is collected by the periodic full collection (``Refreezer.full``)."""
    import weakref

    r = refreezer()

    async def main() -> None:
        acyclic, cyc_a, cyc_b = _Node(), _Node(), _Node()
        cyc_a.other, cyc_b.other = cyc_b, cyc_a
        w_acyclic, w_cycle = weakref.ref(acyclic), weakref.ref(cyc_a)
        r.start(3600)
        try:
            assert r._cb in gc.callbacks
            gc.unfreeze()
            before = r.refreezes
            gc.collect()  # a full collection: its survivors (our three nodes among them) are frozen
            assert r.refreezes == before + 1 and gc.get_freeze_count() > 0
            assert gc.get_count()[0] < 100  # the young generation was emptied into the frozen set
            del acyclic
            assert w_acyclic() is None  # reference counting still frees a frozen object
            del cyc_a, cyc_b
            gc.collect()  # walks only what survived since: the frozen cycle stays
            assert w_cycle() is not None
            r.full()  # everything unfrozen, collected once, survivors frozen again
            assert w_cycle() is None and gc.get_freeze_count() > 0
        finally:
            r.stop()
            gc.unfreeze()
        assert r._cb not in gc.callbacks and r._task is None

    asyncio.run(main())


def test_gc_steps_collect_what_is_not_frozen_on_their_period_and_freeze_the_survivors() -> None:
    """``gc_step_s``: the periodic step collects the unfrozen heap (garbage found, survivors frozen,
    so the next step does not walk them) and never unfreezes (a cycle frozen before it became
    garbage waits for the periodic full collection); ``step_s`` = 0 and ``full_s`` = 0 start no task."""
    import weakref

    r = refreezer()

    def tracked(obj: object) -> bool:  # in a collector generation (not frozen)
        return any(o is obj for o in gc.get_objects())

    async def main() -> None:
        r.start(0, 0)
        try:
            assert r._task is None and r._cb in gc.callbacks
        finally:
            r.stop()
        gc.unfreeze()
        garbage_a, garbage_b = _Node(), _Node()
        garbage_a.other, garbage_b.other = garbage_b, garbage_a
        w_garbage = weakref.ref(garbage_a)
        del garbage_a, garbage_b  # an unreachable cycle, not frozen: the first step collects it
        kept = _Node()
        full_runs = r.full_runs
        r.start(3600, 0.01)
        try:
            assert r._task is not None
            await _more_steps(1)
            assert w_garbage() is None  # collected by the step
            assert not tracked(kept)  # survived it: frozen, out of the next steps' walk
            cyc_a, cyc_b = _Node(), _Node()
            cyc_a.other, cyc_b.other = cyc_b, cyc_a
            w_cycle = weakref.ref(cyc_a)
            await _more_steps(1)
            assert not tracked(cyc_a)  # frozen while alive
            del cyc_a, cyc_b
            await _more_steps(2)
            assert w_cycle() is not None  # steps never unfreeze: it waits for the full collection
            assert r.full_runs == full_runs
            r.full()
            assert w_cycle() is None
        finally:
            r.stop()
            gc.unfreeze()
        assert r._task is None

    asyncio.run(main())


def test_runtime_settings_step_default_and_bounds() -> None:
    assert RuntimeSettings().gc_step_s == 0.5
    assert RuntimeSettings(gc_step_s=0).gc_step_s == 0
    with pytest.raises(ValueError):
        RuntimeSettings(gc_step_s=-1)


def test_refreeze_ends_with_a_loop_that_closed_without_a_stop() -> None:
    """An app whose loop ended without its shutdown leaves no refreezing behind: the next full
    collection removes the callback (nothing would run the periodic full collection any more)."""
    r = refreezer()

    async def main() -> None:
        r.start(3600)

    asyncio.run(main())  # the loop closes with the periodic task pending, no stop
    try:
        assert r._cb in gc.callbacks
        frozen = gc.get_freeze_count()
        gc.collect()
        assert r._cb not in gc.callbacks and r._task is None and r.users == 0
        assert gc.get_freeze_count() == frozen
    finally:
        r.stop()
        gc.unfreeze()


def test_runtime_settings_refuse_bad_values() -> None:
    with pytest.raises(ValueError):
        RuntimeSettings(stall_threshold_ms=0)
    with pytest.raises(ValueError):
        RuntimeSettings(gc_threshold0=0)
