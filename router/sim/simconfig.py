"""The configuration of one what-if simulation (one capacity point).

Knobs (:class:`SimConfig`): ``profile`` (the node's step-time coefficients and limits),
``replicas``, ``kv_cache_gb`` (per replica), ``block_tokens`` (512: the Mooncake block size; also
the KV allocation unit), ``frontier`` (:class:`~router.sim.frontier.FrontierConfig`),
``gpu_hour_usd`` (0.20 per GPU), ``scale_to_zero``, ``wake_s`` (267-282 s), ``idle_reap_s``
(1800 s), ``slo_short_s`` (p95 target and per-step SLO of short steps), ``slo_ttft_s`` (per-step
SLO of long steps: their TTFT), ``local_model``, ``seed``, ``fast_forward`` (False = step every
decode iteration; same results, slower: the reference in tests), ``log_steps`` (keep every step's
run-log record, :class:`features.schema.Step`, on the result: a simulated deployment's log),
``scrape`` (True: the router reads each replica's vLLM ``/metrics`` — running, waiting, KV usage,
prefix-cache counters — modelled as exact; False: as a sidecar with ``scrape.interval_s: 0``, it
sees only its own in-flight requests and no cache-pressure signal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.workload import SimError

__all__ = ["SimConfig"]


@dataclass
class SimConfig:
    profile: NodeProfile
    replicas: int = 2
    kv_cache_gb: float = 16.0
    block_tokens: int = 512
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    gpu_hour_usd: float = 0.20
    scale_to_zero: bool = False
    wake_s: tuple[float, float] = (267.0, 282.0)
    idle_reap_s: float = 1800.0
    slo_short_s: float = 5.0
    slo_ttft_s: float = 5.0
    local_model: str = "local"
    seed: int = 0
    fast_forward: bool = True  # False: one event per decode iteration (the reference for tests)
    log_steps: bool = False  # keep each step's run-log record on the result
    scrape: bool = True  # the router reads the replicas' /metrics (False: only its own in-flight count)

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise SimError("replicas must be >= 0")
        if self.kv_cache_gb <= 0:
            raise SimError("kv_cache_gb must be > 0")
        if self.wake_s[0] > self.wake_s[1] or self.wake_s[0] < 0:
            raise SimError("wake_s must be (low, high) with 0 <= low <= high")
        if self.gpu_hour_usd < 0:
            raise SimError("gpu_hour_usd must be >= 0")

    def kv_blocks(self) -> int:
        return self.profile.kv_capacity_tokens(self.kv_cache_gb) // self.block_tokens
