"""Prometheus metrics of one sidecar app, in a per-app ``CollectorRegistry`` (no global registry,
so several apps in one process — tests — never collide).

Exposed at ``GET /metrics``:

- ``runroute_requests_total{tier,status}``: finished chat-completions requests;
- ``runroute_decisions_total{tier,reason}``: routing decisions;
- ``runroute_step_latency_seconds{tier,kind}``: end-to-end step latency, ``kind`` = ``short``
  (<= ``slo.short_step_tokens`` output tokens or a tool call) or ``long``;
- ``runroute_ttft_seconds{tier}``: time to the first streamed byte;
- ``runroute_prompt_tokens_total{tier}``, ``runroute_cache_hit_tokens_total{tier,replica}``;
- ``runroute_flaps_total``: steps where a run's pin changed after its first step;
- ``runroute_fallbacks_total{from_tier,to_tier}``;
- ``runroute_upstream_errors_total{tier,kind}`` (``connect``/``timeout``/``5xx``/``stream``);
- ``runroute_slo_steps_total{met}``;
- ``runroute_bundle_info{version}`` (gauge 1 for the serving bundle),
  ``runroute_bundle_reloads_total{result}``;
- ``runroute_inflight{backend}``, ``runroute_backend_healthy{backend}``,
  ``runroute_backend_running/waiting/kv_usage{backend}`` (scraped);
- ``runroute_runlog_overflow_total`` (steps that went to the writer's overflow list);
- admission and capacity (:mod:`router.server.admission`): ``runroute_admission_total{verdict,priority,reason}``
  (first-step verdicts), ``runroute_admission_active_runs`` (the store's shared count),
  ``runroute_admission_run_token_rate``, ``runroute_admission_utilisation``,
  ``runroute_admission_predicted_short_step_seconds``, ``runroute_replica_utilisation{backend}``,
  ``runroute_capacity_forecast_runs_per_second{horizon_s}``,
  ``runroute_capacity_recommended_replicas{horizon_s}``,
  ``runroute_capacity_expected_spill_share{horizon_s}``,
  ``runroute_capacity_expected_reject_share{horizon_s}`` (set from the same figures as
  ``GET /v1/capacity`` on every scrape).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["RouterMetrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("runroute_requests", "Finished requests", ["tier", "status"], registry=r)
        self.decisions = Counter("runroute_decisions", "Routing decisions", ["tier", "reason"], registry=r)
        self.step_latency = Histogram(
            "runroute_step_latency_seconds",
            "Step latency",
            ["tier", "kind"],
            buckets=_LAT_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "runroute_ttft_seconds", "Time to first byte", ["tier"], buckets=_LAT_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter("runroute_prompt_tokens", "Prompt tokens", ["tier"], registry=r)
        self.cache_hit_tokens = Counter(
            "runroute_cache_hit_tokens", "Cached prompt tokens", ["tier", "replica"], registry=r
        )
        self.flaps = Counter("runroute_flaps", "Pin changes after a run's first step", registry=r)
        self.fallbacks = Counter(
            "runroute_fallbacks", "Fallbacks to the other tier", ["from_tier", "to_tier"], registry=r
        )
        self.upstream_errors = Counter(
            "runroute_upstream_errors", "Upstream errors", ["tier", "kind"], registry=r
        )
        self.slo_steps = Counter("runroute_slo_steps", "Steps within the step SLO", ["met"], registry=r)
        self.bundle_info = Gauge("runroute_bundle_info", "Serving bundle version", ["version"], registry=r)
        self.store_degraded = Gauge(
            "runroute_store_degraded",
            "1 while the shared run-state store (Redis) is unreachable and local pins serve",
            registry=r,
        )
        self.bundle_reloads = Counter("runroute_bundle_reloads", "Bundle reloads", ["result"], registry=r)
        self.inflight = Gauge("runroute_inflight", "Router in-flight requests", ["backend"], registry=r)
        self.healthy = Gauge("runroute_backend_healthy", "Backend healthy", ["backend"], registry=r)
        self.running = Gauge("runroute_backend_running", "vllm:num_requests_running", ["backend"], registry=r)
        self.waiting = Gauge("runroute_backend_waiting", "vllm:num_requests_waiting", ["backend"], registry=r)
        self.kv_usage = Gauge(
            "runroute_backend_kv_usage", "vllm:kv_cache_usage_perc", ["backend"], registry=r
        )
        self.runlog_overflow = Counter(
            "runroute_runlog_overflow", "Run-log steps spilled to overflow", registry=r
        )
        self.admission = Counter(
            "runroute_admission",
            "First-step admission verdicts",
            ["verdict", "priority", "reason"],
            registry=r,
        )
        self.adm_active = Gauge("runroute_admission_active_runs", "Active admitted local runs", registry=r)
        self.adm_rate = Gauge(
            "runroute_admission_run_token_rate", "Work tokens/s per active local run", registry=r
        )
        self.adm_util = Gauge("runroute_admission_utilisation", "Predicted local utilisation", registry=r)
        self.adm_short = Gauge(
            "runroute_admission_predicted_short_step_seconds", "Predicted short-step latency", registry=r
        )
        self.replica_util = Gauge(
            "runroute_replica_utilisation", "Served work / replica capacity", ["backend"], registry=r
        )
        self.cap_rate = Gauge(
            "runroute_capacity_forecast_runs_per_second", "Forecast new runs/s", ["horizon_s"], registry=r
        )
        self.cap_replicas = Gauge(
            "runroute_capacity_recommended_replicas", "Replicas holding the SLO", ["horizon_s"], registry=r
        )
        self.cap_spill = Gauge(
            "runroute_capacity_expected_spill_share", "Expected spilled share", ["horizon_s"], registry=r
        )
        self.cap_reject = Gauge(
            "runroute_capacity_expected_reject_share", "Expected rejected share", ["horizon_s"], registry=r
        )
        self._bundle_version: str | None = None
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: prometheus_client's ``labels`` costs ~10 us a call."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def set_bundle(self, version: str | None) -> None:
        if self._bundle_version is not None:
            self.bundle_info.remove(self._bundle_version)
        self._bundle_version = version
        if version is not None:
            self.bundle_info.labels(version).set(1)

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

    def render(self) -> bytes:
        return generate_latest(self.registry)
