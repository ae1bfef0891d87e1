"""Translation between the three protocols when the chosen backend does not speak the client's.

Chat Completions is the pivot: a Responses or Messages request goes to a chat-only backend as a
chat request (:func:`responses_to_chat`, :func:`messages_to_chat`), a chat request to an Anthropic
backend as a Messages request (:func:`chat_to_messages`; a Responses request for an Anthropic
backend goes through both). Answers come back the other way (:mod:`router.server.protocols.translate_answers`:
whole bodies; :mod:`router.server.protocols.translate_stream`: streams). Field by field (checked against the ``openai`` and
``anthropic`` SDKs' types by tests/test_translate.py):

- roles and turns: Responses ``instructions`` / system / developer items and Messages ``system``
  become the chat system message; chat system messages become Messages ``system`` blocks.
  Responses ``function_call`` items and Messages ``tool_use`` blocks are chat ``tool_calls`` (one
  assistant message per turn), ``function_call_output`` items and ``tool_result`` blocks are chat
  ``tool`` messages (an ``is_error`` result is prefixed ``Error: ``), and back again.
- content: text parts map to text parts/blocks; images: Responses ``input_image``, chat
  ``image_url`` and Messages ``image`` (base64 or URL source) map to each other.
- tools: function tools map (``parameters`` <-> ``input_schema``); built-in tools (web search,
  computer use, Anthropic server tools) have no translation: 400 ``untranslatable``.
- choices: ``tool_choice`` auto / none / required(any) / a named function; ``text.format`` JSON modes
  <-> ``response_format``; ``max_output_tokens`` / ``max_tokens``; ``stop_sequences`` <-> ``stop``;
  ``temperature`` (clipped to Anthropic's [0, 1]), ``top_p``; Messages needs ``max_tokens``
  (``DEFAULT_MAX_TOKENS`` when the chat request had none); ``user`` <-> ``metadata.user_id``.
- prompt caching: a chat request sent to Anthropic gets ``cache_control: ephemeral`` on the system
  prompt and on the last block of the last message (the whole prefix is cached and re-read on the
  next step, as a chat backend caches automatically); ``cache_control`` from a Messages client is
  dropped towards a chat backend.
- thinking/reasoning blocks and items have no chat equivalent and are dropped in translation (they
  pass through untouched on the fast path).
- finish reasons: stop <-> end_turn, length <-> max_tokens, tool_calls <-> tool_use,
  content_filter <-> refusal; usage: chat ``prompt_tokens`` = Anthropic ``input_tokens +
  cache_creation_input_tokens + cache_read_input_tokens``, cached = ``cache_read_input_tokens`` =
  Responses ``input_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import orjson

from router.server.errors import ProxyError
from router.server.protocols.sse import JSONObject, obj_of, objs_of

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "responses_to_chat",
    "messages_to_chat",
    "chat_to_messages",
    "finish_to_stop",
    "stop_to_finish",
    "new_id",
]

DEFAULT_MAX_TOKENS = 4096
_FINISH_TO_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_STOP_TO_FINISH = {
    "end_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "stop_sequence": "stop",
    "refusal": "content_filter",
    "pause_turn": "stop",
}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def finish_to_stop(finish: object) -> str:
    return _FINISH_TO_STOP.get(str(finish), "end_turn")


def stop_to_finish(stop: object) -> str:
    return _STOP_TO_FINISH.get(str(stop), "stop")


def _untranslatable(what: str) -> ProxyError:
    return ProxyError(400, "untranslatable", f"{what} cannot be translated for the chosen backend")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return "" if content is None else str(content)


def _copy(src: Mapping[str, object], dst: JSONObject, *keys: str) -> None:
    for k in keys:
        if src.get(k) is not None:
            dst[k] = src[k]


# ------------------------------------------------------------------ Responses -> chat
def _resp_part(part: object) -> JSONObject:
    p = obj_of(part)
    t = p.get("type")
    if t in ("input_text", "output_text", "text", "summary_text"):
        return {"type": "text", "text": str(p.get("text", ""))}
    if t == "refusal":
        return {"type": "text", "text": str(p.get("refusal", ""))}
    if t == "input_image":
        url = p.get("image_url")
        if not isinstance(url, str):
            raise _untranslatable("an input_image without image_url")
        return {"type": "image_url", "image_url": {"url": url, "detail": p.get("detail") or "auto"}}
    raise _untranslatable(f"content part {t!r}")


def _chat_content(c: object) -> str | list[JSONObject]:
    if isinstance(c, str):
        return c
    parts = [_resp_part(p) for p in (c if isinstance(c, list) else ())]
    texts = [p["text"] for p in parts if p["type"] == "text" and isinstance(p["text"], str)]
    return "".join(texts) if len(texts) == len(parts) else parts


def responses_to_chat(body: Mapping[str, object], model: str) -> JSONObject:
    """A Responses request as a chat-completions request (module docstring)."""
    msgs: list[JSONObject] = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": _text(body["instructions"])})
    inp = body.get("input")
    items: list[JSONObject] = [{"role": "user", "content": inp}] if isinstance(inp, str) else objs_of(inp)
    calls: list[JSONObject] | None = None  # the tool calls of msgs[-1], an assistant message
    for it in items:
        t = it.get("type", "message")
        if t == "message":
            role = it.get("role")
            msgs.append(
                {
                    "role": role if role != "developer" else "system",
                    "content": _chat_content(it.get("content")),
                }
            )
            calls = None
        elif t == "function_call":
            call: JSONObject = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": str(it.get("arguments") or "")},
            }
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and calls is not None:
                calls.append(call)
            elif last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str):
                calls = last["tool_calls"] = [call]
            else:
                calls = [call]
                msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif t == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": _text(it.get("output"))})
            calls = None
        elif t in ("reasoning", "item_reference", "compaction"):
            continue
        else:
            raise _untranslatable(f"input item {t!r}")
    out: JSONObject = {"model": model, "messages": msgs}
    tools = objs_of(body.get("tools"))
    if tools:
        ctools = []
        for tl in tools:
            if tl.get("type") != "function":
                raise _untranslatable(f"tool type {tl.get('type')!r}")
            fn: JSONObject = {"name": tl["name"]}
            _copy(tl, fn, "description", "parameters", "strict")
            ctools.append({"type": "function", "function": fn})
        out["tools"] = ctools
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        out["tool_choice"] = tc
    elif isinstance(tc, dict) and tc.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            js: JSONObject = {"name": fmt.get("name") or "response"}
            _copy(fmt, js, "schema", "strict", "description")
            out["response_format"] = {"type": "json_schema", "json_schema": js}
        elif fmt.get("type") == "json_object":
            out["response_format"] = {"type": "json_object"}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    _copy(body, out, "temperature", "top_p", "parallel_tool_calls", "user")
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


# ------------------------------------------------------------------ Messages -> chat
def _image_url(src: object) -> str:
    if isinstance(src, dict):
        if src.get("type") == "base64":
            return f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
        if src.get("type") == "url":
            return str(src.get("url", ""))
    raise _untranslatable("an image source other than base64 or url")


def _msg_parts(blocks: list[JSONObject]) -> str | list[JSONObject]:
    parts: list[JSONObject] = []
    for b in blocks:
        t = b.get("type")
        if t == "text":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
        elif t == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source"))}})
        elif t in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _untranslatable(f"content block {t!r}")
    texts = [p["text"] for p in parts if p["type"] == "text" and isinstance(p["text"], str)]
    return "".join(texts) if len(texts) == len(parts) else parts


def messages_to_chat(body: Mapping[str, object], model: str) -> JSONObject:
    """A Messages request as a chat-completions request (module docstring)."""
    msgs: list[JSONObject] = []
    system = body.get("system")
    if system:
        msgs.append({"role": "system", "content": _text(system)})
    for m in objs_of(body.get("messages")):
        c = m.get("content")
        if m["role"] == "assistant":
            if isinstance(c, str):
                msgs.append({"role": "assistant", "content": c})
                continue
            blocks = objs_of(c)
            text = "".join(
                t for b in blocks if b.get("type") == "text" and isinstance(t := b.get("text", ""), str)
            )
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {
                        "name": b.get("name"),
                        "arguments": orjson.dumps(b.get("input") or {}).decode(),
                    },
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            for b in blocks:
                if b.get("type") not in ("text", "tool_use", "thinking", "redacted_thinking"):
                    raise _untranslatable(f"assistant block {b.get('type')!r}")
            am: JSONObject = {"role": "assistant", "content": text or None}
            if calls:
                am["tool_calls"] = calls
            msgs.append(am)
            continue
        if isinstance(c, str):
            msgs.append({"role": "user", "content": c})
            continue
        rest = []
        for b in objs_of(c):
            if b.get("type") == "tool_result":
                txt = _text(b.get("content"))
                if b.get("is_error"):
                    txt = "Error: " + txt
                msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": txt})
            else:
                rest.append(b)
        if rest:
            msgs.append({"role": "user", "content": _msg_parts(rest)})
    out: JSONObject = {"model": model, "messages": msgs, "max_tokens": body["max_tokens"]}
    tools = objs_of(body.get("tools"))
    if tools:
        ctools = []
        for tl in tools:
            if tl.get("type") not in (None, "custom"):
                raise _untranslatable(f"tool type {tl.get('type')!r}")
            fn: JSONObject = {"name": tl["name"], "parameters": tl.get("input_schema") or {"type": "object"}}
            _copy(tl, fn, "description")
            ctools.append({"type": "function", "function": fn})
        out["tools"] = ctools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
        elif kind in ("auto", "any", "none"):
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
        if tc.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    _copy(body, out, "temperature", "top_p")
    meta = body.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("user_id"), str):
        out["user"] = meta["user_id"]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


# ------------------------------------------------------------------ chat -> Messages
def _anth_blocks(content: object) -> list[JSONObject]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[JSONObject] = []
    for part in content if isinstance(content, list) else (content,):
        p = obj_of(part)
        t = p.get("type")
        if t == "text":
            out.append({"type": "text", "text": str(p.get("text", ""))})
        elif t == "image_url":
            url = str(obj_of(p.get("image_url")).get("url", ""))
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                out.append({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
            else:
                out.append({"type": "image", "source": {"type": "url", "url": url}})
        else:
            raise _untranslatable(f"content part {t!r}")
    return out


def chat_to_messages(body: Mapping[str, object], model: str) -> JSONObject:
    """A chat-completions request as a Messages request (module docstring)."""
    system: list[str] = []
    turns: list[tuple[str, list[JSONObject]]] = []  # (role, content blocks)

    def add(role: str, blocks: list[JSONObject]) -> None:
        if not blocks:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))

    for m in objs_of(body.get("messages")):
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
        elif role == "user":
            add("user", _anth_blocks(m.get("content")))
        elif role == "assistant":
            blocks = _anth_blocks(m.get("content"))
            for tc in objs_of(m.get("tool_calls")):
                fn = obj_of(tc.get("function"))
                text = fn.get("arguments") or "{}"
                try:
                    args = orjson.loads(text) if isinstance(text, (str, bytes)) else {}
                except orjson.JSONDecodeError:
                    args = {}
                blocks.append({"type": "tool_use", "id": tc.get("id"), "name": fn.get("name"), "input": args})
            add("assistant", blocks)
        elif role in ("tool", "function"):
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": m.get("tool_call_id"),
                        "content": _text(m.get("content")),
                    }
                ],
            )
    if turns and turns[-1][1]:
        last = turns[-1][1]
        last[-1] = {**last[-1], "cache_control": {"type": "ephemeral"}}
    mt = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    messages: list[JSONObject] = [{"role": role, "content": blocks} for role, blocks in turns]
    out: JSONObject = {"model": model, "max_tokens": mt, "messages": messages}
    if system:
        out["system"] = [
            {"type": "text", "text": "\n\n".join(system), "cache_control": {"type": "ephemeral"}}
        ]
    tools = objs_of(body.get("tools"))
    if tools:
        out["tools"] = [
            {
                "name": fn.get("name"),
                "description": fn.get("description") or "",
                "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
            }
            for t in tools
            if t.get("type") == "function" and (fn := obj_of(t.get("function")))
        ]
    choice_in = body.get("tool_choice")
    if choice_in in ("auto", "none"):
        out["tool_choice"] = {"type": choice_in}
    elif choice_in == "required":
        out["tool_choice"] = {"type": "any"}
    elif isinstance(choice_in, dict):
        out["tool_choice"] = {"type": "tool", "name": obj_of(choice_in.get("function")).get("name")}
    if body.get("parallel_tool_calls") is False and tools:
        choice = out.get("tool_choice")
        if not isinstance(choice, dict):
            auto: JSONObject = {"type": "auto"}
            choice = out["tool_choice"] = auto
        choice["disable_parallel_tool_use"] = True
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = list(stop) if isinstance(stop, list) else [stop]
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float, str)):
        out["temperature"] = min(float(temperature), 1.0)
    _copy(body, out, "top_p")
    if isinstance(body.get("user"), str):
        out["metadata"] = {"user_id": body["user"]}
    if body.get("stream"):
        out["stream"] = True
    return out
