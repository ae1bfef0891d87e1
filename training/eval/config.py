"""The two deployments an evaluation runs policies on: simulated (:class:`SimSettings`) and live
(:class:`LiveSettings`).

- :class:`SimSettings`: the what-if simulator's deployment every policy is compared on
  (:func:`training.eval.compare.compare_policies`): local replicas of a node profile, KV cache per
  replica, Poisson run starts, the per-step SLO of short steps, admission control on or off, a seed.
- :class:`LiveSettings`: the short live segment (:func:`training.eval.live.live_segment`): a few
  runs per policy driven through the real HTTP sidecar against fake backends, bounded in steps,
  prompt / completion size and wall-clock time.

Every knob is a field below, with its meaning in its description. A deployment description
(:class:`router.policy.deployment.Deployment`, the file ``runroute serve --config`` serves from)
gives both the simulated deployment (:meth:`SimSettings.from_deployment`: replicas, node profile,
KV size, SLOs, admission on/off) and the prices (:func:`prices_for`: frontier prices and GPU-hour
price of :class:`training.eval.outcome.Prices`); a command-line value passed as an override wins.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.policy.defaults import KV_CACHE_GB, SLO_SHORT_STEP_S, SLO_TTFT_S
from router.policy.deployment import Deployment
from training.eval.outcome import Prices

__all__ = ["SimSettings", "LiveSettings", "prices_for"]


class SimSettings(BaseModel):
    """The simulated deployment every policy is compared on."""

    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(default=2, ge=1, description="local vLLM replicas")
    kv_cache_gb: float = Field(default=KV_CACHE_GB, gt=0, description="KV cache per replica (GB)")
    gpu: str = Field(default="a100", description="node profile family (router.sim.profiles)")
    profile: str | None = Field(
        default=None, description="node profile name or JSON path (None: the family's default)"
    )
    arrival_rate: float = Field(
        default=0.1, gt=0, description="run starts per second (Poisson) in the held-out replay"
    )
    slo_short_s: float = Field(default=SLO_SHORT_STEP_S, gt=0, description="per-step SLO of short steps (s)")
    slo_ttft_s: float = Field(default=SLO_TTFT_S, gt=0, description="per-step SLO of long steps: TTFT (s)")
    admission: bool = Field(
        default=True, description="consult router.policy.admission at each run's first step (spill/reject)"
    )
    seed: int = Field(default=0, description="seed of the run starts and the simulator's latency draws")

    @classmethod
    def from_deployment(cls, dep: Deployment, **overrides: object) -> SimSettings:
        """The simulated deployment of ``dep`` (what it states; the rest default), then ``overrides``."""
        data: dict[str, object] = {
            "gpu": dep.node.gpu,
            "profile": dep.node.profile,
            "slo_short_s": dep.slo_short_step_s,
            "slo_ttft_s": dep.slo.ttft_s,
            "admission": dep.admission.enabled,
        }
        if dep.replicas:  # a deployment without local replicas keeps the evaluation's default
            data["replicas"] = dep.replicas
        if dep.node.kv_cache_gb is not None:
            data["kv_cache_gb"] = dep.node.kv_cache_gb
        return cls.model_validate({**data, **overrides})


class LiveSettings(BaseModel):
    """The short live segment through the real sidecar with fake backends."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="run the live segment at all")
    runs_per_policy: int = Field(default=4, ge=1, description="runs driven concurrently per policy")
    max_steps: int = Field(default=10, ge=1, description="steps per run at most")
    budget_s: float = Field(default=60.0, gt=0, description="wall-clock budget of the whole segment")
    max_prompt_tokens: int = Field(default=8000, ge=64, description="prompts are capped at this size")
    max_completion_tokens: int = Field(default=96, ge=1, description="completions are capped at this size")


def prices_for(dep: Deployment, **overrides: object) -> Prices:
    """The evaluation's :class:`~training.eval.outcome.Prices` of ``dep`` (its default frontier's
    prices and its GPU-hour price), then ``overrides`` (e.g. ``gpu_hour_usd`` from a flag)."""
    data: dict[str, object] = {
        "frontier_in_per_m": dep.frontier.price_in_per_m,
        "frontier_cached_in_per_m": dep.frontier.price_cached_in_per_m,
        "frontier_out_per_m": dep.frontier.price_out_per_m,
        "gpu_hour_usd": dep.gpu_hour_usd,
    }
    return Prices.model_validate({**data, **overrides})
