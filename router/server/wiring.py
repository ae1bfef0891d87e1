"""Wiring of the sidecar's parts from its settings: backends, the run-state store, the step engine.

- :func:`make_backends`: one :class:`~router.server.hotpath.backends.Backend` per local replica and one per
  frontier entry, with the protocols each speaks (URLs), the headers (auth) and the
  :class:`~router.policy.types.BackendState` template the policy prices them with;
- :func:`make_store`: ``memory`` -> :class:`~router.server.state.store.InProcessStore`; ``redis`` ->
  :class:`~router.server.state.redis_store.RedisStore` behind
  :class:`~router.server.state.redis_store.FallbackStore` (keeps serving from local pins while Redis is
  down, resyncs when it returns);
- :func:`make_engine`: the :class:`~router.core.engine.StepEngine` with its admission gate (the
  traffic model on the injected clocks, the per-tenant spill budget) and the store-backed
  :class:`~router.server.hotpath.admission.LiveAdmission` (None without a local tier).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.core.engine import StepEngine
from router.policy.types import BackendState
from router.server.hotpath.backends import Backend
from router.server.metrics.scrape import Scraper
from router.server.settings import RouterSettings

if TYPE_CHECKING:
    from router.server.hotpath.admission import LiveAdmission
    from router.server.state.store import RunStateStore

__all__ = ["make_backends", "make_store", "make_engine", "make_prefix_share", "make_kv_events"]


def make_backends(s: RouterSettings) -> list[Backend]:
    """One backend per local replica (speaking ``local.protocols``) and one per frontier entry
    (its kind's URLs and auth headers, see :meth:`~router.server.settings.FrontierTier.endpoints`)."""
    out = []
    if s.local is not None:
        hdr = {"content-type": "application/json"}
        if s.local.api_key_env:
            import os

            key = os.environ.get(s.local.api_key_env)
            if key:
                hdr["authorization"] = f"Bearer {key}"
        paths = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
        for name, url in zip(s.local.names or [], s.local.urls, strict=True):
            tmpl = BackendState(
                name=name,
                tier="local",
                model=s.local.model,
                max_context=s.local.max_context,
                prefill_s_per_token=s.local.prefill_s_per_token,
                ttft_base_s=s.local.ttft_base_s,
                gpu_usd_per_hour=s.local.gpu_usd_per_hour,
            )
            urls: dict[str, str] = {str(p): url + paths[p] for p in s.local.protocols}
            patterns = s.local.serves if s.local.models else None
            out.append(Backend(name, "local", s.local.model, url, hdr, tmpl, urls=urls, patterns=patterns))
    for f in s.frontier_list:
        urls, hdr = f.endpoints()
        tmpl = BackendState(
            name=f.name,
            tier="frontier",
            model=f.model,
            max_context=f.max_context,
            price_in_per_m=f.price_in_per_m,
            price_cached_in_per_m=f.price_cached_in_per_m,
            price_cache_write_per_m=f.price_cache_write_per_m or 0.0,
            price_out_per_m=f.price_out_per_m,
            ttft_base_s=f.ttft_base_s,
        )
        out.append(
            Backend(
                f.name,
                "frontier",
                f.model,
                f.url,
                hdr,
                tmpl,
                urls=urls,
                patterns=f.serves,
                pass_model=f.pass_model,
            )
        )
    return out


def make_store(s: RouterSettings) -> RunStateStore:
    """``memory``: InProcessStore. ``redis``: RedisStore behind FallbackStore (keeps serving from
    local pins while Redis is down, resyncs when it returns)."""
    from router.server.state.store import InProcessStore

    if s.store.kind == "memory":
        return InProcessStore(ttl_s=s.store.ttl_s)
    from router.server.state.fallback import FallbackStore
    from router.server.state.redis_store import RedisStore

    st = s.store
    return FallbackStore(
        RedisStore(
            st.redis_url,
            key_prefix=st.key_prefix,
            ttl_s=st.ttl_s,
            admit_ttl_s=st.admit_ttl_s,
            health_check_s=st.health_check_s,
        ),
        InProcessStore(ttl_s=st.ttl_s),
        slots=st.router_slots,
        slot=st.router_slot,
        step_gap=st.step_gap,
        epoch_check_s=st.epoch_check_s,
        reset_settle_s=st.reset_settle_s,
    )


def make_engine(
    s: RouterSettings,
    store: RunStateStore,
    scraper: Scraper,
    backends: list[Backend],
    budget_hook: Callable[[str | None], bool] | None,
    clock: Callable[[], float],
    wall: Callable[[], float],
) -> tuple[StepEngine, LiveAdmission | None]:
    """The step engine of this app and its store-backed admission (None without a local tier)."""
    from router.core.admission import AdmissionGate, TenantSpillBudget
    from router.core.capacity import ArrivalForecaster
    from router.core.traffic import TrafficModel
    from router.server.hotpath.admission import LiveAdmission

    hist = s.server.run_history_steps
    if s.local is None:
        return StepEngine(max_steps=hist), None
    a = s.admission
    cfg = a.controller_config(s.local)
    local = [b.name for b in backends if b.tier == "local"]
    frontier = [b.name for b in backends if b.tier == "frontier"]
    traffic = TrafficModel(
        local,
        tau_s=a.rate_tau_s,
        prefill_weight=cfg.work_prefill_weight,
        min_rate_steps=a.min_rate_steps,
        forecaster=ArrivalForecaster(
            bucket_s=a.forecast_bucket_s, alpha=a.forecast_alpha, min_history_s=a.forecast_min_history_s
        ),
        idle_end_s=s.identity.idle_end_s,
        clock=clock,
        wall=wall,
    )
    budget = None
    if budget_hook is None and (a.tenant_spill_limits or a.default_tenant_spill_limit is not None):
        budget = TenantSpillBudget(a.tenant_spill_limits, a.default_tenant_spill_limit)
    gate = AdmissionGate(cfg, traffic, budget_hook=budget_hook, tenant_budget=budget)

    def healthy() -> tuple[list[str], bool]:
        stats = scraper.stats
        return [n for n in local if n not in stats or stats[n].healthy], bool(frontier)

    live = LiveAdmission(
        gate,
        store,
        key=a.counter_key,
        idle_release_s=a.idle_release_s or s.store.ttl_s,
        sweep_s=a.sweep_s,
        healthy=healthy,
        horizons_s=a.horizons_s,
        default_run_s=a.default_run_s,
    )
    return StepEngine(admission=gate, max_steps=hist, **prefix_index_kw(s, local)), live


def prefix_index_kw(s: RouterSettings, local: list[str]) -> dict[str, Any]:
    """The engine's prefix index and text chainer (router.core.prefix_index) from ``local``'s
    settings: character blocks of ``prefix_block_chars``, each replica's capacity its
    ``kv_cache_tokens`` (else ``prefix_index_tokens``) in blocks; empty when off."""
    from router.core.prefix_index import CHARS_PER_TOKEN, PrefixIndex, TextChainer

    lt = s.local
    if lt is None or not lt.prefix_index or not local:
        return {}
    if lt.prefix_index_mode == "precise" and lt.prefix_tokenizer:  # token blocks (docs/prefix-index.md)
        from router.server.protocols.chat_tokens import ChatTokenChainer, ChatTokenizer

        bt = lt.prefix_block_tokens
        cap = max(1, (lt.kv_cache_tokens or lt.prefix_index_tokens) // bt)
        return {
            "prefix_index": PrefixIndex(bt, [(n, cap) for n in local]),
            "text_chainer": ChatTokenChainer(ChatTokenizer(lt.prefix_tokenizer), bt),
        }
    bt = max(1, lt.prefix_block_chars // CHARS_PER_TOKEN)
    cap = max(1, (lt.kv_cache_tokens or lt.prefix_index_tokens) // bt)
    return {
        "prefix_index": PrefixIndex(bt, [(n, cap) for n in local]),
        "text_chainer": TextChainer(bt * CHARS_PER_TOKEN),
    }


def make_kv_events(
    s: RouterSettings, engine: StepEngine, on_mode: Callable[[str, str], None] | None = None
) -> Any:
    """The KV event subscriber (:mod:`router.server.state.kv_events`) of the replicas with an endpoint
    when the index is in precise mode; else None (every replica approximate)."""
    lt = s.local
    if (
        lt is None
        or engine.prefix_index is None
        or lt.prefix_index_mode != "precise"
        or not lt.kv_events_endpoints
    ):
        return None
    from router.server.state.kv_events import KvEventsConfig, KvEventSubscriber, parse_replicas

    reps = parse_replicas(
        lt.names or [], lt.kv_events_endpoints, lt.kv_events_replay_endpoints, lt.kv_events_topic
    )
    cfg = KvEventsConfig(reps, silence_s=lt.kv_events_silence_s)
    return KvEventSubscriber(engine.prefix_index, cfg, on_mode=on_mode)


def make_prefix_share(s: RouterSettings, engine: StepEngine) -> Any:
    """The engine's prefix index shared through Redis (:mod:`router.server.state.prefix_share`) when the
    store is Redis, the index is on and ``local.prefix_share`` is set; else None."""
    if s.store.kind != "redis" or engine.prefix_index is None or s.local is None or not s.local.prefix_share:
        return None
    from router.server.state.prefix_share import PrefixShare

    return PrefixShare(engine.prefix_index, s.store.redis_url, key=f"{s.store.key_prefix}prefix-index:events")
