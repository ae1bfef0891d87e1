"""The tokenizer-free prompt-size estimate, in one place for importers, the sidecar and tests.

The router has no tokenizer and must size a prompt before generation starts (features, admission,
switch cost). Training reads logged token counts; so that serving sees the same quantity, the
sidecar estimates the count the upstream's usage will report, and the step record keeps both the
estimate (``prompt_tokens_est``) and the upstream's count (``prompt_tokens``).

Algorithm:

- text: ``ceil(chars / CHARS_PER_TOKEN)`` (:func:`text_tokens`);
- a chat message: its text (string content, or the text parts of a list content, plus tool-call
  names and argument strings) + :data:`MESSAGE_OVERHEAD_TOKENS` for role/format markers
  (:func:`message_tokens`);
- a step's prompt (:func:`prompt_tokens`): when the run's previous step is known with the
  upstream's own counts, ``previous prompt + previous completion + the messages after the last
  assistant message`` (what a chat prompt adds per step: the tool results and user turns since
  the model last spoke; O(new messages), so the per-step cost does not grow with the history);
  otherwise the sum over every message plus the tool definitions' JSON size.

Knobs: :data:`CHARS_PER_TOKEN` (4.0, the rule of thumb for English/JSON with BPE tokenizers) and
:data:`MESSAGE_OVERHEAD_TOKENS` (4; OpenAI's cookbook counts 3-4 per message).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CHARS_PER_TOKEN",
    "MESSAGE_OVERHEAD_TOKENS",
    "text_tokens",
    "content_chars",
    "message_tokens",
    "prompt_tokens",
]

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4


def text_tokens(n_chars: int) -> int:
    """Estimated tokens of ``n_chars`` characters of text."""
    return math.ceil(n_chars / CHARS_PER_TOKEN) if n_chars > 0 else 0


def content_chars(content: Any) -> int:
    """Characters of a message content: a string, or a list of parts (``text`` / ``content`` /
    nested lists), anything else by its ``str`` length. Depth-limited (32) so a hostile body
    cannot recurse without bound."""
    return _chars(content, 0)


def _chars(c: Any, depth: int) -> int:
    if isinstance(c, str):
        return len(c)
    if c is None or depth > 32:
        return 0
    if isinstance(c, list):
        return sum(_chars(p, depth + 1) for p in c)
    if isinstance(c, dict):
        n = 0
        for key in ("text", "content", "input", "output", "arguments"):
            v = c.get(key)
            if v is not None:
                n += _chars(v, depth + 1)
        return n
    return len(str(c))


def message_tokens(m: Any) -> int:
    """Estimated tokens of one chat message (content + tool calls + overhead)."""
    if not isinstance(m, dict):
        return MESSAGE_OVERHEAD_TOKENS
    n = content_chars(m.get("content"))
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        for tc in calls:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                n += len(str(fn.get("name") or "")) + len(str(fn.get("arguments") or ""))
    return text_tokens(n) + MESSAGE_OVERHEAD_TOKENS


def prompt_tokens(
    messages: Sequence[Any],
    *,
    previous_total: int | None = None,
    tools_chars: int = 0,
) -> int:
    """Estimated prompt tokens of a chat request (see the module docstring).

    ``previous_total``: the run's previous step's prompt + completion tokens as the upstream
    counted them (None when unknown: the whole request is estimated). ``tools_chars``: size of the
    request's tool definitions (counted only when the whole request is estimated: later steps
    inherit them through ``previous_total``).
    """
    if previous_total is not None:
        n = 0
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "assistant":
                break
            n += message_tokens(m)
        return previous_total + n
    return sum(message_tokens(m) for m in messages) + text_tokens(tools_chars)
