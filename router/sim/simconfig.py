"""The configuration of one what-if simulation (one capacity point).

Knobs (:class:`SimConfig`): ``profile`` (the node's step-time coefficients and limits),
``replicas``, ``kv_cache_gb`` (per replica), ``block_tokens`` (512: the Mooncake block size; also
the KV allocation unit), ``frontier`` (:class:`~router.sim.frontier.FrontierConfig`),
``gpu_hour_usd`` (per GPU; default :mod:`router.policy.defaults`), ``scale_to_zero``, ``wake_s`` (267-282 s), ``idle_reap_s``
(1800 s), ``slo_short_s`` (:mod:`router.policy.defaults`; p95 target and per-step SLO of short steps), ``slo_ttft_s`` (per-step
SLO of long steps: their TTFT; :mod:`router.policy.defaults`), ``slo_tpot_s`` (None; when set, details report the goodput share:
served steps with TTFT <= ``slo_ttft_s`` and time per output token <= it, DistServe's measure),
``local_model``, ``seed``, ``fast_forward`` (False = step every
decode iteration; same results, slower: the reference in tests), ``log_steps`` (keep every step's
run-log record, :class:`features.schema.Step`, on the result: a simulated deployment's log),
``scrape`` (True: the router reads each replica's vLLM ``/metrics`` — running, waiting, KV usage,
prefix-cache counters — modelled as exact; False: as a sidecar with ``scrape.interval_s: 0``, it
sees only its own in-flight requests and no cache-pressure signal).

KV quantisation: ``kv_dtype`` (``fp16``/``bf16`` 2 bytes per element, ``fp8`` 1, ``int4`` 0.5 and
``int2`` 0.25 plus, for the two integer formats, an fp16 scale and zero point per
``kv_quant_group`` elements, KIVI-style: 4 / group bytes per element). The profile's
``kv_bytes_per_token`` is taken as fp16; the node's bytes per token scale by bytes per element / 2,
so the same ``kv_cache_gb`` holds more blocks (and lower tiers and KV transfers move fewer bytes).
``kv_read_scales`` (False) also scales the decode KV-read coefficient ``d`` by that ratio (decode
attention bound by memory bandwidth; dequantisation cost not modelled). Accuracy is not modelled:
:func:`kv_quant_note` says so in the report. KIVI's fp16 residual window is not modelled.

Lower KV tiers per replica (:mod:`router.sim.kvtier`; 0 GB = off): ``cpu_kv_gb`` (or ``cpu_kv_x``, a
multiple of ``kv_cache_gb``, used when ``cpu_kv_gb`` is 0; the same for SSD), ``cpu_kv_gbps``
(25: an assumption, ~80% of PCIe 4.0 x16's 32 GB/s), ``cpu_kv_latency_s`` (0.001, assumed);
``ssd_kv_gb``, ``ssd_kv_gbps`` (5, assumed NVMe read), ``ssd_kv_latency_s`` (0.002, assumed).
``cpu_kv_global`` (False): one CPU pool shared by every tiered replica (Mooncake's store) instead of
one per replica, of their summed size, read at ``cpu_kv_gbps`` (:mod:`router.sim.kvtier`).

Speculative decoding: ``spec`` (a :class:`~router.sim.specdec.SpecDecode`, None = off).

Disaggregation (:mod:`router.sim.disagg`): ``disagg_prefill`` (0 = co-located chunked prefill;
``P > 0``: of the ``replicas`` GPUs, P are prefill-only replicas, the router's local backends, and
``replicas - P`` decode-only), ``kv_link_gbps`` (prefill -> decode KV transfer bandwidth per
prefill replica, GB/s) and ``kv_link_latency_s`` (per transfer).

A deployment description (:class:`router.policy.deployment.Deployment`, what ``runroute serve
--config`` serves) gives a config with :meth:`SimConfig.for_deployment`: its GPU price, short-step
and TTFT SLOs, frontier prices, and its KV size and replica count where it states them.

Tensor parallelism (:func:`router.sim.disagg.tp_profile`): ``tp`` (GPUs per replica sharding the
model, every replica; 1 = the profile as fitted), ``tp_decode`` (the decode pool's degree when
disaggregated; 0 = ``tp``), ``tp_efficiency`` (0.8, an assumption, not fitted: the share of the
t-fold speed-up left after the all-reduces). A TP-t replica costs t GPUs and holds t x the KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from router.policy.defaults import GPU_HOUR_USD, KV_CACHE_GB, SLO_SHORT_STEP_S, SLO_TTFT_S
from router.policy.deployment import Deployment
from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.specdec import SpecDecode
from router.sim.workload import SimError

__all__ = ["SimConfig", "KV_DTYPES", "kv_bytes_per_element", "kv_quant_note"]

KV_DTYPES: dict[str, float] = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int4": 0.5, "int2": 0.25}


def kv_bytes_per_element(dtype: str, group: int = 32) -> float:
    """Bytes per KV element of ``dtype`` (integer formats: + an fp16 scale and zero per ``group``)."""
    if dtype not in KV_DTYPES:
        raise SimError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {dtype!r}")
    b = KV_DTYPES[dtype]
    if dtype in ("int4", "int2") and group > 0:
        b += 4.0 / group
    return b


def kv_quant_note(dtype: str) -> str | None:
    """The accuracy-risk note of a KV format (None for fp16/bf16). No accuracy figure is modelled."""
    if dtype in ("fp16", "bf16"):
        return None
    if dtype == "fp8":
        return (
            "fp8 KV cache (vLLM --kv-cache-dtype fp8): the simulator models capacity only, not accuracy; "
            "check task success (e.g. tau-bench reward) with and without before relying on it"
        )
    return (
        f"{dtype} KV cache (KIVI-style, per-group scales): capacity only, accuracy NOT modelled; needs a "
        "kernel vLLM's --kv-cache-dtype does not offer (fp8 only) and a measurement of task success on "
        "your own runs before any use"
    )


@dataclass
class SimConfig:
    profile: NodeProfile
    replicas: int = 2
    kv_cache_gb: float = KV_CACHE_GB
    block_tokens: int = 512
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    gpu_hour_usd: float = GPU_HOUR_USD
    scale_to_zero: bool = False
    wake_s: tuple[float, float] = (267.0, 282.0)
    idle_reap_s: float = 1800.0
    slo_short_s: float = SLO_SHORT_STEP_S
    slo_ttft_s: float = SLO_TTFT_S
    slo_tpot_s: float | None = None
    local_model: str = "local"
    seed: int = 0
    fast_forward: bool = True  # False: one event per decode iteration (the reference for tests)
    log_steps: bool = False  # keep each step's run-log record on the result
    scrape: bool = True  # the router reads the replicas' /metrics (False: only its own in-flight count)
    kv_dtype: str = "fp16"
    kv_quant_group: int = 32
    kv_read_scales: bool = False
    cpu_kv_gb: float = 0.0
    cpu_kv_x: float = 0.0
    cpu_kv_gbps: float = 25.0
    cpu_kv_latency_s: float = 0.001
    ssd_kv_gb: float = 0.0
    ssd_kv_x: float = 0.0
    ssd_kv_gbps: float = 5.0
    ssd_kv_latency_s: float = 0.002
    cpu_kv_global: bool = False
    spec: SpecDecode | None = None
    disagg_prefill: int = 0
    kv_link_gbps: float = 50.0
    kv_link_latency_s: float = 0.0005
    tp: int = 1
    tp_decode: int = 0
    tp_efficiency: float = 0.8

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise SimError("replicas must be >= 0")
        if self.kv_cache_gb <= 0:
            raise SimError("kv_cache_gb must be > 0")
        if self.wake_s[0] > self.wake_s[1] or self.wake_s[0] < 0:
            raise SimError("wake_s must be (low, high) with 0 <= low <= high")
        if self.gpu_hour_usd < 0:
            raise SimError("gpu_hour_usd must be >= 0")
        kv_bytes_per_element(self.kv_dtype, self.kv_quant_group)
        if min(self.cpu_kv_gb, self.ssd_kv_gb, self.cpu_kv_x, self.ssd_kv_x) < 0:
            raise SimError("cpu_kv_gb/_x and ssd_kv_gb/_x must be >= 0")
        if self.ssd_gb() > 0 and self.cpu_gb() <= 0:
            raise SimError("an SSD KV tier needs a CPU tier above it (cpu_kv_gb > 0)")
        if min(self.cpu_kv_gbps, self.ssd_kv_gbps, self.kv_link_gbps) <= 0:
            raise SimError("tier and link bandwidths must be > 0")
        if self.disagg_prefill < 0 or (self.disagg_prefill and self.disagg_prefill >= self.replicas):
            raise SimError("disagg_prefill must leave at least one decode replica (0 < P < replicas)")
        if self.cpu_kv_global and (self.ssd_gb() > 0 or self.scale_to_zero):
            raise SimError("a global CPU KV pool is modelled without an SSD tier and without scale-to-zero")
        if self.tp < 1 or self.tp_decode < 0 or not 0 < self.tp_efficiency <= 1:
            raise SimError("tp must be >= 1, tp_decode >= 0 (0: tp) and 0 < tp_efficiency <= 1")

    @classmethod
    def for_deployment(
        cls, dep: Deployment, profile: NodeProfile, frontier: FrontierConfig | None = None
    ) -> SimConfig:
        """The simulated node of ``dep`` on ``profile``: ``frontier`` (its timing; default
        :class:`FrontierConfig`'s) priced at ``dep``'s frontier prices."""
        fr = replace(
            frontier or FrontierConfig(),
            price_in_per_m=dep.frontier.price_in_per_m,
            price_cached_in_per_m=dep.frontier.price_cached_in_per_m,
            price_out_per_m=dep.frontier.price_out_per_m,
        )
        cfg = cls(
            profile=profile,
            frontier=fr,
            gpu_hour_usd=dep.gpu_hour_usd,
            slo_short_s=dep.slo_short_step_s,
            slo_ttft_s=dep.slo.ttft_s,
        )
        if dep.node.kv_cache_gb is not None:
            cfg = replace(cfg, kv_cache_gb=dep.node.kv_cache_gb)
        if dep.replicas is not None:
            cfg = replace(cfg, replicas=dep.replicas)
        return cfg

    def pool_tp(self, role: str) -> int:
        """The tensor-parallel degree of a replica of ``role`` (both, prefill or decode)."""
        return self.tp_decode if role == "decode" and self.tp_decode else self.tp

    def kv_scale(self) -> float:
        """Node KV bytes per token / the profile's (fp16) bytes per token."""
        return kv_bytes_per_element(self.kv_dtype, self.kv_quant_group) / 2.0

    def kv_bytes_per_token(self) -> float:
        return self.profile.kv_bytes_per_token * self.kv_scale()

    def node_profile(self) -> NodeProfile:
        """The profile the replicas run (``d`` scaled when ``kv_read_scales``)."""
        if self.kv_read_scales and self.kv_scale() != 1.0:
            return replace(self.profile, d=self.profile.d * self.kv_scale())
        return self.profile

    def kv_blocks(self) -> int:
        return int(self.kv_cache_gb * 1e9 // self.kv_bytes_per_token()) // self.block_tokens

    def cpu_gb(self) -> float:
        """The CPU tier's size per replica: ``cpu_kv_gb``, else ``cpu_kv_x`` times ``kv_cache_gb``."""
        return self.cpu_kv_gb if self.cpu_kv_gb > 0 else self.cpu_kv_x * self.kv_cache_gb

    def ssd_gb(self) -> float:
        return self.ssd_kv_gb if self.ssd_kv_gb > 0 else self.ssd_kv_x * self.kv_cache_gb

    @property
    def tiers_on(self) -> bool:
        return self.cpu_gb() > 0
