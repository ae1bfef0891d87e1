"""Streamed answers translated event by event, and the capture that reads and translates an answer.

Each translator takes the backend's SSE events as JSON objects, one at a time, and returns the
client protocol's events (objects), in order; ``close()`` flushes what the end of the stream implies.

- :class:`ChatToResponses` (a chat backend, a Responses client): ``response.created`` /
  ``response.in_progress`` first; a text delta opens a ``message`` item (``output_item.added``,
  ``content_part.added``) and becomes ``output_text.delta``; a tool-call header opens a
  ``function_call`` item and its argument pieces become ``function_call_arguments.delta``; the end
  (``[DONE]`` or the stream's end) closes every open item (``*.done``) and sends
  ``response.completed`` with the whole response and usage. Events carry ``sequence_number``.
- :class:`ChatToMessages` (a chat backend, a Messages client): ``message_start`` (usage unknown
  yet: zeros), ``content_block_start`` / ``content_block_delta`` (``text_delta``,
  ``input_json_delta``) / ``content_block_stop`` per text or tool call, then ``message_delta`` with
  the stop reason and the usage the chat stream reported last, then ``message_stop``.
- :class:`MessagesToChat` (an Anthropic backend, a chat client): the first chunk carries the
  role, ``text_delta`` becomes ``delta.content``, a ``tool_use`` block a tool-call header and its
  ``input_json_delta`` pieces argument deltas; ``message_delta`` gives the finish reason; the usage
  chunk (when the client asked for it) and ``[DONE]`` end it. Thinking deltas are dropped.
- A Responses client on an Anthropic backend chains :class:`MessagesToChat` and
  :class:`ChatToResponses`.

:func:`translating_capture` builds the capture the hot path uses: the backend protocol's reader
(usage, tool calls) plus the translation of JSON bodies and streams.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import orjson

from router.server.protocols.base import AnswerReader, ClientRequest, JSONObject
from router.server.protocols.chat import ChatReader
from router.server.protocols.messages import MessagesReader
from router.server.protocols.sse import DONE, encode, obj_of, objs_of, parse_event
from router.server.protocols.translate import finish_to_stop, new_id, stop_to_finish
from router.server.protocols.translate_answers import (
    call_item,
    chat_to_messages_json,
    chat_to_responses_json,
    chat_usage_from_messages,
    message_item,
    messages_to_chat_json,
    messages_usage_from_chat,
    response_shell,
    responses_usage_from_chat,
)

__all__ = [
    "Translator",
    "ChatToResponses",
    "ChatToMessages",
    "MessagesToChat",
    "TranslatingCapture",
    "translating_capture",
]

Obj = JSONObject


class Translator(Protocol):
    """One stage of a stream translation: events in (None: ``[DONE]``), events out."""

    def feed(self, obj: Obj | None) -> list[Obj]: ...
    def close(self) -> list[Obj]: ...


class ChatToResponses:
    """Chat chunks -> Responses events (module docstring)."""

    def __init__(self, req: Mapping[str, object], model: str = ""):
        self.req, self.model = req, model
        self.rid = new_id("resp_")
        self.seq = 0
        self.started = False
        self.items: list[Obj] = []  # output items in order (as announced)
        self.text_idx: int | None = None
        self.text = ""  # the message item's text so far
        self.args: dict[int, str] = {}  # a function_call item's arguments so far, by output index
        self.calls: dict[object, int] = {}  # chat tool-call index -> output index
        self.usage: Obj | None = None
        self.finish: str | None = None
        self.done = False
        self.response: Obj | None = None

    def _ev(self, out: list[Obj], type_: str, **kw: object) -> None:
        out.append({"type": type_, "sequence_number": self.seq, **kw})
        self.seq += 1

    def _shell(self, status: str) -> Obj:
        return response_shell(self.req, self.model, self.rid, status)

    def _start(self, out: list[Obj]) -> None:
        if not self.started:
            self.started = True
            self._ev(out, "response.created", response=self._shell("in_progress"))
            self._ev(out, "response.in_progress", response=self._shell("in_progress"))

    def feed(self, obj: Obj | None) -> list[Obj]:
        out: list[Obj] = []
        if obj is None:  # [DONE]
            return self.close()
        if obj.get("model") and not self.model:
            self.model = str(obj["model"])
        self._start(out)
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = u
        for ch in objs_of(obj.get("choices")):
            d = obj_of(ch.get("delta"))
            content = d.get("content")
            if content:
                if self.text_idx is None:
                    self.text_idx = len(self.items)
                    item = message_item("", new_id("msg_"), "in_progress")
                    self.items.append(item)
                    self._ev(out, "response.output_item.added", output_index=self.text_idx, item=item)
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    self._ev(
                        out,
                        "response.content_part.added",
                        item_id=item["id"],
                        output_index=self.text_idx,
                        content_index=0,
                        part=part,
                    )
                self.text += str(content)
                self._ev(
                    out,
                    "response.output_text.delta",
                    item_id=self.items[self.text_idx]["id"],
                    output_index=self.text_idx,
                    content_index=0,
                    delta=content,
                    logprobs=[],
                )
            for tc in objs_of(d.get("tool_calls")):
                k = tc.get("index", 0)
                fn = obj_of(tc.get("function"))
                if k not in self.calls:
                    self.calls[k] = len(self.items)
                    self.args[self.calls[k]] = ""
                    item = call_item(
                        str(tc.get("id") or new_id("call_")),
                        str(fn.get("name") or ""),
                        "",
                        new_id("fc_"),
                        "in_progress",
                    )
                    self.items.append(item)
                    self._ev(out, "response.output_item.added", output_index=self.calls[k], item=dict(item))
                piece = fn.get("arguments") or ""
                if piece:
                    self.args[self.calls[k]] += str(piece)
                    self._ev(
                        out,
                        "response.function_call_arguments.delta",
                        item_id=self.items[self.calls[k]]["id"],
                        output_index=self.calls[k],
                        delta=piece,
                    )
            if ch.get("finish_reason"):
                self.finish = str(ch["finish_reason"])
        return out

    def close(self) -> list[Obj]:
        if self.done:
            return []
        self.done = True
        out: list[Obj] = []
        self._start(out)
        final: list[Obj] = []
        for i, it in enumerate(self.items):
            item_id = str(it["id"])
            if it["type"] == "message":
                text = self.text
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                self._ev(
                    out,
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=i,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                self._ev(
                    out,
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=i,
                    content_index=0,
                    part=part,
                )
                done = message_item(text, item_id)
            else:
                self._ev(
                    out,
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=i,
                    name=it["name"],
                    arguments=self.args[i],
                )
                done = {**it, "arguments": self.args[i], "status": "completed"}
            final.append(done)
            self._ev(out, "response.output_item.done", output_index=i, item=done)
        status = "incomplete" if self.finish == "length" else "completed"
        r = self._shell(status)
        r["output"] = final
        r["usage"] = responses_usage_from_chat(self.usage)
        if status == "incomplete":
            r["incomplete_details"] = {"reason": "max_output_tokens"}
        self.response = r
        self._ev(out, "response.completed" if status == "completed" else "response.incomplete", response=r)
        return out


class ChatToMessages:
    """Chat chunks -> Messages events (module docstring)."""

    def __init__(self, model: str = ""):
        self.model = model
        self.started = False
        self.block: int | None = None  # open content block index
        self.kind: str | None = None
        self.n = 0
        self.calls: dict[object, int] = {}  # chat tool-call index -> content block index
        self.usage: Obj | None = None
        self.finish: str | None = None
        self.done = False

    def _start(self, out: list[Obj]) -> None:
        if not self.started:
            self.started = True
            msg: Obj = {
                "id": new_id("msg_"),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 0,
                },
            }
            out.append({"type": "message_start", "message": msg})

    def _close_block(self, out: list[Obj]) -> None:
        if self.block is not None:
            out.append({"type": "content_block_stop", "index": self.block})
            self.block = self.kind = None

    def feed(self, obj: Obj | None) -> list[Obj]:
        if obj is None:
            return self.close()
        out: list[Obj] = []
        if obj.get("model") and not self.model:
            self.model = str(obj["model"])
        self._start(out)
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = u
        for ch in objs_of(obj.get("choices")):
            d = obj_of(ch.get("delta"))
            if d.get("content"):
                if self.kind != "text":
                    self._close_block(out)
                    self.block, self.kind = self.n, "text"
                    self.n += 1
                    out.append(
                        {
                            "type": "content_block_start",
                            "index": self.block,
                            "content_block": {"type": "text", "text": ""},
                        }
                    )
                out.append(
                    {
                        "type": "content_block_delta",
                        "index": self.block,
                        "delta": {"type": "text_delta", "text": d["content"]},
                    }
                )
            for tc in objs_of(d.get("tool_calls")):
                k = tc.get("index", 0)
                fn = obj_of(tc.get("function"))
                if k not in self.calls:
                    self._close_block(out)
                    self.calls[k] = self.block = self.n
                    self.kind = f"tool{k}"
                    self.n += 1
                    cb = {
                        "type": "tool_use",
                        "id": str(tc.get("id") or new_id("toolu_")),
                        "name": str(fn.get("name") or ""),
                        "input": {},
                    }
                    out.append({"type": "content_block_start", "index": self.block, "content_block": cb})
                if fn.get("arguments"):
                    out.append(
                        {
                            "type": "content_block_delta",
                            "index": self.calls[k],
                            "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                        }
                    )
            if ch.get("finish_reason"):
                self.finish = str(ch["finish_reason"])
        return out

    def close(self) -> list[Obj]:
        if self.done:
            return []
        self.done = True
        out: list[Obj] = []
        self._start(out)
        self._close_block(out)
        out.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": finish_to_stop(self.finish), "stop_sequence": None},
                "usage": messages_usage_from_chat(self.usage),
            }
        )
        out.append({"type": "message_stop"})
        return out


class MessagesToChat:
    """Messages events -> chat chunks (module docstring)."""

    def __init__(self, include_usage: bool, model: str = ""):
        self.include_usage = include_usage
        self.model = model
        self.cid = new_id("chatcmpl-")
        self.created = int(time.time())
        self.usage: Obj = {}
        self.calls: dict[object, int] = {}  # block index -> tool-call index
        self.finish: str | None = None
        self.done = False

    def _chunk(self, delta: Obj, finish: str | None = None) -> Obj:
        return {
            "id": self.cid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    def feed(self, obj: Obj | None) -> list[Obj]:
        if obj is None:
            return []
        t = obj.get("type")
        if t == "message_start":
            msg = obj_of(obj.get("message"))
            self.model = self.model or str(msg.get("model", ""))
            self.usage.update(obj_of(msg.get("usage")))
            return [self._chunk({"role": "assistant", "content": ""})]
        if t == "content_block_start":
            b = obj_of(obj.get("content_block"))
            if b.get("type") == "tool_use":
                k = self.calls[obj.get("index", 0)] = len(self.calls)
                head = {
                    "index": k,
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": ""},
                }
                return [self._chunk({"tool_calls": [head]})]
            if b.get("type") == "text" and b.get("text"):
                return [self._chunk({"content": b["text"]})]
            return []
        if t == "content_block_delta":
            d = obj_of(obj.get("delta"))
            if d.get("type") == "text_delta":
                return [self._chunk({"content": d.get("text", "")})]
            if d.get("type") == "input_json_delta" and obj.get("index", 0) in self.calls:
                k = self.calls[obj.get("index", 0)]
                return [
                    self._chunk(
                        {"tool_calls": [{"index": k, "function": {"arguments": d.get("partial_json", "")}}]}
                    )
                ]
            return []
        if t == "message_delta":
            self.usage.update({k: v for k, v in obj_of(obj.get("usage")).items() if v is not None})
            self.finish = stop_to_finish(obj_of(obj.get("delta")).get("stop_reason"))
            return [self._chunk({}, self.finish)]
        if t == "message_stop":
            return self.close()
        return []

    def close(self) -> list[Obj]:
        if self.done:
            return []
        self.done = True
        if not self.include_usage:
            return []
        c = self._chunk({})
        c["choices"] = []
        c["usage"] = chat_usage_from_messages(self.usage)
        return [c]


class TranslatingCapture:
    """The backend protocol's reader + the translation into the client's protocol."""

    markers: tuple[bytes, ...] | None = None  # every event
    translating: bool = True

    def __init__(self, req: ClientRequest, backend_protocol: str):
        self.client = req.protocol
        self.backend = backend_protocol
        self.req = req
        self.reader: AnswerReader = (
            ChatReader(logprobs=req.extra.get("logprobs")) if backend_protocol == "chat" else MessagesReader()
        )
        self.chain: list[Translator] = []
        self.response: Obj | None = None  # the Responses object produced (Responses clients)
        body = req.body
        so = body.get("stream_options")
        include = self.client != "chat" or (isinstance(so, dict) and so.get("include_usage") is True)
        if backend_protocol == "messages":
            self.chain.append(MessagesToChat(include_usage=include))
        if self.client == "responses":
            self.chain.append(ChatToResponses(body))
        elif self.client == "messages":
            self.chain.append(ChatToMessages())

    # ---- JSON
    def json(self, data: bytes) -> bytes:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(obj, dict):
            return data
        self.reader.read(obj)
        chat = messages_to_chat_json(obj) if self.backend == "messages" else obj
        if self.client == "chat":
            return orjson.dumps(chat)
        if self.client == "responses":
            self.response = chat_to_responses_json(chat, self.req.body)
            return orjson.dumps(self.response)
        return orjson.dumps(chat_to_messages_json(chat))

    # ---- SSE
    def _run(self, objs: list[Obj | None], stage: int = 0) -> list[Obj | None]:
        for tr in self.chain[stage:]:
            nxt: list[Obj | None] = []
            for o in objs:
                nxt.extend(tr.feed(o))
            objs = nxt
        return objs

    def _encode(self, objs: list[Obj | None]) -> bytes:
        out = b"".join(encode(self.client, o) for o in objs if o is not None)
        last = self.chain[-1] if self.chain else None
        if isinstance(last, ChatToResponses) and last.response is not None:
            self.response = last.response
        return out

    def event(self, ev: bytes) -> bytes | None:
        name, obj = parse_event(ev)
        if obj is None and b"[DONE]" not in ev:
            return None
        if obj is not None:
            self.reader.read_event(obj)
        return self._encode(self._run([obj])) or None

    def finish_stream(self) -> bytes:
        """Close every stage in order, feeding what an earlier stage flushes through the later ones."""
        pending: list[Obj | None] = []
        for tr in self.chain:
            nxt: list[Obj | None] = []
            for o in pending:
                nxt.extend(tr.feed(o))
            nxt.extend(tr.close())
            pending = nxt
        out = self._encode(pending)
        if self.client == "chat":
            out += DONE
        return out

    # ---- what the run log reads
    def counts(self) -> tuple[int | None, int | None, int]:
        return self.reader.counts()

    def tools(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.reader.tools()

    def call_args(self) -> tuple[str, ...]:
        return self.reader.call_args()

    def token_logprobs(self) -> list[float]:
        """The backend's token logprobs (a chat backend asked for them; the translation drops them)."""
        return self.reader.token_logprobs()

    def response_id(self) -> str | None:
        rid = self.response.get("id") if self.response else None
        return rid if isinstance(rid, str) else None

    def output_items(self) -> list[Obj]:
        return objs_of(self.response.get("output")) if self.response else []


def translating_capture(req: ClientRequest, backend_protocol: str) -> TranslatingCapture:
    return TranslatingCapture(req, backend_protocol)
