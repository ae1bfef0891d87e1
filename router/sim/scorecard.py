"""What one simulation returns and the scorecard computed from it (once, from the per-step arrays).

Each step ends exactly once as one of :data:`SERVED_LOCAL`, :data:`SERVED_FRONTIER`, :data:`SPILLED`
(served by the frontier because admission spilled its run) or :data:`REJECTED`; a run's status is
0 (policy-routed), 1 (spilled) or 2 (rejected). :func:`scorecard` turns a :class:`SimResult` into
the ARCHITECTURE.md scorecard (keys :data:`SCORECARD_KEYS`, in order; each key is described in its
docstring and in ``training.eval``'s typed model of it), :func:`details` into the figures beside it
(cost split, cold starts, step outcomes, simulator speed, and the figures of the optional model
elements: cache hit rate per KV tier, KV format, speculative decoding, disaggregation, TPOT).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from router.core.accounting import gpu_usd
from router.core.figures import percentile, ratio, run_figures, step_figures
from router.sim.simconfig import SimConfig

__all__ = [
    "SERVED_LOCAL",
    "SERVED_FRONTIER",
    "SPILLED",
    "REJECTED",
    "SCORECARD_KEYS",
    "SimResult",
    "scorecard",
    "details",
]

SERVED_LOCAL, SERVED_FRONTIER, SPILLED, REJECTED = 1, 2, 3, 4

SCORECARD_KEYS: tuple[str, ...] = (
    "policy",
    "replicas",
    "kv_cache_gb",
    "runs_completed",
    "runs_rejected",
    "runs_spilled",
    "run_completion_s_p50",
    "run_completion_s_p95",
    "step_latency_s_p50",
    "step_latency_s_p95",
    "step_latency_s_p99",
    "short_step_latency_s_p95",
    "ttft_s_p95",
    "cache_hit_rate",
    "cache_hit_upper_bound",
    "cost_usd",
    "escalation_rate",
    "flaps_per_run",
    "slo_attainment",
)


@dataclass
class SimResult:
    """Per-step arrays (indexed by global step id) and per-run/totals of one simulation."""

    policy: str
    config: SimConfig
    outcome: np.ndarray
    latency: np.ndarray
    ttft: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    upper: np.ndarray
    short: np.ndarray
    step_index: np.ndarray
    run_of_step: np.ndarray
    run_completion_s: np.ndarray  # nan for runs not completed
    run_status: np.ndarray  # 0 policy-routed, 1 spilled, 2 rejected
    run_switches: np.ndarray
    run_frontier_steps: np.ndarray
    frontier_cost_usd: float
    gpu_hours: float
    cold_starts: int
    makespan_s: float
    wall_s: float
    cpu_s: float  # this process's CPU time (the machine is shared: wall time is noisy)
    events: int
    rate_limited: int
    iterations: int
    records: list[Any] | None = None  # each finished step's run-log record (SimConfig.log_steps)
    completion: np.ndarray | None = None  # output tokens per step
    tier_cached: np.ndarray | None = None  # (lower tiers, steps): tokens loaded from each tier
    tier_stats: list[dict[str, Any]] | None = None  # per lower tier, summed over replicas
    gpu_evictions: int = 0  # blocks the GPU prefix caches evicted
    disagg_stats: dict[str, Any] | None = None  # prefill/decode pools (router.sim.disagg)
    runs_unfit: int = 0  # of the rejected runs: a prompt never fits one replica's KV cache

    @property
    def local_cost_usd(self) -> float:
        return gpu_usd(self.gpu_hours * 3600.0, self.config.gpu_hour_usd)

    @property
    def cost_usd(self) -> float:
        return self.frontier_cost_usd + self.local_cost_usd


def _pct(x: np.ndarray, q: float) -> float | None:
    return _r(percentile(x, q))


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def scorecard(res: SimResult) -> dict[str, Any]:
    """The ARCHITECTURE.md scorecard of one simulation (keys: :data:`SCORECARD_KEYS`, in order).

    Served steps = local + frontier + spilled. Every figure is :mod:`router.core.figures`'s
    definition (short steps, cross-turn ``cache_hit_rate`` and ``cache_hit_upper_bound`` over local
    steps with index >= 1, ``escalation_rate`` and ``flaps_per_run`` over policy-routed runs, the
    run's switches from the step engine, ``slo_attainment`` at ``slo_short_s`` / ``slo_ttft_s``),
    rounded to 6 decimals. ``cost_usd`` = frontier tokens x prices + local GPU-hours x
    ``gpu_hour_usd`` (:mod:`router.core.accounting`).
    """
    cfg = res.config
    served = (res.outcome == SERVED_LOCAL) | (res.outcome == SERVED_FRONTIER) | (res.outcome == SPILLED)
    figs = step_figures(
        served=served,
        local=res.outcome == SERVED_LOCAL,
        step=res.step_index,
        prompt=res.prompt,
        cached=res.cached,
        upper=res.upper,
        latency=res.latency,
        ttft=res.ttft,
        short=res.short,
        slo_s=(cfg.slo_short_s, cfg.slo_ttft_s),
    )
    routed = res.run_status == 0
    completed = ~np.isnan(res.run_completion_s)
    esc, flaps = run_figures(res.run_frontier_steps[routed], res.run_switches[routed])
    card = {
        "policy": res.policy,
        "replicas": cfg.replicas,
        "kv_cache_gb": cfg.kv_cache_gb,
        "runs_completed": int(completed.sum()),
        "runs_rejected": int((res.run_status == 2).sum()),
        "runs_spilled": int((res.run_status == 1).sum()),
        "run_completion_s_p50": _pct(res.run_completion_s[completed], 50),
        "run_completion_s_p95": _pct(res.run_completion_s[completed], 95),
        **{
            k: _r(figs[k])
            for k in (
                "step_latency_s_p50",
                "step_latency_s_p95",
                "step_latency_s_p99",
                "short_step_latency_s_p95",
                "ttft_s_p95",
                "cache_hit_rate",
                "cache_hit_upper_bound",
            )
        },
        "cost_usd": round(res.cost_usd, 6),
        "escalation_rate": _r(esc),
        "flaps_per_run": _r(flaps),
        "slo_attainment": _r(figs["slo_attainment"]),
    }
    assert tuple(card) == SCORECARD_KEYS
    return card


def details(res: SimResult) -> dict[str, Any]:
    """Figures beside the scorecard: cost split, cold starts, step outcomes, simulator speed."""
    oc = res.outcome
    return {
        "policy": res.policy,
        "replicas": res.config.replicas,
        "kv_cache_gb": res.config.kv_cache_gb,
        "scale_to_zero": res.config.scale_to_zero,
        "node_profile": res.config.profile.name,
        "frontier_cost_usd": round(res.frontier_cost_usd, 6),
        "local_cost_usd": round(res.local_cost_usd, 6),
        "gpu_hours": round(res.gpu_hours, 6),
        "cold_starts": res.cold_starts,
        "cold_start_cost_usd": round(
            gpu_usd(
                res.cold_starts * sum(res.config.wake_s) / 2,
                res.config.gpu_hour_usd,
                res.config.profile.gpus_per_replica,
            ),
            6,
        ),
        "steps_local": int((oc == SERVED_LOCAL).sum()),
        "steps_frontier": int((oc == SERVED_FRONTIER).sum()),
        "steps_spilled": int((oc == SPILLED).sum()),
        "steps_rejected": int((oc == REJECTED).sum()),
        "makespan_s": round(res.makespan_s, 3),
        "rate_limited": res.rate_limited,
        "sim_wall_s": round(res.wall_s, 4),
        "sim_cpu_s": round(res.cpu_s, 4),
        "sim_steps_per_cpu_s": round(len(oc) / res.cpu_s, 1) if res.cpu_s else None,
        "events": res.events,
        "node_iterations": res.iterations,
        **_elements(res),
    }


def _elements(res: SimResult) -> dict[str, Any]:
    """Per-tier hit rates, KV format, speculative decoding, disaggregation, TPOT."""
    cfg = res.config
    out: dict[str, Any] = {
        "kv_dtype": cfg.kv_dtype,
        "kv_blocks_per_replica": cfg.kv_blocks(),
        "runs_rejected_kv_too_small": res.runs_unfit,
        "gpu_evicted_blocks": res.gpu_evictions,
    }
    local2 = (res.outcome == SERVED_LOCAL) & (res.step_index >= 1)
    ptok = float(res.prompt[local2].sum())
    if res.tier_cached is not None and res.tier_stats is not None:
        lower = res.tier_cached[:, local2].sum(axis=1)
        gpu = float(res.cached[local2].sum()) - float(lower.sum())
        out["cache_hit_rate_gpu"] = _r(ratio(gpu, ptok))
        for st, n in zip(res.tier_stats, lower, strict=True):
            out[f"cache_hit_rate_{st['tier']}"] = _r(ratio(float(n), ptok))
        out["kv_tiers"] = res.tier_stats
    if cfg.spec is not None:
        out["spec_decode"] = cfg.spec.describe()
    if res.disagg_stats is not None:
        out["disagg"] = {**res.disagg_stats, "kv_link_gbps": cfg.kv_link_gbps}
    if res.completion is not None:
        m = (res.outcome == SERVED_LOCAL) & (res.completion > 1)
        tpot = (res.latency[m] - res.ttft[m]) / (res.completion[m] - 1)
        out["tpot_s_p50"] = _pct(tpot, 50)
        out["tpot_s_p95"] = _pct(tpot, 95)
        if cfg.slo_tpot_s is not None:
            served = (
                (res.outcome == SERVED_LOCAL) | (res.outcome == SERVED_FRONTIER) | (res.outcome == SPILLED)
            )
            c = res.completion[served]
            per = np.where(c > 1, (res.latency[served] - res.ttft[served]) / np.maximum(c - 1, 1), 0.0)
            good = (res.ttft[served] <= cfg.slo_ttft_s) & (per <= cfg.slo_tpot_s)
            out["goodput_share"] = _r(float(good.mean())) if good.size else None
    return out
