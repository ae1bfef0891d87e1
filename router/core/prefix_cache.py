"""The one prefix-cache model (vLLM's automatic prefix caching): block hashes, refcounts, LRU.

Used by the fake vLLM (``router.fakes.vllm``), the fake frontier's provider prompt cache
(``router.fakes.frontier``), the simulator's node (``router.sim.node``) and training's cache-label
replay (``training.dataset.lru_replay``), so calibrating the simulator against the fake compares one
model with itself, and ``local_cache_pressure`` (:func:`turnover`) means the same everywhere.

Algorithm:

- **Blocks and chains.** KV memory is counted in blocks of ``block_size`` tokens. A request names
  its cacheable blocks by a *chain* of ids, leading blocks first. :func:`block_hashes` builds one
  from tokens: block ``i``'s id = hash(id of block ``i-1``, the block's tokens), so a block matches
  only if the whole prefix up to it matches; only full blocks are hashed. The simulator and the
  replay pass integer ids from the run log (Mooncake ``hash_ids``) or run-private ids instead. A
  chain's ids must be distinct (a hash chain's are).
- **Lookup.** A request's hit = the leading blocks of its chain present in the cache, at most
  ``n_lookup`` (the chain blocks that lie inside the prompt) and at most ``(prompt - 1) //
  block_size`` (:func:`max_hit_blocks`): as in vLLM the last prompt token is always computed, so a
  fully cached prompt of ``n`` tokens reports ``floor((n - 1) / block_size)`` blocks.
- **Admission** (:meth:`PrefixCache.admit`) reserves ``n_blocks`` blocks for the request: its first
  ``min(len(chain), n_blocks)`` chain blocks are *hashed* (present ones are referenced, absent ones
  newly written and counted in ``inserted``), the rest are *private* (uncached: a partial block,
  decode space). It fits when the new blocks (absent hashed + private) fit in the free space plus
  the evictable cached blocks it does not itself reference; otherwise nothing changes (-1).
- **Reference counts and LRU.** Blocks referenced by a running request are never evicted. On
  :meth:`PrefixCache.release` private blocks are freed at once; hashed blocks whose count drops to
  0 stay cached, unreferenced, in an LRU list, pushed tail block first, so the tail is evicted first
  and a prefix outlives its suffix (as vLLM frees a request's blocks in reverse order). An
  admission that needs room evicts the least recently freed blocks, oldest first.
- **Capacity accounting.** ``occupied`` = cached blocks (referenced or not) + private blocks <=
  ``capacity``; ``pinned`` = occupied - unreferenced cached = blocks held by running requests (what
  vLLM's ``kv_cache_usage_perc`` reports, over ``capacity``).
- **Shortfall** (additive): a refused admission leaves in ``shortfall`` how many blocks it lacked;
  while only releases happen, free + evictable space must grow by that much before it can fit.
- **Demotion hook** (additive, for a lower KV tier such as the simulator's CPU tier): when
  ``spill`` is a list, every block evicted to make room is appended to it (oldest first); the
  owner drains it. ``None`` (the default) keeps nothing and costs nothing.
- **Counters.** ``inserted``: hashed blocks ever newly written; ``wipes``: whole-cache losses
  (:meth:`PrefixCache.reset`, vLLM's ``/reset_prefix_cache``, drops the unreferenced cached blocks;
  :meth:`PrefixCache.wipe`, a scale-to-zero reap or restart, drops everything); ``evictions``:
  blocks evicted to make room.
- **Turnover** (:func:`turnover`, the feature ``local_cache_pressure``): how much of the cache was
  rewritten since a mark = (counter now - counter at the mark) / capacity, clipped to [0, 1]; 1.0
  after a wipe, or when the counter went backwards (the server restarted).

- **Forest chains** (:class:`ForestPrefixCache`, the simulator's when its workload allows): when
  every chain given is a path of one forest (:func:`chains_form_forest`: one predecessor per id, as
  hash chains have), the same model by delta work: admit and release walk from the chain's tip over
  the blocks whose state changes only (the class docstring says why that is exact).

Knobs: ``capacity_blocks`` (KV capacity in blocks, >= 1) and ``block_size`` (tokens per block,
>= 1) of :class:`PrefixCache`; ``block_size`` of :func:`block_hashes`.

:func:`block_hashes` uses Python's ``hash()``: over token strings it is salted per process
(``PYTHONHASHSEED``), so ids are comparable within one process only. That is all the fakes need:
the cache lives in the fake's process and is never shared. Integer chains (the simulator's, the
replay's) do not depend on it. A stable hash (blake2b) cost ~4x more per block on this machine.

Pure and synchronous, no I/O; the hot methods (:meth:`~PrefixCache.lookup`,
:meth:`~PrefixCache.admit`, :meth:`~PrefixCache.release`) allocate nothing per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Allocation",
    "Chain",
    "ForestPrefixCache",
    "PrefixCache",
    "block_hashes",
    "chains_form_forest",
    "max_hit_blocks",
    "turnover",
]

Chain = Sequence[int]  # block ids, leading block first


def block_hashes(tokens: Sequence[str], block_size: int) -> list[int]:
    """Hash chain of the full blocks: ``h_i = hash((h_{i-1}, tokens of block i))``, ``h_{-1} = 0``.

    Comparable within one process only (see the module docstring)."""
    out: list[int] = []
    h = 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[i : i + block_size])))
        out.append(h)
    return out


def max_hit_blocks(n_prompt: int, block_size: int) -> int:
    """Most blocks of an ``n_prompt``-token prompt that can hit: the last prompt token is computed."""
    return (n_prompt - 1) // block_size if n_prompt > 0 else 0


def turnover(inserted_now: float, inserted_mark: float, capacity: float, wiped: bool = False) -> float:
    """``local_cache_pressure``: share of the cache rewritten since a mark, in [0, 1].

    ``(inserted_now - inserted_mark) / capacity`` clipped to [0, 1] (any unit: blocks or tokens, the
    same for all three); 1.0 when the cache was wiped since the mark or the counter went backwards
    (the server restarted). ``capacity`` must be > 0."""
    if capacity <= 0:
        raise ValueError(f"cache capacity must be > 0, got {capacity}")
    if wiped or inserted_now < inserted_mark:
        return 1.0
    d = (inserted_now - inserted_mark) / capacity
    return d if d < 1.0 else 1.0


@dataclass(slots=True)
class Allocation:
    """Blocks a running request holds; from :meth:`PrefixCache.allocate`, given back by ``free``."""

    hashes: list[int]  # the hashed (cached) prompt blocks it references, in prompt order
    private_blocks: int  # uncached blocks (partial prompt block + decode) held while running
    cached_tokens: int  # the hit, in tokens (whole blocks)
    created_tokens: int  # tokens of hashed blocks this request newly wrote into the cache


class PrefixCache:
    """Block-granular prefix cache with reference counts and LRU eviction; see the module docstring.

    ``ref`` maps each cached block id to its reference count (0 = unreferenced, evictable) and
    ``lru`` holds the unreferenced ones, least recently freed first; read them, do not write them.
    """

    __slots__ = (
        "capacity",
        "block_size",
        "ref",
        "lru",
        "occupied",
        "inserted",
        "wipes",
        "evictions",
        "spill",
        "shortfall",
    )

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 1 or block_size < 1:
            raise ValueError(
                f"capacity_blocks and block_size must be >= 1, got {capacity_blocks}, {block_size}"
            )
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.occupied = 0  # cached blocks (referenced or not) + private blocks
        self.inserted = 0
        self.wipes = 0
        self.evictions = 0
        self.spill: list[int] | None = None  # evicted block ids are appended here when a list
        self.shortfall = 0  # blocks the last refused admission lacked (room must grow this much)

    # ------------------------------------------------------------------ observation
    @property
    def pinned(self) -> int:
        """Blocks held by running requests (referenced cached + private)."""
        return self.occupied - len(self.lru)

    @property
    def cached_blocks(self) -> int:
        return len(self.ref)

    def kv_usage(self) -> float:
        """``pinned / capacity`` (vLLM's ``kv_cache_usage_perc``, 0-1)."""
        return (self.occupied - len(self.lru)) / self.capacity

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens (ceil)."""
        return -(-n_tokens // self.block_size)

    def lookup(self, chain: Chain, n_lookup: int) -> int:
        """Leading blocks of ``chain[:n_lookup]`` present in the cache (no side effects, no cap)."""
        ref = self.ref
        n = 0
        for i in range(n_lookup):
            if chain[i] not in ref:
                break
            n += 1
        return n

    def hit_blocks(self, chain: Chain, n_lookup: int, n_prompt: int) -> int:
        """The hit :meth:`admit` would report now: :meth:`lookup` capped by :func:`max_hit_blocks`."""
        hit = self.lookup(chain, n_lookup)
        cap = max_hit_blocks(n_prompt, self.block_size)
        return hit if hit < cap else cap

    def fits(self, chain: Chain, n_blocks: int) -> bool:
        """Whether :meth:`admit` of a request of ``n_blocks`` blocks would succeed now."""
        get = self.ref.get
        n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
        n_new = present_free = 0
        for i in range(n_hashed):
            rc = get(chain[i])
            if rc is None:
                n_new += 1
            elif rc == 0:
                present_free += 1
        need = n_new + n_blocks - n_hashed
        return need <= self.capacity - self.occupied + len(self.lru) - present_free

    # ------------------------------------------------------------------ requests
    def admit(self, chain: Chain, n_lookup: int, n_prompt: int, n_blocks: int) -> int:
        """Reserve ``n_blocks`` blocks for a request; return its hit in blocks, or -1 if it does not fit.

        The first ``min(len(chain), n_blocks)`` chain blocks are hashed (referenced, absent ones
        written), the rest private; evicts unreferenced blocks, oldest first, as needed.
        Give the blocks back with ``release(chain, min(len(chain), n_blocks), private)``."""
        ref = self.ref
        lru = self.lru
        get = ref.get
        n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
        hit = -1  # the first absent block
        n_new = 0
        free = self.capacity - self.occupied
        if n_blocks + n_hashed <= free + len(lru):
            # fits whatever is cached (need <= n_blocks, present_free <= n_hashed): reference the
            # present blocks in the same pass
            for b in chain if n_hashed == len(chain) else chain[:n_hashed]:
                rc = get(b)
                if rc is None:
                    n_new += 1
                else:
                    if rc == 0:
                        del lru[b]
                    ref[b] = rc + 1
            if n_new:  # the first absent block: the absent ones are usually the chain's last n_new
                hit = n_hashed - n_new
                for i in range(hit, n_hashed):
                    if chain[i] in ref:  # not the tail after all: the first absent one from the start
                        hit = 0
                        while chain[hit] in ref:
                            hit += 1
                        break
            need = n_new + n_blocks - n_hashed
        else:
            last = -1  # the last present block
            present_free = 0
            for i in range(n_hashed):
                rc = get(chain[i])
                if rc is None:
                    n_new += 1
                    if hit < 0:
                        hit = i
                else:
                    last = i
                    if rc == 0:
                        present_free += 1
            need = n_new + n_blocks - n_hashed
            if need > free + len(lru) - present_free:
                self.shortfall = need - (free + len(lru) - present_free)
                return -1
            for i in range(last + 1):  # reference the present blocks (out of the LRU list if free)
                b = chain[i]
                rc = get(b)
                if rc is not None:
                    if rc == 0:
                        del lru[b]
                    ref[b] = rc + 1
        evict = need - free
        if evict > 0:
            self.evictions += evict
            self.occupied -= evict
            popitem = lru.popitem
            spill = self.spill
            if spill is None:
                while evict > 0:
                    b, _ = popitem(last=False)
                    del ref[b]
                    evict -= 1
            else:
                while evict > 0:
                    b, _ = popitem(last=False)
                    del ref[b]
                    spill.append(b)
                    evict -= 1
        if n_new:
            self.inserted += n_new
            for i in range(hit, n_hashed):
                b = chain[i]
                if b not in ref:
                    ref[b] = 1
        else:
            hit = n_hashed
        self.occupied += need
        if hit > n_lookup:
            hit = n_lookup
        cap = (n_prompt - 1) // self.block_size if n_prompt > 0 else 0
        return hit if hit < cap else cap

    def release(self, chain: Chain, n_hashed: int, n_private: int) -> None:
        """Give back a request's blocks: private ones are freed, hashed ones unreferenced (tail first)."""
        ref = self.ref
        lru = self.lru
        for b in reversed(chain if n_hashed == len(chain) else chain[:n_hashed]):
            rc = ref[b] - 1
            ref[b] = rc
            if rc == 0:
                lru[b] = None
        self.occupied -= n_private

    def allocate(self, hashes: list[int], n_prompt: int, n_out: int) -> Allocation | None:
        """:meth:`admit` for a prompt whose ``hashes`` are its full blocks, plus ``n_out`` output tokens.

        Returns the :class:`Allocation` to :meth:`free` later, or None when it does not fit now."""
        n_blocks = self.blocks_for(n_prompt + n_out)
        if n_blocks < len(hashes):
            raise ValueError(f"{len(hashes)} hashed blocks do not lie inside {n_prompt} + {n_out} tokens")
        before = self.inserted
        hit = self.admit(hashes, len(hashes), n_prompt, n_blocks)
        if hit < 0:
            return None
        bs = self.block_size
        return Allocation(hashes, n_blocks - len(hashes), hit * bs, (self.inserted - before) * bs)

    def free(self, alloc: Allocation) -> None:
        """Release an :class:`Allocation` (idempotent: a freed allocation holds nothing)."""
        self.release(alloc.hashes, len(alloc.hashes), alloc.private_blocks)
        alloc.hashes = []
        alloc.private_blocks = 0

    # ------------------------------------------------------------------ losses
    def reset(self) -> None:
        """Drop every unreferenced cached block (vLLM's ``/reset_prefix_cache``); counts as a wipe."""
        ref = self.ref
        for b in self.lru:
            del ref[b]
        self.occupied -= len(self.lru)
        self.lru.clear()
        self.wipes += 1

    def wipe(self) -> None:
        """Lose everything (a scale-to-zero reap, a restart); no request may hold blocks."""
        self.ref.clear()
        self.lru.clear()
        self.occupied = 0
        self.wipes += 1


def chains_form_forest(chains: Iterable[Chain]) -> bool:
    """Whether every block id has one predecessor in all ``chains`` (the first block of a chain
    none): the chains are paths of one forest, as hash chains are (a block's id names its whole
    prefix). :class:`ForestPrefixCache` needs it of every chain it is given."""
    parent: dict[int, int | None] = {}
    get = parent.get
    unseen = object()
    for chain in chains:
        prev: int | None = None
        for b in chain:
            p = get(b, unseen)
            if p is unseen:
                parent[b] = prev
            elif p != prev:
                return False
            prev = b
    return True


class ForestPrefixCache(PrefixCache):
    """:class:`PrefixCache` for chains that form a forest (:func:`chains_form_forest`): the same
    hits, admissions, refusals (``shortfall``), evictions (order included), LRU order, counters and
    ``spill``, by work proportional to the blocks whose state changes, not to the chain's length.

    Over such chains the referenced blocks and the cached blocks are each prefix-closed along any
    chain: a request references its whole hashed prefix, and a block enters the LRU list only after
    every block below it in the tree (released tail first, re-referenced with its descendants), so it
    is evicted after them. A request's hashed blocks are therefore a referenced prefix, then
    unreferenced cached blocks, then absent ones, found by walking back from the tip. ``ref`` then
    holds, per cached block, the requests whose hashed chain ends there plus its referenced children
    (not the requests through it): zero exactly when :class:`PrefixCache`'s count is zero, so
    :meth:`lookup`, :meth:`fits`, ``lru`` and every figure derived from them read the same.
    A release walks up from the tip while counts drop to zero (those blocks go to the LRU list, tail
    first, as :class:`PrefixCache` pushes them); an admission walks down from the tip over the absent
    and the unreferenced blocks only (``tests/test_prefix_cache.py`` checks both classes op by op).
    """

    __slots__ = ()

    def admit(self, chain: Chain, n_lookup: int, n_prompt: int, n_blocks: int) -> int:
        ref = self.ref
        lru = self.lru
        n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
        i = n_hashed - 1
        while i >= 0 and chain[i] not in ref:  # the absent tail
            i -= 1
        hit = i + 1
        j = i
        while j >= 0 and ref[chain[j]] == 0:  # cached, unreferenced: chain[j + 1 : hit]
            j -= 1
        free = self.capacity - self.occupied
        need = n_hashed - hit + n_blocks - n_hashed
        if need > free + len(lru) - (i - j):
            self.shortfall = need - (free + len(lru) - (i - j))
            return -1
        if j >= 0:  # the deepest referenced block: one more request ends there or passes through
            ref[chain[j]] += 1
        if j + 1 < hit:  # referenced now: out of the LRU list, one holder each
            for b in chain[j + 1 : hit]:
                del lru[b]
                ref[b] = 1
        evict = need - free
        if evict > 0:
            self.evictions += evict
            self.occupied -= evict
            popitem = lru.popitem
            spill = self.spill
            while evict > 0:
                b, _ = popitem(last=False)
                del ref[b]
                if spill is not None:
                    spill.append(b)
                evict -= 1
        if hit < n_hashed:
            self.inserted += n_hashed - hit
            for b in chain[hit:n_hashed]:
                ref[b] = 1
        self.occupied += need
        if hit > n_lookup:
            hit = n_lookup
        cap = (n_prompt - 1) // self.block_size if n_prompt > 0 else 0
        return hit if hit < cap else cap

    def release(self, chain: Chain, n_hashed: int, n_private: int) -> None:
        ref = self.ref
        lru = self.lru
        if n_hashed:  # from the tip up (a reversed slice: no index arithmetic per block)
            for b in chain[n_hashed - 1 :: -1]:
                rc = ref[b] - 1
                ref[b] = rc
                if rc:
                    break
                lru[b] = None
        self.occupied -= n_private
