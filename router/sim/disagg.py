"""Prefill/decode disaggregation on one node (DistServe / Splitwise style) and the replicas of a config.

Algorithm (:class:`DisaggNode`, ``SimConfig.disagg_prefill = P > 0`` of ``replicas = G`` GPUs):

- **Pools.** P prefill-only replicas (``role="prefill"``; the router's local backends, named
  ``local-i``, each with its own prefix cache, so run-sticky policies keep their cache affinity)
  and ``G - P`` decode-only replicas (``role="decode"``, named ``decode-j``).
- **Prefill.** The router's chosen prefill replica runs the request with one output iteration:
  chunked prefill, then the first token (TTFT ends there, as in DistServe), then its blocks are
  released (hashed prompt blocks stay cached there).
- **KV transfer.** Each prefill replica has one outgoing link (``kv_link_gbps``,
  ``kv_link_latency_s``), first-come-first-served: a transfer starts when the prefill ends or the
  link frees, whichever is later, and takes ``latency + prompt tokens * KV bytes per token /
  bandwidth`` (the whole prompt's KV; quantised KV moves fewer bytes).
- **Decode.** On arrival the request goes to the decode replica with the fewest running + waiting
  requests (ties: the fewest occupied blocks, then the lowest index); it reserves prompt + output
  blocks (waiting while they do not fit) and decodes from its second token on, batched with the
  others (decode-only iterations: the node's fast-forward). A one-token output needs no decode.
- **Co-location** (``disagg_prefill = 0``): G ordinary replicas with chunked prefill, the
  baseline the break-even sweep (:mod:`router.sim.breakeven`) compares against.

Conservation (checked in the tests): every local request is prefilled once, transferred once
(unless its output is one token) and decoded once; ``transfers`` and ``transfer_bytes`` add up.

:func:`build_replicas` makes the replicas of a :class:`~router.sim.simconfig.SimConfig` (KV tiers,
speculative decoding, roles). Knobs: those of ``SimConfig``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from router.sim.engine import EventLoop
from router.sim.kvtier import KVTier, TierStack, tier_blocks
from router.sim.node import Replica, Request
from router.sim.profiles import NodeProfile
from router.sim.simconfig import SimConfig
from router.sim.workload import SimError

__all__ = ["DisaggNode", "build_replicas"]


class DisaggNode:
    """The prefill and decode pools of one node and the KV links between them."""

    def __init__(
        self,
        prefill: list[Replica],
        decode: list[Replica],
        loop: EventLoop,
        cfg: SimConfig,
        on_done: Callable[[Request], None],
    ):
        if not prefill or not decode:
            raise SimError("disaggregation needs at least one prefill and one decode replica")
        self.prefill = prefill
        self.decode = decode
        self.loop = loop
        self.on_done = on_done
        self.block_tokens = cfg.block_tokens
        self.s_per_token = cfg.kv_bytes_per_token() / (cfg.kv_link_gbps * 1e9)
        self.bytes_per_token = cfg.kv_bytes_per_token()
        self.latency_s = cfg.kv_link_latency_s
        self.link_free = [0.0] * len(prefill)
        self._target: dict[Request, int] = {}
        self.transfers = 0
        self.transfer_bytes = 0.0
        self.transfer_s = 0.0
        self.link_wait_s = 0.0
        self.prefilled = 0
        self.decoded = 0
        for i, rep in enumerate(prefill):
            rep.on_done = functools.partial(self._prefilled, i)
        for rep in decode:
            rep.on_done = self._decoded

    def submit(self, rep: Replica, req: Request) -> bool:
        """Send ``req`` to prefill replica ``rep``; its decode iterations are kept for later."""
        self._target[req] = req.it_target
        req.it_target = 1
        if not rep.submit(req):
            del self._target[req]
            return False
        return True

    def _prefilled(self, i: int, req: Request) -> None:
        self.prefilled += 1
        target = self._target.pop(req)
        t = self.loop.now
        if target <= 1:  # the first token was the whole output
            self.decoded += 1
            self.on_done(req)
            return
        start = max(t, self.link_free[i])
        dur = self.latency_s + req.prompt * self.s_per_token
        end = start + dur
        self.link_free[i] = end
        self.transfers += 1
        self.transfer_bytes += req.prompt * self.bytes_per_token
        self.transfer_s += dur
        self.link_wait_s += start - t
        d = Request(req.key, req.prompt, req.gen_target, (), 0, req.arrival, self.block_tokens)
        d.prefilled = req.prompt
        d.decoded = 1
        d.first_token_t = req.first_token_t
        d.cached = req.cached
        d.tier_t = req.tier_t
        d.it_target, d.grow, d.c0, d.vt = target, req.grow, req.c0, req.vt
        self.loop.schedule(end, self._to_decode, d)

    def _to_decode(self, d: Request) -> None:
        best = min(
            range(len(self.decode)),
            key=lambda j: (len(self.decode[j].running) + len(self.decode[j].waiting), self.decode[j].used, j),
        )
        if not self.decode[best].submit(d):  # pragma: no cover - the prefill side fits the same KV
            raise SimError("a prefilled request does not fit a decode replica's KV cache")

    def _decoded(self, d: Request) -> None:
        self.decoded += 1
        self.on_done(d)

    def stats(self) -> dict[str, Any]:
        return {
            "prefill_replicas": len(self.prefill),
            "decode_replicas": len(self.decode),
            "prefilled": self.prefilled,
            "decoded": self.decoded,
            "kv_transfers": self.transfers,
            "kv_transfer_gb": round(self.transfer_bytes / 1e9, 6),
            "kv_transfer_s": round(self.transfer_s, 6),
            "kv_link_wait_s": round(self.link_wait_s, 6),
        }


def _tiers(cfg: SimConfig, shared: KVTier | None = None) -> TierStack | None:
    if not cfg.tiers_on:
        return None
    if shared is not None:  # the global CPU pool (SimConfig.cpu_kv_global): the same tier object
        return TierStack([shared])
    bpb = cfg.kv_bytes_per_token() * cfg.block_tokens
    tiers = [KVTier("cpu", tier_blocks(cfg.cpu_gb(), bpb), cfg.cpu_kv_gbps, cfg.cpu_kv_latency_s, bpb)]
    if cfg.ssd_gb() > 0:
        tiers.append(
            KVTier("ssd", tier_blocks(cfg.ssd_gb(), bpb), cfg.ssd_kv_gbps, cfg.ssd_kv_latency_s, bpb)
        )
    return TierStack(tiers)


def tp_profile(prof: NodeProfile, tp: int, efficiency: float) -> NodeProfile:
    """The profile of a replica sharded over ``tp`` GPUs: a stated scaling, not a fit.

    Algorithm: every time term (``a`` the per-iteration overhead, ``b`` per prefill token, ``c`` the
    causal-attention term, ``d`` per decode KV token read, ``e`` per sequence) is divided by
    ``tp x efficiency`` (each GPU does 1/tp of the matmuls and reads 1/tp of the weights and of the
    KV; ``efficiency`` is what the all-reduces leave of that); ``gpus_per_replica`` is multiplied
    by ``tp`` (the cost). The KV a replica holds grows by ``tp`` (:func:`build_replicas`; the
    weights' freed memory on each GPU is not counted, so this under-states it). ``tp == 1`` returns
    the profile unchanged.

    Knobs: ``tp`` (>= 1), ``efficiency`` (0 < x <= 1; SimConfig.tp_efficiency, 0.8 assumed)."""
    if tp == 1:
        return prof
    k = tp * efficiency
    return replace(
        prof,
        name=f"{prof.name}-tp{tp}",
        a=prof.a / k,
        b=prof.b / k,
        c=prof.c / k,
        d=prof.d / k,
        e=prof.e / k,
        gpus_per_replica=prof.gpus_per_replica * tp,
    )


def build_replicas(
    cfg: SimConfig, loop: EventLoop, on_done: Callable[[Request], None], forest: bool = False
) -> tuple[list[Replica], list[Replica], DisaggNode | None]:
    """(the router's local backends, every replica, the disaggregated node or None). ``forest``: the
    requests' chains form a forest (``Replica``'s ``forest``)."""
    blocks = cfg.kv_blocks()
    prof = cfg.node_profile()
    spec = cfg.spec
    draft = spec.draft_s(prof) if spec is not None else 0.0
    if cfg.disagg_prefill and cfg.scale_to_zero:
        raise SimError("disaggregation with scale-to-zero is not modelled")

    shared = None
    if cfg.cpu_kv_global and cfg.tiers_on:  # one pool of every tiered replica's DRAM together
        bpb = cfg.kv_bytes_per_token() * cfg.block_tokens
        n = cfg.disagg_prefill or cfg.replicas
        shared = KVTier("cpu", tier_blocks(cfg.cpu_gb() * n, bpb), cfg.cpu_kv_gbps, cfg.cpu_kv_latency_s, bpb)

    def rep(name: str, role: str) -> Replica:
        t = cfg.pool_tp(role)
        p = tp_profile(prof, t, cfg.tp_efficiency)
        return Replica(
            name,
            p,
            loop,
            blocks * t,
            cfg.block_tokens,
            on_done,
            scale_to_zero=cfg.scale_to_zero,
            wake_s=cfg.wake_s,
            idle_reap_s=cfg.idle_reap_s,
            fast_forward=cfg.fast_forward,
            tiers=_tiers(cfg, shared) if role != "decode" else None,
            spec=spec is not None and role != "prefill",
            draft_s=draft if t == 1 else spec.draft_s(p) if spec is not None else 0.0,
            draft_s_per_token=spec.draft_s_per_token if spec is not None else 0.0,  # drafter: not TP-scaled
            role=role,
            forest=forest,
        )

    if not cfg.disagg_prefill:
        reps = [rep(f"local-{i}", "both") for i in range(cfg.replicas)]
        return reps, reps, None
    pre = [rep(f"local-{i}", "prefill") for i in range(cfg.disagg_prefill)]
    dec = [rep(f"decode-{j}", "decode") for j in range(cfg.replicas - cfg.disagg_prefill)]
    return pre, pre + dec, DisaggNode(pre, dec, loop, cfg, on_done)
