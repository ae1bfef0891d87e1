"""Parity: one run log through the what-if simulator and through decision replay (router.replay)
gives the same decisions step by step (tier, backend, reason), the same frontier cost and the same
local prefix-cache hit rate, for every policy kind.

Both adapters drive the one step engine through its one call order (router.core.driver: the
simulator holds a StepTurn across its events, replay calls ``engine.step`` with a port); this test
checks that the adapters give the engine the same world. What a parity test may fix, nothing else:

- the runs never overlap in time and their steps are short next to their tool pauses, so no backend
  is busy at a decision (replay has no load) and admission is off (replay has none);
- the simulation runs first and the replay reads its times (each step's arrival and latency), so
  the time features (tool pause, run age) are the same;
- replay's backends are the simulator's idle backend states, and its prefix index has the
  simulator's replica capacity and block size; the log carries block chains (``hash_ids``), so both
  read the prefix index the engine fills;
- the frontier's cached-input price equals its input price: replay models the frontier's provider
  cache as the run's own last context, the simulator as a block chain with a TTL (what a provider
  cache holds is not a decision of the router), so the frontier cost compared is the price of the
  tokens each world sent there, the same in both when the decisions are.
"""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import PROF

from features.runlog import RunLog, records_to_frame
from features.schema import Run, Step
from models.predictor import FeaturePredictor
from models.types import Predictions
from router.core.accounting import backend_step_usd
from router.policy import build_policy
from router.replay import replay
from router.sim.frontier import FrontierConfig
from router.sim.whatif import SimConfig, Simulator, Workload

B = 16  # tokens per block, both worlds
FRONT = FrontierConfig(
    ttft_sigma=0.0,
    tokens_per_s_sigma=0.0,
    ttft_p50_s=0.2,
    tokens_per_s_p50=400.0,
    price_in_per_m=3.0,
    price_cached_in_per_m=3.0,  # module docstring: the provider cache is not compared
    price_out_per_m=15.0,
)
POLICIES = [
    {"kind": "always-local"},
    {"kind": "always-frontier"},
    {"kind": "prefix-aware"},
    {"kind": "session-sticky"},
    {"kind": "per-step-threshold", "threshold": 0.5},
    {"kind": "stall-escalation"},
    {"kind": "learned", "p_frontier_up": 0.6, "p_frontier_down": 0.3, "min_dwell_steps": 1},
    {"kind": "oracle"},
]
N_RUNS, N_STEPS = 8, 6


class CtxPredictor(FeaturePredictor):
    """P(frontier) rising with the run's context and its tool errors: decisions that read the
    features (so the two worlds must give the engine the same prefix to agree)."""

    version = "parity-ctx"

    def predict_features(self, x: np.ndarray) -> Predictions:
        from features.extract import FEATURE_NAMES

        ctx = float(x[FEATURE_NAMES.index("ctx_tokens")])
        return Predictions(p_frontier=float(min(0.95, ctx / 2500.0)))


def _log() -> tuple[list, Workload]:
    """Runs whose prompts grow by tool results; runs of even index share a system prompt (blocks
    another run left on a replica), some steps repeat a call or carry an error."""
    recs: list = []
    shared = list(range(1, 41))  # 40 blocks of a common system prompt
    for r in range(N_RUNS):
        rid = f"run-{r}"
        recs.append(Run(run_id=rid, source="parity", started_at=1000.0 * r, needs_frontier=r % 3 == 0))
        chain = list(shared) if r % 2 == 0 else [10_000 * (r + 1) + j for j in range(30)]
        for k in range(N_STEPS):
            new = 8 + 6 * ((r + k) % 4)
            chain = chain + [100_000 * (r + 1) + 100 * k + j for j in range(new)]
            prompt = len(chain) * B - 3
            comp = 20 + 7 * ((r * k) % 5)
            err = (r + k) % 5 == 4
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    prompt_tokens=prompt,
                    completion_tokens=comp,
                    tool_pause_s=30.0 + 3 * k if k else None,
                    tool_calls=["search" if k % 2 else "lookup"],
                    tool_call_keys=["search:q" if r % 4 == 1 and k >= 2 else f"k{r}-{k}"],
                    tool_results_n=1 if k else 0,
                    tool_result_tokens=[new * B] if k else [],
                    tool_result_errors=[err] if k else [],
                    structured=True,
                    n_tools_offered=2,
                    hash_ids=chain,
                )
            )
    df = records_to_frame(recs)
    return recs, Workload.from_frames(df[df.record == "step"], df[df.record == "run"], block_tokens=B)


def _config() -> SimConfig:
    return SimConfig(
        profile=PROF,
        replicas=2,
        kv_cache_gb=4.0,
        frontier=FRONT,
        scrape=False,
        log_steps=True,
        block_tokens=B,
        seed=5,
    )


def _simulate(pcfg: dict, workload: Workload):
    cfg = _config()
    starts = np.array([r.started_s for r in workload.runs])
    sim = Simulator(workload, build_policy(pcfg), cfg, starts, predictor=CtxPredictor())
    idle = [*(sim._local_state(rep, 0.0) for rep in sim.replicas), sim._backends(None, 0.0)[-1]]  # noqa: SLF001
    return sim.run(), idle, sim.replicas[0].capacity


def _replay_log(recs: list, res) -> RunLog:
    """The log with the simulation's times: each step arrives and ends when it did there."""
    when = {(r.run_id, r.step): {"arrival_s": r.arrival_s, "latency_s": r.latency_s} for r in res.records}
    timed = [r.model_copy(update=when[(r.run_id, r.step)]) if isinstance(r, Step) else r for r in recs]
    return RunLog.from_frame(records_to_frame(timed))


@pytest.mark.parametrize("pcfg", POLICIES, ids=[p["kind"] for p in POLICIES])
def test_replay_and_simulator_decide_cost_and_hit_alike(pcfg):
    frames, workload = _log()
    res, idle, capacity = _simulate(pcfg, workload)
    assert len(res.records) == N_RUNS * N_STEPS
    log = _replay_log(frames, res)
    pol = build_policy(pcfg)
    rep = replay(
        log, [pol], CtxPredictor(), backends=idle, index_tokens=capacity * B, block_tokens=B, trace=True
    )
    trace = rep["decisions"][pol.name]
    got = {k: v[:3] for k, v in trace.items()}
    want = {(r.run_id, r.step): (r.tier, r.replica, r.reason) for r in res.records}
    diff = [(k, got.get(k), want[k]) for k in sorted(want) if got.get(k) != want[k]]
    assert not diff, diff[:6]

    # frontier cost: the tokens each world sent to the frontier, at its prices
    fb = idle[-1]
    sim_cost = sum(
        backend_step_usd(fb, r.prompt_tokens, 0, r.completion_tokens)
        for r in res.records
        if r.tier == "frontier"
    )
    figures = rep["policies"][pol.name]
    assert figures["frontier_cost_usd"] == pytest.approx(sim_cost, rel=1e-12)
    assert figures["frontier_cost_usd"] == pytest.approx(res.frontier_cost_usd, rel=1e-12)

    # cross-turn hit rate (the scorecard's: local steps after a run's first), step by step
    later = [r for r in res.records if r.tier == "local" and r.step >= 1]
    for r in later:
        assert trace[(r.run_id, r.step)][3] == (r.cached_tokens or 0), (r.run_id, r.step)
    if pcfg["kind"] in ("always-local", "prefix-aware"):
        assert sum(r.cached_tokens or 0 for r in later) > 0


def test_the_workload_exercises_both_tiers_moves_and_the_index():
    """The parity above is not vacuous: across the policies both tiers serve, runs escalate on
    the features, and local steps hit blocks the index recorded."""
    _, workload = _log()
    tiers, reasons, hits = set(), set(), 0
    for pcfg in POLICIES:
        res, _, _ = _simulate(pcfg, workload)
        tiers |= {r.tier for r in res.records}
        reasons |= {r.reason for r in res.records}
        hits += sum(r.cached_tokens or 0 for r in res.records if r.tier == "local" and r.step >= 1)
        if pcfg["kind"] == "always-frontier":
            assert res.frontier_cost_usd > 0
    assert tiers == {"local", "frontier"}
    assert {"escalate", "stall-escalate"} & reasons, reasons
    assert hits > 0
