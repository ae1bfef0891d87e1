"""Run lifecycle in the sidecar: which run a request belongs to, and how a run ends.

- :meth:`RunLifecycle.resolve`: the run id of a request (:mod:`router.server.runs.identity`'s rules:
  header, ``metadata.run_id``, the protocol's own id, the opening hash with generations) and the
  request's user (a tenant/user attribute).
- :meth:`RunLifecycle.end`: ends a run for a reason (``client``: ``POST /v1/runs/{id}/end``;
  ``idle``: the sweep): the run-log ``run`` record (outcome, reward, ``end_reason``), the engine's
  ``run_ended`` and :meth:`router.server.hotpath.admission.LiveAdmission.release` (the admission slot goes
  back at once), and an ``ended`` tombstone in the run-state store (kept ``store.ttl_s``, so other
  routers' sweeps know the slot was given back and a later step starts a new run).
- :meth:`RunLifecycle.signal`: ``POST /v1/runs/{id}/signal``: the kind is appended to the run's
  signals in the run-state store (shared by router replicas, so the next step sees it whichever
  router serves it: ``RunPrefix.signals``, the ``sig_*`` features, the step's ``Step.signals``);
  at most :data:`MAX_SIGNALS` per run (then 409 ``signal_limit_reached``). A signal on a run that
  already ended (a verifier that judged the finished run) logs a ``run`` record with the run's
  signals at once; otherwise the ``run`` record written at the run's end carries them (with its
  ``domain`` and ``task_embedding``). The optional ``detail`` is never stored or logged.
- the sweep (every ``identity.sweep_s``; 0 = off): every tracked run with no step in flight whose
  last step ended (or arrived, for a step still streaming) more than ``identity.idle_end_s`` ago
  is ended with reason ``idle``. The clock is
  injected, so tests drive it; :meth:`RunLifecycle.sweep_once` runs one pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from router.policy.types import RunState
from router.server.background import BackgroundTask
from router.server.protocols.base import Adapter, ClientRequest
from router.server.runs.identity import OpeningRuns, clean_id, explicit_id, opening_hash, scoped_id

if TYPE_CHECKING:
    from router.core.engine import StepEngine
    from router.core.runs import RunTracker
    from router.server.hotpath.admission import LiveAdmission
    from router.server.hotpath.proxy import RunHistory
    from router.server.runs.context import RunContext
    from router.server.runs.log_writer import RunLogWriter
    from router.server.settings_tiers import IdentitySettings
    from router.server.state.store import RunStateStore

__all__ = ["RunLifecycle", "MAX_SIGNALS"]

#: signals kept per run (a client cannot grow a run's state without bound)
MAX_SIGNALS = 256

log = logging.getLogger("runroute.lifecycle")


class RunLifecycle(BackgroundTask):
    """See the module docstring. ``tracker``: the proxy's run tracker (RunHistory tracks)."""

    def __init__(
        self,
        *,
        tracker: RunTracker[RunHistory],
        store: RunStateStore,
        engine: StepEngine,
        admission: LiveAdmission | None,
        writer: RunLogWriter | None,
        identity: IdentitySettings,
        clock: Callable[[], float],
        wall: Callable[[], float],
        context: RunContext | None = None,
    ):
        self.tracker, self.store, self.engine, self.admission, self.writer = (
            tracker,
            store,
            engine,
            admission,
            writer,
        )
        self.idle_end_s = identity.idle_end_s
        self.sweep_s = identity.sweep_s
        self.clock, self.wall = clock, wall
        self.context = context  # the task embedder's: a run that ends sends its deferred text now
        self.openings = OpeningRuns(identity.reopen_gap_s)
        self.ended_idle = 0

    # ------------------------------------------------------------------ identity
    @staticmethod
    def _last(h: RunHistory) -> float | None:
        seen = [t for t in (h.last_end_s, h.last_seen_s) if t is not None]
        return max(seen) if seen else None

    def _status(self, run_id: str) -> tuple[bool, float | None, bool]:
        h = self.tracker.get(run_id)
        if h is None:
            return False, None, False
        last = self._last(h)
        idle = None if last is None or h.busy else self.clock() - last
        return h.ended, idle, h.served_opening

    def resolve(
        self, headers: Mapping[str, str], proto: Adapter, req: ClientRequest
    ) -> tuple[str, str, str | None]:
        """``(run_id, source, user)`` of a request (module docstring); the run id is scoped by
        the request's tenant (``req.tenant``, :func:`router.server.runs.identity.scoped_id`)."""
        user = proto.user(req)
        tenant = req.tenant
        found = explicit_id(headers.get("x-run-id"), req.body)
        if found is not None:
            return scoped_id(tenant, found[0]), found[1], user
        nat = proto.natural_id(req, headers)
        if nat is not None:
            if nat[1] == "previous_response":  # the stored run id, scoped by the tenant that stored it
                return nat[0], nat[1], user
            return scoped_id(tenant, clean_id(nat[0])), nat[1], user
        system, first, is_opening = proto.opening(req)
        base = scoped_id(tenant, opening_hash(system, first, user, salt=tenant))
        req.extra["opening"] = is_opening
        return self.openings.resolve(base, is_opening, self._status), "hash", user

    # ------------------------------------------------------------------ ending
    async def end(
        self, run_id: str, *, outcome: str | None = None, reward: float | None = None, reason: str = "client"
    ) -> dict[str, Any] | None:
        """End a run (module docstring); None when neither this router nor the store knows it.

        A repeated end (or one for a run another router served, or ended before: its state is in
        the store) logs another ``run`` record with the new outcome; the run-log reader merges a
        run's records and keeps the last label (:mod:`features.runmerge`). ``outcome=None`` (the
        client gave none, or the idle sweep) logs no label and leaves an earlier one alone."""
        h = self.tracker.get(run_id)
        state = await self.store.get(run_id)
        label = {} if outcome is None else {"outcome": outcome, "reward": reward}
        rec: dict[str, Any] = {
            "record": "run",
            "run_id": run_id,
            "source": "runroute",
            **label,
            "end_reason": reason,
        }
        if h is None:
            if state is None:
                return None
            if self.writer is not None and label:
                self.writer.submit(rec)
            if state.admitted not in (None, "ended"):
                # a run served by another router replica: give back its slot, leave the tombstone
                await self._release(state)
            return {
                "run_id": run_id,
                "ended": True,
                "n_steps": state.steps_seen,
                "outcome": outcome or "unknown",
                "end_reason": reason,
            }
        entries = list(h.entries)
        started = entries[0]["arrival_s"] if entries else None
        ended = self.wall()
        if self.writer is not None and (label or not h.ended):
            if not h.ended:
                rec.update(
                    tenant=h.tenant,
                    started_at=started,
                    ended_at=max(ended, started or ended),
                    n_steps=len(entries),
                    **await self._context(h),
                )
            self.writer.submit(rec)
        h.ended = True
        if state is not None and state.admitted != "ended":
            await self._release(state)
        elif state is None:
            await self.store.delete(run_id)
        return {
            "run_id": run_id,
            "ended": True,
            "n_steps": len(entries),
            "outcome": outcome or "unknown",
            "end_reason": reason,
        }

    async def _context(self, h: RunHistory) -> dict[str, Any]:
        """The run record's context fields (contract C2): domain, task embedding, signals."""
        out: dict[str, Any] = {}
        if h.domain is not None:
            out["domain"] = h.domain
        emb = h.task_embedding
        fut = h.embed_future
        if emb is None and fut is not None:
            from router.server.runs.context import TaskEmbedder

            emb = TaskEmbedder.result(fut)
            if emb is None and not fut.done():
                if self.context is not None:
                    self.context.needed(fut)  # still waiting for a batch: no later step will come
                self._log_when_embedded(h.run_id, fut)
        if emb is not None:
            out["task_embedding"] = [float(v) for v in emb]
        sig = await self.store.signals(h.run_id)
        if sig:
            out["signals"] = list(sig)
        return out

    def _log_when_embedded(self, run_id: str, fut: Any) -> None:
        """A run that ended before its (deferred) task embedding: the vector goes to the run log
        in a second ``run`` record once it is done (readers merge a run's records,
        :mod:`features.runmerge`); a failed embedding logs nothing more."""
        loop = asyncio.get_running_loop()

        def log_it() -> None:
            from router.server.runs.context import TaskEmbedder

            emb = TaskEmbedder.result(fut)
            if emb is not None and self.writer is not None:
                rec = {"record": "run", "run_id": run_id, "source": "runroute"}
                self.writer.submit({**rec, "task_embedding": [float(v) for v in emb]})

        def done(_f: Any) -> None:  # the worker's thread
            try:
                loop.call_soon_threadsafe(log_it)
            except RuntimeError:  # the sidecar stopped meanwhile (its loop is closed)
                pass

        fut.add_done_callback(done)

    async def signal(self, run_id: str, kind: str) -> dict[str, Any] | None:
        """Store one signal on a run (module docstring); None when the run is unknown, a dict with
        ``signals: -1`` when the run holds :data:`MAX_SIGNALS` already."""
        h = self.tracker.get(run_id)
        state = await self.store.get(run_id)
        if h is None and state is None:
            return None
        n = await self.store.add_signal(run_id, kind, MAX_SIGNALS)
        ended = (h.ended if h is not None else False) or (state is not None and state.admitted == "ended")
        if n > 0 and ended and self.writer is not None:
            sig = await self.store.signals(run_id)
            self.writer.submit(
                {"record": "run", "run_id": run_id, "source": "runroute", "signals": list(sig)}
            )
        return {"run_id": run_id, "kind": kind, "signals": n, "ended": ended}

    async def _release(self, state: RunState) -> None:
        holds = self.engine.run_ended(state)
        if self.admission is not None:
            await self.admission.release(state, holds)
        await self.store.put(
            RunState(
                run_id=state.run_id,
                admitted="ended",
                steps_seen=state.steps_seen,
                owner=state.owner,
                signals_seen=state.signals_seen,
            )
        )

    # ------------------------------------------------------------------ idle sweep
    def idle_runs(self) -> list[str]:
        now = self.clock()
        out = []
        for rid, h in list(self.tracker.runs.items()):
            last = self._last(h)
            if not h.ended and not h.busy and last is not None and now - last > self.idle_end_s:
                out.append(rid)
        return out

    async def sweep_once(self) -> int:
        n = 0
        for rid in self.idle_runs():
            if await self.end(rid, reason="idle") is not None:
                n += 1
        self.ended_idle += n
        return n

    def start(self) -> None:
        self._start_periodic(self.sweep_s, self.sweep_once, log, "idle-run sweep")
