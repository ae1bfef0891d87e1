"""Compatibility names for the fakes' shared pieces, which now live in three modules.

- :mod:`router.fakes.protocol`: request parsing, the chat template, the tokeniser stand-in.
- :mod:`router.fakes.synth`: completion synthesis.
- :mod:`router.fakes.responses`: response bodies, SSE chunks, Prometheus histograms.
- :mod:`router.core.prefix_cache`: the prefix-cache model (shared with the simulator and training).

Import from those modules; this one only re-exports them for code written against the old layout.
No knobs.
"""

from __future__ import annotations

from router.core.prefix_cache import Allocation, PrefixCache, block_hashes
from router.fakes.protocol import (
    FakeRequestError,
    ParsedRequest,
    TokenMemo,
    error_body,
    parse_request,
    prompt_tokens,
    render_prompt,
    render_segments,
    tokenize,
)
from router.fakes.responses import (
    SSE_DONE,
    Histogram,
    chat_response,
    new_id,
    sse,
    stream_chunks,
    usage_chunk,
)
from router.fakes.synth import Completion, synthesize

__all__ = [
    "SSE_DONE",
    "Allocation",
    "Completion",
    "FakeRequestError",
    "Histogram",
    "ParsedRequest",
    "PrefixCache",
    "TokenMemo",
    "block_hashes",
    "chat_response",
    "error_body",
    "new_id",
    "parse_request",
    "prompt_tokens",
    "render_prompt",
    "render_segments",
    "sse",
    "stream_chunks",
    "synthesize",
    "tokenize",
    "usage_chunk",
]
