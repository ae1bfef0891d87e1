"""Shared stand-ins of the simulator tests: a tiny node profile, a frontier without noise, a fixed
policy, run-log frames from tuples, and the analytic prefill/decode times of the cost model."""

from __future__ import annotations

from features.runlog import records_to_frame
from features.schema import Run, Step
from router.policy.types import Decision, Snapshot
from router.sim.arrivals import run_starts
from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.whatif import SimConfig, Simulator, Workload

__all__ = ["PROF", "FRONT", "Fixed", "frame", "simulate", "prefill_s", "decode_s"]

PROF = NodeProfile(
    name="t", a=0.01, b=1e-4, c=1e-8, d=1e-6, e=0.002, kv_bytes_per_token=1000, token_budget=8192
)
FRONT = FrontierConfig(
    ttft_sigma=0.0, tokens_per_s_sigma=0.0, ttft_p50_s=0.5, tokens_per_s_p50=50.0, prefill_s_per_token=1e-5
)


class Fixed:
    """Stand-in policy: every step to one named backend."""

    def __init__(self, backend: str):
        self.name = f"fixed-{backend}"
        self.backend = backend

    def decide(self, snap: Snapshot) -> Decision:
        b = next(x for x in snap.backends if x.name == self.backend)
        return Decision(tier=b.tier, backend=b.name, model=b.model, reason="fixed")


def frame(runs: list[list[tuple]], starts: list[float] | None = None):
    """runs: per run a list of (prompt, completion, pause, prefix_reuse or None, hash_ids or None)."""
    recs: list = []
    for i, steps in enumerate(runs):
        rid = f"r{i:03d}"
        recs.append(Run(run_id=rid, source="t", started_at=(starts or [0.0] * len(runs))[i]))
        for k, (p, c, pause, reuse, hashes) in enumerate(steps):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    prompt_tokens=p,
                    completion_tokens=c,
                    tool_pause_s=pause if k else None,
                    prefix_reuse_tokens=reuse,
                    hash_ids=hashes,
                )
            )
    df = records_to_frame(recs)
    return df[df.record == "step"], df[df.record == "run"]


def simulate(runs, policy, *, starts=None, **cfg):
    steps, runs_df = frame(runs, starts)
    w = Workload.from_frames(steps, runs_df, block_tokens=cfg.get("block_tokens", 512))
    cfg.setdefault("kv_cache_gb", 1.0)
    cfg.setdefault("replicas", 1)
    c = SimConfig(profile=cfg.pop("profile", PROF), frontier=cfg.pop("frontier", FRONT), **cfg)
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    return Simulator(w, policy, c, st).run(), w


def prefill_s(p: NodeProfile, chunks: list[tuple[int, int]], n_seq: int = 1) -> float:
    return p.a + sum(p.b * ln + p.c * ln * (s + ln) for ln, s in chunks) + p.e * n_seq


def decode_s(p: NodeProfile, prompt: int, n_out: int) -> float:
    return sum(p.a + p.d * (prompt + 1 + j) + p.e for j in range(n_out - 1))
