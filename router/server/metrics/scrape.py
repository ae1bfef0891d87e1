"""Background scraping of each local vLLM replica's ``/metrics`` into per-replica state.

Algorithm: every ``interval_s`` seconds, GET ``<replica root>/metrics`` for all replicas
concurrently (timeout ``timeout_s``), parse the Prometheus text with
:func:`router.server.metrics.parse.read_vllm_metrics` (the parser the vLLM conformance tests use; only
series of the served ``model_name``, summed over label sets) and keep the latest values:

- ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
- ``vllm:kv_cache_usage_perc`` (0-1),
- ``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` (counters; the hit
  rate over the last interval is derived from their deltas; queries - hits = prompt tokens newly
  computed into the KV cache, which the proxy turns into the ``local_cache_pressure`` feature),
- ``vllm:cache_config_info`` (``num_gpu_blocks`` x ``block_size``: the KV cache size in tokens,
  when exposed).

A non-200 answer, a timeout or text that does not parse counts as a failed scrape.

A replica is healthy while its scrapes succeed; ``unhealthy_after`` consecutive failures mark it
unhealthy; one success marks it healthy again. The proxy also marks a replica unhealthy at once on
a connect error (:meth:`Scraper.mark_failed`), so the next decision avoids it before the next scrape.
Before its first scrape a replica counts as healthy (so a router starts serving at once).
``interval_s = 0`` turns the background task off (tests call :meth:`scrape_once`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from router.server.background import BackgroundTask
from router.server.hotpath.upstream import Upstream, UpstreamError
from router.server.metrics.parse import MetricsParseError, read_vllm_metrics

__all__ = ["ReplicaStats", "Scraper"]

log = logging.getLogger("runroute.scrape")


@dataclass
class ReplicaStats:
    """Latest scraped figures of one replica (the counters are the server's running totals)."""

    name: str
    url: str
    healthy: bool = True
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    hit_rate: float | None = None  # prefix-cache hit rate over the last scrape interval
    cache_tokens: float | None = None  # KV cache capacity in tokens (vllm:cache_config_info)
    failures: int = 0
    last_ok_s: float | None = None
    scraped: bool = False

    @property
    def computed_tokens(self) -> float:
        """Prompt tokens newly computed (written into the KV cache) since the server started:
        ``prefix_cache_queries_total - prefix_cache_hits_total``."""
        return self.prefix_queries - self.prefix_hits


class Scraper(BackgroundTask):
    def __init__(
        self,
        replicas: dict[str, str],
        upstream: Upstream,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        unhealthy_after: int = 3,
        model_name: str | None = None,
        on_update=None,
    ):
        self.model_name = model_name
        self.stats = {name: ReplicaStats(name, url) for name, url in replicas.items()}
        self.upstream = upstream
        self.interval_s, self.timeout_s, self.unhealthy_after = interval_s, timeout_s, unhealthy_after
        self.on_update = on_update
        self._task: asyncio.Task[None] | None = None

    async def _one(self, st: ReplicaStats) -> None:
        try:
            status, body = await self.upstream.get("local", st.url + "/metrics", self.timeout_s)
            if status != 200:
                raise UpstreamError("connect", f"status {status}")
            m = read_vllm_metrics(body.decode("utf-8", "replace"), self.model_name)
        except (UpstreamError, MetricsParseError) as e:
            st.failures += 1
            if st.failures >= self.unhealthy_after:
                if st.healthy:
                    log.warning("replica %s unhealthy after %d failed scrapes: %s", st.name, st.failures, e)
                st.healthy = False
            return
        hits, queries = m.prefix_cache_hits_total, m.prefix_cache_queries_total
        dq = queries - st.prefix_queries
        st.hit_rate = (hits - st.prefix_hits) / dq if st.scraped and dq > 0 else st.hit_rate
        st.running, st.waiting = m.num_requests_running, m.num_requests_waiting
        st.kv_usage, st.prefix_hits, st.prefix_queries = m.kv_cache_usage_perc, hits, queries
        if m.cache_capacity_tokens is not None:
            st.cache_tokens = m.cache_capacity_tokens
        st.failures, st.healthy, st.scraped, st.last_ok_s = 0, True, True, time.time()

    async def scrape_once(self) -> None:
        await asyncio.gather(*(self._one(st) for st in self.stats.values()))
        if self.on_update is not None:
            self.on_update(self.stats)

    def mark_failed(self, name: str) -> None:
        st = self.stats.get(name)
        if st is not None:
            st.healthy = False
            st.failures = max(st.failures, self.unhealthy_after)

    async def _loop(self) -> None:
        while True:
            try:
                await self.scrape_once()
            except Exception:  # noqa: BLE001 - a scrape bug must not kill the task
                log.exception("scrape failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self.interval_s > 0:
            self._start_task(self._loop)
