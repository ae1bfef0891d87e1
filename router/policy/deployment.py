"""The deployment description: the facts of one deployment that serving, simulation and evaluation share.

A deployment is what ``runroute serve --config FILE`` serves: its tiers and backends, their prices,
the local node (GPU profile, KV cache per replica, replica count), the SLOs and admission control.
The sidecar's :class:`router.server.settings.RouterSettings` is built from the same file and *is*
this description for its deployment part: its ``slo`` is :class:`SLOTargets`, its ``node`` is
:class:`NodeSpec`, its ``admission`` extends :class:`~router.policy.admission.AdmissionConfig`, and
each frontier entry inherits its prices from :class:`FrontierPrices`. :meth:`Deployment.from_mapping`
reads the deployment part of such a file *without* the serving-only checks (an API key in the
environment, a loadable bundle), so ``runroute whatif --config FILE`` on a planning machine answers
for exactly the deployment the sidecar serves; ``RouterSettings.deployment()`` gives the same object
from a loaded sidecar config (``tests/test_one_deployment.py`` checks that they agree).

Algorithm (how each value is resolved; the CLI's ``--show-config`` prints the source of each):

- frontier prices: the default frontier entry's (``default: true``, else the first of ``frontier``
  then ``frontiers``); no frontier: the defaults of :mod:`router.policy.defaults`.
- GPU price: ``local.gpu_usd_per_hour`` when > 0, else the learned policy's
  ``policy.local_gpu_usd_per_hour``, else ``GPU_HOUR_USD`` (the order the sidecar's cost model uses).
- replicas: ``node.replicas``, else one per ``local.urls`` entry, else None (the command's own
  default, e.g. whatif's grid).
- node profile and KV size: ``node.gpu`` / ``node.profile`` / ``node.kv_cache_gb`` (None = the
  command derives it: whatif from the profile's memory, others ``KV_CACHE_GB``).
- SLOs: ``admission.slo_short_step_s`` (short steps), ``slo.ttft_s`` (long steps' TTFT),
  ``slo.step_latency_s``, ``slo.short_step_tokens``; admission: the ``admission`` mapping.

Knobs: every default is a constant of :mod:`router.policy.defaults`; nothing here adds one.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from router.policy.admission import AdmissionConfig
from router.policy.defaults import (
    FRONTIER_CACHED_IN_PER_M,
    FRONTIER_IN_PER_M,
    FRONTIER_OUT_PER_M,
    GPU_HOUR_USD,
    SHORT_STEP_TOKENS,
    SLO_STEP_S,
    SLO_TTFT_S,
)

__all__ = ["FrontierPrices", "SLOTargets", "NodeSpec", "Deployment", "default_frontier_entry"]


class FrontierPrices(BaseModel):
    """A frontier's prices, USD per 1M tokens (``price_cache_write_per_m`` None = the input price)."""

    model_config = ConfigDict(extra="ignore")

    price_in_per_m: float = Field(default=FRONTIER_IN_PER_M, ge=0)
    price_cached_in_per_m: float = Field(default=FRONTIER_CACHED_IN_PER_M, ge=0)
    price_cache_write_per_m: float | None = Field(default=None, ge=0)
    price_out_per_m: float = Field(default=FRONTIER_OUT_PER_M, ge=0)

    def cache_write_per_m(self) -> float:
        """The cache-write price in effect (the input price when none is set)."""
        w = self.price_cache_write_per_m
        return self.price_in_per_m if w is None else w


class SLOTargets(BaseModel):
    """Per-step targets: ``ttft_s`` (long steps' time to first token), ``step_latency_s`` (the
    sidecar's SLO-attainment metric), ``short_step_tokens`` (short vs long in the histograms). The
    short-step SLO is admission's ``slo_short_step_s`` (the gate admits against it)."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: float = Field(default=SLO_TTFT_S, gt=0)
    step_latency_s: float = Field(default=SLO_STEP_S, gt=0)
    short_step_tokens: int = Field(default=SHORT_STEP_TOKENS, ge=0)


class NodeSpec(BaseModel):
    """The local node: ``gpu`` (profile family: a100 | h100), ``profile`` (a shipped profile name or a
    JSON path; None = the family's default), ``kv_cache_gb`` (per replica; None = derived by the
    command), ``replicas`` (None = one per ``local.urls``). The sidecar serves what its URLs are;
    these describe the node for whatif / bench / evaluate."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = "a100"
    profile: str | None = None
    kv_cache_gb: float | None = Field(default=None, gt=0)
    replicas: int | None = Field(default=None, ge=0)


class Deployment(BaseModel):
    """The resolved deployment (module docstring: where each value comes from)."""

    model_config = ConfigDict(extra="forbid")

    frontier: FrontierPrices = Field(default_factory=FrontierPrices)
    gpu_hour_usd: float = Field(default=GPU_HOUR_USD, ge=0)
    node: NodeSpec = Field(default_factory=NodeSpec)
    replicas: int | None = Field(default=None, ge=0)
    slo: SLOTargets = Field(default_factory=SLOTargets)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)

    @property
    def slo_short_step_s(self) -> float:
        return self.admission.slo_short_step_s

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Deployment:
        """The deployment part of a sidecar config mapping (YAML file merged with env); raises
        ``pydantic.ValidationError`` / ``ValueError`` on a bad value. Serving-only sections are
        not validated here (``RouterSettings`` does that for ``serve``)."""
        local = data.get("local")
        local_m = local if isinstance(local, Mapping) else {}
        node = data.get("node") or {}
        replicas = node.get("replicas") if isinstance(node, Mapping) else None
        urls = local_m.get("urls")
        if replicas is None and isinstance(urls, list | tuple):
            replicas = len(urls)
        adm = data.get("admission") or {}
        if isinstance(adm, Mapping):  # the sidecar's own admission knobs are not the deployment's
            adm = {k: v for k, v in adm.items() if k in AdmissionConfig.model_fields}
        return cls.model_validate(
            {
                "frontier": default_frontier_entry(data) or {},
                "gpu_hour_usd": _gpu_hour_usd(local_m, data.get("policy")),
                "node": node,
                "replicas": replicas,
                "slo": data.get("slo") or {},
                "admission": adm,
            }
        )


def default_frontier_entry(data: Mapping[str, object]) -> Mapping[str, object] | None:
    """The frontier mapping whose prices the deployment bills (``default: true``, else the first)."""
    entries: list[Mapping[str, object]] = []
    one = data.get("frontier")
    if isinstance(one, Mapping):
        entries.append(one)
    many = data.get("frontiers")
    if isinstance(many, list):
        entries += [e for e in many if isinstance(e, Mapping)]
    for e in entries:
        if e.get("default") is True:
            return e
    return entries[0] if entries else None


def _gpu_hour_usd(local: Mapping[str, object], policy: object) -> float:
    """local.gpu_usd_per_hour (> 0), else the learned policy's local_gpu_usd_per_hour, else the default."""
    own = local.get("gpu_usd_per_hour")
    if isinstance(own, int | float | str) and float(own) > 0:
        return float(own)
    shared = policy.get("local_gpu_usd_per_hour") if isinstance(policy, Mapping) else None
    if isinstance(shared, int | float | str):
        return float(shared)
    return GPU_HOUR_USD
