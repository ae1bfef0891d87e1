"""One run log, one set of tier decisions: the simulator, decision replay, OPE replay (and the
sidecar's metrics over the simulator's step records) agree on frontier cost and cache hit rate.

The log has runs that leave a tier and come back (local -> frontier -> local), where the old
"same tier as the previous step" rule of evaluation said the returning step was cold while the
simulator's caches still held the run's context. Token counts are whole blocks, so the simulator's
block-granular caches and the token-count rule measure the same prefix."""

from __future__ import annotations

import numpy as np
import pytest

from features.runlog import RunLog, read_runlog, write_records
from features.schema import Run, Step
from models.predictor import ConstantPredictor
from router.policy.types import BackendState, Decision, Snapshot
from router.replay import replay
from router.server.metrics.registry import RouterMetrics
from router.sim.frontier import FrontierConfig
from router.sim.profiles import load_profile
from router.sim.scorecard import scorecard
from router.sim.simconfig import SimConfig
from router.sim.simulator import Simulator
from router.sim.workload import Workload
from training.eval.ope_replay import load_logged
from training.eval.outcome import Prices

B = 16  # block tokens of the simulated caches
COMPLETION = 32
# run -> per step: the tier every driver serves it on
TIERS = {"r1": "LFLL", "r2": "FFL", "r3": "LLL", "r4": "FLF"}


def _prompts(n: int) -> list[int]:
    return [160 * (k + 1) for k in range(n)]  # whole blocks, growing by the previous output and more


class ScriptedPolicy:
    """Serves each step on the tier :data:`TIERS` names (the first local replica by name)."""

    name = "scripted"

    def decide(self, snap: Snapshot) -> Decision:
        want = TIERS[snap.run.run_id][snap.step_index]
        pick: BackendState
        if want == "F":
            pick = next(b for b in snap.backends if b.tier == "frontier")
        else:
            pick = min((b for b in snap.backends if b.tier == "local"), key=lambda b: b.name)
        return Decision(tier=pick.tier, backend=pick.name, model=pick.model, reason=f"script-{want}")


def _records() -> list[Run | Step]:
    recs: list[Run | Step] = []
    for rid, tiers in TIERS.items():
        prompts = _prompts(len(tiers))
        recs.append(Run(run_id=rid, source="test", outcome="success", n_steps=len(tiers), started_at=0.0))
        t = 0.0
        for k, pt in enumerate(prompts):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    arrival_s=t,
                    tool_pause_s=0.0 if k == 0 else 1.0,
                    prompt_tokens=pt,
                    completion_tokens=COMPLETION,
                    prefix_reuse_tokens=0 if k == 0 else prompts[k - 1] + COMPLETION,
                    tool_calls=["lookup"],
                    tool_results_n=0 if k == 0 else 1,
                    tier="frontier" if tiers[k] == "F" else "local",
                    replica="frontier" if tiers[k] == "F" else "local-0",
                    latency_s=0.5,
                    propensity=1.0,
                    explore=False,
                )
            )
            t += 1.5
    return recs


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> RunLog:
    return read_runlog(write_records(_records(), tmp_path_factory.mktemp("parity") / "runs.jsonl"))


@pytest.fixture(scope="module")
def sim(log):
    w = Workload.from_frames(log.steps, log.runs, block_tokens=B)
    cfg = SimConfig(
        profile=load_profile(None, "a100"),
        replicas=2,
        block_tokens=B,
        frontier=FrontierConfig(cache_min_tokens=0),
        log_steps=True,
    )
    starts = np.arange(len(w.runs), dtype=float) * 100.0  # one run at a time: no cross-run effects
    return Simulator(w, ScriptedPolicy(), cfg, starts, predictor=ConstantPredictor()).run()


def _by_hand() -> tuple[float, float]:
    """Frontier cost and local cross-turn hit rate of :data:`TIERS` by the warm-prefix rule."""
    p = Prices()
    usd, warm_local, prompt_local = 0.0, 0, 0
    for tiers in TIERS.values():
        prompts = _prompts(len(tiers))
        left: dict[str, int] = {}
        for k, (tier, pt) in enumerate(zip(tiers, prompts, strict=True)):
            reuse = 0 if k == 0 else prompts[k - 1] + COMPLETION
            left = {b: min(n, reuse) for b, n in left.items()}
            warm = left.get(tier, 0)
            if tier == "F":
                usd += (
                    (pt - warm) * p.frontier_in_per_m
                    + warm * p.frontier_cached_in_per_m
                    + COMPLETION * p.frontier_out_per_m
                ) / 1e6
            elif k >= 1:
                warm_local += warm
                prompt_local += pt
            left[tier] = pt + COMPLETION
    return usd, warm_local / prompt_local


def test_simulator_replay_and_ope_agree_on_cost_and_hit_rate(log, sim):
    usd, hit = _by_hand()
    # r1 step 2 comes back to local after a frontier step: it finds step 0's 192 tokens there
    assert hit > 0.0
    card = scorecard(sim)
    rep = replay(log, [ScriptedPolicy()], ConstantPredictor())["policies"]["scripted"]
    ope = load_logged(log, Prices()).figures()
    assert sim.frontier_cost_usd == pytest.approx(usd, rel=1e-12)
    assert rep["frontier_cost_usd"] == pytest.approx(usd, rel=1e-12)
    assert ope["frontier_cost_usd"] == pytest.approx(usd, rel=1e-12)
    assert card["cache_hit_rate"] == pytest.approx(hit, abs=1e-6)  # the scorecard rounds to 6 places
    assert rep["cache_hit_rate"] == pytest.approx(hit, rel=1e-12)
    assert ope["cache_hit_rate"] == pytest.approx(hit, rel=1e-12)
    # every step was served where the script said, in all three
    assert rep["frontier_step_share"] == pytest.approx(float(np.mean(log.steps["tier"] == "frontier")))
    assert (sim.outcome == 2).sum() == int((log.steps["tier"] == "frontier").sum())


def test_sidecar_metrics_over_the_simulators_records_agree(sim):
    """The sidecar's per-step metrics (router.server.metrics.registry), fed the simulator's run-log records,
    count the simulator's cross-turn hit rate and frontier spend."""
    m = RouterMetrics()
    fr = FrontierConfig()
    front = BackendState(
        "frontier",
        "frontier",
        fr.model,
        price_in_per_m=fr.price_in_per_m,
        price_cached_in_per_m=fr.price_cached_in_per_m,
        price_out_per_m=fr.price_out_per_m,
    )
    prev: dict[str, int] = {}
    for rec in sorted(sim.records or [], key=lambda r: (r.run_id, r.step)):
        m.step_finished(rec, prev.get(rec.run_id, 0), front if rec.tier == "frontier" else None)
        prev[rec.run_id] = rec.prompt_tokens + rec.completion_tokens
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in m.registry.collect()
        for s in fam.samples
    }

    def total(name: str, **want: str) -> float:
        return sum(
            v
            for (n, labels), v in samples.items()
            if n == name and all((k, x) in labels for k, x in want.items())
        )

    cached = total("runroute_cross_turn_cached_tokens_total", tier="local")
    prompt = total("runroute_cross_turn_prompt_tokens_total", tier="local")
    assert cached / prompt == pytest.approx(scorecard(sim)["cache_hit_rate"], abs=1e-6)
    assert total("runroute_spend_usd_total") == pytest.approx(sim.frontier_cost_usd, rel=1e-12)
