"""The aiohttp server shared by the fake backends; each fake supplies its engine model.

Request path of ``POST /v1/chat/completions`` (and, where the fake serves them, ``/v1/responses`` and
``/v1/messages``, answered in their own shapes by :mod:`router.fakes.answers`): ``precheck`` (auth,
rate limit) -> parse and validate the body once with orjson -> failure injection (``error_rate``: a 5xx before the first byte) ->
synthesise the completion -> ``admit`` (wait for a slot in the engine's FIFO queue) -> sleep the
time to first token -> write the answer (one JSON body, or SSE chunks paced by the per-token decode
time, then a usage chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``) ->
``finish`` (give the slot back, record metrics). ``abort_rate`` cuts the response mid-body (the
client sees a truncated payload). A client that disconnects cancels the handler (``cancelled`` in
the stats), as vLLM aborts the request.

Knobs common to every fake (``CommonKnobs``): ``model`` served model name; ``name`` shown in the
``x-fake-backend`` header; ``zero_latency`` turns every delay off (fast tests); ``delay_ms`` a fixed
delay before the first byte; ``error_rate`` / ``error_status`` injected failures; ``abort_rate``
mid-body aborts; ``seed`` for the failure-injection RNG; ``default_tokens`` completion length when the
request sets no max_tokens; ``max_tokens_cap`` the longest completion; ``tool_call_rate`` chance of a
tool call under tool_choice "auto"; ``strict_model`` refuse requests naming another model (404, as
the real servers do); ``max_concurrency`` requests served at once (0 = unlimited), the rest wait FIFO; ``max_tool_turns``
(0 = never) answers with text once a request carries that many tool results (a run that finishes).

Extra endpoints for tests and demos: ``GET /fake/state`` (counters and knobs, JSON) and
``POST /fake/config`` (JSON object of knob updates, validated; the response is the new knob set).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson
from aiohttp import web

from router.fakes.answers import Exchange
from router.fakes.apis import anthropic_error_body, messages_view
from router.fakes.knobs import CommonKnobs, KnobError, Stats, Ticket, validate_knobs
from router.fakes.protocol import (
    FakeRequestError,
    ParsedRequest,
    TokenMemo,
    error_body,
    load_body,
    parse_body,
)
from router.fakes.synth import Completion, synthesize

__all__ = ["CommonKnobs", "FakeServer", "Ticket", "KnobError"]

_JSON = "application/json"


class FakeServer:
    """Base of the fakes: HTTP handling, queueing, streaming, failure injection.

    Subclasses set ``kind``, ``knobs_class`` and implement the engine hooks: ``can_admit``,
    ``on_admit``, ``on_finish``, ``ttft_s``, ``decode_s_per_token``, ``usage``, ``metrics_text``.
    """

    kind: ClassVar[str] = "fake"
    knobs_class: ClassVar[type[CommonKnobs]] = CommonKnobs
    response_extra: ClassVar[dict[str, Any]] = {}
    vllm_shapes: ClassVar[bool] = False  # build vLLM's response/chunk shapes (see fakes.responses)
    usage_null_in_chunks: ClassVar[bool] = False
    error_types: ClassVar[dict[int, str]] = {}
    protocols: ClassVar[tuple[str, ...]] = ("chat",)

    def __init__(self, **knobs: object):
        self.knobs = validate_knobs(self.knobs_class, knobs)
        self.stats = Stats()
        self.running = 0
        self._waiting: deque[tuple[asyncio.Future[Ticket], Ticket, ParsedRequest, Completion]] = deque()
        self._rng = random.Random(self.knobs.seed)
        self._memo = TokenMemo()
        self.responses_store: dict[str, list[dict[str, Any]]] = {}
        self._port: int | None = None
        self._header_value = ""
        self._refresh_header()
        self.started_at = time.time()

    # --- knobs ---------------------------------------------------------------------------------

    def _refresh_header(self) -> None:
        name = self.knobs.name or (f"127.0.0.1:{self._port}" if self._port else "unbound")
        self._header_value = self.header_name(name)

    def header_name(self, name: str) -> str:
        return f"{self.kind}-fake/{name}"

    def bind_port(self, port: int) -> None:
        self._port = port
        self._refresh_header()

    def update(self, **changes: object) -> None:
        """Change knobs at run time (validated as a whole; unknown names refused)."""
        merged = {**self.knobs.model_dump(), **changes}
        new = validate_knobs(self.knobs_class, merged)
        self.on_knobs_change(self.knobs, new)
        if new.seed != self.knobs.seed:
            self._rng = random.Random(new.seed)
        self.knobs = new
        self._refresh_header()
        self._drain()

    def on_knobs_change(self, old: CommonKnobs, new: CommonKnobs) -> None:  # pragma: no cover - hook
        return None

    # --- engine hooks (overridden) ------------------------------------------------------------

    def validate(self, req: ParsedRequest, comp: Completion) -> None:
        return None

    def can_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> bool:
        mc = self.knobs.max_concurrency
        return mc == 0 or self.running < mc

    def on_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        return None

    def on_finish(self, ticket: Ticket, comp: Completion, ok: bool, ttft: float, end: float) -> None:
        return None

    def ttft_s(self, ticket: Ticket) -> float:
        return 0.0

    def decode_s_per_token(self, ticket: Ticket) -> float:
        return 0.0

    def usage(self, ticket: Ticket, comp: Completion) -> dict[str, Any]:
        n, c = ticket.prompt_tokens, comp.completion_tokens
        return {"prompt_tokens": n, "total_tokens": n + c, "completion_tokens": c}

    def response_headers(
        self, ticket: Ticket, comp: Completion, usage: Mapping[str, object] | None
    ) -> dict[str, str]:
        return {}

    def precheck(self, request: web.Request, protocol: str = "chat") -> web.Response | None:
        return None

    def routes(self) -> list[tuple[str, str]]:
        """``(path, protocol)`` of the generation endpoints this fake serves."""
        paths = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
        return [(paths[p], p) for p in self.protocols]

    def metrics_text(self) -> str:
        return ""

    def model_not_found(self, model: str) -> FakeRequestError:
        """The 404 for a request naming another model (vLLM's own wording in the vLLM fake)."""
        return FakeRequestError(
            404, f"The model `{model}` does not exist.", "NotFoundError", "model_not_found"
        )

    def error_response(
        self,
        status: int,
        message: str,
        type_: str | None = None,
        code: str | int | None = None,
        headers=None,
        param=None,
    ):
        t = type_ or self.error_types.get(
            status, "BadRequestError" if status < 500 else "InternalServerError"
        )
        return web.Response(
            status=status,
            body=error_body(message, t, code if code is not None else status, param),
            content_type=_JSON,
            headers=headers,
        )

    # --- queue ---------------------------------------------------------------------------------

    async def _admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        if not self._waiting and self.can_admit(ticket, req, comp):
            self._start(ticket, req, comp)
            return
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        entry = (fut, ticket, req, comp)
        self._waiting.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            if fut.done() and not fut.cancelled():  # admitted just as we were cancelled
                self._finish(ticket, comp, False, 0.0)
            else:
                try:
                    self._waiting.remove(entry)
                except ValueError:
                    pass
                self._drain()
            raise

    def _start(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        self.running += 1
        ticket.admitted = time.perf_counter()
        self.on_admit(ticket, req, comp)

    def _finish(self, ticket: Ticket, comp: Completion, ok: bool, ttft: float) -> None:
        self.running -= 1
        self.on_finish(ticket, comp, ok, ttft, time.perf_counter())
        self._drain()

    def _drain(self) -> None:
        w = self._waiting
        while w:
            fut, ticket, req, comp = w[0]
            if fut.done():
                w.popleft()
                continue
            if not self.can_admit(ticket, req, comp):
                break
            w.popleft()
            self._start(ticket, req, comp)
            fut.set_result(ticket)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # --- handlers ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path, proto in self.routes():
            handler = {
                "chat": self.handle_chat,
                "responses": self.handle_responses,
                "messages": self.handle_messages,
            }[proto]
            app.router.add_post(path, handler)
            if proto == "messages":
                app.router.add_post(path + "/count_tokens", self.handle_count_tokens)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/load", self.handle_load)
        app.router.add_get("/fake/state", self.handle_state)
        app.router.add_post("/fake/config", self.handle_config)
        app.on_response_prepare.append(self._add_headers)
        return app

    async def _add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-fake-backend"] = self._header_value

    def models_card(self) -> dict[str, Any]:
        return {
            "id": self.knobs.model,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": self.kind,
        }

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps({"object": "list", "data": [self.models_card()]}), content_type=_JSON
        )

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def handle_load(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps({"server_load": self.running + self.waiting}), content_type=_JSON
        )

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain", charset="utf-8")

    async def handle_state(self, request: web.Request) -> web.Response:
        from dataclasses import asdict

        state = {
            "kind": self.kind,
            "header": self._header_value,
            "running": self.running,
            "waiting": self.waiting,
            "stats": asdict(self.stats),
            "knobs": self.knobs.model_dump(),
            **self.extra_state(),
        }
        return web.Response(body=orjson.dumps(state), content_type=_JSON)

    def extra_state(self) -> dict[str, Any]:
        return {}

    async def handle_config(self, request: web.Request) -> web.Response:
        try:
            changes = orjson.loads(await request.read())
            if not isinstance(changes, dict):
                raise KnobError("body must be a JSON object of knob updates")
            self.update(**changes)
        except (KnobError, orjson.JSONDecodeError) as e:
            return self.error_response(400, str(e))
        return web.Response(body=orjson.dumps(self.knobs.model_dump()), content_type=_JSON)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "chat")

    async def handle_responses(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "responses")

    async def handle_messages(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "messages")

    async def handle_count_tokens(self, request: web.Request) -> web.StreamResponse:
        refused = self.precheck(request, "messages")
        if refused is not None:
            return refused
        try:
            view, _ = messages_view(load_body(await request.read()), need_max_tokens=False)
            n = len(parse_body(view, self._memo).tokens)
        except FakeRequestError as e:
            return self.protocol_error("messages", e.status, e.message, e.type, e.code, param=e.param)
        return web.Response(body=orjson.dumps({"input_tokens": n}), content_type=_JSON)

    def protocol_error(
        self,
        protocol: str,
        status: int,
        message: str,
        type_: str | None = None,
        code: str | int | None = None,
        headers=None,
        param=None,
    ):
        """An error in the protocol's shape (Messages: Anthropic's, else OpenAI's / vLLM's)."""
        if protocol == "messages":
            t = {
                400: "invalid_request_error",
                401: "authentication_error",
                404: "not_found_error",
                429: "rate_limit_error",
                529: "overloaded_error",
            }
            return web.Response(
                status=status,
                body=anthropic_error_body(t.get(status, "api_error"), message),
                content_type=_JSON,
                headers=headers,
            )
        return self.error_response(status, message, type_, code, headers, param)

    def on_parsed(self, ex: Exchange, req: ParsedRequest, ticket: Ticket) -> None:  # pragma: no cover - hook
        return None

    async def handle(self, request: web.Request, protocol: str) -> web.StreamResponse:
        st = self.stats
        st.requests += 1
        arrived = time.perf_counter()
        refused = self.precheck(request, protocol)
        if refused is not None:
            return refused
        k = self.knobs
        ex = Exchange(self, protocol)
        try:
            req = ex.parse(await request.read())
            if req.model is not None:
                st.models_seen[req.model] = st.models_seen.get(req.model, 0) + 1
                if k.strict_model and req.model != k.model:
                    raise self.model_not_found(req.model)
            if k.max_tool_turns and req.tool_results >= k.max_tool_turns:
                req.tool_choice = "none"  # the agent's task is done: a final text answer
            comp = synthesize(
                req,
                default_tokens=k.default_tokens,
                max_tokens_cap=k.max_tokens_cap,
                tool_call_rate=k.tool_call_rate,
                malformed_tool_call_rate=k.malformed_tool_call_rate,
            )
            self.validate(req, comp)
        except FakeRequestError as e:
            st.bad_requests += 1
            return self.protocol_error(protocol, e.status, e.message, e.type, e.code, param=e.param)
        st.protocols[protocol] = st.protocols.get(protocol, 0) + 1
        lat = not k.zero_latency
        if lat and k.delay_ms > 0:
            await asyncio.sleep(k.delay_ms / 1000.0)
        if k.error_rate and self._rng.random() < k.error_rate:
            st.errors_injected += 1
            return self.protocol_error(protocol, k.error_status, "injected failure (fake backend error_rate)")
        abort = bool(k.abort_rate) and self._rng.random() < k.abort_rate
        ticket = Ticket(arrived=arrived, prompt_tokens=len(req.tokens))
        self.on_parsed(ex, req, ticket)
        await self._admit(ticket, req, comp)
        ok = False
        ttft = 0.0
        try:
            if lat:
                t = self.ttft_s(ticket)
                if t > 0:
                    await asyncio.sleep(t)
            ex.ids(comp)
            if req.stream:
                resp, ttft = await self._stream(request, ticket, req, comp, abort, ex)
            else:
                resp, ttft = await self._unary(request, ticket, req, comp, abort, ex)
            ok = not abort
            return resp
        except (asyncio.CancelledError, ConnectionError):  # client went away mid-answer
            st.cancelled += 1
            raise
        finally:
            self._finish(ticket, comp, ok, ttft)
            if ok:
                st.completed += 1
                st.prompt_tokens += ticket.prompt_tokens
                st.cached_tokens += ticket.cached_tokens
                st.completion_tokens += comp.completion_tokens

    async def _unary(
        self,
        request: web.Request,
        ticket: Ticket,
        req: ParsedRequest,
        comp: Completion,
        abort: bool,
        ex: Exchange,
    ) -> tuple[web.StreamResponse, float]:
        ttft = time.perf_counter() - ticket.arrived
        if not self.knobs.zero_latency:
            d = self.decode_s_per_token(ticket) * max(0, comp.completion_tokens - 1)
            if d > 0:
                await asyncio.sleep(d)
        usage = self.usage(ticket, comp)
        body = ex.body_bytes(comp, usage)
        headers = self.response_headers(ticket, comp, usage)
        if not abort:
            return web.Response(body=body, content_type=_JSON, headers=headers), ttft
        self.stats.aborts_injected += 1
        resp = web.StreamResponse(headers=headers)
        resp.content_type = _JSON
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        _cut(request)
        return resp, ttft

    async def _stream(
        self,
        request: web.Request,
        ticket: Ticket,
        req: ParsedRequest,
        comp: Completion,
        abort: bool,
        ex: Exchange,
    ) -> tuple[web.StreamResponse, float]:
        self.stats.streamed += 1
        resp = web.StreamResponse(headers=self.response_headers(ticket, comp, None))
        resp.content_type = "text/event-stream"
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        per_tok = 0.0 if self.knobs.zero_latency else self.decode_s_per_token(ticket)
        usage = self.usage(ticket, comp)
        chunks = ex.events(comp, req, usage)
        cut_at = len(chunks) // 2 if abort else -1
        t_first = time.perf_counter()
        ttft = t_first - ticket.arrived
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, (done, data) in enumerate(chunks):
            if i == cut_at:
                self.stats.aborts_injected += 1
                _cut(request)
                return resp, ttft
            if per_tok > 0 and done > 1:
                wait = t0 + (done - 1) * per_tok - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            await resp.write(data)
        await resp.write(ex.tail(comp, req, usage))
        await resp.write_eof()
        return resp, ttft


def _cut(request: web.Request) -> None:
    """Drop the connection mid-body (failure injection)."""
    transport = request.transport
    if transport is not None:
        transport.close()
