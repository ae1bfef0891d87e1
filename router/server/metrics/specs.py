"""Every series of ``GET /metrics`` declared once: :data:`SPECS` (name, type, help, labels, unit)
and the 0.1 names kept as deprecated aliases, :data:`DEPRECATED`. :class:`router.server.metrics.registry.RouterMetrics`
builds its series from these; :mod:`router.server.metrics.doc` writes docs/metrics.md's list from them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricSpec", "SPECS", "DEPRECATED", "Alias", "CHAT_HANDLER", "LATENCY_BUCKETS"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CHAT_HANDLER = "/v1/chat/completions"
#: the hot path's endpoint of each protocol (the ``handler`` label of its requests)
HANDLERS = {"chat": CHAT_HANDLER, "responses": "/v1/responses", "messages": "/v1/messages"}


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
        "budget_share",
        "gauge",
        "runroute_frontier_budget_share",
        "The frontier budget the policy holds to (policy.frontier_budget.share: share of runs or steps); "
        "absent without a budget",
        ("policy",),
    ),
    MetricSpec(
        "budget_realised",
        "gauge",
        "runroute_frontier_budget_realised_share",
        "Realised frontier share over the budget's window of recent runs (or steps), by policy and domain "
        "('*': all traffic, or a run without a domain)",
        ("policy", "domain"),
    ),
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
        "End-to-end latency of served steps; kind = short (tool call, structured answer or <= "
        "slo.short_step_tokens output tokens) | long",
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
        "and output (min(prompt - 1, previous prompt + output): the last prompt token is always "
        "computed; chat clients resend the history)",
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
    MetricSpec(
        "run_signals",
        "counter",
        "runroute_run_signals",
        "Signals posted on runs (POST /v1/runs/{id}/signal) or recorded by the router on a local answer (router.server.hotpath.posthoc) by kind",
        ("kind",),
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
        "domain_mode",
        "gauge",
        "runroute_domain_mode",
        "1 for the mode each domain of the serving bundle runs in: model (its evidence beat the "
        "prior) or prior (the reason is in the bundle manifest and GET /v1/runs/{id})",
        ("domain", "mode"),
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
        "prefix_index_mode",
        "gauge",
        "runroute_prefix_index_mode",
        "The prefix index's mode per local replica: 1 on the mode it is in (precise: its vLLM KV "
        "events; approximate: what the routers sent where), 0 on the other (docs/prefix-index.md)",
        ("replica", "mode"),
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
