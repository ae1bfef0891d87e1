"""The step's I/O besides routing: the answer of a non-streaming step, the ``x-runroute-*`` headers,
and the record of a finished step (engine.finish -> run summary, run log, metrics, Responses store).

:class:`StepIO` is a mixin of :class:`router.server.proxy.Proxy` (it uses the proxy's engine,
writer, metrics and settings); split out so the hot path stays readable and each hook
(``_unary``, ``_headers``, ``_finish``) is one small method other layers (metrics, tracing) can
extend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from router.core.engine import StepPlan
from router.core.record import StepResult, step_entry
from router.policy.types import RunState
from router.server.backends import Backend
from router.server.protocol import ClientRequest

__all__ = ["StepIO", "StepContext"]


@dataclass(slots=True)
class StepContext:
    """Everything the proxy holds about one step while it is being served."""

    plan: StepPlan
    run: RunState
    hist: Any  # router.server.proxy.RunHistory
    backend: Backend
    req: ClientRequest
    proto: Any
    t0: float
    arrival_s: float
    capture: Any
    ttft_s: float | None = None
    done: bool = False


class StepIO:
    """Mixin: see the module docstring."""

    engine: Any
    writer: Any
    m: Any
    s: Any
    clock: Any
    perf: Any

    def _unary(self, ctx: StepContext, resp: Any, data: bytes) -> Response:
        status = resp.status
        media = resp.headers.get("content-type", "application/json")
        if status == 200:
            data = ctx.capture.json(data)
            if ctx.capture.translating:
                media = "application/json"
        elif ctx.capture.translating:  # the backend's error, in the client's protocol
            data = ctx.proto.error_body(status, f"upstream_{status}", _error_message(data))
            media = "application/json"
        self._finish(ctx, status, None if status < 400 else f"upstream_{status}")
        return Response(data, status_code=status, media_type=media, headers=self._headers(ctx))

    def _headers(self, ctx: StepContext) -> dict[str, str]:
        p = ctx.plan
        h = {
            "x-runroute-run-id": ctx.run.run_id,
            "x-runroute-tier": ctx.backend.tier,
            "x-runroute-replica": ctx.backend.name,
            "x-runroute-reason": p.decision.reason,
            "x-runroute-step": str(p.step),
        }
        if p.fallback_from:
            h["x-runroute-fallback-from"] = p.fallback_from
        if p.admission in ("admit-local", "spill"):
            h["x-runroute-admission"] = p.admission
        return h

    # ------------------------------------------------------------------ record
    def _finish(self, ctx: StepContext, status: int, error_code: str | None) -> None:
        latency = self.perf() - ctx.t0
        cap = ctx.capture
        prompt, cached, completion = cap.counts()
        names, keys = cap.tools()
        b = ctx.backend
        res = StepResult(
            status=status,
            error_code=error_code,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            tool_calls=names,
            tool_call_keys=keys,
            ttft_s=ctx.ttft_s,
            latency_s=latency,
        )
        rec = self.engine.finish(
            ctx.plan,
            ctx.hist,
            res,
            now=self.clock(),
            tier=b.tier or None,
            replica=b.name or None,
            model=b.model or None,
            arrival_s=ctx.arrival_s,
        )
        ctx.hist.entries.append(step_entry(rec, ctx.plan.fallback_from, ctx.plan.decision.switched))
        if status == 200:
            if ctx.req.extra.get("opening"):
                ctx.hist.served_opening = True
            remember = getattr(ctx.proto, "remember", None)
            if remember is not None:
                remember(ctx.req, cap, ctx.run.run_id, b.name)
        if self.writer is not None:
            out = dict(rec.__dict__)
            if self.s.runlog.log_prompts:
                body = ctx.req.body
                prompt_part = body.get("messages") if "messages" in body else body.get("input")
                out["prompt_text"] = orjson.dumps(prompt_part).decode()
            self.writer.submit(out)
        m = self.m
        tier = b.tier or "none"
        m.child(m.requests, tier, str(status)).inc()
        if status == 200:
            short = names or rec.completion_tokens <= self.s.slo.short_step_tokens
            m.child(m.step_latency, tier, "short" if short else "long").observe(latency)
            m.child(m.prompt_tokens, tier).inc(rec.prompt_tokens)
            if rec.cached_tokens:
                m.child(m.cache_hit_tokens, tier, b.name).inc(rec.cached_tokens)
            m.child(m.slo_steps, "yes" if latency <= self.s.slo.step_latency_s else "no").inc()
        if ctx.ttft_s is not None:
            m.child(m.ttft, tier).observe(ctx.ttft_s)


def _error_message(data: bytes) -> str:
    """The message of an upstream error body (OpenAI or Anthropic shape), else its start."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:200].decode("utf-8", "replace")
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return data[:200].decode("utf-8", "replace")
