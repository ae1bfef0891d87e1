"""A fake Anthropic Messages API: ``x-api-key`` + ``anthropic-version``, prompt caching by
``cache_control`` breakpoints with cache-write and cache-read prices, Anthropic's errors and stream.

Algorithm per request (besides the frontier fake's rate limit, latency and failure injection,
:mod:`router.fakes.frontier`): the key (``x-api-key``, or ``Authorization: Bearer`` as the
anthropic SDK 2.x sends it) must equal ``api_key`` when one is set (401 ``authentication_error``); the ``anthropic-version`` header is required (400). Prompt caching
follows Anthropic's rule at the fakes' template granularity (a segment = the tools block, the
system prompt or one message): the prefix up to each segment that carries a ``cache_control``
breakpoint is written to the cache (kept ``cache_ttl_s``, refreshed on a hit) when it is at least
``cache_min_tokens`` long; a request reads the longest cached prefix that ends at a segment
boundary at or before its last breakpoint, looking back at most 20 segments (so the previous
step's breakpoint is found from the next step's). Usage: ``cache_read_input_tokens`` = that hit,
``cache_creation_input_tokens`` = the tokens from the hit to the last breakpoint,
``input_tokens`` = the rest; cost = input x ``price_in_per_m`` + writes x
``price_cache_write_per_m`` + reads x ``price_cached_in_per_m`` + output x ``price_out_per_m``.
``POST /v1/messages/count_tokens`` answers ``{"input_tokens": n}``.

Knobs (besides the frontier fake's): ``price_cache_write_per_m`` (:mod:`router.policy.defaults`), ``cache_ttl_s`` (300),
``cache_min_tokens`` (1024).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web
from pydantic import Field

from router.core.accounting import token_usd
from router.fakes.frontier import FakeFrontier, FrontierKnobs
from router.fakes.protocol import ParsedRequest
from router.fakes.server import Ticket
from router.fakes.synth import Completion
from router.policy.defaults import (
    FRONTIER_CACHE_WRITE_PER_M,
    FRONTIER_CACHED_IN_PER_M,
    FRONTIER_IN_PER_M,
    FRONTIER_OUT_PER_M,
)

if TYPE_CHECKING:
    from router.fakes.answers import Exchange

__all__ = ["AnthropicKnobs", "FakeAnthropic"]


class AnthropicKnobs(FrontierKnobs):
    model: str = "claude-fake"
    price_in_per_m: float = Field(FRONTIER_IN_PER_M, ge=0)
    price_cached_in_per_m: float = Field(FRONTIER_CACHED_IN_PER_M, ge=0)
    price_cache_write_per_m: float = Field(FRONTIER_CACHE_WRITE_PER_M, ge=0)
    price_out_per_m: float = Field(FRONTIER_OUT_PER_M, ge=0)
    cache_ttl_s: float = Field(300.0, gt=0)


class FakeAnthropic(FakeFrontier):
    kind = "anthropic"
    knobs_class = AnthropicKnobs  # type: ignore[assignment]
    response_extra: ClassVar[dict[str, Any]] = {}
    protocols: ClassVar[tuple[str, ...]] = ("messages",)
    knobs: AnthropicKnobs

    def __init__(self, **knobs: object):
        super().__init__(**knobs)
        self.prefixes: dict[str, float] = {}  # prefix hash -> expiry (monotonic s)

    def header_name(self, name: str) -> str:
        return f"anthropic-fake/{self.knobs.name}" if self.knobs.name else "anthropic-fake"

    def routes(self) -> list[tuple[str, str]]:
        return [("/v1/messages", "messages")]

    def precheck(self, request: web.Request, protocol: str = "messages") -> web.Response | None:
        k = self.knobs
        if k.api_key is not None:
            auth = request.headers.get("authorization", "")
            got = request.headers.get("x-api-key") or (auth[7:] if auth.startswith("Bearer ") else "")
            if not got or not hmac.compare_digest(got.encode(), k.api_key.encode()):
                self.stats.unauthorized += 1
                return self.protocol_error("messages", 401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return self.protocol_error("messages", 400, "anthropic-version: header is required")
        return self.rate_limit(protocol)

    def on_parsed(self, ex: Exchange, req: ParsedRequest, ticket: Ticket) -> None:
        """Prompt caching by breakpoints (module docstring)."""
        k = self.knobs
        segs = req.segments or []
        off = 1 if req.tools else 0
        bounds, acc = [], 0
        hashes, h = [], hashlib.sha1()
        for seg in segs[:-1]:  # the generation prompt is never cached
            acc += len(self._memo.tokens(seg))
            h.update(seg.encode())
            bounds.append(acc)
            hashes.append(h.hexdigest())
        marks = sorted({(m + off) if m >= 0 else 0 for m in ex.marks if (m + off) < len(bounds)})
        now = time.monotonic()
        hit = 0
        if marks and k.prompt_cache:
            last = marks[-1]
            for i in range(last, max(-1, last - 20), -1):
                exp = self.prefixes.get(hashes[i])
                if exp is not None and exp > now:
                    hit = bounds[i]
                    self.prefixes[hashes[i]] = now + k.cache_ttl_s
                    break
            written = 0
            for m in marks:
                if bounds[m] >= k.cache_min_tokens:
                    self.prefixes[hashes[m]] = now + k.cache_ttl_s
                    written = max(written, bounds[m])
            ex.cache_creation = max(0, written - hit)
        ticket.cached_tokens = hit
        ticket.extra["cache_write"] = ex.cache_creation
        if len(self.prefixes) > 100000:
            self.prefixes = {h: e for h, e in self.prefixes.items() if e > now}

    def on_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        ticket.extra["jitter"] = self._jitter()

    def on_finish(self, ticket: Ticket, comp: Completion, ok: bool, ttft: float, end: float) -> None:
        if ok:
            self.cost_usd += self.cost(ticket, comp)

    def cost(self, ticket: Ticket, comp: Completion) -> float:
        k = self.knobs
        cached = ticket.cached_tokens
        write = int(ticket.extra.get("cache_write", 0))
        return token_usd(
            float(ticket.prompt_tokens),
            float(cached),
            float(comp.completion_tokens),
            price_in_per_m=k.price_in_per_m,
            price_cached_in_per_m=k.price_cached_in_per_m,
            price_out_per_m=k.price_out_per_m,
            cache_write=float(write),
            price_cache_write_per_m=k.price_cache_write_per_m,
        )
