"""The step engine's one call order (router.core.driver): a StepTurn refuses calls out of order with
an error naming the stage it is at and the stage the call needs; engine.step runs the whole order
through a StepPort (claim, forced action, serve, one fallback)."""

from __future__ import annotations

import pytest

from models.predictor import ConstantPredictor
from router.core.admission import AdmissionGate
from router.core.driver import Served, StepOrderError, StepTurn
from router.core.engine import StepEngine, StepPlan
from router.core.record import StepRequest, StepResult
from router.core.runs import RunTrack
from router.core.traffic import TrafficModel
from router.policy import build_policy
from router.policy.admission import AdmissionConfig
from router.policy.types import BackendState, Decision, RunState

POLICY = build_policy({"kind": "always-local"})
PRED = ConstantPredictor()
OK = StepResult(status=200, prompt_tokens=100, completion_tokens=10)


def _backends() -> list[BackendState]:
    return [
        BackendState(name="local-0", tier="local", model="m"),
        BackendState(name="frontier", tier="frontier", model="f", price_in_per_m=3.0, price_out_per_m=15.0),
    ]


def _turn(engine: StepEngine | None = None, run_id: str = "r1") -> StepTurn:
    return (engine or StepEngine()).begin(RunState(run_id=run_id), RunTrack.new(run_id, 0.0))


def _plan(turn: StepTurn) -> StepPlan:
    return turn.plan(StepRequest(prompt_tokens=100), _backends(), now=0.0, policy=POLICY, predictor=PRED)


def _finish(turn: StepTurn, res: StepResult = OK):
    return turn.finish(res, now=1.0, tier="local", replica="local-0", model="m")


def test_the_legal_order_runs_and_ends_the_turn():
    turn = _turn()
    plan = _plan(turn)
    assert turn.stage == "planned" and not turn.needs_claim
    chosen = turn.commit()
    assert chosen is not None and chosen.name == plan.decision.backend == "local-0"
    rec = _finish(turn)
    assert rec is not None and rec.step == 0 and rec.tier == "local"
    assert turn.done and turn.stage == "finished"


@pytest.mark.parametrize(
    ("calls", "bad", "at", "needs"),
    [
        ([], "commit", "begun", "planned"),  # commit before plan
        ([], "finish", "begun", "committed"),  # finish before anything
        (["plan"], "finish", "planned", "committed"),  # finish before commit
        (["plan"], "fallback", "planned", "committed"),
        (["plan"], "plan", "planned", "begun"),  # plan twice
        (["plan"], "claim", "planned", "claiming"),  # a claim nobody asked for
        (["plan", "commit"], "commit", "committed", "planned"),  # commit twice
        (["plan", "commit"], "force", "committed", "planned"),  # force after commit
        (["plan", "commit", "finish"], "finish", "finished", "committed"),  # finish twice
        (["plan", "commit", "finish"], "fallback", "finished", "committed"),  # fallback after finish
        (["plan", "commit", "finish"], "adopt", "finished", "committed"),
        (["plan", "commit"], "abandon", "committed", "planned"),  # abandon a committed step
    ],
)
def test_a_call_out_of_order_names_the_stage_it_needs(calls, bad, at, needs):
    turn = _turn()
    do = {
        "plan": lambda: _plan(turn),
        "commit": turn.commit,
        "finish": lambda: _finish(turn),
        "fallback": lambda: turn.fallback("local-0", "connect", _backends()),
        "claim": lambda: turn.claim(True),
        "force": lambda: turn.force(Decision(tier="local", backend="local-0", model="m", reason="x")),
        "adopt": lambda: turn.adopt(RunState(run_id="r1")),
        "abandon": turn.abandon,
    }
    for c in calls:
        do[c]()
    with pytest.raises(StepOrderError) as e:
        do[bad]()
    msg = str(e.value)
    assert f"{bad}()" in msg and repr(at) in msg and repr(needs) in msg, msg
    assert "run r1" in msg


def test_the_plan_is_unreadable_before_plan():
    with pytest.raises(StepOrderError, match="no plan yet"):
        _ = _turn().planned


def _gated(max_runs: int) -> StepEngine:
    cfg = AdmissionConfig(max_runs_per_replica=max_runs, spill=False)
    return StepEngine(admission=AdmissionGate(cfg, TrafficModel(["local-0"])))


def test_a_first_local_step_under_admission_waits_for_its_claim():
    engine = _gated(4)
    turn = _turn(engine)
    plan = _plan(turn)
    assert turn.needs_claim and plan.claim_limit is not None
    with pytest.raises(StepOrderError, match="'claiming'"):
        turn.commit()  # commit before the claim
    turn.claim(True)
    assert turn.claimed_slot and turn.stage == "planned"
    assert turn.abandon()  # dropped before commit: the slot it took goes back
    assert turn.done and turn.release_slot


def test_a_refused_claim_rejects_and_ends_the_turn():
    turn = _turn(_gated(4))
    _plan(turn)
    turn.claim(False)
    assert turn.rejected and turn.done and turn.planned.rejected
    with pytest.raises(StepOrderError, match="'rejected'"):
        turn.commit()


def test_an_unserved_first_step_gives_its_admission_back_at_finish():
    turn = _turn(_gated(4))
    _plan(turn)
    turn.claim(True)
    turn.commit()
    assert turn.run.admitted == "admit-local"
    _finish(turn, StepResult(status=502, error_code="upstream_error"))
    assert turn.unserved and turn.release_slot and turn.run.admitted is None


def test_commit_answers_none_when_every_backend_is_down():
    turn = _turn()
    turn.plan(
        StepRequest(prompt_tokens=100),
        [BackendState(name="local-0", tier="local", model="m", healthy=False)],
        now=0.0,
        policy=POLICY,
        predictor=PRED,
    )
    assert turn.commit() is None


def test_commit_gives_the_chosen_state_while_some_backend_is_up_even_a_down_one():
    """commit's chosen backend: the one the decision names whenever any backend is healthy (even
    when the named one is down), None when every one is down or none has the name."""
    for healthy, pick, expect in (
        ((True, False), "local-1", "local-1"),
        ((True, False), "local-0", "local-0"),
        ((False, True), "local-1", "local-1"),
        ((False, False), "local-0", None),
        ((True, True), "local-9", None),
    ):
        turn = _turn()
        states = [
            BackendState(name=f"local-{i}", tier="local", model="m", healthy=h) for i, h in enumerate(healthy)
        ]
        turn.plan(StepRequest(prompt_tokens=100), states, now=0.0, policy=POLICY, predictor=PRED)
        turn.force(Decision(tier="local", backend=pick, model="m", reason="forced"))
        chosen = turn.commit()
        assert (chosen.name if chosen is not None else None) == expect, (healthy, pick)
        assert chosen is None or chosen is states[int(pick[-1])]


def test_fallback_happens_once_per_step():
    turn = _turn()
    _plan(turn)
    turn.commit()
    d = turn.fallback("local-0", "connect", _backends())
    assert d is not None and d.backend == "frontier" and d.reason == "fallback-connect"
    assert turn.fallback("frontier", "5xx", _backends()) is None  # a second failure ends the step


class Port:
    """A synchronous adapter's I/O: the first serve fails (``fail``), then serves."""

    def __init__(self, fail: str | None = None, force: Decision | None = None):
        self.fail, self.force, self.served, self.claims = fail, force, [], []

    def backends(self) -> list[BackendState]:
        return _backends()

    def claim(self, limit: int | None) -> bool:
        self.claims.append(limit)
        return True

    def forced(self, plan: StepPlan) -> Decision | None:
        return self.force

    def serve(self, plan: StepPlan, backend: BackendState | None) -> Served:
        self.served.append(backend.name if backend else None)
        if self.fail is not None and len(self.served) == 1:
            return Served(StepResult(status=503), 1.0, failure=self.fail)
        return Served(OK, 2.0)


def test_engine_step_runs_the_whole_order_with_one_fallback():
    engine = _gated(4)
    run, track = RunState(run_id="r"), RunTrack.new("r", 0.0)
    port = Port(fail="connect")
    turn = engine.step(
        run, track, StepRequest(prompt_tokens=100), port, now=0.0, policy=POLICY, predictor=PRED, record=True
    )
    assert port.claims and port.claims[0] is not None  # the first local step claimed a slot
    assert port.served == ["local-0", "frontier"]
    assert turn.done and turn.record is not None
    assert turn.record.tier == "frontier" and turn.record.reason == "fallback-connect"
    assert track.last_end_s == 2.0 and len(track.base.steps) == 1


def test_engine_step_takes_the_forced_action():
    forced = Decision(tier="frontier", backend="frontier", model="f", reason="logged")
    run, track = RunState(run_id="r"), RunTrack.new("r", 0.0)
    port = Port(force=forced)
    turn = StepEngine().step(
        run, track, StepRequest(prompt_tokens=100), port, now=0.0, policy=POLICY, predictor=PRED
    )
    assert port.served == ["frontier"] and run.tier == "frontier"
    assert turn.planned.decision.reason == "logged"
