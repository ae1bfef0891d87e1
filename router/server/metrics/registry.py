"""Prometheus metrics of one sidecar app, in a per-app ``CollectorRegistry`` (no global registry,
so several apps in one process — tests — never collide).

Algorithm: every series is declared once in :data:`router.server.metrics.specs.SPECS` (name, type,
help, labels, unit); the metric list in docs/metrics.md is generated from it (:mod:`router.server.metrics.doc`).
The proxy calls a few named hooks and every per-step series is computed here from the step's run-log record
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

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from router.core.accounting import backend_step_usd
from router.core.figures import is_short, upper_bound_tokens
from router.policy.defaults import SHORT_STEP_TOKENS, SLO_STEP_S
from router.server.metrics.specs import (
    CHAT_HANDLER,
    DEPRECATED,
    HANDLERS,
    LATENCY_BUCKETS,
    SPECS,
    Alias,
    MetricSpec,
)

if TYPE_CHECKING:  # pragma: no cover
    from features.schema import Step
    from models.benefit import BenefitModel
    from router.core.engine import StepPlan
    from router.policy.types import BackendState, Decision
    from router.server.hotpath.backends import Backend
    from router.server.metrics.scrape import ReplicaStats

__all__ = ["RouterMetrics", "MetricSpec", "SPECS", "DEPRECATED", "Alias", "CHAT_HANDLER"]


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
        by_sample: dict[str, list[Sample]] = {}
        for fam in fams:
            for s in fam.samples:
                by_sample.setdefault(s.name, []).append(s)
        for a in self.aliases:
            yield _alias_family(a, by_sample.get(a.new, []))


def _alias_family(a: Alias, samples: Iterable[Sample]) -> Metric:
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


def adder(child: Any) -> Callable[[float], None]:
    """``child.inc`` (a counter's labelled child) without the library's per-call checks: the
    amount goes straight to the child's value (its own lock kept); a negative amount still goes
    through ``child.inc``, which refuses it as before."""
    value = getattr(child, "_value", None)
    if value is None:  # pragma: no cover - another prometheus_client layout
        return child.inc  # type: ignore[no-any-return]
    add = value.inc

    def inc(amount: float) -> None:
        if amount < 0:
            child.inc(amount)  # raises ValueError
        add(amount)

    return inc


def observer(child: Any) -> Callable[[float], None]:
    """``child.observe`` (a histogram's labelled child, no exemplars) with the bucket found by
    bisection: the same sum and the same bucket (the first bound >= the amount; none for NaN)."""
    try:
        sum_inc, incs, bounds = child._sum.inc, [b.inc for b in child._buckets], child._upper_bounds
    except AttributeError:  # pragma: no cover - another prometheus_client layout
        return child.observe  # type: ignore[no-any-return]

    def observe(amount: float) -> None:
        sum_inc(amount)
        if amount == amount:  # NaN falls in no bucket (the library's loop finds none)
            incs[bisect_left(bounds, amount)](1)

    return observe


class _StepSeries:
    """The per-step series of one (protocol, tier, status, model, backend), each bound on its
    first use (a labelled child exists only once it was used, as before): the step hook then
    looks up one key per step instead of a label tuple per series."""

    def __init__(self, m: RouterMetrics, handler: str, tier: str, status: str, model: str, backend: str):
        self.m, self.handler, self.tier, self.status, self.model, self.backend = (
            m,
            handler,
            tier,
            status,
            model,
            backend,
        )

    def _count(self, metric: Any, *labels: str) -> Callable[[], None]:
        child = self.m.child(metric, *labels)
        value = getattr(child, "_value", None)
        return partial(child.inc if value is None else value.inc, 1)

    def _add(self, metric: Any, *labels: str) -> Callable[[float], None]:
        return adder(self.m.child(metric, *labels))

    @cached_property
    def requests(self) -> Callable[[], None]:
        return self._count(self.m.requests, self.handler, self.tier, self.status)

    @cached_property
    def ttft(self) -> Callable[[float], None]:
        return observer(self.m.child(self.m.ttft, self.tier))

    @cached_property
    def latency_short(self) -> Callable[[float], None]:
        return observer(self.m.child(self.m.step_latency, self.tier, "short"))

    @cached_property
    def latency_long(self) -> Callable[[float], None]:
        return observer(self.m.child(self.m.step_latency, self.tier, "long"))

    @cached_property
    def slo_yes(self) -> Callable[[], None]:
        return self._count(self.m.slo_steps, "yes")

    @cached_property
    def slo_no(self) -> Callable[[], None]:
        return self._count(self.m.slo_steps, "no")

    @cached_property
    def prompt(self) -> Callable[[float], None]:
        return self._add(self.m.prompt_tokens, self.tier, self.model)

    @cached_property
    def output(self) -> Callable[[float], None]:
        return self._add(self.m.output_tokens, self.tier, self.model)

    @cached_property
    def cached(self) -> Callable[[float], None]:
        return self._add(self.m.cached_tokens, self.tier, self.backend)

    @cached_property
    def xturn_prompt(self) -> Callable[[float], None]:
        return self._add(self.m.xturn_prompt, self.tier, self.backend)

    @cached_property
    def xturn_cached(self) -> Callable[[float], None]:
        return self._add(self.m.xturn_cached, self.tier, self.backend)

    @cached_property
    def xturn_bound(self) -> Callable[[float], None]:
        return self._add(self.m.xturn_bound, self.tier, self.backend)

    @cached_property
    def spend(self) -> Callable[[float], None]:
        return self._add(self.m.spend, self.tier, self.model)


class RouterMetrics:
    """The app's series (:data:`SPECS`) and the hooks that set them; see the module docstring."""

    def __init__(
        self,
        *,
        deprecated_names: bool = True,
        short_step_tokens: int = SHORT_STEP_TOKENS,
        step_slo_s: float = SLO_STEP_S,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.short_step_tokens, self.step_slo_s = short_step_tokens, step_slo_s
        self._exposed = _Exposed(self.registry, DEPRECATED if deprecated_names else ())
        for spec in SPECS:
            setattr(self, spec.attr, self._make(spec))
        self._bundle_labels: tuple[str, str] | None = None
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # step_finished: by (protocol, tier, status, model, backend)
        self._steps: dict[tuple[Any, ...], _StepSeries] = {}

    def _make(self, spec: MetricSpec) -> Any:
        kw: dict[str, Any] = {"registry": self.registry, "unit": spec.unit}
        if spec.kind == "counter":
            return Counter(spec.name, spec.help, spec.labels, **kw)
        if spec.kind == "gauge":
            return Gauge(spec.name, spec.help, spec.labels, **kw)
        return Histogram(spec.name, spec.help, spec.labels, buckets=LATENCY_BUCKETS, **kw)

    def __getattr__(self, name: str) -> Any:  # the series of SPECS, set in __init__ (for mypy)
        raise AttributeError(name)

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    # ------------------------------------------------------------------ hot-path hooks
    def request_rejected(self, status: int, handler: str = CHAT_HANDLER) -> None:
        """A chat request answered before routing (401, 404, 413, 400/422, 429, 431, 499, 503 no
        bundle) or without a backend (503 no_healthy_backend: its step is recorded, not counted here)."""
        self.child(self.requests, handler, "none", str(status)).inc()

    def request_served(self, handler: str, status: int) -> None:
        """Any other endpoint (counted by the app for every request it answers)."""
        self.child(self.requests, handler, "none", str(status)).inc()

    def admission_verdict(self, verdict: str, priority: str, reason: str) -> None:
        self.child(self.admission, verdict, priority, reason).inc()

    def decided(self, plan: StepPlan) -> None:
        """A committed decision (:class:`router.core.engine.StepPlan`): a run starts at its step 0
        (the store's step index, unique across routers) or at a first-step admission verdict (a run
        id used again after its end); a move of a pinned run (``flapped``) to the frontier is an
        escalation (the frontier tier is one backend, so the run was local)."""
        d = plan.decision
        self.child(self.decisions, d.tier, d.reason).inc()
        if plan.step == 0 or plan.admission is not None:
            self.child(self.runs_started, d.tier).inc()
        if plan.flapped:
            self.child(self.flaps, "policy").inc()
            if d.tier == "frontier":
                self.child(self.escalations, d.reason).inc()
        fb = plan.frontier_budget
        if fb is not None:
            self.child(self.budget_share, plan.policy_name).set(fb.share)
            if plan.budget_realised is not None:
                self.child(self.budget_realised, plan.policy_name, plan.budget_domain).set(
                    plan.budget_realised
                )

    def fell_back(self, from_tier: str, decision: Decision) -> None:
        """A step retried on another backend after an upstream failure."""
        self.child(self.fallbacks, from_tier, decision.tier).inc()
        self.child(self.flaps, "fallback").inc()
        self.child(self.decisions, decision.tier, decision.reason).inc()
        if from_tier == "local" and decision.tier == "frontier":
            self.child(self.escalations, decision.reason).inc()

    def upstream_error(self, tier: str, kind: str) -> None:
        self.child(self.upstream_errors, tier, kind).inc()

    def step_finished(self, rec: Step, prev_tokens: int, state: BackendState | None) -> None:
        """Every per-step series from the step's run-log record (:class:`features.schema.Step`);
        ``prev_tokens``: the run's previous served prompt + output tokens as this router saw them
        (0: unknown), ``state``: the serving backend's ``BackendState`` (prices; None: nothing served).

        Each series is the step's contribution to a scorecard figure as :mod:`router.core.figures`
        defines it (summed by Prometheus rather than computed over a batch): the short/long split
        (:func:`~router.core.figures.is_short`), the cross-turn counters (steps after a run's first;
        the bound is :func:`~router.core.figures.upper_bound_tokens`), the spend
        (:func:`router.core.accounting.backend_step_usd`). ``runroute_slo_steps`` is not the
        scorecard's SLO attainment: it judges every step's end-to-end latency against
        ``slo.step_latency_s``."""
        tier = rec.tier or "none"
        status, model, backend = rec.status, rec.model or "", rec.replica or ""
        key = (rec.protocol, tier, status, model, backend)
        ss = self._steps.get(key)
        if ss is None:
            handler = HANDLERS.get(rec.protocol or "chat", CHAT_HANDLER)
            ss = self._steps[key] = _StepSeries(self, handler, tier, str(status), model, backend)
        if rec.error_code != "no_healthy_backend":  # that answer is counted by request_rejected
            ss.requests()
        if rec.ttft_s is not None:
            ss.ttft(rec.ttft_s)
        if status != 200:
            return
        latency, prompt, cached = rec.latency_s or 0.0, rec.prompt_tokens, rec.cached_tokens or 0
        out = rec.completion_tokens
        short = is_short(out, bool(rec.tool_calls), bool(rec.structured), self.short_step_tokens)
        (ss.latency_short if short else ss.latency_long)(latency)
        (ss.slo_yes if latency <= self.step_slo_s else ss.slo_no)()
        ss.prompt(prompt)
        ss.output(out)
        if cached:
            ss.cached(cached)
        if rec.step > 0:
            ss.xturn_prompt(prompt)
            ss.xturn_cached(cached)
            ss.xturn_bound(upper_bound_tokens(prev_tokens, prompt))
        if state is not None:
            usd = backend_step_usd(state, prompt, cached, out)
            if usd > 0:
                ss.spend(usd)

    # ------------------------------------------------------------------ set elsewhere
    def set_prefix_mode(self, replica: str, mode: str) -> None:
        """The prefix index's mode of ``replica`` (router.server.state.kv_events tells each change)."""
        for m in ("precise", "approximate"):
            self.child(self.prefix_index_mode, replica, m).set(1 if m == mode else 0)

    def set_bundle(self, version: str | None, registry_version: str | None = None) -> None:
        if self._bundle_labels is not None:
            self.bundle_info.remove(*self._bundle_labels)
            self._bundle_labels = None
        if version is not None:
            self._bundle_labels = (version, registry_version or "")
            self.bundle_info.labels(*self._bundle_labels).set(1)

    def set_domains(self, benefit: BenefitModel | None) -> None:
        """``runroute_domain_mode{domain,mode}`` = 1 per domain of the serving bundle's benefit
        model (:class:`models.benefit.BenefitModel`; None: no series)."""
        self.domain_mode.clear()
        for dom, d in benefit.domains.items() if benefit is not None else ():
            self.domain_mode.labels(dom, d.mode).set(1)

    def signal_posted(self, kind: str) -> None:
        self.run_signals.labels(kind).inc()

    def bundle_reloaded(self, ok: bool) -> None:
        self.bundle_reloads.labels("ok" if ok else "refused").inc()

    def set_backends(self, backends: Iterable[Backend], stats: dict[str, ReplicaStats]) -> None:
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
        """Copy the figures of ``GET /v1/capacity`` (:meth:`router.server.hotpath.admission.LiveAdmission.capacity`)."""
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
        return next(s for s in SPECS if s.attr == attr)
