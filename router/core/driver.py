"""The one step driver: the call order around the step engine, written once for every adapter.

A step of a run is a :class:`StepTurn` (``engine.begin(run, track)``); its methods are the stages
of :mod:`router.core.engine` and must be called in this order (any other order raises
:class:`StepOrderError` naming the stage the turn is at and the stage the call needs)::

    begun     --plan-->                 planned | claiming | rejected
    claiming  --claim-->                planned | rejected
    planned   --force-->                planned
    planned   --commit-->               committed
    committed --adopt, fallback (once)-> committed
    committed --finish-->               finished
    planned | claiming --abandon-->     abandoned

(rejected, finished and abandoned end the turn.)

- **plan** (engine stages 1-5) returns the :class:`~router.core.engine.StepPlan`; a plan with
  ``claim_limit`` (a first local step under admission) or ``late_local`` (a run started on the
  frontier that moved local) waits for **claim** (``ok``: the adapter's slot counter took it); a
  rejected plan ends the turn (the adapter answers 429 / drops the run).
- **force** replaces the decision before commit (off-policy replay walks a run on with the logged
  action past the candidate's deviation).
- **commit** (6) applies the decision and returns the chosen backend's state, or None when nothing
  can serve the step (no such backend, or every backend unhealthy: the adapter answers at once, then
  finishes the step unserved).
- **adopt** (9) another router's first pin; **fallback** (7) the other tier after the chosen
  backend failed before its first byte, at most once per step (a second failure ends the step).
- **finish** (8) closes the step and returns its run-log record; a run's first step that ended
  unserved gives its admission back (``turn.unserved``; ``turn.release_slot``: the adapter's slot
  counter must be decremented), so the client's retry is admitted afresh.

Adapters whose serving is synchronous (replay, off-policy replay) do not hold a turn: they call
``engine.step(run, track, request, port, ...)`` (:func:`drive_step`), which runs the whole order and
asks a :class:`StepPort` for the I/O (fresh backend states, an admission slot, an optional forced
action, serving the step). The event-driven simulator and the streaming sidecar hold the turn
across their events / the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from router.core.record import StepRequest, StepResult
from router.policy.types import BackendState, Decision, Policy, RunState

if TYPE_CHECKING:  # pragma: no cover
    from features.schema import Step
    from models.predictor import Predictor
    from router.core.engine import StepEngine, StepPlan
    from router.core.runs import RunTrack

__all__ = ["StepTurn", "DrivenTurn", "StepOrderError", "StepPort", "Served", "drive_step"]

# the stages of a turn (module docstring)
BEGUN = "begun"
CLAIMING = "claiming"
PLANNED = "planned"
REJECTED = "rejected"
COMMITTED = "committed"
FINISHED = "finished"
ABANDONED = "abandoned"

# the stages each call needs
_NEEDS: dict[str, tuple[str, ...]] = {
    "plan": (BEGUN,),
    "claim": (CLAIMING,),
    "force": (PLANNED,),
    "commit": (PLANNED,),
    "abandon": (PLANNED, CLAIMING),
    "adopt": (COMMITTED,),
    "fallback": (COMMITTED,),
    "finish": (COMMITTED,),
}


class StepOrderError(RuntimeError):
    """A stage of a step was called out of order (module docstring)."""


class StepTurn:
    """One step of one run between ``engine.begin`` and its end (module docstring)."""

    __slots__ = ("engine", "run", "track", "stage", "_plan", "fell_back", "unserved", "release_slot", "_slot")

    def __init__(self, engine: StepEngine, run: RunState, track: RunTrack):
        self.engine = engine
        self.run = run
        self.track = track
        self.stage = BEGUN
        self._plan: StepPlan | None = None
        self.fell_back = False
        self.unserved = False  # finish: a first step that was not served gave its admission back
        self.release_slot = False  # finish / abandon: the adapter must release one admission slot
        self._slot = False  # claim took a slot that commit has not yet made the run's

    def restart(self) -> None:
        """Back to ``begun`` for the run's next step (:meth:`StepEngine.begin` with ``reuse``): the
        state :meth:`__init__` sets, on this object."""
        self.stage = BEGUN
        self._plan = None
        self.fell_back = False
        self.unserved = False
        self.release_slot = False
        self._slot = False

    def _enter(self, call: str) -> StepPlan | None:
        needs = _NEEDS[call]
        if self.stage not in needs:
            self._refuse(call)
        return self._plan

    def _refuse(self, call: str) -> None:
        """Raise the :class:`StepOrderError` of ``call`` at this stage (the hot stages check their
        one allowed stage inline and call this only when it is wrong)."""
        needs = _NEEDS[call]
        if self.stage not in needs:
            where = f"run {self.run.run_id}" + (f" step {self._plan.step}" if self._plan is not None else "")
            raise StepOrderError(
                f"{where}: {call}() called at stage {self.stage!r}; it needs stage "
                + " or ".join(repr(s) for s in needs)
            )

    @property
    def planned(self) -> StepPlan:
        """The step's plan (after :meth:`plan`)."""
        if self._plan is None:
            raise StepOrderError(f"run {self.run.run_id}: the step has no plan yet (stage {self.stage!r})")
        return self._plan

    @property
    def needs_claim(self) -> bool:
        """The plan waits for the adapter's slot claim (:meth:`claim`)."""
        return self.stage == CLAIMING

    @property
    def claimed_slot(self) -> bool:
        """The claim took a slot the step has not committed yet (:meth:`abandon` gives it back)."""
        return self._slot

    @property
    def rejected(self) -> bool:
        return self.stage == REJECTED

    @property
    def done(self) -> bool:
        """The turn has ended (rejected, finished or abandoned)."""
        return self.stage in (REJECTED, FINISHED, ABANDONED)

    # ------------------------------------------------------------------ stages
    def plan(
        self,
        req: StepRequest,
        backends: list[BackendState],
        *,
        now: float | None,
        policy: Policy,
        predictor: Predictor,
        active_local_runs: int = 0,
    ) -> StepPlan:
        """Engine stages 1-5; ``backends`` is a fresh list the engine may mutate."""
        if self.stage != BEGUN:
            self._refuse("plan")
        p = self._plan = self.engine._plan(  # positional, in _plan's order
            self.run, self.track, req, backends, now, policy, predictor, active_local_runs
        )
        self.stage = (
            REJECTED if p.rejected else (CLAIMING if p.claim_limit is not None or p.late_local else PLANNED)
        )
        return p

    def claim(self, ok: bool) -> StepPlan:
        """The adapter's slot claim: ``plan.claim_limit`` on its counter (``ok``: taken), or for a
        ``late_local`` plan a slot counted without limit (``ok`` is then True)."""
        p = self._enter("claim")
        assert p is not None
        if p.claim_limit is not None:
            self.engine._claimed(p, self.run, self.track, ok)
        else:
            self.engine._late_local_claimed(p, self.run)
            ok = True
        self._slot = ok
        self.stage = REJECTED if p.rejected else PLANNED
        return p

    def force(self, decision: Decision) -> None:
        """Replace the plan's decision before commit (module docstring)."""
        p = self._enter("force")
        assert p is not None
        p.decision = decision

    def commit(self) -> BackendState | None:
        """Engine stage 6; returns the chosen backend's state (None: nothing can serve the step)."""
        if self.stage != PLANNED:
            self._refuse("commit")
        p = self._plan
        assert p is not None
        backends = p.snapshot.backends
        name = p.decision.backend
        chosen = None
        for c in backends:
            if c.name == name:
                chosen = c
                break
        if chosen is not None and not chosen.healthy:  # is some backend up? (none: nothing serves)
            for b in backends:
                if b.healthy:
                    break
            else:
                chosen = None
        self.engine._commit(p, self.run, self.track, chosen)
        self.stage = COMMITTED
        self._slot = False
        return chosen

    def abandon(self) -> bool:
        """Drop the step before commit (an error between plan and commit); returns True when the
        adapter must release the slot its claim took."""
        self._enter("abandon")
        self.stage = ABANDONED
        if self._slot:
            self._slot = False
            self.release_slot = self.engine.run_ended(self.run)
        return self.release_slot

    def adopt(self, winner: RunState) -> bool:
        """Engine stage 9: take ``winner``'s first pin; True when this router's slot goes back."""
        p = self._enter("adopt")
        assert p is not None
        return self.engine._adopt(p, self.run, winner)

    def fallback(self, failed: str, kind: str, backends: list[BackendState]) -> Decision | None:
        """Engine stage 7, at most once per step (None: no other tier, or the step fell back
        already)."""
        p = self._enter("fallback")
        assert p is not None
        if self.fell_back:
            return None
        self.fell_back = True
        return self.engine._fallback(p, self.run, failed, kind, backends)

    def finish(
        self,
        res: StepResult,
        *,
        now: float | None,
        tier: str | None,
        replica: str | None,
        model: str | None,
        arrival_s: float | None = None,
        record: bool = True,
    ) -> Step | None:
        """Engine stage 8 (and the unserved start of 9); returns the record when ``record``."""
        if self.stage != COMMITTED:
            self._refuse("finish")
        p = self._plan
        assert p is not None
        self.stage = FINISHED
        rec = self.engine._finish(  # positional, in _finish's order
            p, self.track, res, now, tier, replica, model, arrival_s, record
        )
        if res.status != 200 and p.admission is not None:  # a first step not served
            self.unserved = True
            self.release_slot = self.engine._unserved_start(p, self.run)
        return rec


# ---------------------------------------------------------------------- the synchronous driver
@dataclass(slots=True)
class Served:
    """What a :class:`StepPort` observed serving a step: the result, when it ended, and the kind of
    failure before the first byte (``connect``, ``timeout``, ``5xx``; None: it was served)."""

    result: StepResult
    end_s: float | None
    failure: str | None = None


class StepPort(Protocol):
    """The I/O of a synchronous adapter (:func:`drive_step`)."""

    def backends(self) -> list[BackendState]:
        """Fresh backend states (the engine may mutate them)."""
        ...

    def claim(self, limit: int | None) -> bool:
        """Claim an admission slot on the adapter's counter (``limit`` None: count it, never refuse)."""
        ...

    def forced(self, plan: StepPlan) -> Decision | None:
        """The action the adapter must take instead of the plan's (None: the plan's)."""
        ...

    def serve(self, plan: StepPlan, backend: BackendState | None) -> Served:
        """Serve the step on ``backend`` (the plan's decision; None: nothing can serve it)."""
        ...


def drive_step(
    engine: StepEngine,
    run: RunState,
    track: RunTrack,
    req: StepRequest,
    port: StepPort,
    *,
    now: float | None,
    policy: Policy,
    predictor: Predictor,
    active_local_runs: int = 0,
    record: bool = False,
) -> DrivenTurn:
    """One whole step in the order of the module docstring; returns the ended turn (its
    ``planned`` plan, ``rejected``, ``release_slot``, and ``record``: the step's run-log record
    when ``record``). A failure the port reports falls back once; what the fallback target
    returns is final."""
    turn = DrivenTurn(engine, run, track)
    plan = turn.plan(
        req, port.backends(), now=now, policy=policy, predictor=predictor, active_local_runs=active_local_runs
    )
    if turn.needs_claim:
        turn.claim(port.claim(plan.claim_limit))
    if turn.rejected:
        return turn
    forced = port.forced(plan)
    if forced is not None:
        turn.force(forced)
    backend = turn.commit()
    served = port.serve(plan, backend)
    if served.failure is not None and backend is not None:
        fresh = port.backends()
        d = turn.fallback(backend.name, served.failure, fresh)
        if d is not None:
            served = port.serve(plan, next((b for b in fresh if b.name == d.backend), None))
    d = plan.decision
    turn.record = turn.finish(
        served.result,
        now=served.end_s,
        tier=d.tier if d.backend else None,
        replica=d.backend or None,
        model=d.model if d.backend else None,
        record=record,
    )
    return turn


class DrivenTurn(StepTurn):
    """A turn run by :func:`drive_step`, with the step's record (None unless asked for)."""

    __slots__ = ("record",)

    def __init__(self, engine: StepEngine, run: RunState, track: RunTrack):
        super().__init__(engine, run, track)
        self.record: Step | None = None
