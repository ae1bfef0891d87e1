"""The upstreams the sidecar routes to, and the backend states the step engine sees for one request.

A :class:`Backend` is one local vLLM replica or one frontier entry (``frontier`` / ``frontiers``
in the settings) with the protocols it speaks (``urls``: protocol -> URL, e.g. an Anthropic
frontier only ``messages``, an Azure deployment ``chat`` and ``responses``), its auth headers and
the :class:`~router.policy.types.BackendState` template the policy prices it with (incl. the
frontier's cache-write price).

:class:`BackendSet` builds the states for one request: the local replicas (scraped health, running,
waiting and KV usage, plus this router's in-flight counts) and *one* frontier: the entry the
client's model alias maps to (``frontiers[].models``), else the default entry (the policy chooses
the tier, config maps the model); a request naming a concrete backend model sees every frontier
(the policy is bypassed for it). ``aliases(name)`` answers which entry a model name maps to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router.policy.types import BackendState

__all__ = ["Backend", "BackendSet"]


@dataclass
class Backend:
    """One upstream the router may send a step to, with its live in-flight count."""

    name: str
    tier: str
    model: str
    root: str
    headers: dict[str, str]
    state_template: BackendState
    inflight: int = 0
    urls: dict[str, str] = field(default_factory=dict)
    patterns: Any = None  # FrontierTier.serves (model aliases), None for local replicas
    pass_model: bool = False  # send the client's aliased model name upstream

    def __post_init__(self) -> None:
        if not self.urls and self.root:
            self.urls = {"chat": self.root + "/v1/chat/completions"}

    @property
    def chat_url(self) -> str:
        return self.urls.get("chat", self.root + "/v1/chat/completions")


class BackendSet:
    """All backends of the app and the per-request view of them (module docstring)."""

    def __init__(self, backends: list[Backend], scraper: Any):
        self.all = {b.name: b for b in backends}
        self.models = {b.model: b.tier for b in backends}
        self.local = [b for b in backends if b.tier == "local"]
        self.frontiers = [b for b in backends if b.tier == "frontier"]
        self.scraper = scraper

    def alias(self, name: str) -> Backend | None:
        """The frontier entry a client's model name maps to (``frontiers[].models``)."""
        for b in self.frontiers:
            if b.patterns is not None and b.patterns(name):
                return b
        return None

    def aliases(self, name: str) -> str | None:
        """The backend a client's model name maps to (a frontier entry, else a local replica whose
        ``local.models`` patterns match), or None."""
        b = self.alias(name)
        if b is None:
            b = next((x for x in self.local if x.patterns is not None and x.patterns(name)), None)
        return b.name if b is not None else None

    def for_request(self, requested: str | None, alias: str | None, pinned: str | None) -> list[Backend]:
        if requested is not None or len(self.frontiers) <= 1:
            return list(self.all.values())
        chosen = self.alias(alias) if alias is not None else None
        if chosen is None:
            chosen = next((b for b in self.frontiers if b.name == pinned), self.frontiers[0])
        return [*self.local, chosen]

    def states(self, backends: list[Backend]) -> list[BackendState]:
        """Fresh backend states: scraped health/load + this router's in-flight count."""
        stats = self.scraper.stats if self.scraper is not None else {}
        out = []
        for b in backends:
            t = b.state_template
            st = stats.get(b.name)
            out.append(
                BackendState(
                    name=b.name,
                    tier=t.tier,
                    model=t.model,
                    healthy=st.healthy if st is not None else t.healthy,
                    max_context=t.max_context,
                    running=(int(st.running) if st is not None else 0) + b.inflight,
                    waiting=int(st.waiting) if st is not None else 0,
                    kv_usage=st.kv_usage if st is not None else 0.0,
                    price_in_per_m=t.price_in_per_m,
                    price_cached_in_per_m=t.price_cached_in_per_m,
                    price_cache_write_per_m=t.price_cache_write_per_m,
                    price_out_per_m=t.price_out_per_m,
                    prefill_s_per_token=t.prefill_s_per_token,
                    ttft_base_s=t.ttft_base_s,
                    gpu_usd_per_hour=t.gpu_usd_per_hour,
                )
            )
        return out
