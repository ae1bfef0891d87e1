"""A fake backend for the protocol axis of ``bench/overhead.py --realistic``: the peers'
``fake_backend.py`` model (raw ASGI, 20 ms per request, 16 SSE chunks spread over it, usage from the
body size) for all three protocols, so chat, Responses and Messages are measured against one backend.

- ``POST /v1/chat/completions``: as the peers' fake (``chat.completion``, SSE chunks + ``[DONE]``).
- ``POST /v1/responses``: a ``response`` with one ``message`` output item; streamed as
  ``response.created``, 16 ``response.output_text.delta``, ``response.completed`` (with usage).
- ``POST /v1/messages``: an Anthropic ``message``; streamed as ``message_start``, a text block with
  16 ``text_delta``, ``message_delta`` (usage), ``message_stop``.
- ``GET /health``, ``/v1/models``, ``/metrics``: tiny static answers.

Each request body is parsed once with orjson (as the peers' fake does), whatever its protocol.
Knobs: ``--port``, ``--delay-ms`` (20), ``--chunks`` (16).

Usage: ``python bench/proto_backend.py --port 18000`` (uvloop + httptools when present).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import orjson

__all__ = ["app", "main"]

DELAY = 0.020
NCHUNKS = 16
JSON_HDR = [(b"content-type", b"application/json")]
SSE_HDR = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def _body(receive: Any) -> bytes:
    parts = []
    while True:
        msg = await receive()
        if msg["type"] == "http.request":
            parts.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                return b"".join(parts)
        elif msg["type"] == "http.disconnect":
            return b"".join(parts)


async def _json(send: Any, obj: Any, status: int = 200) -> None:
    body = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status, "headers": JSON_HDR})
    await send({"type": "http.response.body", "body": body})


def _named(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def _events(proto: str, model: str, n_in: int) -> tuple[list[bytes], bytes, dict[str, Any]]:
    """(per-chunk SSE bytes, closing bytes, the non-streaming body) of one answer."""
    text = " ".join(["tok"] * NCHUNKS)
    rid = uuid.uuid4().hex[:24]
    if proto == "chat":
        base = {
            "id": "chatcmpl-" + rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        usage = {"prompt_tokens": n_in, "completion_tokens": NCHUNKS, "total_tokens": n_in + NCHUNKS}
        chunks = [
            b"data: "
            + orjson.dumps(
                {**base, "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}]}
            )
            + b"\n\n"
            for _ in range(NCHUNKS)
        ]
        last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        body = {
            **base,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }
        return chunks, b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n", body
    if proto == "responses":
        usage = {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": NCHUNKS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + NCHUNKS,
        }
        item = {
            "type": "message",
            "id": "msg_" + rid,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        resp = {
            "id": "resp_" + rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
        }
        body = {
            **resp,
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }
        first = _named(
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {**resp, "status": "in_progress", "output": []},
            }
        )
        chunks = [
            _named(
                {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 1,
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "tok ",
                }
            )
            for i in range(NCHUNKS)
        ]
        chunks[0] = first + chunks[0]
        return (
            chunks,
            _named({"type": "response.completed", "sequence_number": NCHUNKS + 1, "response": body}),
            body,
        )
    usage = {
        "input_tokens": n_in,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": NCHUNKS,
    }
    msg = {
        "id": "msg_" + rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
    }
    body = {**msg, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": usage}
    first = _named(
        {"type": "message_start", "message": {**msg, "content": [], "usage": {**usage, "output_tokens": 1}}}
    )
    first += _named(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    chunks = [
        _named({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "tok "}})
        for _ in range(NCHUNKS)
    ]
    chunks[0] = first + chunks[0]
    end = _named({"type": "content_block_stop", "index": 0})
    end += _named(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": NCHUNKS},
        }
    )
    end += _named({"type": "message_stop"})
    return chunks, end, body


async def _generate(receive: Any, send: Any, proto: str) -> None:
    raw = await _body(receive)
    try:
        req = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        await _json(send, {"error": {"message": "bad json"}}, 400)
        return
    chunks, end, body = _events(proto, str(req.get("model", "fake-model")), max(1, len(raw) // 4))
    if not req.get("stream"):
        await asyncio.sleep(DELAY)
        await _json(send, body)
        return
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HDR})
    loop = asyncio.get_running_loop()
    t0, step = loop.time(), DELAY / NCHUNKS
    for i, c in enumerate(chunks):
        await asyncio.sleep(max(0.0, t0 + (i + 1) * step - loop.time()))
        await send({"type": "http.response.body", "body": c, "more_body": True})
    await send({"type": "http.response.body", "body": end, "more_body": False})


_PATHS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if scope["method"] == "POST" and path in _PATHS:
        return await _generate(receive, send, _PATHS[path])
    if path == "/v1/models":
        return await _json(
            send, {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "fake"}]}
        )
    if path == "/health":
        return await _json(send, b"{}")
    if path == "/metrics":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"vllm:num_requests_running 0\n"})
        return
    await _json(send, {"error": {"message": "not found: " + path}}, 404)


def main() -> None:
    global DELAY, NCHUNKS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--chunks", type=int, default=16)
    a = ap.parse_args()
    DELAY, NCHUNKS = a.delay_ms / 1000.0, a.chunks
    import uvicorn

    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False, lifespan="on")


if __name__ == "__main__":
    main()
