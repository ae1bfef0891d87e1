"""Server-sent events as the three protocols write them, and the shared bits of reading bodies.

- Chat Completions: ``data: {json}\\n\\n`` per chunk, ending with ``data: [DONE]\\n\\n``;
- Responses and Messages: ``event: <type>\\ndata: {json}\\n\\n`` (the JSON's ``type`` repeats the
  event name); no terminator.

:func:`parse_event` reads one event (``(name, object)``; the object is ``None`` for ``[DONE]`` or
anything that is not a JSON object); :func:`encode` writes one in a protocol's shape.
:func:`text_of` joins the text of a content value (a string, or a list of parts/blocks with
``text``), the one normalisation the run-identity hash uses in every protocol.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["DONE", "parse_event", "encode", "text_of", "looks_error"]

DONE = b"data: [DONE]\n\n"
_ERR_WORDS = ("error", "exception", "traceback")


def parse_event(ev: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """``(event name or None, JSON object or None)`` of one SSE event (without its blank line)."""
    name = None
    data = b""
    for line in ev.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data = line[5:].strip() if not data else data + line[5:].strip()
    if not data or data == b"[DONE]":
        return name, None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return name, None
    return name, obj if isinstance(obj, dict) else None


def encode(protocol: str, obj: dict[str, Any]) -> bytes:
    """One event in ``protocol``'s SSE shape (module docstring)."""
    if protocol == "chat":
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    return b"event: " + str(obj.get("type", "message")).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def text_of(content: Any) -> str | None:
    """The text of a message content (string, or the ``text`` of its parts); None when absent."""
    if content is None:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            if isinstance(p, dict) and isinstance(p.get("text"), str)
            else (p if isinstance(p, str) else "")
            for p in content
        )
    return str(content)


def looks_error(c: Any) -> bool:
    """A tool result that reports a failure: ``error``/``exception``/``traceback`` in its first 200
    characters (the same rule for every protocol)."""
    if isinstance(c, str):
        head = c[:200]
    elif isinstance(c, list):
        head = " ".join(
            p.get("text", "") for p in c[:4] if isinstance(p, dict) and isinstance(p.get("text"), str)
        )[:200]
    else:  # validated content is a string, a list or null: nothing else is stringified
        head = ""
    head = head.lower()
    return any(w in head for w in _ERR_WORDS)
