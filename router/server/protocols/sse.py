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

import orjson

__all__ = ["DONE", "JSONObject", "parse_event", "encode", "text_of", "looks_error", "obj_of", "objs_of"]

JSONObject = dict[str, object]
"""A parsed JSON object; a value is narrowed (``isinstance``, :func:`obj_of`) before it is used."""

DONE = b"data: [DONE]\n\n"
_ERR_WORDS = ("error", "exception", "traceback")


def parse_event(ev: bytes) -> tuple[str | None, JSONObject | None]:
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


def encode(protocol: str, obj: JSONObject) -> bytes:
    """One event in ``protocol``'s SSE shape (module docstring)."""
    if protocol == "chat":
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    return b"event: " + str(obj.get("type", "message")).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def text_of(content: object) -> str | None:
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


def looks_error(c: object) -> bool:
    """A tool result that reports a failure: ``error``/``exception``/``traceback`` in its first 200
    characters (the same rule for every protocol)."""
    if isinstance(c, str):
        head = c[:200]
    elif isinstance(c, list):
        head = " ".join(t for p in c[:4] if isinstance(p, dict) and isinstance(t := p.get("text"), str))[:200]
    else:  # validated content is a string, a list or null: nothing else is stringified
        head = ""
    head = head.lower()
    return any(w in head for w in _ERR_WORDS)


def obj_of(v: object) -> JSONObject:
    """``v`` when it is a JSON object, else an empty one (a missing or malformed field reads as
    absent)."""
    return v if isinstance(v, dict) else {}


def objs_of(v: object) -> list[JSONObject]:
    """The objects of ``v`` when it is a list (other entries skipped), else none."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []
