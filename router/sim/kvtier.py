"""KV tiers below a replica's GPU prefix cache: CPU DRAM and optionally SSD (LMCache / Mooncake style).

Algorithm (one :class:`TierStack` per replica, tiers ordered fastest first: CPU, then SSD):

- **Blocks.** Each tier holds whole KV blocks (the GPU cache's ``block_tokens``) by their block id
  in an LRU list with a capacity in blocks (``gb * 1e9 // bytes per block``; the bytes per token
  are the node's, after KV quantisation, so a quantised cache is also smaller in the tiers).
- **Demotion.** Every block the GPU cache evicts to make room
  (:attr:`router.core.prefix_cache.PrefixCache.spill`) is written to the first tier; a block
  already there is refreshed (moved to the most recently used end). A full tier pushes its least
  recently used block down to the next tier; the last tier drops it. Writes are asynchronous (off
  the critical path, as LMCache's offload), so demotion costs no time.
- **Inclusive.** A block loaded back into the GPU stays in its tier (refreshed), so a prefix that is
  evicted again costs no second write.
- **Lookup** (:meth:`TierStack.extend`, on admission): after the GPU hit of ``h`` leading blocks,
  the chain's next blocks are looked up tier by tier, contiguously: the walk stops at the first
  block in no tier, and at the GPU's own hit limit (the blocks inside the prompt, at most ``prompt
  - 1`` tokens). Those blocks are not prefilled; they are loaded.
- **Cost of a load.** Each tier that supplies blocks costs ``latency_s + blocks * bytes_per_block /
  (gbps * 1e9)``; tiers load one after another. The load is synchronous: the iteration that admits
  the request lasts that much longer (vLLM's KV connector loads before the forward pass), which
  also delays the requests batched with it.
- **Loss.** :meth:`TierStack.wipe` empties every tier (the node was released: scale-to-zero).
- **Global pool** (``SimConfig.cpu_kv_global``, Mooncake's store): every tiered replica's stack holds
  the *same* CPU :class:`KVTier`, of the replicas' summed size, so a block one replica demoted is
  found by another's lookup and loaded at the pool's ``gbps`` (``cpu_kv_gbps``; an assumption: the
  network path of a remote pool is not modelled apart from it). Its stats are counted once.

Conservation (checked in the tests): in every tier ``resident == stored - dropped <= capacity``;
with a tier below the GPU, every GPU eviction is one write (``stored + refreshed`` of the first
tier); per step, prompt = GPU-cached + loaded per tier + prefilled tokens.

Knobs (:class:`KVTier`): ``name``, ``capacity_blocks``, ``gbps`` (transfer bandwidth to the GPU,
GB/s), ``latency_s`` (per load), ``bytes_per_block``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["KVTier", "TierStack", "tier_blocks"]


def tier_blocks(gb: float, bytes_per_block: float) -> int:
    """Whole blocks of ``bytes_per_block`` bytes that ``gb`` gigabytes hold."""
    return int(gb * 1e9 // bytes_per_block) if gb > 0 else 0


class KVTier:
    """One LRU tier of KV blocks (see the module docstring)."""

    __slots__ = (
        "name",
        "capacity",
        "s_per_block",
        "latency_s",
        "lru",
        "stored",
        "refreshed",
        "dropped",
        "hit_blocks",
        "loads",
        "load_s",
    )

    def __init__(
        self, name: str, capacity_blocks: int, gbps: float, latency_s: float, bytes_per_block: float
    ):
        if capacity_blocks < 1:
            raise ValueError(f"KV tier {name}: capacity of {capacity_blocks} blocks is too small")
        if gbps <= 0 or latency_s < 0:
            raise ValueError(f"KV tier {name}: bandwidth must be > 0 and latency >= 0")
        self.name = name
        self.capacity = capacity_blocks
        self.s_per_block = bytes_per_block / (gbps * 1e9)
        self.latency_s = latency_s
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.stored = 0  # blocks newly written
        self.refreshed = 0  # writes of a block already resident
        self.dropped = 0  # blocks pushed out (to the next tier or lost)
        self.hit_blocks = 0  # blocks loaded into the GPU
        self.loads = 0  # loads (requests served from this tier)
        self.load_s = 0.0  # seconds spent loading

    def put(self, b: int) -> int | None:
        """Write block ``b``; returns the block pushed out to make room (or None)."""
        lru = self.lru
        if b in lru:
            lru.move_to_end(b)
            self.refreshed += 1
            return None
        lru[b] = None
        self.stored += 1
        if len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            self.dropped += 1
            return old
        return None

    def transfer_s(self, blocks: int) -> float:
        return self.latency_s + blocks * self.s_per_block


class TierStack:
    """The tiers of one replica, fastest first; demotes GPU evictions and extends GPU hits."""

    __slots__ = ("tiers",)

    def __init__(self, tiers: Sequence[KVTier]):
        if not tiers:
            raise ValueError("a tier stack needs at least one tier")
        self.tiers = list(tiers)

    def demote(self, blocks: list[int]) -> None:
        """Write the GPU's evicted blocks (oldest first) down the stack."""
        tiers = self.tiers
        n = len(tiers)
        for b in blocks:
            out: int | None = b
            i = 0
            while out is not None and i < n:
                out = tiers[i].put(out)
                i += 1

    def extend(self, chain: Sequence[int], start: int, limit: int) -> tuple[list[int], float]:
        """Blocks ``chain[start:limit]`` found contiguously in the tiers: (blocks per tier, load seconds).

        Found blocks are refreshed in their tier; the counters of each supplying tier advance."""
        tiers = self.tiers
        got = [0] * len(tiers)
        i = start
        while i < limit:
            b = chain[i]
            for t, tier in enumerate(tiers):
                if b in tier.lru:
                    tier.lru.move_to_end(b)
                    got[t] += 1
                    break
            else:
                break
            i += 1
        secs = 0.0
        for t, n in enumerate(got):
            if n:
                tier = tiers[t]
                s = tier.transfer_s(n)
                tier.hit_blocks += n
                tier.loads += 1
                tier.load_s += s
                secs += s
        return got, secs

    def wipe(self) -> None:
        for t in self.tiers:
            t.dropped += len(t.lru)
            t.lru.clear()

    def stats(self) -> list[dict[str, float | int | str]]:
        return [
            {
                "tier": t.name,
                "capacity_blocks": t.capacity,
                "resident_blocks": len(t.lru),
                "stored_blocks": t.stored,
                "refreshed_blocks": t.refreshed,
                "dropped_blocks": t.dropped,
                "hit_blocks": t.hit_blocks,
                "loads": t.loads,
                "load_s": round(t.load_s, 6),
            }
            for t in self.tiers
        ]
