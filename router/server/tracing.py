"""OpenTelemetry tracing of the hot path: a span per step, the upstream call as its child, W3C trace
context in and out. Off by default (``tracing.enabled``); when off, :func:`make_tracing` returns
None, the proxy skips every hook with one ``is None`` test and the OpenTelemetry SDK is never
imported (FastAPI itself imports the ``opentelemetry`` API package).

Algorithm:

- :meth:`Tracing.start_step`: a ``runroute.step`` span (kind SERVER) starts when the request has
  been read; its parent is the client's ``traceparent`` / ``tracestate`` when present (W3C Trace
  Context, :class:`TraceContextTextMapPropagator`), else a new trace.
- :meth:`Tracing.start_upstream`: a ``runroute.upstream`` child span (kind CLIENT) per attempt,
  with ``runroute.backend`` / ``runroute.tier`` / ``server.address``; the headers sent upstream get
  the child's ``traceparent`` (so vLLM / the frontier, or a proxy in between, continue the trace).
  A failed attempt ends its span with an error status (``runroute.error``: connect / timeout / 5xx);
  a fallback starts a second child.
- :meth:`Tracing.end_step`: when the step is recorded (after the last streamed byte), the step span
  gets the step's facts from its run-log record — ``runroute.run_id``, ``runroute.step``,
  ``runroute.tier``, ``runroute.backend``, ``runroute.reason``, ``runroute.admission``, token
  counts (``runroute.prompt_tokens``, ``runroute.cached_tokens``, ``runroute.completion_tokens``),
  ``http.response.status_code`` — and ends, with the open upstream span. Steps refused before a
  record (429) end with their status. Run ids are span attributes, never metric labels.

Knobs (:class:`router.server.settings.TracingSettings`): ``enabled``; ``exporter`` (``otlp``:
OTLP/HTTP to ``endpoint`` through a batch processor, needs ``opentelemetry-exporter-otlp-proto-http``;
``console``; ``memory``: an in-process exporter, for tests and the overhead bench); ``service_name``;
``sample_ratio`` (parent-based: a sampled client trace is always continued).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

    from features.schema import Step
    from router.server.hotpath.backends import Backend
    from router.server.settings import RouterSettings, TracingSettings

__all__ = ["Tracing", "make_tracing"]


def make_tracing(settings: RouterSettings) -> Tracing | None:
    """A :class:`Tracing` for ``settings.tracing`` when enabled, else None (no import at all)."""
    t = getattr(settings, "tracing", None)
    if t is None or not t.enabled:
        return None
    return Tracing(t)


class Tracing:
    """The sidecar's tracer provider (its own, not the global one) and the span hooks."""

    def __init__(self, s: TracingSettings):
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace, self._kind, self._status, self._code = trace, SpanKind, Status, StatusCode
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": s.service_name}),
            sampler=ParentBased(TraceIdRatioBased(s.sample_ratio)),
        )
        self.memory: Any = None
        if s.exporter == "memory":
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            self.memory = InMemorySpanExporter()
            self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        elif s.exporter == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise ValueError(
                    "tracing.exporter otlp needs the package opentelemetry-exporter-otlp-proto-http"
                ) from None
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=s.endpoint)))
        self.tracer = self.provider.get_tracer("runroute")
        self.propagator = TraceContextTextMapPropagator()

    # ------------------------------------------------------------------ hooks
    def start_step(self, headers: Mapping[str, str]) -> Span:
        tp = headers.get("traceparent")
        parent = None
        if tp:
            carrier = {"traceparent": tp}
            ts = headers.get("tracestate")
            if ts:
                carrier["tracestate"] = ts
            parent = self.propagator.extract(carrier)
        return self.tracer.start_span("runroute.step", context=parent, kind=self._kind.SERVER)

    def start_upstream(
        self, step: Span, backend: Backend, headers: dict[str, str]
    ) -> tuple[Span, dict[str, str]]:
        """The child span of one upstream attempt and the headers to send (``headers`` plus its
        traceparent)."""
        ctx = self._trace.set_span_in_context(step)
        span = self.tracer.start_span(
            "runroute.upstream",
            context=ctx,
            kind=self._kind.CLIENT,
            attributes={
                "runroute.backend": backend.name,
                "runroute.tier": backend.tier,
                "server.address": backend.root,
                "gen_ai.request.model": backend.model,
            },
        )
        headers = dict(headers)
        self.propagator.inject(headers, context=self._trace.set_span_in_context(span))
        return span, headers

    def end_upstream(self, span: Span | None, status: int | None = None, error: str | None = None) -> None:
        """End one attempt's span (returns None: the caller's handle is cleared with it)."""
        if span is None or not span.is_recording():
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None:
            span.set_attribute("runroute.error", error)
            span.set_status(self._status(self._code.ERROR, error))
        span.end()

    def end_step(self, span: Span | None, rec: Step, upstream: Span | None = None) -> None:
        """Close the step span (and an open upstream span) with the step record's facts."""
        if upstream is not None:
            self.end_upstream(upstream, rec.status if rec.status != 200 else None)
        if span is None or not span.is_recording():
            return
        attrs: dict[str, AttributeValue] = {
            "runroute.run_id": rec.run_id,
            "runroute.step": rec.step,
            "runroute.tier": rec.tier or "none",
            "runroute.backend": rec.replica or "",
            "runroute.reason": rec.reason or "",
            "runroute.prompt_tokens": rec.prompt_tokens,
            "runroute.cached_tokens": rec.cached_tokens or 0,
            "runroute.completion_tokens": rec.completion_tokens,
            "http.response.status_code": rec.status or 0,
        }
        if rec.admission:
            attrs["runroute.admission"] = rec.admission
        if rec.model:
            attrs["gen_ai.response.model"] = rec.model
        span.set_attributes(attrs)
        if rec.status and rec.status >= 500:
            span.set_status(self._status(self._code.ERROR, rec.error_code or str(rec.status)))
        span.end()

    def end_refused(self, span: Span | None, run_id: str, status: int, code: str) -> None:
        """A step refused before it had a record (e.g. 429 at admission)."""
        if span is None or not span.is_recording():
            return
        span.set_attributes(
            {"runroute.run_id": run_id, "http.response.status_code": status, "runroute.error": code}
        )
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()
