"""The simulated frontier API: latency distributions, prices, a rate limit and provider prompt caching.

Algorithm (per request, no queueing inside the provider):

- **Rate limit** (``rpm_limit`` requests/minute, None = unlimited): a generic cell-rate algorithm
  (token bucket of ``rpm_limit`` requests refilled continuously). A request over the limit waits
  (client retry) until the bucket admits it; the wait is part of its latency and counted.
- **Provider prompt cache**: the run's warm prefix on the frontier by the one warm-prefix rule
  (:class:`router.core.accounting.RunContext`, block chains): the provider keeps the run's latest
  prompt chain for ``cache_ttl_s`` after the run's previous frontier call ends; a new prompt's
  leading blocks equal to it are cached input if at least ``cache_min_tokens`` long (priced at
  ``price_cached_in_per_m``).
- **Latency**: TTFT ~ lognormal(median ``ttft_p50_s``, ``ttft_sigma``) + ``prefill_s_per_token`` x
  uncached input; decode speed ~ lognormal(median ``tokens_per_s_p50``, ``tokens_per_s_sigma``);
  end-to-end = wait + TTFT + (output - 1) / speed.
- **Cost** = (uncached input x ``price_in_per_m`` + cached input x ``price_cached_in_per_m`` + output x
  ``price_out_per_m``) / 1e6 USD
  (:func:`router.core.accounting.token_usd`).

All draws come from the event loop's seeded ``random.Random``.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from router.core.accounting import RunContext, token_usd
from router.policy.defaults import FRONTIER_CACHED_IN_PER_M, FRONTIER_IN_PER_M, FRONTIER_OUT_PER_M

__all__ = ["FrontierConfig", "Frontier"]


@dataclass(frozen=True)
class FrontierConfig:
    name: str = "frontier"
    model: str = "frontier"
    ttft_p50_s: float = 0.4
    ttft_sigma: float = 0.35
    prefill_s_per_token: float = 0.0
    tokens_per_s_p50: float = 60.0
    tokens_per_s_sigma: float = 0.25
    price_in_per_m: float = FRONTIER_IN_PER_M  # router.policy.defaults, as the sidecar's FrontierTier
    price_cached_in_per_m: float = FRONTIER_CACHED_IN_PER_M
    price_out_per_m: float = FRONTIER_OUT_PER_M
    rpm_limit: float | None = None
    cache_ttl_s: float = 300.0
    cache_min_tokens: int = 1024
    max_context: int = 131072

    def __post_init__(self) -> None:
        for f in ("ttft_p50_s", "tokens_per_s_p50"):
            if getattr(self, f) <= 0:
                raise ValueError(f"frontier {f} must be > 0")
        if min(self.price_in_per_m, self.price_cached_in_per_m, self.price_out_per_m) < 0:
            raise ValueError("frontier prices must be >= 0")
        if self.rpm_limit is not None and self.rpm_limit <= 0:
            raise ValueError("frontier rpm_limit must be > 0 (or None)")


class Frontier:
    """Stateless but for the rate-limit clock, per-run provider caches and in-flight end times."""

    def __init__(self, cfg: FrontierConfig, rng: random.Random, block_tokens: int):
        self.cfg = cfg
        self.rng = rng
        self.block_tokens = block_tokens
        self._mu_ttft = math.log(cfg.ttft_p50_s)
        self._mu_tps = math.log(cfg.tokens_per_s_p50)
        self._tat = -math.inf  # GCRA theoretical arrival time
        self._caches: dict[int, RunContext] = {}  # run -> its prefix model (the one backend: None)
        self._inflight: list[float] = []
        self.rate_limited = 0
        self.cost_usd = 0.0
        self.tokens_in = 0
        self.tokens_cached = 0
        self.tokens_out = 0

    def running(self, t: float) -> int:
        fl = self._inflight
        while fl and fl[0] <= t:
            heapq.heappop(fl)
        return len(fl)

    def cached_tokens(
        self, run: int, chain: tuple[int, ...] | list[int], n_lookup: int, prompt: int, t: float
    ) -> int:
        """The run's warm prefix here at ``t`` (module docstring), in tokens."""
        ctx = self._caches.get(run)
        if ctx is None:
            return 0
        return ctx.warm_chain(None, chain, n_lookup, prompt, self.block_tokens, t, self.cfg.cache_min_tokens)

    def serve(
        self,
        run: int,
        prompt: int,
        completion: int,
        chain: tuple[int, ...] | list[int],
        n_lookup: int,
        n_cacheable: int,
        t: float,
    ) -> tuple[float, float, int, float]:
        """One request at time ``t``: returns (ttft_s, latency_s, cached_tokens, cost_usd)."""
        cfg, rng = self.cfg, self.rng
        wait = 0.0
        if cfg.rpm_limit is not None:
            interval = 60.0 / cfg.rpm_limit
            tau = 60.0 - interval  # burst: a full minute's allowance
            start = max(t, self._tat - tau)
            wait = start - t
            if wait > 0:
                self.rate_limited += 1
            self._tat = max(self._tat, start) + interval
        cached = self.cached_tokens(run, chain, n_lookup, prompt, t + wait)
        ttft = wait + math.exp(self._mu_ttft + cfg.ttft_sigma * rng.gauss(0.0, 1.0))
        ttft += cfg.prefill_s_per_token * (prompt - cached)
        tps = math.exp(self._mu_tps + cfg.tokens_per_s_sigma * rng.gauss(0.0, 1.0))
        latency = ttft + max(completion - 1, 0) / tps
        cost = token_usd(
            float(prompt),
            float(cached),
            float(completion),
            price_in_per_m=cfg.price_in_per_m,
            price_cached_in_per_m=cfg.price_cached_in_per_m,
            price_out_per_m=cfg.price_out_per_m,
        )
        self.cost_usd += cost
        self.tokens_in += prompt
        self.tokens_cached += cached
        self.tokens_out += completion
        ctx = self._caches.get(run)
        if ctx is None:
            ctx = self._caches[run] = RunContext()
        ctx.served_chain(None, chain, n_cacheable, t + latency + cfg.cache_ttl_s)
        heapq.heappush(self._inflight, t + latency)
        return ttft, latency, cached, cost

    def forget(self, run: int) -> None:
        self._caches.pop(run, None)
