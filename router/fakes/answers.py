"""What a fake sends for each protocol: the parsed request in, the body or the stream events out.

:class:`Exchange` is one request of one protocol (``chat``, ``responses``, ``messages``) on a fake:
``parse`` reads the body into the fakes' :class:`~router.fakes.protocol.ParsedRequest` (through the
chat view of :mod:`router.fakes.apis` for Responses and Messages), ``body(comp, usage)`` builds a
non-streaming answer, ``events(comp, usage)`` the ``(output tokens so far, SSE bytes)`` of a stream
and ``tail(usage)`` what ends it (chat: the usage chunk when asked, ``[DONE]``; Responses:
``response.completed``; Messages: nothing more). ``usage(chat_usage)`` is the protocol's usage
object from the fake's chat-shaped one (Messages: ``input_tokens`` is the uncached remainder;
a fake may report cache writes through ``cache_creation``). A Responses answer is stored (unless
``store: false``) so a later ``previous_response_id`` resolves on the same server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from router.fakes.apis import (
    messages_body,
    messages_events,
    messages_view,
    responses_body,
    responses_events,
    responses_usage,
    responses_view,
)
from router.fakes.protocol import ParsedRequest, load_body, parse_body
from router.fakes.responses import SSE_DONE, chat_response, new_id, sse, stream_chunks, usage_chunk
from router.fakes.synth import Completion

if TYPE_CHECKING:
    from router.fakes.server import FakeServer

__all__ = ["Exchange", "sse_named"]


def sse_named(obj: dict[str, object]) -> bytes:
    return b"event: " + str(obj["type"]).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class Exchange:
    """One request/answer of one protocol on a fake server (module docstring)."""

    def __init__(self, server: FakeServer, protocol: str):
        self.server, self.protocol = server, protocol
        self.body: dict[str, Any] = {}
        self.items: list[dict[str, Any]] = []
        self.marks: list[int] = []
        self.cache_creation = 0
        self.rid = ""
        self.call_id = ""
        self._finish: Any = None

    def parse(self, raw: bytes) -> ParsedRequest:
        s = self.server
        self.body = load_body(raw)
        if self.protocol == "chat":
            return parse_body(self.body, s._memo)
        if self.protocol == "responses":
            view, self.items = responses_view(self.body, s.responses_store)
        else:
            view, self.marks = messages_view(self.body)
        return parse_body(view, s._memo)

    def ids(self, comp: Completion) -> None:
        if self.protocol == "chat":
            self.rid, self.call_id = new_id(), (new_id("chatcmpl-tool-") if comp.tool_name else "")
        elif self.protocol == "responses":
            self.rid, self.call_id = new_id("resp_"), new_id("call_")
        else:
            self.rid, self.call_id = new_id("msg_"), new_id("toolu_")

    def usage(self, u: dict[str, Any]) -> dict[str, Any]:
        n, c = int(u["prompt_tokens"]), int(u["completion_tokens"])
        d = u.get("prompt_tokens_details")
        cached = int(d.get("cached_tokens") or 0) if isinstance(d, dict) else 0
        if self.protocol == "chat":
            return u
        if self.protocol == "responses":
            return responses_usage(n, cached, c)
        w = min(self.cache_creation, n - cached)
        return {
            "input_tokens": n - cached - w,
            "cache_creation_input_tokens": w,
            "cache_read_input_tokens": cached,
            "output_tokens": c,
            "service_tier": "standard",
        }

    def _store(self, comp: Completion, output: list[dict[str, object]]) -> None:
        if self.body.get("store") is False:
            return
        st = self.server.responses_store
        out_items = []
        for it in output:
            if it["type"] == "message":
                out_items.append({"type": "message", "role": "assistant", "content": it["content"]})
            else:
                out_items.append({k: it[k] for k in ("type", "call_id", "name", "arguments")})
        st[self.rid] = self.items + out_items
        if len(st) > 10000:
            st.pop(next(iter(st)))

    def logprobs(self) -> int | None:
        """The chat request's ``top_logprobs`` (0 unset) when it asked for ``logprobs``, else None."""
        if self.body.get("logprobs") is not True:
            return None
        top = self.body.get("top_logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else 0

    def body_bytes(self, comp: Completion, usage: dict[str, Any]) -> bytes:
        s = self.server
        model = s.knobs.model
        if self.protocol == "chat":
            return chat_response(
                comp,
                rid=self.rid,
                model=model,
                usage=usage,
                call_id=self.call_id,
                extra=s.response_extra,
                vllm=s.vllm_shapes,
                logprobs=self.logprobs(),
            )
        if self.protocol == "responses":
            r = responses_body(self.body, comp, self.rid, model, self.usage(usage), self.call_id)
            self._store(comp, r["output"])
            return orjson.dumps(r)
        return orjson.dumps(messages_body(comp, self.rid, model, self.usage(usage), self.call_id))

    def events(self, comp: Completion, req: ParsedRequest, usage: dict[str, Any]) -> list[tuple[int, bytes]]:
        s = self.server
        model = s.knobs.model
        if self.protocol == "chat":
            chunks = stream_chunks(
                comp,
                rid=self.rid,
                model=model,
                call_id=self.call_id,
                usage_null=s.usage_null_in_chunks and req.include_usage,
                extra=s.response_extra,
                vllm=s.vllm_shapes,
                logprobs=self.logprobs(),
            )
            return [(done, sse(ch)) for done, ch in chunks]
        if self.protocol == "responses":
            evs, self._finish = responses_events(self.body, comp, self.rid, model, self.call_id)
            return [(done, sse_named(e)) for done, e in evs]
        return [
            (done, sse_named(e))
            for done, e in messages_events(comp, self.rid, model, self.usage(usage), self.call_id)
        ]

    def tail(self, comp: Completion, req: ParsedRequest, usage: dict[str, Any]) -> bytes:
        s = self.server
        if self.protocol == "chat":
            tail = b""
            if req.include_usage:
                tail = sse(usage_chunk(self.rid, s.knobs.model, usage, s.response_extra, vllm=s.vllm_shapes))
            return tail + SSE_DONE
        if self.protocol == "responses":
            last = self._finish(self.usage(usage))
            self._store(comp, last["response"]["output"])
            return sse_named(last)
        return b""
