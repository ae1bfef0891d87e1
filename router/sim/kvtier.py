"""A replica's KV tiers: its GPU prefix cache's LRU list kept as segments, and the tiers below
it, CPU DRAM and optionally SSD (LMCache / Mooncake style).

The GPU tier (:class:`SegmentForestCache`, the node's cache when the workload's chains form a
forest): :class:`router.core.prefix_cache.ForestPrefixCache`'s model (same hits, refusals,
``shortfall``, evictions and their order, ``spill``, counters), with the unreferenced blocks kept as
*segments* instead of one ordered-dict entry per block:

- **Segments.** A release makes the blocks from its chain's tip up to the first block still
  referenced unreferenced, at once: one segment ``[chain, lo, hi]`` (blocks ``chain[lo:hi]``; in
  LRU order tail first, ``chain[hi - 1]`` the oldest), appended to ``segs`` (oldest first) and
  found by its top block in ``top``. The LRU list is the segments' blocks in that order, exactly
  the per-block list's order.
- **Readmission** takes a run ``chain[a:b]`` of unreferenced blocks below a referenced one (or from
  the root) off the list. Over a forest ``chain[a]`` is a segment's top (its parent, were it in the
  list, would sit right above it in its segment), and that segment shares a leading part with
  ``chain[a:b]``; equal ids at equal depth below a common block mean equal paths, so that part's
  length is found by one comparison (the whole segment or the whole run) or a bisection; it is
  cut off the segment's top and the rest of the run, if any, starts another segment's top.
- **Eviction** takes blocks from the oldest segment's bottom up (emptied segments are dropped there;
  ``segs`` is compacted when more than half of it is empty).
- **Counters.** ``pinned`` (blocks held by running requests: ``occupied`` - unreferenced cached) is
  an attribute kept per admission and release, read by the node and the simulator per step; the
  list's length is ``occupied - pinned``. ``lru`` is a read-only view (length, order; ``clear``).

Per block, a release and a readmission still write its count in ``ref`` (read by ``lookup``) but no
longer insert or delete an ordered-dict entry: on 32 replicas a step puts ~11 blocks on the list and
takes ~10 off again.

The lower tiers (one :class:`TierStack` per replica, tiers ordered fastest first: CPU, then SSD):

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

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from typing import Any

from router.core.prefix_cache import Chain, ForestPrefixCache

__all__ = ["KVTier", "SegmentForestCache", "TierStack", "tier_blocks"]

Segment = list[Any]  # [chain, lo, hi]: unreferenced blocks chain[lo:hi], chain[hi - 1] the oldest


class _SegmentView:
    """``SegmentForestCache.lru``: the LRU list's length, its blocks oldest first, ``clear``."""

    __slots__ = ("_c",)

    def __init__(self, cache: SegmentForestCache):
        self._c = cache

    def __len__(self) -> int:
        return self._c.occupied - self._c.pinned

    def __iter__(self) -> Iterator[int]:
        for chain, lo, hi in list(self._c.segs):
            yield from reversed(chain[lo:hi])

    def clear(self) -> None:
        self._c.segs.clear()
        self._c.top.clear()


class SegmentForestCache(ForestPrefixCache):
    """:class:`~router.core.prefix_cache.ForestPrefixCache` with its LRU list as segments (module
    docstring); same behaviour, read ``pinned`` rather than ``len(lru)``."""

    __slots__ = ("pinned", "segs", "top")
    pinned: int  # PrefixCache's property, kept here as a count

    def __init__(self, capacity_blocks: int, block_size: int):
        super().__init__(capacity_blocks, block_size)
        self.pinned = 0  # blocks held by running requests: occupied - unreferenced cached
        self.segs: deque[Segment] = deque()  # oldest first; emptied ones dropped lazily
        self.top: dict[int, Segment] = {}  # a non-empty segment's top block -> the segment
        self.lru = _SegmentView(self)  # type: ignore[assignment]

    def kv_usage(self) -> float:
        return self.pinned / self.capacity

    def admit(self, chain: Chain, n_lookup: int, n_prompt: int, n_blocks: int) -> int:
        ref = self.ref
        n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
        hit = n_hashed
        while hit > 0 and chain[hit - 1] not in ref:  # the absent tail: chain[hit:n_hashed]
            hit -= 1
        top = hit  # cached, unreferenced: chain[top:hit]; chain[top - 1] referenced (or top 0)
        while top > 0 and ref[chain[top - 1]] == 0:
            top -= 1
        need = n_blocks - hit  # absent hashed + private blocks
        room = self.capacity - self.pinned - (hit - top)  # free + the others' unreferenced blocks
        if need > room:
            self.shortfall = need - room
            return -1
        if top > 0:  # the deepest referenced block: one more request ends there or passes through
            ref[chain[top - 1]] += 1
        if top < hit:  # referenced now, one holder each: off the LRU list
            for b in chain[top:hit]:
                ref[b] = 1
            self._unlink(chain, top, hit)
        evict = need - (self.capacity - self.occupied)
        if evict > 0:
            self.evictions += evict
            self.occupied -= evict
            self._evict(evict)
        if hit < n_hashed:
            self.inserted += n_hashed - hit
            for b in chain[hit:n_hashed]:
                ref[b] = 1
        self.occupied += need
        self.pinned += need + hit - top
        if hit > n_lookup:
            hit = n_lookup
        cap = (n_prompt - 1) // self.block_size if n_prompt > 0 else 0
        return hit if hit < cap else cap

    def _unlink(self, chain: Chain, a: int, b: int) -> None:
        """Take the unreferenced blocks ``chain[a:b]`` off the LRU list (module docstring)."""
        top = self.top
        while a < b:
            seg = top.pop(chain[a])
            sc, lo, hi = seg
            m = hi - lo if hi - lo < b - a else b - a
            if sc[lo + m - 1] != chain[a + m - 1]:  # the paths part within: the shared length
                m = bisect_left(range(1, m), True, key=lambda k: sc[lo + k] != chain[a + k])  # noqa: B023
                m += 1
            lo += m
            a += m
            seg[1] = lo
            if lo < hi:
                top[sc[lo]] = seg

    def _evict(self, n: int) -> None:
        """Evict ``n`` unreferenced blocks, least recently freed first (to ``spill`` when a list)."""
        ref, segs, spill = self.ref, self.segs, self.spill
        while n > 0:
            seg = segs[0]
            sc, lo, hi = seg
            if hi - lo > n:  # the segment's oldest n blocks
                lo = seg[2] = hi - n
                n = 0
            else:  # all of it (none when readmissions emptied it)
                segs.popleft()
                if lo == hi:
                    continue
                del self.top[sc[lo]]
                n -= hi - lo
            gone = sc[lo:hi]
            for b in gone:
                del ref[b]
            if spill is not None:
                spill.extend(reversed(gone))

    def release(self, chain: Chain, n_hashed: int, n_private: int) -> None:
        ref = self.ref
        lo = n_hashed
        if n_hashed:  # from the tip up while counts drop to zero: one segment
            for b in chain[n_hashed - 1 :: -1]:
                rc = ref[b] - 1
                ref[b] = rc
                if rc:
                    break
                lo -= 1
            if lo < n_hashed:
                seg = [chain, lo, n_hashed]
                segs = self.segs
                segs.append(seg)
                self.top[chain[lo]] = seg
                if len(segs) > 2 * len(self.top) + 64:  # mostly emptied by readmissions: compact
                    self.segs = deque(s for s in segs if s[1] < s[2])
        self.occupied -= n_private
        self.pinned -= n_private + n_hashed - lo

    def wipe(self) -> None:
        super().wipe()
        self.pinned = 0


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
