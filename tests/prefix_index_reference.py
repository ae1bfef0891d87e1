"""The prefix index's approximate form before the sixth pass (main 3550e52), kept verbatim as the
reference the tests hold the current :mod:`router.core.prefix_index` to: the same matches, the same
blocks, stamps, parents, children counts, owners and eviction counts after any sequence of records,
applies, clears, mode switches and lookups (``tests/test_prefix_index_equiv.py``). Not imported by
the package."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from router.core.prefix_precise import PreciseReplicaIndex

_PER_REPLICA_MAX = 4


class ReplicaIndex:
    """One replica's blocks: a tree of block ids with leaf-LRU eviction (module docstring).

    ``stamp`` maps each held block to its LRU stamp (a block is held iff it is a key), ``parent``
    a non-root block to the block before it, ``children`` a block to its number of held children
    (absent: 0); read them, do not write them. Plain int dictionaries (no per-block objects), so
    the garbage collector never walks the index. ``owners`` (shared by every approximate replica
    of one :class:`PrefixIndex`, its own otherwise) maps a block to the bit mask of the replicas
    holding it; this replica keeps its ``bit`` there in step with ``stamp`` (set on insert,
    cleared on eviction and :meth:`clear`).
    """

    __slots__ = ("capacity", "stamp", "parent", "children", "_heap", "evictions", "owners", "bit")

    def __init__(self, capacity_blocks: int, owners: dict[int, int] | None = None, bit: int = 1):
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        if bit < 1 or bit & (bit - 1):
            raise ValueError(f"bit must be a power of two, got {bit}")
        self.capacity = capacity_blocks
        self.stamp: dict[int, int] = {}
        self.parent: dict[int, int] = {}
        self.children: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (stamp, block) of leaves; stale entries skipped
        self.evictions = 0
        self.owners: dict[int, int] = {} if owners is None else owners
        self.bit = bit

    def __len__(self) -> int:
        return len(self.stamp)

    def __contains__(self, block: int) -> bool:
        return block in self.stamp

    def match(self, chain: Sequence[int], n: int, hint: int = 0) -> int:
        """Leading blocks of ``chain[:n]`` held (binary search: presence is prefix-closed).

        ``hint``: a guess of the answer (the run's match on this replica at its previous step);
        checked with two lookups (``chain[hint - 1]`` held, ``chain[hint]`` not) and, when wrong,
        it narrows the search. Any hint gives the same answer."""
        held = self.stamp
        if n <= 0 or chain[0] not in held:
            return 0
        lo, hi = 1, n  # chain[lo-1] held; the answer lies in [lo, hi]
        if 0 < hint < n:
            if chain[hint - 1] in held:
                if chain[hint] not in held:
                    return hint
                lo = hint + 1
            else:
                hi = hint - 1
        if chain[hi - 1] in held:
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def record(self, chain: Sequence[int], n: int, stamp: int, hint: int = 0) -> None:
        """The replica now holds ``chain[:n]``: insert what it lacks, stamp the tip, evict LRU leaves
        (``hint``: :meth:`match`'s, e.g. the match just read for this step)."""
        if n > self.capacity:
            n = self.capacity
        if n <= 0:
            return
        held, parent, children = self.stamp, self.parent, self.children
        owners, bit = self.owners, self.bit
        if 0 < hint < n and chain[0] in held and chain[hint - 1] in held and chain[hint] not in held:
            k = hint  # the hint is right (match's own first checks, inline)
        else:
            k = self.match(chain, n, hint)
        prev = chain[k - 1] if k > 0 else None
        for i in range(k, n):
            b = chain[i]
            if b in held:  # an id seen under another parent (not a hash chain): keep the first
                prev = b
                continue
            held[b] = stamp
            owners[b] = owners.get(b, 0) | bit
            if prev is not None:
                parent[b] = prev
                children[prev] = children.get(prev, 0) + 1
            prev = b
        tip = chain[n - 1]
        held[tip] = stamp
        if tip not in children:
            heapq.heappush(self._heap, (stamp, tip))
        if len(held) > self.capacity:
            self._evict(len(held) - self.capacity)
        elif len(self._heap) > 4 * self.capacity + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop stale heap entries (touched or no longer leaves); keeps the heap O(capacity)."""
        held, children = self.stamp, self.children
        self._heap = [(t, b) for t, b in self._heap if held.get(b) == t and b not in children]
        heapq.heapify(self._heap)

    def _evict(self, count: int) -> None:
        held, parent, children = self.stamp, self.parent, self.children
        heap, owners, keep = self._heap, self.owners, ~self.bit
        pop, push = heapq.heappop, heapq.heappush
        self.evictions += count  # all of them (or the error below)
        while count > 0 and heap:
            t, b = pop(heap)
            if held.get(b) != t or b in children:
                continue  # stale: evicted, no longer a leaf, or touched since
            while True:  # evict b, then its parent while that is the next leaf the heap would give
                del held[b]
                m = owners[b] & keep
                if m:
                    owners[b] = m
                else:
                    del owners[b]
                count -= 1
                p = parent.pop(b, None)
                if p is None:
                    break
                c = children[p] - 1
                pt = held[p]
                if t > pt:
                    held[p] = pt = t
                if c:
                    children[p] = c
                    break
                del children[p]
                if count > 0 and (not heap or (pt, p) < heap[0]):
                    t, b = pt, p  # what push then pop would give: skip both
                    continue
                push(heap, (pt, p))
                break
        if count > 0:  # pragma: no cover - the heap always holds every leaf
            raise RuntimeError("prefix index: no leaf left to evict")

    def clear(self) -> None:
        owners, keep = self.owners, ~self.bit
        for b in self.stamp:
            m = owners[b] & keep
            if m:
                owners[b] = m
            else:
                del owners[b]
        self.stamp.clear()
        self.parent.clear()
        self.children.clear()
        self._heap.clear()


class PrefixIndex:
    """Per local replica, the block chains it holds (module docstring); ``block_tokens`` per block.

    Besides each replica's own index, one map ``owners`` (block -> bit mask of the approximate
    replicas holding it; each tracked replica's bit is fixed for the index's life) answers for
    every approximate replica at once: :meth:`lookup` reads it instead of each replica's blocks."""

    __slots__ = (
        "block_tokens",
        "replicas",
        "_clock",
        "listener",
        "owners",
        "_bits",
        "_names",
        "_zeros",
        "_precise",
        "_by_mask",
        "_cold",
    )

    def __init__(self, block_tokens: int, capacities: Iterable[tuple[str, int]] = ()):
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.replicas: dict[str, ReplicaIndex | PreciseReplicaIndex] = {}
        self._clock = 0
        # told of every local record (replica, chain, n): how an adapter shares the index with
        # other routers (router.server.state.prefix_share); None = nobody
        self.listener: Callable[[str, Sequence[int], int], None] | None = None
        self.owners: dict[int, int] = {}  # block -> bit mask of the approximate replicas holding it
        self._bits: dict[str, int] = {}  # replica -> its bit (never reused)
        self._names: list[str] = []  # bit position -> replica
        self._zeros: dict[str, int] = {}  # every replica -> 0 (lookup's starting answer)
        self._precise: list[tuple[str, PreciseReplicaIndex]] = []
        self._by_mask: dict[int, tuple[str, ...]] = {}  # mask -> its replicas (a cache)
        # the answers of the latest lookup made with no hints (a run's first step): the hints of
        # the next one (runs that share leading blocks tend to leave each replica at one place)
        self._cold: dict[str, int] = {}
        for name, cap in capacities:
            self.add_replica(name, cap)

    def _approximate(self, name: str, capacity_blocks: int) -> ReplicaIndex:
        bit = self._bits.get(name)
        if bit is None:
            bit = self._bits[name] = 1 << len(self._names)
            self._names.append(name)
            self._zeros[name] = 0
        return ReplicaIndex(capacity_blocks, self.owners, bit)

    def _replace(self, name: str, r: ReplicaIndex | PreciseReplicaIndex) -> None:
        cur = self.replicas.get(name)
        if isinstance(cur, ReplicaIndex):
            cur.clear()  # its bits leave the owners map
        self.replicas[name] = r
        self._precise = [(n, p) for n, p in self.replicas.items() if isinstance(p, PreciseReplicaIndex)]

    def add_replica(self, name: str, capacity_blocks: int) -> None:
        """Track replica ``name`` (kept as is when already tracked with that capacity)."""
        cur = self.replicas.get(name)
        if cur is None or cur.capacity != capacity_blocks:
            self._replace(name, self._approximate(name, capacity_blocks))

    def set_precise(self, name: str) -> PreciseReplicaIndex:
        """Put replica ``name`` in precise mode (an empty index its KV events fill; kept as is when
        already precise); returns it. The replica's block size must be ``block_tokens``."""
        cur = self.replicas.get(name)
        if isinstance(cur, PreciseReplicaIndex):
            return cur
        cap = cur.capacity if cur is not None else 1
        self._approximate(name, cap)  # its bit and its zero, for a later switch back
        r = PreciseReplicaIndex(self.block_tokens, cap)
        self._replace(name, r)
        return r

    def set_approximate(self, name: str) -> None:
        """Put replica ``name`` back in approximate mode (empty; kept as is when already so)."""
        cur = self.replicas.get(name)
        if isinstance(cur, PreciseReplicaIndex):
            self._replace(name, self._approximate(name, max(1, cur.capacity)))

    def modes(self) -> dict[str, str]:
        """Each replica's mode: ``precise`` (KV events) or ``approximate`` (what was sent where)."""
        return {
            n: "precise" if isinstance(r, PreciseReplicaIndex) else "approximate"
            for n, r in self.replicas.items()
        }

    def match(self, replica: str, chain: Sequence[int], n: int, hint: int = 0) -> int:
        """Leading blocks of ``chain[:n]`` that ``replica`` holds (0 for an unknown replica);
        ``hint``: :meth:`ReplicaIndex.match`'s."""
        r = self.replicas.get(replica)
        return r.match(chain, min(n, len(chain)), hint) if r is not None else 0

    def _holders(self, mask: int) -> tuple[str, ...]:
        t = self._by_mask.get(mask)
        if t is None:
            names = self._names
            out = []
            m = mask
            while m:
                low = m & -m
                out.append(names[low.bit_length() - 1])
                m ^= low
            t = tuple(out)
            if len(self._by_mask) >= 4096:
                self._by_mask.clear()
            self._by_mask[mask] = t
        return t

    def lookup(self, chain: Sequence[int], n: int, hints: dict[str, int]) -> dict[str, int]:
        """Every replica's :meth:`match` of ``chain[:n]`` in one pass, written into ``hints``
        (replica -> blocks; the values found there are read first as places to probe) and returned.

        The same answers as one :meth:`match` per replica (a hash chain: each replica's presence
        along it is prefix-closed, so the set of replicas holding ``chain[i]`` only shrinks with
        ``i``), from the ``owners`` map instead of each replica's blocks: a replica's match is
        where it leaves that set. The masks at block 0, the last block and either side of every
        hint value are read (a step's hints are the run's previous matches: they usually sit
        exactly on the places where the set shrinks); between two read blocks whose masks differ,
        a binary search finds each place where it shrinks. Cost: O(distinct hint values + places
        where the set shrinks x log n) dictionary lookups, whatever the number of replicas,
        plus writing the answers (C-level dictionary updates). A precise replica answers by its
        own :meth:`~router.core.prefix_precise.PreciseReplicaIndex.match`. With no hints at all
        (a run's first step) the answers of the latest such lookup are the probes instead: runs
        that share leading blocks (a system prompt, tool schemas) tend to leave each replica at the
        same place, and a wrong guess only costs its two lookups (any guess, the same answers)."""
        if n > len(chain):
            n = len(chain)
        cold = not hints
        if len(self._names) <= _PER_REPLICA_MAX:
            self._lookup_each(chain, n, hints, self._cold if cold else hints)
        else:
            self._lookup_masks(chain, n, hints, self._cold if cold else hints)
        if cold:
            self._cold = hints.copy()
        return hints

    def lookup_some(
        self, chain: Sequence[int], n: int, hints: dict[str, int], names: Sequence[str]
    ) -> dict[str, int]:
        """:meth:`lookup` for the replicas ``names`` only (each by its own :meth:`match`, its value in
        ``hints`` the probe), written into ``hints`` and returned: for an adapter that gives the
        engine a few of the replicas (the simulator, for a run a pin-keeping policy keeps where it
        is). The same answers for those; the other replicas' values are left as they were (they are
        search hints only)."""
        if n > len(chain):
            n = len(chain)
        reps = self.replicas
        for name in names:
            r = reps.get(name)
            if r is not None:
                hints[name] = r.match(chain, n, hints.get(name, 0)) if n > 0 else 0
        return hints

    def _lookup_masks(
        self, chain: Sequence[int], n: int, hints: dict[str, int], guess: dict[str, int]
    ) -> dict[str, int]:
        """:meth:`lookup` from the owners map; ``guess``: the hints to probe."""
        probes = set(guess.values()) if guess else None
        hints.update(self._zeros)
        for name, pr in self._precise:
            hints[name] = pr.match(chain, n, 0) if n > 0 else 0
        if n <= 0:
            return hints
        get = self.owners.get
        m0 = get(chain[0], 0)
        if not m0:
            return hints
        last = n - 1
        mt = get(chain[last], 0) & m0 if last else m0
        if mt != m0:
            seen = {0: m0, last: mt}
            if probes:
                for v in probes:
                    if 0 < v < n:
                        if v not in seen:
                            seen[v] = get(chain[v], 0) & m0
                        if v - 1 not in seen:
                            seen[v - 1] = get(chain[v - 1], 0) & m0
            pts = sorted(seen) if len(seen) > 2 else (0, last)
            holders = self._holders
            lo, mlo = 0, m0
            for hi in pts[1:]:
                mhi = seen[hi]
                while mhi != mlo:  # the set shrinks somewhere in (lo, hi]: find the first place
                    a, b = lo, hi  # mask(a) == mlo, mask(b) != mlo
                    mb = mhi
                    while b > a + 1:
                        mid = (a + b) // 2
                        mm = get(chain[mid], 0) & m0
                        if mm == mlo:
                            a = mid
                        else:
                            b, mb = mid, mm
                    hints.update(dict.fromkeys(holders(mlo & ~mb), b))
                    lo, mlo = b, mb
                lo = hi
        if mt:
            hints.update(dict.fromkeys(self._holders(mt), n))
        return hints

    def _lookup_each(
        self, chain: Sequence[int], n: int, hints: dict[str, int], guess: dict[str, int]
    ) -> dict[str, int]:
        """:meth:`lookup` for a few replicas: one replica at a time (one dictionary lookup for a
        replica without the chain's first block, two more, inline, when its hint is right, its
        :meth:`ReplicaIndex.match` otherwise): cheaper than the owners map below a handful."""
        if n <= 0:
            hints.update(self._zeros)
            return hints
        first = chain[0]
        get = guess.get
        for name, r in self.replicas.items():
            held = r.stamp
            if first not in held:
                hints[name] = 0
                continue
            h = get(name, 0)
            if type(r) is ReplicaIndex and 0 < h < n and chain[h - 1] in held and chain[h] not in held:
                if guess is not hints:
                    hints[name] = h
                continue  # the hint is right
            hints[name] = r.match(chain, n, h)
        return hints

    def record(self, replica: str, chain: Sequence[int], n: int | None = None, hint: int = 0) -> None:
        """A step with this chain was sent to ``replica``: it holds ``chain[:n]`` (all by default);
        ``hint``: the chain's match there, if known (:meth:`ReplicaIndex.match`)."""
        r = self.replicas.get(replica)
        if r is None:
            return
        n = len(chain) if n is None else min(n, len(chain))
        self._clock += 1
        r.record(chain, n, self._clock, hint)
        if self.listener is not None and n > 0:
            self.listener(replica, chain, n)

    def apply(self, replica: str, chain: Sequence[int]) -> None:
        """Another router sent ``chain`` to ``replica`` (:meth:`record` without the listener; a
        precise replica ignores it: its events say what it holds)."""
        r = self.replicas.get(replica)
        if isinstance(r, ReplicaIndex):
            self._clock += 1
            r.record(chain, len(chain), self._clock)

    def clear(self, replica: str) -> None:
        """``replica`` lost its cache (restart, reap, prefix-cache reset)."""
        r = self.replicas.get(replica)
        if r is not None:
            r.clear()
