"""A fake frontier API (OpenAI-compatible): bearer key, token-bucket rate limit, TTFT + tokens/s
latency, token prices, provider-style prompt caching and failure injection.

Algorithm per request: check ``Authorization: Bearer <api_key>`` when a key is configured (401
``invalid_api_key`` otherwise); take one token from a bucket refilled at ``rate_limit_rps`` up to
``rate_limit_burst`` (empty -> 429 ``rate_limit_exceeded`` with ``Retry-After`` = whole seconds until
the next token, and ``retry-after-ms``); then wait ``ttft_ms`` (times a seeded jitter factor in
[1 - jitter, 1 + jitter]) before the first token and ``1 / tokens_per_s`` per further token.
Prompt caching follows OpenAI's rule: prompts of at least ``cache_min_tokens`` (1024) tokens get
their longest cached prefix in ``cache_block`` (128) token increments reported as
``prompt_tokens_details.cached_tokens`` (the vLLM fake's model, ``router.core.prefix_cache``, with a
large capacity; a prompt that does not fit beside the requests in flight is served uncached).
Prices (USD per 1M tokens) are announced in ``x-fake-prices``; a non-streaming response also carries
its cost in ``x-fake-cost-usd`` = (uncached in x price_in + cached x price_cached_in + out x price_out) / 1e6
(:func:`router.core.accounting.token_usd`).

API styles (``api_style``): ``openai`` serves ``/v1/chat/completions`` and ``/v1/responses`` with a
Bearer key; ``azure`` serves ``/openai/deployments/{azure_deployment}/chat/completions`` and
``/openai/responses``, needs the ``api-version`` query parameter (404 without, as Azure) and takes
the key in ``api-key``; ``compatible`` serves ``{path_prefix}/chat/completions`` with the key in
``auth_header`` after ``auth_scheme`` (Gemini's OpenAI-compatible base is ``/v1beta/openai``).

Knobs (besides ``server.CommonKnobs``): ``api_key`` (none = no auth), ``api_style``,
``azure_deployment``, ``path_prefix``, ``auth_header``, ``auth_scheme``; ``rate_limit_rps`` (0 = off),
``rate_limit_burst``; ``ttft_ms`` (400), ``tokens_per_s`` (80), ``jitter`` (0); ``price_in_per_m``,
``price_cached_in_per_m``, ``price_out_per_m``; ``prompt_cache`` (true), ``cache_min_tokens``,
``cache_block``, ``cache_capacity_blocks``. ``max_concurrency`` defaults to 0 (unlimited).
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from aiohttp import web
from pydantic import Field

from router.core.accounting import token_usd
from router.core.prefix_cache import Allocation, PrefixCache, block_hashes
from router.fakes.protocol import ParsedRequest
from router.fakes.server import CommonKnobs, FakeServer, Ticket
from router.fakes.synth import Completion
from router.policy.defaults import FRONTIER_CACHED_IN_PER_M, FRONTIER_IN_PER_M, FRONTIER_OUT_PER_M

__all__ = ["FrontierKnobs", "FakeFrontier"]


class FrontierKnobs(CommonKnobs):
    model: str = "fake-frontier-model"
    api_key: str | None = None
    rate_limit_rps: float = Field(0.0, ge=0)
    rate_limit_burst: float = Field(10.0, ge=1)
    ttft_ms: float = Field(400.0, ge=0)
    tokens_per_s: float = Field(80.0, gt=0)
    jitter: float = Field(0.0, ge=0, lt=1)
    price_in_per_m: float = Field(FRONTIER_IN_PER_M, ge=0)
    price_cached_in_per_m: float = Field(FRONTIER_CACHED_IN_PER_M, ge=0)
    price_out_per_m: float = Field(FRONTIER_OUT_PER_M, ge=0)
    prompt_cache: bool = True
    # API style: "openai" (/v1/chat/completions + /v1/responses, Bearer), "azure"
    # (/openai/deployments/{azure_deployment}/chat/completions?api-version=..., api-key header),
    # "compatible" ({path_prefix}/chat/completions, auth_header with auth_scheme)
    api_style: str = Field("openai", pattern="^(openai|azure|compatible)$")
    azure_deployment: str = "fake-deployment"
    path_prefix: str = "/v1beta/openai"
    auth_header: str = "authorization"
    auth_scheme: str = "Bearer"
    cache_min_tokens: int = Field(1024, ge=1)
    cache_block: int = Field(128, ge=1)
    cache_capacity_blocks: int = Field(1_000_000, ge=1)


class FakeFrontier(FakeServer):
    kind = "frontier"
    knobs_class = FrontierKnobs
    response_extra = {"system_fingerprint": "fp_fake", "service_tier": "default"}
    usage_null_in_chunks = True
    protocols: ClassVar[tuple[str, ...]] = ("chat", "responses")
    error_types = {
        400: "invalid_request_error",
        401: "invalid_request_error",
        404: "invalid_request_error",
        429: "requests",
    }
    knobs: FrontierKnobs

    def __init__(self, **knobs: object):
        super().__init__(**knobs)
        k = self.knobs
        self.cache = PrefixCache(k.cache_capacity_blocks, k.cache_block)
        self._tokens = k.rate_limit_burst
        self._refilled = time.monotonic()
        self.cost_usd = 0.0
        self._prices = f"in={k.price_in_per_m};cached_in={k.price_cached_in_per_m};out={k.price_out_per_m};unit=usd_per_1m_tokens"

    def header_name(self, name: str) -> str:
        return f"frontier-fake/{self.knobs.name}" if self.knobs.name else "frontier-fake"

    def on_knobs_change(self, old: Any, new: Any) -> None:
        if (old.cache_block, old.cache_capacity_blocks) != (new.cache_block, new.cache_capacity_blocks):
            self.cache = PrefixCache(new.cache_capacity_blocks, new.cache_block)
        self._prices = (
            f"in={new.price_in_per_m};cached_in={new.price_cached_in_per_m};out={new.price_out_per_m};"
            "unit=usd_per_1m_tokens"
        )
        if new.rate_limit_burst != old.rate_limit_burst:
            self._tokens = min(self._tokens, new.rate_limit_burst)

    def routes(self) -> list[tuple[str, str]]:
        k = self.knobs
        if k.api_style == "azure":
            return [
                (f"/openai/deployments/{k.azure_deployment}/chat/completions", "chat"),
                ("/openai/responses", "responses"),
            ]
        if k.api_style == "compatible":
            return [(k.path_prefix.rstrip("/") + "/chat/completions", "chat")]
        return super().routes()

    def authorized(self, request: web.Request) -> bool:
        k = self.knobs
        assert k.api_key is not None
        if k.api_style == "azure":
            got = request.headers.get("api-key", "")
        else:
            raw = request.headers.get(k.auth_header, "")
            pre = (k.auth_scheme + " ") if k.auth_scheme else ""
            got = raw[len(pre) :] if raw.startswith(pre) else ""
        return bool(got) and hmac.compare_digest(got.encode(), k.api_key.encode())

    def precheck(self, request: web.Request, protocol: str = "chat") -> web.Response | None:
        k = self.knobs
        if k.api_style == "azure" and not request.query.get("api-version"):
            return self.protocol_error(protocol, 404, "Resource not found", "invalid_request_error", "404")
        if k.api_key is not None and not self.authorized(request):
            self.stats.unauthorized += 1
            if protocol == "messages":
                return self.protocol_error(protocol, 401, "invalid x-api-key")
            return self.error_response(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        return self.rate_limit(protocol)

    def rate_limit(self, protocol: str) -> web.Response | None:
        """Take a token from the bucket; a 429 with Retry-After when it is empty."""
        k = self.knobs
        if k.rate_limit_rps > 0:
            now = time.monotonic()
            self._tokens = min(k.rate_limit_burst, self._tokens + (now - self._refilled) * k.rate_limit_rps)
            self._refilled = now
            if self._tokens < 1.0:
                self.stats.rate_limited += 1
                wait = (1.0 - self._tokens) / k.rate_limit_rps
                headers = {
                    "Retry-After": str(max(1, math.ceil(wait))),
                    "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
                    "x-ratelimit-limit-requests": str(int(k.rate_limit_burst)),
                    "x-ratelimit-remaining-requests": "0",
                }
                return self.protocol_error(
                    protocol,
                    429,
                    "Rate limit reached for requests (fake frontier).",
                    "requests",
                    "rate_limit_exceeded",
                    headers,
                )
            self._tokens -= 1.0
        return None

    def _jitter(self) -> float:
        j = self.knobs.jitter
        return 1.0 + (2.0 * self._rng.random() - 1.0) * j if j else 1.0

    def on_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        k = self.knobs
        n = ticket.prompt_tokens
        if k.prompt_cache and n >= k.cache_min_tokens:
            cache = self.cache
            alloc = cache.allocate(block_hashes(req.tokens, k.cache_block), n, 0)
            if alloc is not None:
                ticket.cached_tokens = alloc.cached_tokens
                ticket.slot = (cache, alloc)  # a knob change may replace self.cache meanwhile
        ticket.extra["jitter"] = self._jitter()

    def on_finish(self, ticket: Ticket, comp: Completion, ok: bool, ttft: float, end: float) -> None:
        held: tuple[PrefixCache, Allocation] | None = ticket.slot
        if held is not None:
            held[0].free(held[1])
            ticket.slot = None
        if ok:
            self.cost_usd += self.cost(ticket, comp)

    def ttft_s(self, ticket: Ticket) -> float:
        return self.knobs.ttft_ms * ticket.extra.get("jitter", 1.0) / 1000.0

    def decode_s_per_token(self, ticket: Ticket) -> float:
        return ticket.extra.get("jitter", 1.0) / self.knobs.tokens_per_s

    def usage(self, ticket: Ticket, comp: Completion) -> dict[str, Any]:
        n, c = ticket.prompt_tokens, comp.completion_tokens
        return {
            "prompt_tokens": n,
            "completion_tokens": c,
            "total_tokens": n + c,
            "prompt_tokens_details": {"cached_tokens": ticket.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def cost(self, ticket: Ticket, comp: Completion) -> float:
        k = self.knobs
        cached = ticket.cached_tokens
        return token_usd(
            float(ticket.prompt_tokens),
            float(cached),
            float(comp.completion_tokens),
            price_in_per_m=k.price_in_per_m,
            price_cached_in_per_m=k.price_cached_in_per_m,
            price_out_per_m=k.price_out_per_m,
        )

    def response_headers(
        self, ticket: Ticket, comp: Completion, usage: Mapping[str, object] | None
    ) -> dict[str, str]:
        h = {"x-fake-prices": self._prices}
        if usage is not None:
            h["x-fake-cost-usd"] = f"{self.cost(ticket, comp):.8f}"
        return h

    def models_card(self) -> dict[str, Any]:
        return {
            "id": self.knobs.model,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": "fake-frontier",
        }

    def extra_state(self) -> dict[str, Any]:
        return {"cost_usd": self.cost_usd, "rate_tokens": self._tokens}
