"""Prometheus metrics of one sidecar app, in a per-app ``CollectorRegistry`` (no global registry,
so several apps in one process — tests — never collide).

Algorithm: every series is declared once in :data:`SPECS` (name, type, help, labels, unit); the
README's metric list is generated from it (:mod:`router.server.metrics_doc`). The proxy calls a few
named hooks and every per-step series is computed here from the step's run-log record
(:meth:`RouterMetrics.step_finished`), so the hot path holds no metric logic: request counts
(:meth:`request_rejected` for rejections before routing, :meth:`request_served` for the other
endpoints, counted by the app), decisions, run starts, escalations and flaps
(:meth:`decided`, :meth:`fell_back`), admission verdicts, upstream errors. Label children are cached
(``prometheus_client``'s ``labels()`` costs ~10 us a call).

Exposition (:meth:`render`): the Prometheus text format 0.0.4, or OpenMetrics 1.0 when the scrape's
``Accept`` header asks for ``application/openmetrics-text`` (``prometheus_client.choose_encoder``).
The ``_created`` series of counters and histograms are dropped (they doubled the sample count and
no dashboard reads them). Conventions: counters end in ``_total``, units are base units in the
name (``_seconds``, ``_tokens``, ``_usd``), shares are ``_ratio`` in [0, 1], gauges name their noun
(``_requests``, ``_runs``), one label name per dimension (``backend`` for a replica or the frontier,
``tier``, ``code`` for the HTTP status), no run ids in labels.

Knobs: ``deprecated_names`` (``metrics.deprecated_names``, default on for one release): the names
of runroute 0.1 are also exposed, computed at scrape time from the new series (:data:`DEPRECATED`,
their HELP says what replaces them); ``short_step_tokens`` and ``step_slo_s`` (from ``slo``): the
short/long split of the latency histogram and the SLO counter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

__all__ = ["RouterMetrics", "MetricSpec", "SPECS", "DEPRECATED", "Alias", "CHAT_HANDLER"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CHAT_HANDLER = "/v1/chat/completions"


@dataclass(frozen=True)
class MetricSpec:
    """One exposed metric family: ``name`` without the ``_total`` of counters."""

    attr: str
    kind: str  # counter | gauge | histogram
    name: str
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    @property
    def exposed(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


_B = ("backend",)
SPECS: tuple[MetricSpec, ...] = (
    # --- requests and decisions (hot path)
    MetricSpec(
        "requests",
        "counter",
        "runroute_requests",
        "HTTP requests answered, by endpoint, the tier that served them ('none': answered before "
        "routing, e.g. 401/404/413/422/429) and status code",
        ("handler", "tier", "code"),
    ),
    MetricSpec(
        "decisions", "counter", "runroute_decisions", "Routing decisions by reason", ("tier", "reason")
    ),
    MetricSpec("runs_started", "counter", "runroute_runs_started", "Runs admitted, by first tier", ("tier",)),
    MetricSpec(
        "escalations",
        "counter",
        "runroute_escalations",
        "Moves of a run from the local tier to the frontier (policy or fallback), by reason",
        ("reason",),
    ),
    MetricSpec(
        "flaps",
        "counter",
        "runroute_flaps",
        "Pin changes (tier or replica) after a run's first step, by cause (policy | fallback)",
        ("cause",),
    ),
    MetricSpec(
        "fallbacks", "counter", "runroute_fallbacks", "Fallbacks to the other tier", ("from_tier", "to_tier")
    ),
    MetricSpec(
        "upstream_errors",
        "counter",
        "runroute_upstream_errors",
        "Upstream errors by kind (connect | timeout | 5xx | stream)",
        ("tier", "kind"),
    ),
    MetricSpec(
        "admission",
        "counter",
        "runroute_admission_verdicts",
        "First-step admission verdicts (admit-local | spill | reject | frontier)",
        ("verdict", "priority", "reason"),
    ),
    # --- served steps
    MetricSpec(
        "step_latency",
        "histogram",
        "runroute_step_latency_seconds",
        "End-to-end latency of served steps; kind = short (tool call or <= slo.short_step_tokens "
        "output tokens) | long",
        ("tier", "kind"),
        "seconds",
    ),
    MetricSpec(
        "ttft", "histogram", "runroute_ttft_seconds", "Time to the first streamed byte", ("tier",), "seconds"
    ),
    MetricSpec(
        "prompt_tokens",
        "counter",
        "runroute_prompt_tokens",
        "Prompt tokens of served steps",
        ("tier", "model"),
    ),
    MetricSpec(
        "cached_tokens",
        "counter",
        "runroute_cached_prompt_tokens",
        "Prompt tokens the backend served from its prefix cache (usage cached_tokens)",
        ("tier", "backend"),
    ),
    MetricSpec(
        "output_tokens", "counter", "runroute_output_tokens", "Output (completion) tokens", ("tier", "model")
    ),
    MetricSpec(
        "xturn_prompt",
        "counter",
        "runroute_cross_turn_prompt_tokens",
        "Prompt tokens of served steps after a run's first (the cross-turn cache hit's denominator)",
        ("tier", "backend"),
    ),
    MetricSpec(
        "xturn_cached",
        "counter",
        "runroute_cross_turn_cached_tokens",
        "Cached prompt tokens of served steps after a run's first",
        ("tier", "backend"),
    ),
    MetricSpec(
        "xturn_bound",
        "counter",
        "runroute_cross_turn_reusable_tokens",
        "Upper bound of the cross-turn cache hit: prompt tokens repeating the run's previous prompt "
        "and output (min(prompt, previous prompt + output); chat clients resend the history)",
        ("tier", "backend"),
    ),
    MetricSpec(
        "spend",
        "counter",
        "runroute_spend_usd",
        "Token spend in USD at the tier's configured prices (uncached, cached input and output)",
        ("tier", "model"),
    ),
    MetricSpec(
        "slo_steps",
        "counter",
        "runroute_slo_steps",
        "Served steps within (met=yes) or over (no) slo.step_latency_s",
        ("met",),
    ),
    # --- bundle, store, run log
    MetricSpec(
        "bundle_info",
        "gauge",
        "runroute_bundle_info",
        "1 for the serving bundle (registry_version: the MLflow model version, '' for a path)",
        ("version", "registry_version"),
    ),
    MetricSpec(
        "bundle_reloads", "counter", "runroute_bundle_reloads", "Bundle reloads (ok | refused)", ("result",)
    ),
    MetricSpec(
        "store_degraded",
        "gauge",
        "runroute_store_degraded",
        "1 while the shared run-state store (Redis) is unreachable and local pins serve",
    ),
    MetricSpec(
        "runlog_overflow",
        "counter",
        "runroute_runlog_overflow_steps",
        "Run-log steps that went to the writer's overflow list",
    ),
    # --- backends (set on each scrape)
    MetricSpec("inflight", "gauge", "runroute_inflight_requests", "This router's in-flight requests", _B),
    MetricSpec("healthy", "gauge", "runroute_backend_healthy", "1 while the backend is healthy", _B),
    MetricSpec(
        "running", "gauge", "runroute_backend_running_requests", "vllm:num_requests_running (scraped)", _B
    ),
    MetricSpec(
        "waiting", "gauge", "runroute_backend_waiting_requests", "vllm:num_requests_waiting (scraped)", _B
    ),
    MetricSpec(
        "kv_usage",
        "gauge",
        "runroute_backend_kv_cache_usage_ratio",
        "vllm:kv_cache_usage_perc (scraped), 0..1",
        _B,
        "ratio",
    ),
    MetricSpec(
        "gpu_cost",
        "gauge",
        "runroute_backend_cost_usd_per_hour",
        "Configured price of a local replica (local.gpu_usd_per_hour)",
        _B,
    ),
    # --- admission and capacity (set from GET /v1/capacity's figures on each scrape)
    MetricSpec(
        "adm_active", "gauge", "runroute_admission_active_runs", "Active admitted local runs (shared count)"
    ),
    MetricSpec(
        "adm_rate",
        "gauge",
        "runroute_admission_run_work_tokens_per_second",
        "Work tokens per second per active local run",
    ),
    MetricSpec(
        "adm_util",
        "gauge",
        "runroute_admission_utilisation_ratio",
        "Predicted utilisation of the local tier",
        (),
        "ratio",
    ),
    MetricSpec(
        "adm_short",
        "gauge",
        "runroute_admission_predicted_short_step_seconds",
        "Predicted short-step latency",
        (),
        "seconds",
    ),
    MetricSpec(
        "replica_util",
        "gauge",
        "runroute_backend_utilisation_ratio",
        "Served work / replica capacity",
        _B,
        "ratio",
    ),
    MetricSpec(
        "cap_rate",
        "gauge",
        "runroute_capacity_forecast_runs_per_second",
        "Forecast new runs per second",
        ("horizon_s",),
    ),
    MetricSpec(
        "cap_replicas",
        "gauge",
        "runroute_capacity_recommended_replicas",
        "Replicas that hold the SLO at the forecast",
        ("horizon_s",),
    ),
    MetricSpec(
        "cap_spill",
        "gauge",
        "runroute_capacity_expected_spill_ratio",
        "Expected share of new runs spilled to the frontier",
        ("horizon_s",),
        "ratio",
    ),
    MetricSpec(
        "cap_reject",
        "gauge",
        "runroute_capacity_expected_reject_ratio",
        "Expected share of new runs rejected",
        ("horizon_s",),
        "ratio",
    ),
)
_BY_ATTR = {s.attr: s for s in SPECS}


@dataclass(frozen=True)
class Alias:
    """A 0.1 name computed from a new series: ``labels`` maps old label -> new label (a new label
    not named is summed over); ``where`` keeps only samples with these new-label values."""

    old: str
    new: str  # exposed name of the new series
    kind: str  # counter | gauge
    labels: tuple[tuple[str, str], ...] = ()
    where: tuple[tuple[str, str], ...] = ()


# Same name, changed labels (no alias possible, a name is exposed once): runroute_requests_total
# (label status -> code; new handler: it counts every endpoint now, handler="/v1/chat/completions"
# is the 0.1 figure plus the rejections before routing), runroute_prompt_tokens_total (new label
# model), runroute_flaps_total (new label cause), runroute_bundle_info (new label
# registry_version): sum() over the new labels gives the 0.1 series.
DEPRECATED: tuple[Alias, ...] = (
    Alias(
        "runroute_admission_total",
        "runroute_admission_verdicts_total",
        "counter",
        tuple((x, x) for x in ("verdict", "priority", "reason")),
    ),
    Alias(
        "runroute_cache_hit_tokens_total",
        "runroute_cached_prompt_tokens_total",
        "counter",
        (("tier", "tier"), ("replica", "backend")),
    ),
    Alias("runroute_runlog_overflow_total", "runroute_runlog_overflow_steps_total", "counter"),
    Alias("runroute_inflight", "runroute_inflight_requests", "gauge", (("backend", "backend"),)),
    Alias(
        "runroute_backend_running", "runroute_backend_running_requests", "gauge", (("backend", "backend"),)
    ),
    Alias(
        "runroute_backend_waiting", "runroute_backend_waiting_requests", "gauge", (("backend", "backend"),)
    ),
    Alias(
        "runroute_backend_kv_usage",
        "runroute_backend_kv_cache_usage_ratio",
        "gauge",
        (("backend", "backend"),),
    ),
    Alias("runroute_admission_run_token_rate", "runroute_admission_run_work_tokens_per_second", "gauge"),
    Alias("runroute_admission_utilisation", "runroute_admission_utilisation_ratio", "gauge"),
    Alias(
        "runroute_replica_utilisation",
        "runroute_backend_utilisation_ratio",
        "gauge",
        (("backend", "backend"),),
    ),
    Alias(
        "runroute_capacity_expected_spill_share",
        "runroute_capacity_expected_spill_ratio",
        "gauge",
        (("horizon_s", "horizon_s"),),
    ),
    Alias(
        "runroute_capacity_expected_reject_share",
        "runroute_capacity_expected_reject_ratio",
        "gauge",
        (("horizon_s", "horizon_s"),),
    ),
)


class _Exposed:
    """The registry as scraped: no ``_created`` samples, plus the deprecated aliases."""

    def __init__(self, registry: CollectorRegistry, aliases: tuple[Alias, ...]):
        self.registry, self.aliases = registry, aliases

    def collect(self) -> Iterator[Metric]:
        fams = []
        for fam in self.registry.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            fams.append(out)
        yield from fams
        by_sample: dict[str, list[Any]] = {}
        for fam in fams:
            for s in fam.samples:
                by_sample.setdefault(s.name, []).append(s)
        for a in self.aliases:
            yield _alias_family(a, by_sample.get(a.new, []))


def _alias_family(a: Alias, samples: Iterable[Any]) -> Metric:
    base = a.old[: -len("_total")] if a.kind == "counter" else a.old
    fam = Metric(base, f"DEPRECATED (removed in the next release): use {a.new}", a.kind)
    sums: dict[tuple[str, ...], float] = {}
    for s in samples:
        if any(s.labels.get(k) != v for k, v in a.where):
            continue
        key = tuple(s.labels.get(new, "") for _, new in a.labels)
        sums[key] = sums.get(key, 0.0) + s.value
    for key, v in sums.items():
        fam.add_sample(a.old, dict(zip((old for old, _ in a.labels), key, strict=True)), v)
    return fam


class RouterMetrics:
    """The app's series (:data:`SPECS`) and the hooks that set them; see the module docstring."""

    def __init__(
        self, *, deprecated_names: bool = True, short_step_tokens: int = 64, step_slo_s: float = 10.0
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.short_step_tokens, self.step_slo_s = short_step_tokens, step_slo_s
        self._exposed = _Exposed(self.registry, DEPRECATED if deprecated_names else ())
        for spec in SPECS:
            setattr(self, spec.attr, self._make(spec))
        self._bundle_labels: tuple[str, str] | None = None
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _make(self, spec: MetricSpec) -> Any:
        kw: dict[str, Any] = {"registry": self.registry, "unit": spec.unit}
        if spec.kind == "counter":
            return Counter(spec.name, spec.help, spec.labels, **kw)
        if spec.kind == "gauge":
            return Gauge(spec.name, spec.help, spec.labels, **kw)
        return Histogram(spec.name, spec.help, spec.labels, buckets=_LAT_BUCKETS, **kw)

    def __getattr__(self, name: str) -> Any:  # the series of SPECS, set in __init__ (for mypy)
        raise AttributeError(name)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    # ------------------------------------------------------------------ hot-path hooks
    def request_rejected(self, status: int) -> None:
        """A chat request answered before routing (401, 413, 400/422, 429, 503 no bundle, 499)."""
        self.child(self.requests, CHAT_HANDLER, "none", str(status)).inc()

    def request_served(self, handler: str, status: int) -> None:
        """Any other endpoint (counted by the app for every request it answers)."""
        self.child(self.requests, handler, "none", str(status)).inc()

    def admission_verdict(self, verdict: str, priority: str, reason: str) -> None:
        self.child(self.admission, verdict, priority, reason).inc()

    def decided(self, decision: Any, prev_tier: str | None, flapped: bool) -> None:
        """A committed decision: ``prev_tier`` is the run's pin before it (None: a new run)."""
        self.child(self.decisions, decision.tier, decision.reason).inc()
        if prev_tier is None:
            self.child(self.runs_started, decision.tier).inc()
        elif prev_tier == "local" and decision.tier == "frontier":
            self.child(self.escalations, decision.reason).inc()
        if flapped:
            self.child(self.flaps, "policy").inc()

    def fell_back(self, from_tier: str, decision: Any) -> None:
        """A step retried on another backend after an upstream failure."""
        self.child(self.fallbacks, from_tier, decision.tier).inc()
        self.child(self.flaps, "fallback").inc()
        self.child(self.decisions, decision.tier, decision.reason).inc()
        if from_tier == "local" and decision.tier == "frontier":
            self.child(self.escalations, decision.reason).inc()

    def upstream_error(self, tier: str, kind: str) -> None:
        self.child(self.upstream_errors, tier, kind).inc()

    def step_finished(self, rec: Any, prev_tokens: int, state: Any) -> None:
        """Every per-step series from the step's run-log record (:class:`features.schema.Step`);
        ``prev_tokens``: the run's previous served prompt + output tokens as this router saw them
        (0: unknown), ``state``: the serving backend's ``BackendState`` (prices; None: nothing served)."""
        tier = rec.tier or "none"
        c = self.child
        c(self.requests, CHAT_HANDLER, tier, str(rec.status)).inc()
        if rec.ttft_s is not None:
            c(self.ttft, tier).observe(rec.ttft_s)
        if rec.status != 200:
            return
        latency, prompt, cached = rec.latency_s or 0.0, rec.prompt_tokens, rec.cached_tokens or 0
        out, model, backend = rec.completion_tokens, rec.model or "", rec.replica or ""
        short = bool(rec.tool_calls) or out <= self.short_step_tokens
        c(self.step_latency, tier, "short" if short else "long").observe(latency)
        c(self.slo_steps, "yes" if latency <= self.step_slo_s else "no").inc()
        c(self.prompt_tokens, tier, model).inc(prompt)
        c(self.output_tokens, tier, model).inc(out)
        if cached:
            c(self.cached_tokens, tier, backend).inc(cached)
        if rec.step > 0:
            c(self.xturn_prompt, tier, backend).inc(prompt)
            c(self.xturn_cached, tier, backend).inc(cached)
            c(self.xturn_bound, tier, backend).inc(min(prompt, prev_tokens))
        if state is not None:
            usd = (
                (prompt - cached) * state.price_in_per_m
                + cached * state.price_cached_in_per_m
                + out * state.price_out_per_m
            ) / 1e6
            if usd > 0:
                c(self.spend, tier, model).inc(usd)

    # ------------------------------------------------------------------ set elsewhere
    def set_bundle(self, version: str | None, registry_version: str | None = None) -> None:
        if self._bundle_labels is not None:
            self.bundle_info.remove(*self._bundle_labels)
            self._bundle_labels = None
        if version is not None:
            self._bundle_labels = (version, registry_version or "")
            self.bundle_info.labels(*self._bundle_labels).set(1)

    def bundle_reloaded(self, ok: bool) -> None:
        self.bundle_reloads.labels("ok" if ok else "refused").inc()

    def set_backends(self, backends: Iterable[Any], stats: dict[str, Any]) -> None:
        """This router's in-flight counts and the scraped figures of each backend."""
        for b in backends:
            self.inflight.labels(b.name).set(b.inflight)
            if b.tier == "local":
                self.gpu_cost.labels(b.name).set(b.state_template.gpu_usd_per_hour)
        for name, st in stats.items():
            self.healthy.labels(name).set(1 if st.healthy else 0)
            self.running.labels(name).set(st.running)
            self.waiting.labels(name).set(st.waiting)
            self.kv_usage.labels(name).set(st.kv_usage)

    def set_capacity(self, cap: dict[str, Any]) -> None:
        """Copy the figures of ``GET /v1/capacity`` (:meth:`router.server.admission.LiveAdmission.capacity`)."""
        loc = cap["local"]
        self.adm_active.set(loc["active_runs"])
        self.adm_rate.set(loc["run_token_rate"] or loc["run_token_rate_default"])
        self.adm_util.set(loc["utilisation"])
        self.adm_short.set(loc["predicted_short_step_s"])
        for rep in cap["replicas"]:
            self.replica_util.labels(rep["name"]).set(rep["utilisation"])
        for f in cap["forecast"]:
            h = f"{f['horizon_s']:g}"
            self.cap_rate.labels(h).set(f["runs_per_s"])
            self.cap_replicas.labels(h).set(f["recommended_replicas"])
            self.cap_spill.labels(h).set(f["expected_spill_share"])
            self.cap_reject.labels(h).set(f["expected_reject_share"])

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this ``Accept`` header."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self._exposed), content_type  # type: ignore[arg-type]

    @staticmethod
    def spec(attr: str) -> MetricSpec:
        return _BY_ATTR[attr]
