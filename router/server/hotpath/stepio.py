"""The step's I/O besides routing: what is sent upstream, the answer of a non-streaming step, the
``x-runroute-*`` headers, and the record of a finished step (``turn.finish`` -> run summary,
run log, metrics, the Responses store; an unserved first step's slot given back). The step's
``turn`` (:mod:`router.core.driver`) is finished here, once.

:class:`StepIO` is a mixin of :class:`router.server.hotpath.proxy.Proxy` (it uses the proxy's engine,
writer, metrics, store and settings); split out so the hot path stays readable and each hook
(``_outbound``, ``_answer_body``, ``_headers``, ``_finish``) is one small method other layers
(metrics, tracing) can extend.

- ``_outbound``: the protocol the backend is spoken to (:func:`router.server.protocols.base.pick_protocol`:
  the client's own when the backend serves it, else chat), the capture that reads (and, when the
  protocols differ, translates) its answer, and the bytes: the client's body with only ``model``
  rewritten on the fast path, else the translation; ``anthropic-beta`` / ``openai-beta`` client
  headers go along to a backend of that protocol; with ``local.request_logprobs`` a local
  replica spoken to in chat is asked for ``logprobs`` (``_logprobs_mode``; the capture strips them
  again when the client did not ask, :mod:`router.server.hotpath.posthoc`).
- ``_answer_body``: a 200 answer through the capture (translated when needed); a backend's error
  answer in the client's protocol when translating (the backend's message kept, code
  ``upstream_<status>``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from router.core.driver import StepTurn
from router.core.engine import StepEngine, StepPlan
from router.core.record import StepResult, step_entry
from router.policy.types import RunState
from router.server.hotpath.answers import step_headers
from router.server.hotpath.backends import Backend, state_of
from router.server.hotpath.posthoc import offered_tools, token_cap
from router.server.hotpath.posthoc import scan as posthoc_scan
from router.server.hotpath.posthoc import uncertainty as posthoc_uncertainty
from router.server.protocols.base import Adapter, ClientRequest, pick_protocol
from router.server.protocols.chat import add_logprobs
from router.server.runs.lifecycle import MAX_SIGNALS

if TYPE_CHECKING:  # pragma: no cover
    from router.server.hotpath.admission import LiveAdmission
    from router.server.hotpath.proxy import RunHistory
    from router.server.hotpath.upstream import UpstreamResponse
    from router.server.metrics.registry import RouterMetrics
    from router.server.runs.log_writer import RunLogWriter
    from router.server.settings import RouterSettings
    from router.server.state.store import RunStateStore
    from router.server.tracing import Tracing

__all__ = ["StepIO", "StepContext"]

log = logging.getLogger("runroute.proxy")
_FORWARD_HEADERS = {"messages": ("anthropic-beta",), "responses": ("openai-beta",), "chat": ()}


@dataclass(slots=True)
class StepContext:
    """Everything the proxy holds about one step while it is being served."""

    turn: StepTurn  # the engine's call order for this step (router.core.driver)
    plan: StepPlan
    run: RunState
    hist: RunHistory
    backend: Backend
    req: ClientRequest
    proto: Adapter  # the client's protocol adapter
    t0: float
    arrival_s: float
    capture: Any
    ttft_s: float | None = None
    done: bool = False
    span: Any = None  # tracing: the step span and the open upstream span
    up_span: Any = None


class StepIO:
    """Mixin: see the module docstring."""

    engine: StepEngine
    writer: RunLogWriter | None
    admission: LiveAdmission | None
    store: RunStateStore
    m: RouterMetrics
    s: RouterSettings
    clock: Callable[[], float]
    perf: Callable[[], float]
    tracing: Tracing | None

    def _outbound(self, ctx: StepContext) -> tuple[str, bytes, dict[str, str]]:
        b, req = ctx.backend, ctx.req
        bp = pick_protocol(req.protocol, b.urls)
        model = req.model_alias if b.pass_model and req.model_alias else b.model
        req.extra["logprobs"] = lp = self._logprobs_mode(req, b, bp)
        ctx.capture = ctx.proto.capture(req, bp)
        body = ctx.proto.outbound(req, bp, model, b.name)
        if lp == "router":
            body = add_logprobs(body, req.body if req.protocol == "chat" else {})
        headers = b.headers
        fwd = _FORWARD_HEADERS.get(bp, ())
        if fwd and req.extra.get("headers"):
            headers = {**headers, **{k: v for k, v in req.extra["headers"].items() if k in fwd}}
        return b.urls[bp], body, headers

    def _logprobs_mode(self, req: ClientRequest, b: Backend, bp: str) -> str | None:
        """Who asked a step's backend for logprobs (:mod:`router.server.protocols.chat`):
        ``"client"`` (a chat client did), ``"router"`` (``local.request_logprobs``: a local
        replica spoken to in chat), else None."""
        if bp != "chat":
            return None
        if req.protocol == "chat" and req.body.get("logprobs") is True:
            return "client"
        local = self.s.local
        if b.tier == "local" and local is not None and local.request_logprobs:
            return "router"
        return None

    def _answer_body(self, ctx: StepContext, resp: UpstreamResponse, data: bytes) -> tuple[bytes, str]:
        status = resp.status
        media = resp.headers.get("content-type", "application/json")
        if status == 200:
            data = ctx.capture.json(data)
            if ctx.capture.translating:
                media = "application/json"
        elif ctx.capture.translating:  # the backend's error, in the client's protocol
            data = ctx.proto.error_body(status, f"upstream_{status}", _error_message(data))
            media = "application/json"
        return data, media

    def _served(self, ctx: StepContext) -> None:
        """A step answered 200: its opening is served; a Responses answer is remembered."""
        if ctx.req.extra.get("opening"):
            ctx.hist.served_opening = True
        remember = getattr(ctx.proto, "remember", None)
        if remember is not None:
            remember(ctx.req, ctx.capture, ctx.run.run_id, ctx.backend.name)

    def _headers(self, ctx: StepContext) -> dict[str, str]:
        return step_headers(ctx.plan, ctx.run.run_id, ctx.backend.tier, ctx.backend.name)

    # ------------------------------------------------------------------ record
    async def _close(
        self, ctx: StepContext, status: int, error_code: str | None, locked: bool = False
    ) -> None:
        """Finish the step (once) and await what must happen before the answer completes."""
        after = self._finish(ctx, status, error_code, locked)
        if after is not None:
            await after

    async def _give_back(self, run: RunState | None, holds: bool, lock: asyncio.Lock | None = None) -> None:
        """Release an admission slot (``holds``) and store ``run`` (when given), under ``lock``."""
        if lock is not None:
            async with lock:
                return await self._give_back(run, holds)
        if holds and self.admission is not None:
            await self.admission.release(run, True)
        if run is not None:
            await self.store.put(run)

    async def _after(self, give: Awaitable[None] | None, durable: Awaitable[None] | None) -> None:
        if give is not None:
            await give
        if durable is not None:
            try:
                await durable
            except Exception as e:  # noqa: BLE001 - the answer still goes out; the loss is logged
                log.error("run log: step record not durable: %s", e)

    def _finish(
        self, ctx: StepContext, status: int, error_code: str | None, locked: bool = False
    ) -> Awaitable[None] | None:
        """Record the step (once: later calls are no-ops); returns the work the answer waits for
        (an unserved first step's give-back, the record's fsync with ``durability: ack``)."""
        if ctx.done:
            return None
        ctx.done = True  # before anything that may raise: a later exit must not record it again
        latency = self.perf() - ctx.t0
        prompt, cached, completion = ctx.capture.counts()
        names, keys = ctx.capture.tools()
        b = ctx.backend
        u = posthoc_uncertainty(ctx.capture.token_logprobs()) if b.tier == "local" and status == 200 else None
        posthoc = self._posthoc(ctx, status, names, keys, prompt, completion, u)
        prev_tokens = ctx.hist.last_tokens if ctx.hist.base.steps else 0
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
        turn = ctx.turn
        rec = turn.finish(
            res,
            now=self.clock(),
            tier=b.tier or None,
            replica=b.name or None,
            model=b.model or None,
            arrival_s=ctx.arrival_s,
        )
        assert rec is not None
        ctx.hist.entries.append(step_entry(rec, ctx.plan.fallback_from, ctx.plan.decision.switched))
        if status == 200:
            self._served(ctx)
        durable = None
        if self.writer is not None:
            out = dict(rec.__dict__)
            if u is not None:
                out["answer_uncertainty"] = u
            if self.s.runlog.log_prompts:
                body = ctx.req.body
                out["prompt_text"] = orjson.dumps(
                    body.get("messages") if "messages" in body else body.get("input")
                ).decode()
            durable = self.writer.submit(out)
        give = None
        if turn.unserved:  # a first step not served: its admission went back in the engine
            give = self._give_back(ctx.run, turn.release_slot, None if locked else ctx.hist.lock)
        self.m.step_finished(rec, prev_tokens, state_of(ctx.plan.snapshot.backends, b.name))
        if ctx.span is not None and self.tracing is not None:
            self.tracing.end_step(ctx.span, rec, ctx.up_span)
        if posthoc:
            give = self._post_signals(ctx.run.run_id, posthoc, give)
        if give is None and durable is None:
            return None
        return self._after(give, durable)

    def _posthoc(
        self,
        ctx: StepContext,
        status: int,
        names: tuple[str, ...],
        keys: tuple[str, ...],
        prompt: int | None,
        completion: int,
        u: dict[str, float] | None = None,
    ) -> tuple[str, ...]:
        """The post-hoc signals of a local step's 200 answer (:mod:`router.server.hotpath.posthoc`)."""
        if status != 200 or ctx.backend.tier != "local":
            return ()
        steps = ctx.hist.base.steps
        body = ctx.req.body
        return posthoc_scan(
            names=names,
            keys=keys,
            args=ctx.capture.call_args(),
            prompt_tokens=prompt,
            completion_tokens=completion,
            offered=offered_tools(body),
            cap=token_cap(body),
            previous_keys=steps[-1].tool_call_keys if steps else (),
            mean_nll=u["mean_nll"] if u is not None else None,
            low_confidence_nll=self.s.local.low_confidence_nll if self.s.local is not None else None,
        )

    async def _post_signals(self, run_id: str, kinds: tuple[str, ...], give: Awaitable[None] | None) -> None:
        """Append ``kinds`` to the run's signals (the next step sees them) after ``give``; a store
        failure loses the signals, not the answer."""
        if give is not None:
            await give
        for kind in kinds:
            try:
                n = await self.store.add_signal(run_id, kind, MAX_SIGNALS)
            except Exception as e:  # noqa: BLE001 - evidence only; the answer still goes out
                log.warning("run %s: post-hoc signal %s not stored: %s", run_id, kind, e)
                return
            if n > 0:
                self.m.signal_posted(kind)


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
