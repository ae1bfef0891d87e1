"""Parity: the off-policy replay (training.eval.ope_replay) of a simulated run log, with the policy
that logged it as the candidate, agrees with the simulator on every decision (the candidate's
probability of the logged action is 1 at every step, its frontier probability is the logged tier,
its decision reasons are the logged ones), sees the same run prefix at every step (the feature
vector the predictor is asked for is the logged one: tool history, tiers, cached tokens, hence the
cache-hit features), and prices the logged frontier steps as the simulator did.

Both adapters drive the one step engine through its one call order (router.core.driver). The world
is the one of :mod:`test_parity_replay` (runs that never overlap, idle backends, no admission, the
frontier's cached-input price equal to its input price), the log is the simulation's own step
records (times, tiers, cached tokens, propensities) with an outcome per run. The off-policy replay
keeps no prefix index (it answers "which tier", never "which replica"), so the policies compared
are those whose tier does not read the index.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_parity_replay import FRONT, POLICIES, CtxPredictor, _log, _simulate

from features.extract import FEATURE_NAMES
from features.runlog import RunLog, records_to_frame
from features.schema import Run
from models.types import Predictions
from router.policy import build_policy
from training.eval.ope_replay import load_logged, replay_candidate
from training.eval.outcome import Prices

BUDGETED = {
    "kind": "learned",
    "name": "learned-budget",
    "p_frontier_up": 0.6,
    "p_frontier_down": 0.3,
    "min_dwell_steps": 1,
    "frontier_budget": {"share": 0.4, "window": 10, "min_window": 1},
}
CANDIDATES = [p for p in POLICIES if p["kind"] != "prefix-aware"] + [BUDGETED]
PRICES = Prices(
    frontier_in_per_m=FRONT.price_in_per_m,
    frontier_cached_in_per_m=FRONT.price_cached_in_per_m,
    frontier_out_per_m=FRONT.price_out_per_m,
)


class Recording(CtxPredictor):
    """The parity predictor, keeping every feature vector it is asked for."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def predict_features(self, x: np.ndarray) -> Predictions:
        self.seen.append(np.array(x, dtype=np.float64))
        return super().predict_features(x)


def _logged(recs: list, res) -> RunLog:
    """The simulation's step records and the runs, each with an outcome."""
    runs = [
        r.model_copy(update={"outcome": "success" if i % 2 else "failure"})
        for i, r in enumerate(x for x in recs if isinstance(x, Run))
    ]
    return RunLog.from_frame(records_to_frame([*runs, *res.records]))


@pytest.mark.parametrize("pcfg", CANDIDATES, ids=[p.get("name", p["kind"]) for p in CANDIDATES])
def test_ope_replay_of_the_logging_policy_reproduces_the_simulation(pcfg):
    recs, workload = _log()
    res, idle, _ = _simulate(pcfg, workload)
    logged = load_logged(_logged(recs, res), PRICES)
    assert logged.n_runs == len(workload.runs) and not logged.left_out
    pred = Recording()
    out = replay_candidate(logged, build_policy(pcfg), pred, backends=idle)

    # decisions: the candidate takes the logged action at every step
    sim = {(r.run_id, r.step): r for r in res.records}
    order = [sim[(r, int(k))] for r, k in zip(logged.steps["run_id"], logged.steps["step"], strict=True)]
    assert out.deviated_runs == 0 and out.unsupported_runs == 0
    np.testing.assert_array_equal(out.pi, np.ones(len(order)))
    np.testing.assert_array_equal(out.pf, [1.0 if r.tier == "frontier" else 0.0 for r in order])
    want_reasons: dict[str, int] = {}
    for r in order:
        want_reasons[r.reason] = want_reasons.get(r.reason, 0) + 1
    assert out.reasons == want_reasons

    # the same prefix at every step: the predictor saw the simulation's logged feature vectors
    # (run by run, as logged; a budgeted candidate walks the steps in arrival order instead)
    seen = {v.tobytes() for v in pred.seen}
    assert len(pred.seen) == len(order)
    for r in order:
        assert np.asarray(r.features, dtype=np.float64).tobytes() in seen, (r.run_id, r.step)
    hit = FEATURE_NAMES.index("cache_hit_ratio")
    assert any(v[hit] > 0 for v in pred.seen) or all(r.tier == "frontier" for r in order)

    # cost: the logged frontier steps at the simulator's frontier prices
    front = logged.a == 1
    assert float(logged.cost[front].sum()) == pytest.approx(res.frontier_cost_usd, rel=1e-12)


def test_a_candidate_that_differs_deviates():
    """The check above can fail: a candidate other than the logging policy deviates where the
    tiers differ."""
    recs, workload = _log()
    res, idle, _ = _simulate({"kind": "always-local"}, workload)
    logged = load_logged(_logged(recs, res), PRICES)
    out = replay_candidate(logged, build_policy({"kind": "always-frontier"}), CtxPredictor(), backends=idle)
    assert out.deviated_runs == logged.n_runs
    assert float(out.pi.sum()) == 0.0
