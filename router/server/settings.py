"""Settings of the routing sidecar (``runroute serve``), one pydantic model per component.

Sources, lowest priority first: the embedded defaults below, the YAML file given to
:meth:`RouterSettings.load` (``runroute serve --config runroute.yaml``), then environment variables
``RUNROUTE_<FIELD>`` with ``__`` between nested fields (``RUNROUTE_FRONTIER__MODEL=gpt-4.1``,
``RUNROUTE_SERVER__PORT=9000``). Environment variables win over the file, so one file can serve
several deployments.

Knobs (see ``runroute.example.yaml`` for a documented file):

- ``context`` (:mod:`router.server.runs.context`): how a run's domain is known (``domain_header``,
  ``tenant_domains``, ``agent_header``, ``agent_domains``; else ``metadata.domain``, else a hash of
  the system prompt) and its task embedding (``embed``: auto / on / off, ``embed_executor``,
  ``embed_sched``, ``embed_nice``, ``embed_cache``, ``embed_wait_ms``, ``embed_queue``,
  ``embed_max_per_s``, ``embed_batch``, ``embed_defer_ms``).
- ``local``: the local tier: ``urls`` (one vLLM server root per replica, e.g. ``http://10.0.0.5:8000``;
  a trailing ``/v1`` is accepted), ``model`` (the served model name sent upstream), ``names`` (replica
  ids, default ``local-0..``), ``max_context``, ``kv_cache_tokens`` (one replica's KV cache size in
  tokens, the denominator of the ``local_cache_pressure`` feature; unset = each replica's scraped
  ``vllm:cache_config_info`` ``num_gpu_blocks x block_size``; the feature is NaN when neither is known).
- ``local.protocols``: the client APIs a replica serves itself (vLLM: ``chat``, ``responses``,
  ``messages``); a request in another protocol is translated to chat. ``local.models``: model
  names (fnmatch patterns, e.g. ``claude-*`` for Claude Code without an Anthropic frontier) a
  client may send; the policy still decides, the local model name is sent upstream.
- ``frontier`` (one) and/or ``frontiers`` (a list; names unique): frontier backends. Each has a
  ``kind``: ``openai`` (``url`` base, Bearer key; chat + responses), ``anthropic`` (Messages,
  ``x-api-key`` + ``anthropic-version``), ``azure`` (``url`` = the resource, ``deployment``,
  ``api_version``, ``api-key`` header; chat + responses), ``openai-compatible`` (any base URL with
  ``chat_path`` / ``responses_path`` (unset = not served) and ``auth_header`` / ``auth_scheme``,
  e.g. Gemini's ``/v1beta/openai``); ``model`` (sent upstream), ``models`` (names or fnmatch
  patterns a client may request that map to this entry while the policy still chooses the tier,
  e.g. ``claude-*``; ``pass_model: true`` sends the client's name upstream), ``default`` (the frontier the policy escalates auto requests to; the first
  entry when none says so), prices per 1M tokens (``price_in_per_m``, ``price_cached_in_per_m``,
  ``price_cache_write_per_m``: Anthropic's cache-write price, unset = the input price),
  ``api_key_env`` (the *name* of the env var holding the key; the key itself never appears in
  config or logs). A frontier whose key variable is unset or empty is refused at load time
  unless ``allow_no_key: true`` (fakes on loopback only).
- ``identity``: run identity and lifecycle (:mod:`router.server.runs.identity`): ``idle_end_s`` (a run
  idle this long is ended, its admission slot released; default 900 s = 1.25 x the largest
  tool-pause p99 of the shipped run logs (Mooncake 690 s; tau2-bench 4.6 s), rounded up to a
  minute), ``reopen_gap_s`` (an identical opening after this idle gap starts a new run),
  ``sweep_s`` (how often idle runs are looked for; 0 = never), ``response_store_entries``
  (Responses chains kept for ``previous_response_id``), ``session_header``.
- ``policy``: the decision layer's config, a discriminated union on ``kind`` (``learned``,
  ``always-local``, ``always-frontier``, ``per-step-threshold``, ``session-sticky``,
  ``stall-escalation``), validated by :mod:`router.policy.config`.
- ``bundle``: where the learned model bundle comes from: ``path`` (a bundle directory) or
  ``mlflow_uri`` (``models:/runroute-bundle@champion`` or ``models:/runroute-bundle/3``) with
  ``mlflow_tracking_uri``; ``watch_s`` polls the path's mtime or the alias's version for hot
  reload (0 turns the watcher off). A source set in the environment replaces the file's.
- ``slo``: per-step targets (defaults in :mod:`router.policy.defaults`, shared with whatif and the
  evaluation): ``ttft_s`` (long steps' TTFT; the simulator scores against it), ``step_latency_s``
  (the SLO-attainment metric); ``short_step_tokens`` splits short vs long steps in the histograms.
  The short-step SLO is ``admission.slo_short_step_s``.
- ``node``: the local node as the planning commands see it (:class:`router.policy.deployment.NodeSpec`):
  ``gpu`` (a100 | h100), ``profile`` (a node profile name or JSON path), ``kv_cache_gb`` (per
  replica), ``replicas`` (unset = one per ``local.urls``). ``serve`` does not read them;
  ``whatif``, ``bench``, ``evaluate``, ``train``, ``replay``, ``loop`` and ``demo`` given the same
  ``--config`` do (:meth:`RouterSettings.deployment`).
- ``timeouts``: ``connect_s`` (TCP connect to an upstream), ``first_byte_s`` (until response headers
  / the first byte), ``total_s`` (whole upstream request).
- ``fallback``: ``enabled`` (retry once on the other tier on connect error / 5xx before the first
  byte), ``on_requested_model`` (also for requests that named a concrete model).
- ``server``: ``host``, ``port``, ``max_body_bytes`` (413 above), ``max_json_depth`` (422
  ``body_too_deep`` above), ``max_headers`` / ``max_header_bytes`` (431 above: count and total
  size of the request headers), ``api_keys`` (client bearer keys; empty = no auth; a run belongs
  to the key that started it), ``api_keys_env`` (name of an env var with comma-separated keys),
  ``admin_keys`` / ``admin_keys_env`` (the only keys ``/admin/*`` accepts; see
  :mod:`router.server.auth`), ``metrics_keys`` / ``metrics_keys_env`` (``/metrics`` needs one, or
  an admin key, when set), ``run_history_steps`` / ``run_history_runs`` (bounded in-memory history
  behind ``/v1/runs``); connection limits (:mod:`router.server.limits`, defaults in
  docs/server-limits.md): ``header_timeout_s``, ``idle_timeout_s``, ``body_timeout_s``,
  ``max_connections`` (503 beyond); ``upstream_client`` (``lean``, the default: a ``POST`` to a
  plain ``http://`` upstream goes through :mod:`router.server.hotpath.h1client`, the same
  ``timeouts`` and error kinds; ``aiohttp``: every request through aiohttp's client, as before).
- ``runlog``: ``dir``, ``log_prompts`` (false: no prompt text is ever written), ``durability``
  (``batched``: records fsynced at least every ``flush_s``, a SIGKILL loses at most the last
  ``flush_s`` seconds of records; ``ack``: a step's response completes only after its record is
  fsynced, group-committed), ``flush_s`` (fsync period, at most 1 s), ``queue_max``, ``rotate_bytes``.
- ``scrape``: ``interval_s`` (each local replica's ``/metrics``; 0 turns scraping off),
  ``timeout_s``, ``unhealthy_after`` (consecutive failed scrapes before a replica is unhealthy).
- ``store``: run-state store: ``kind`` (``memory`` | ``redis``), ``redis_url``, ``ttl_s``,
  ``admit_ttl_s``, ``key_prefix``; Redis only: ``router_slots`` / ``router_slot`` / ``step_gap``
  (router-scoped step numbering while Redis is unreachable,
  :mod:`router.server.state.fallback`), ``health_check_s`` (pooled connections idle longer are
  PINGed before use), ``epoch_check_s`` / ``reset_settle_s`` (a Redis that lost its data without
  dropping connections: noticed by the epoch watch; a run without a counter waits for the settle).
- ``admission``: admission control at a run's first step (:mod:`router.server.hotpath.admission`,
  :mod:`router.policy.admission`); **on by default** with conservative figures derived from the
  local tier (see :class:`AdmissionSettings`), e.g. ``RUNROUTE_ADMISSION__ENABLED=false``,
  ``RUNROUTE_ADMISSION__SLO_SHORT_STEP_S=1.5``, ``RUNROUTE_ADMISSION__REPLICA_TOKENS_PER_S=4000``.
- ``tracing``: OpenTelemetry spans per step, off by default (:class:`TracingSettings`).
- ``metrics``: ``deprecated_names`` (the 0.1 metric names as aliases for one release).
- ``runtime`` (:mod:`router.server.loopwatch`): the event-loop stall monitor (``stall_monitor``,
  off by default; ``stall_threshold_ms``, ``stall_path``, ...) and the collector (``gc_freeze``,
  ``gc_threshold0..2``, ``gc_refreeze``, ``gc_full_s``, ``gc_step_s``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from router.policy.admission import AdmissionConfig
from router.policy.deployment import Deployment, NodeSpec, SLOTargets
from router.server.loopwatch import RuntimeSettings
from router.server.runs.context import RunContextSettings
from router.server.settings_tiers import (
    FrontierTier,
    IdentitySettings,
    LocalTier,
    ProtocolName,
    SettingsError,
    StrictModel,
)

_Strict = StrictModel

__all__ = [
    "LocalTier",
    "FrontierTier",
    "BundleSource",
    "SLOSettings",
    "NodeSpec",
    "Deployment",
    "Timeouts",
    "FallbackSettings",
    "ServerSettings",
    "RunLogSettings",
    "ScrapeSettings",
    "StoreSettings",
    "AdmissionSettings",
    "IdentitySettings",
    "TracingSettings",
    "MetricsSettings",
    "UiSettings",
    "RunContextSettings",
    "RouterSettings",
    "SettingsError",
    "ProtocolName",
]


class BundleSource(_Strict):
    """Where the learned bundle comes from: ``path`` or ``mlflow_uri`` (``models:/NAME@ALIAS`` or
    ``models:/NAME/VERSION``), not both; an empty string counts as unset (``RUNROUTE_BUNDLE__PATH=""``).
    ``mlflow_tracking_uri``: unset = ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the
    working directory (the default of ``runroute train``). ``watch_s``: seconds between probes of
    the path's mtime or of the version the alias points at (0 = no following)."""

    path: Path | None = None
    mlflow_uri: str | None = None
    mlflow_tracking_uri: str | None = None
    watch_s: float = Field(default=2.0, ge=0)

    @field_validator("path", "mlflow_uri", "mlflow_tracking_uri", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("mlflow_uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        if v is not None:
            from models.bundle import parse_model_uri

            parse_model_uri(v)  # BundleError is a ValueError: becomes a one-line settings error
        return v

    @model_validator(mode="after")
    def _one(self) -> BundleSource:
        if self.path is not None and self.mlflow_uri is not None:
            raise ValueError("bundle: give either path or mlflow_uri, not both")
        return self

    def tracking_uri(self) -> str | None:
        """The tracking URI the registry source uses (see the class docstring); None for a path."""
        if self.mlflow_uri is None:
            return None
        from models.bundle import default_tracking_uri

        return default_tracking_uri(self.mlflow_tracking_uri)


class TracingSettings(_Strict):
    """OpenTelemetry tracing (:mod:`router.server.tracing`), off by default.

    ``enabled``: a span per step (``runroute.step``) with the upstream call as its child
    (``runroute.upstream``) and W3C ``traceparent`` sent to the backend; ``exporter``: ``otlp``
    (OTLP/HTTP to ``endpoint``, needs the ``opentelemetry-exporter-otlp-proto-http`` package),
    ``console`` (stdout) or ``memory`` (kept in process: tests and the overhead bench);
    ``service_name`` (resource ``service.name``); ``sample_ratio`` (parent-based ratio sampler:
    a client's sampled ``traceparent`` is honoured, new traces are sampled at this ratio)."""

    enabled: bool = False
    exporter: Literal["otlp", "console", "memory"] = "otlp"
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "runroute"
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)


class MetricsSettings(_Strict):
    """``GET /metrics`` (:mod:`router.server.metrics.registry`): ``deprecated_names`` also exposes the
    names of runroute 0.1 (renamed to the Prometheus conventions) as deprecated aliases, for one
    release (dashboards and alerts can move at their own pace)."""

    deprecated_names: bool = True


class UiSettings(_Strict):
    """The live page ``GET /ui`` (:mod:`router.server.ui`).

    ``report_dir``: where the latest scorecard's plots are read from (the PNGs and
    ``scorecard.json`` that ``runroute demo`` / ``runroute bench --plot`` write; absent = the page
    says so); ``frontier_share_budget``: the share of runs you budget for the frontier, drawn as
    the line the page's frontier share is compared with (None: no budget line); ``refresh_s``: how
    often the page polls ``/ui/data``; ``spend_window_s``: the window of the spend-per-hour rate
    (samples taken at each ``/ui/data`` call; before a full window, since the first sample)."""

    report_dir: str = "runroute-report"
    frontier_share_budget: float | None = Field(default=None, ge=0.0, le=1.0)
    refresh_s: float = Field(default=2.0, gt=0)
    spend_window_s: float = Field(default=300.0, gt=0)


class SLOSettings(SLOTargets):
    """``slo``: the deployment description's per-step targets (:class:`~router.policy.deployment.SLOTargets`)."""


class Timeouts(_Strict):
    connect_s: float = Field(default=2.0, gt=0)
    first_byte_s: float = Field(default=60.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)


class FallbackSettings(_Strict):
    enabled: bool = True
    on_requested_model: bool = False


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_json_depth: int = Field(default=64, ge=2, le=250)
    max_headers: int = Field(default=100, ge=8)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    api_keys: list[str] = Field(default_factory=list)
    api_keys_env: str | None = None
    admin_keys: list[str] = Field(default_factory=list)
    admin_keys_env: str | None = None
    metrics_keys: list[str] = Field(default_factory=list)
    metrics_keys_env: str | None = None
    run_history_steps: int = Field(default=1000, gt=0)
    run_history_runs: int = Field(default=10000, gt=0)
    # incremental body parse (router.server.protocols.incremental): conversations kept, their bytes
    parse_cache_runs: int = Field(default=2048, ge=0)
    parse_cache_mb: float = Field(default=256.0, ge=0)
    # the client of plain-http upstream POSTs: "lean" (router.server.hotpath.h1client) or "aiohttp"
    upstream_client: Literal["lean", "aiohttp"] = "lean"
    # connection limits (router.server.limits; docs/server-limits.md)
    header_timeout_s: float = Field(default=10.0, gt=0)  # first byte of a request -> end of its headers
    idle_timeout_s: float = Field(default=15.0, gt=0)  # a connection with no request in progress
    body_timeout_s: float = Field(default=30.0, gt=0)  # the longest wait for the next piece of a body
    max_connections: int = Field(default=8192, ge=16)  # open connections; requests beyond: 503

    @staticmethod
    def _keys(listed: list[str], env: str | None) -> frozenset[str]:
        keys = {k for k in listed if k}
        if env and os.environ.get(env):
            keys.update(k.strip() for k in os.environ[env].split(",") if k.strip())
        return frozenset(keys)

    def client_keys(self) -> frozenset[str]:
        return self._keys(self.api_keys, self.api_keys_env)

    def admin_key_set(self) -> frozenset[str]:
        return self._keys(self.admin_keys, self.admin_keys_env)

    def metrics_key_set(self) -> frozenset[str]:
        return self._keys(self.metrics_keys, self.metrics_keys_env)

    @field_validator("port", mode="before")
    @classmethod
    def _no_bool_port(cls, v: object) -> object:
        if isinstance(v, bool):  # YAML `port: true` would otherwise bind port 1
            raise ValueError("server.port must be a port number, not a boolean")
        return v

    @model_validator(mode="after")
    def _distinct(self) -> ServerSettings:
        if self.admin_key_set() & self.client_keys():
            raise ValueError("server.admin_keys must differ from the client api_keys")
        return self


class RunLogSettings(_Strict):
    dir: Path = Path("runroute-logs")
    log_prompts: bool = False
    durability: Literal["batched", "ack"] = "batched"
    flush_s: float = Field(default=0.5, gt=0, le=1.0)
    queue_max: int = Field(default=10000, gt=0)
    rotate_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    parquet: bool = True  # roll JSONL into Parquet on rotation/shutdown


class ScrapeSettings(_Strict):
    interval_s: float = Field(default=1.0, ge=0)
    timeout_s: float = Field(default=1.0, gt=0)
    unhealthy_after: int = Field(default=3, ge=1)


class StoreSettings(_Strict):
    kind: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "runroute:"  # several deployments can share one Redis under different prefixes
    ttl_s: float = Field(default=3600.0, gt=0)
    # admission counters expire this long after their last change, bounding slots leaked by a
    # router process that died between admit and release (None = never)
    admit_ttl_s: float | None = Field(default=6 * 3600.0, gt=0)
    router_slots: int = Field(default=16, ge=1, le=1024)  # most routers sharing one Redis
    router_slot: int | None = Field(default=None, ge=0)  # None = leased in Redis at first contact
    step_gap: int = Field(default=1024, ge=1)
    health_check_s: float = Field(default=5.0, ge=0)
    # data loss without an outage (FLUSHALL, failover to an empty replica): router.server.state.fallback
    epoch_check_s: float = Field(default=0.25, ge=0)  # background epoch watch (0 = off)
    reset_settle_s: float = Field(default=1.5, ge=0)  # new-to-Redis runs wait this long after a loss

    @model_validator(mode="after")
    def _slot(self) -> StoreSettings:
        if self.router_slot is not None and self.router_slot >= self.router_slots:
            raise ValueError("store.router_slot must be < store.router_slots")
        return self


class AdmissionSettings(AdmissionConfig):
    """Admission control (on by default: an overloaded local tier must not slow admitted runs).

    Extends the one definition of the controller's knobs,
    :class:`router.policy.admission.AdmissionConfig` (see it for ``slo_short_step_s``,
    ``decode_s_per_token``, ``replica_slots``, ``base_short_step_s``, ``replica_tokens_per_s``,
    ``prefill_weight``, ``default_run_token_rate``, ``headroom``, ``hysteresis``, ``spill``,
    ``retry_after_*``, ``max_runs_per_replica``): :meth:`controller_config` fills its
    ``prefill_s_per_token`` / ``ttft_base_s`` from the local tier unless set here.

    Sidecar-only knobs: ``priority_header`` (``x-run-priority``: ``interactive`` | ``batch``;
    anything else counts as batch), ``default_priority``; ``tenant_header`` (``x-tenant``; else the
    body's ``metadata.tenant``); ``tenant_spill_limits`` / ``default_tenant_spill_limit``
    (concurrently spilled runs per tenant; over it a shed run is rejected instead); ``counter_key``
    (the store's admission counter); ``idle_release_s`` (unset: ``store.ttl_s``) and ``sweep_s``
    (10; 0 = no background sweep) bound slot leaks (see :mod:`router.server.hotpath.admission`);
    ``rate_tau_s`` (30) time constant of the live rates, ``min_rate_steps`` (20) local steps before
    the measured per-run rate replaces the default; the arrival forecaster's ``forecast_bucket_s``
    (60), ``forecast_alpha`` (0.2), ``forecast_min_history_s`` (86400, then a daily profile);
    ``horizons_s`` (300, 900, 3600) of ``GET /v1/capacity``; ``default_run_s`` (60) mean run
    duration before any run ended; ``client_retry_max_s`` (60): a 429 whose Retry-After is longer
    says ``x-should-retry: false`` (the openai/anthropic SDKs then raise at once instead of waiting
    silently), shorter ones ``true``.
    """

    model_config = ConfigDict(extra="forbid")

    priority_header: str = "x-run-priority"
    default_priority: Literal["interactive", "batch"] = "interactive"
    tenant_header: str = "x-tenant"
    tenant_spill_limits: dict[str, int] = Field(default_factory=dict)
    default_tenant_spill_limit: int | None = Field(default=None, ge=0)
    counter_key: str = "local"
    idle_release_s: float | None = Field(default=None, gt=0)
    sweep_s: float = Field(default=10.0, ge=0)
    rate_tau_s: float = Field(default=30.0, gt=0)
    min_rate_steps: int = Field(default=20, ge=1)
    forecast_bucket_s: float = Field(default=60.0, gt=0)
    forecast_alpha: float = Field(default=0.2, gt=0, le=1)
    forecast_min_history_s: float = Field(default=86400.0, gt=0)
    horizons_s: tuple[float, ...] = (300.0, 900.0, 3600.0)
    default_run_s: float = Field(default=60.0, gt=0)
    client_retry_max_s: float = Field(default=60.0, ge=0)

    def controller_config(self, local: LocalTier | None) -> AdmissionConfig:
        """The controller's :class:`AdmissionConfig`: these knobs, with the local tier's prefill
        and TTFT terms where they were not set explicitly."""
        upd: dict[str, Any] = {}
        if local is not None:
            if "prefill_s_per_token" not in self.model_fields_set:
                upd["prefill_s_per_token"] = local.prefill_s_per_token
            if "ttft_base_s" not in self.model_fields_set:
                upd["ttft_base_s"] = local.ttft_base_s
        data = {k: getattr(self, k) for k in AdmissionConfig.model_fields}
        return AdmissionConfig(**{**data, **upd})


def _validate_policy(v: object) -> object:
    """Validate through router.policy.config's discriminated union (the one registry of policies)."""
    from router.policy.config import parse_policy_config

    return parse_policy_config(v)


class RouterSettings(BaseSettings):
    """All settings of one sidecar process. Build with :meth:`load` (file + env) or directly."""

    model_config = SettingsConfigDict(
        env_prefix="RUNROUTE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    local: LocalTier | None = None
    frontier: FrontierTier | None = None
    frontiers: list[FrontierTier] = Field(default_factory=list)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    policy: Any = Field(default_factory=lambda: {"kind": "learned"})
    bundle: BundleSource = Field(default_factory=BundleSource)
    slo: SLOSettings = Field(default_factory=SLOSettings)
    node: NodeSpec = Field(default_factory=NodeSpec)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    fallback: FallbackSettings = Field(default_factory=FallbackSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    runlog: RunLogSettings = Field(default_factory=RunLogSettings)
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    ui: UiSettings = Field(default_factory=UiSettings)
    context: RunContextSettings = Field(default_factory=RunContextSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: object) -> object:
        return _validate_policy(v)

    @model_validator(mode="after")
    def _tiers(self) -> RouterSettings:
        if self.local is None and not self.frontier_list:
            raise ValueError("configure at least one tier (local and/or frontier)")
        names = [f.name for f in self.frontier_list]
        if len(set(names)) != len(names):
            raise ValueError("frontier names must be unique (frontiers[].name)")
        if self.policy_kind == "learned" and self.bundle.path is None and self.bundle.mlflow_uri is None:
            raise ValueError("policy kind 'learned' needs bundle.path or bundle.mlflow_uri")
        return self

    @property
    def frontier_list(self) -> list[FrontierTier]:
        """Every configured frontier, the default first (``default: true``, else the first listed)."""
        out = ([self.frontier] if self.frontier is not None else []) + list(self.frontiers)
        out.sort(key=lambda f: not f.default)
        return out

    @property
    def policy_kind(self) -> str:
        return str(self.policy.kind)

    def deployment(self) -> Deployment:
        """The deployment this sidecar serves, resolved as for every other command
        (:meth:`router.policy.deployment.Deployment.from_mapping` of these settings)."""
        return Deployment.from_mapping(self.model_dump(mode="python"))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # env first = env wins over the values passed in (the YAML file)
        return (env_settings, init_settings)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: object) -> RouterSettings:
        """Read a YAML file (optional), apply ``overrides`` then RUNROUTE_* env; one-line errors."""
        data: dict[str, object] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise SettingsError(f"config file not found: {p}")
            try:
                loaded = yaml.safe_load(p.read_text()) or {}
            except yaml.YAMLError as e:
                raise SettingsError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
            if not isinstance(loaded, dict):
                raise SettingsError(f"{p}: top level must be a mapping")
            data = loaded
        data = _merge(data, overrides)
        data = _env_bundle_source_wins(data)
        try:
            return cls(**cast("dict[str, Any]", data))  # the fields validate every value
        except Exception as e:  # pydantic.ValidationError -> one line
            raise SettingsError(_one_line(e, path)) from None


def _env_bundle_source_wins(data: dict[str, object]) -> dict[str, object]:
    """A bundle source named in the environment replaces the one of the file / overrides as a whole
    (``RUNROUTE_BUNDLE__MLFLOW_URI`` over a file's ``bundle.path``, and the reverse): the nested
    merge would otherwise keep both and refuse them."""
    env = {k.upper(): v for k, v in os.environ.items()}
    bundle = data.get("bundle")
    if not isinstance(bundle, dict):
        return data
    for key, other in (("MLFLOW_URI", "path"), ("PATH", "mlflow_uri")):
        if env.get(f"RUNROUTE_BUNDLE__{key}", "").strip():
            data = {**data, "bundle": {k: v for k, v in bundle.items() if k != other}}
    return data


def _merge(a: Mapping[str, object], b: Mapping[str, object]) -> dict[str, object]:
    out = dict(a)
    for k, v in b.items():
        old = out.get(k)
        out[k] = _merge(old, v) if isinstance(v, dict) and isinstance(old, dict) else v
    return out


def _one_line(e: Exception, path: object) -> str:
    from pydantic import ValidationError

    where = f"{path}: " if path else ""
    if isinstance(e, ValidationError):
        errs = e.errors()
        parts = []
        for err in errs[:3]:
            loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return f"{where}invalid config: " + "; ".join(parts) + more
    return f"{where}invalid config: {e}"
