"""The prefix index: per local replica, which block-hash chains it holds (approximate or precise).

One index for the sidecar, the what-if simulator and replay (the step engine owns it:
:class:`router.core.engine.StepEngine` ``prefix_index``; :func:`router.replay.replay` gives each
policy its own for logs with ``hash_ids``), so a what-if places with exactly what the sidecar would
know. Training's cache *labels* are not read from it: they model what the replica's own cache
holds (:func:`training.dataset.lru_replay`, the node model of :mod:`router.core.prefix_cache`),
which this index approximates. Reuse *across* runs counts: a system prompt or tool schema shared by many runs
is one chain prefix, held once per replica, and any run whose chain starts with it matches it.

Algorithm:

- **Chains.** A step names its cacheable prompt blocks by a chain of integer ids, leading block
  first, where an id determines the whole prefix up to it (a hash chain). The simulator and replay
  pass the run log's chains (Mooncake ``hash_ids``, or the workload's run-private ids); text prompts
  get theirs from :class:`TextChainer` (below).
- **Approximate mode** (what the routers sent where): when a step is placed on a replica, the
  replica is assumed to hold the step's chain afterwards (:meth:`PrefixIndex.record`). Each
  replica's blocks form a tree (a block's parent is the block before it in its chain) with LRU
  eviction of *leaves* at the replica's capacity in blocks (SGLang's approximate radix tree;
  vLLM frees a request's tail blocks first, so a prefix outlives its suffix). A record stamps the
  chain's tip with a logical clock; a leaf evicted hands its stamp up to its parent (which becomes
  a leaf with the newest stamp of its evicted subtree). So a block present implies its whole prefix
  present, and the matched prefix of a chain is found by binary search: O(log n) dictionary
  lookups per replica (:meth:`PrefixIndex.match`), two when the caller's hint (the run's match
  on that replica at its previous step, or what it recorded there) is right;
  :meth:`PrefixIndex.lookup` gives every replica's match in one pass (the step engine's per-step
  lookup). Beside the per-replica trees, one map block -> bit mask of the replicas holding it
  (``PrefixIndex.owners``, kept by each insert and eviction beyond four replicas) answers for all replicas at once: along
  a chain the set of holders only shrinks, a replica's match is where it leaves the set, and those
  places are found by probing the run's previous matches (its hints) and binary search between
  probes whose masks differ: O(places x log n) lookups whatever the number of replicas (up to
  four replicas, one replica at a time is cheaper: one lookup each, two more when the hint is
  right, or when the hint lies past the lookup and the chain's last block is held; the map is then
  not kept at all). A record inserts only the blocks the replica
  lacks and touches the tip: O(new blocks + log n), flat in the body size for a run that grows;
  its leaf evictions run in the same frame.
- **Several routers** (:mod:`router.server.state.prefix_share`, with Redis): every local record is
  also published (the ``listener``) and other routers' records are applied
  (:meth:`PrefixIndex.apply`), so each router's index holds what all routers sent where.
- **Losses.** :meth:`PrefixIndex.clear` drops a replica's blocks (a restart, a scale-to-zero reap,
  vLLM's ``/reset_prefix_cache``).
- **Precise mode** (per replica, :meth:`PrefixIndex.set_precise`): the replica's blocks as its vLLM
  reports them in KV events (:mod:`router.core.prefix_precise`, fed by
  :mod:`router.server.state.kv_events`); records change nothing there, events do. It needs token chains
  of the replica's block size (:class:`router.core.prefix_precise.TokenChainer`); a replica without
  events, or whose events stopped, is switched back (:meth:`PrefixIndex.set_approximate`, empty:
  approximate blocks are guesses, events are not, and neither is converted into the other).
  :meth:`PrefixIndex.modes` says which mode each replica is in (``/ready``, a metric).

Text prompts (:class:`TextChainer`, the sidecar): a *stated character-block approximation* of the
replica's token blocks. The prompt is a sequence of segments (one per message: role, then content);
the segments are joined with a separator into one character stream cut into blocks of
``block_chars`` characters (``block_tokens x chars_per_token``; 4 characters per token is the usual
English BPE figure); block ``i``'s id = xxh64(the block's UTF-8 text, seed = id of block ``i-1``)
as a signed int64, stable across processes and machines (so two routers agree; routers of
different versions before this hash disagree until they run one version). xxh64 is not
cryptographic: a client could forge a colliding block and mislead placement (never correctness).
blake2b cost ~3 us per block here, xxh64 ~0.2 us. Incremental per run: a run remembers how many segments it
hashed, the characters of its unfinished block and a fingerprint of its last hashed segment
(length, first and last 32 characters) and of its first one; a step whose segment list still has
both at their positions hashes only the segments after it; any other step (an edited or compacted
history) re-hashes from the start. Not seen: an edit of a middle segment that keeps the segment
count and the first and last hashed segments (the chain then over-states the match until the run's
history changes there again); in the sidecar, an edit of a tool offered that keeps the number of
tools and the first and last tools (:class:`router.server.protocols.chat.MessageSegments` fingerprints the
tools by those, so a step does not re-serialise every tool schema). Token blocks from the model's
tokenizer: :class:`router.core.prefix_precise.TokenChainer` (precise mode needs them).

Knobs: ``PrefixIndex(block_tokens)`` (in precise mode: the replicas' vLLM block size); per replica ``capacity_blocks`` (:meth:`PrefixIndex.add_replica`,
the replica's KV capacity in the index's blocks: the node profile's KV size in the simulator, the
configured KV size in the sidecar); ``TextChainer(block_chars)``.

Pure and synchronous, no I/O. Not thread-safe: one thread (the sidecar's event loop) records,
matches and applies events.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Protocol

from xxhash import xxh64_intdigest as _xxh64

from router.core.prefix_precise import PreciseReplicaIndex

__all__ = [
    "PrefixIndex",
    "ReplicaIndex",
    "RunChain",
    "Segments",
    "TextChainer",
    "SEGMENT_SEP",
    "CHARS_PER_TOKEN",
]

SEGMENT_SEP = "\x1e"  # joins the segments (messages) of a text prompt into one character stream
CHARS_PER_TOKEN = 4  # the character-block approximation's characters per token
_MASK64, _TWO63, _TWO64 = (1 << 64) - 1, 1 << 63, 1 << 64
# PrefixIndex.lookup: up to this many tracked replicas, one replica at a time (each a dictionary
# lookup or two when the run's hint there is right; measured cheaper than the owners map at 4,
# dearer from about 5 with a cold hint: bench/prefix_index_cost.py); beyond, the owners map
_PER_REPLICA_MAX = 4


class Segments(Protocol):
    """A prompt's text segments by index (a list, or a lazy view of a request body). A view may
    also offer ``fingerprint(i)`` (any comparable value that changes when segment ``i`` does,
    cheaper than building it); :class:`TextChainer` then uses it for segment 0's history checks
    (the tools offered, in the sidecar: costly to serialise) and its own length-and-ends
    fingerprint of the segment text for the others (it has that text in hand after hashing it)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> str: ...


class ReplicaIndex:
    """One replica's blocks: a tree of block ids with leaf-LRU eviction (module docstring).

    ``stamp`` maps each held block to its LRU stamp (a block is held iff it is a key), ``parent``
    a non-root block to the block before it, ``children`` a block to its number of held children
    (absent: 0); read them, do not write them. Plain int dictionaries (no per-block objects), so
    the garbage collector never walks the index. ``owners`` (shared by every approximate replica
    of one :class:`PrefixIndex` once it tracks more than ``_PER_REPLICA_MAX`` replicas, the only
    case its :meth:`PrefixIndex.lookup` reads it; None otherwise: not kept) maps a block to the bit
    mask of the replicas holding it; this replica keeps its ``bit`` there in step with ``stamp``
    (set on insert, cleared on eviction and :meth:`clear`).
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
        self.owners = owners
        self.bit = bit

    def __len__(self) -> int:
        return len(self.stamp)

    def __contains__(self, block: int) -> bool:
        return block in self.stamp

    def keep_owners(self, owners: dict[int, int]) -> None:
        """Keep this replica's bit in ``owners`` from now on (set for every block it holds now)."""
        bit = self.bit
        get = owners.get
        for b in self.stamp:
            owners[b] = get(b, 0) | bit
        self.owners = owners

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
        (``hint``: :meth:`match`'s, e.g. the match just read for this step). One frame: the
        insertion and the eviction are inline (a step records once; most records evict)."""
        cap = self.capacity
        if n > cap:
            n = cap
        if n <= 0:
            return
        held = self.stamp
        # k = match(chain, n, hint), its first checks inline (the hint right, or the whole chain held)
        if chain[0] not in held:
            k = 0
        elif 0 < hint < n:
            k = hint if chain[hint - 1] in held and chain[hint] not in held else self.match(chain, n, hint)
        elif chain[n - 1] in held:
            k = n
        else:
            k = self.match(chain, n, hint)
        tip = chain[n - 1]
        children = self.children
        heap = self._heap
        if k < n:
            # chain[k] is not held (match's answer stops before a block it lacks): no check
            b = chain[k]
            held[b] = stamp
            if k:
                prev = chain[k - 1]
                self.parent[b] = prev
                children[prev] = children.get(prev, 0) + 1
            if k + 1 < n:
                parent = self.parent
                prev = b
                for b in chain[k + 1 : n]:
                    if b in held:  # an id seen under another parent (not a hash chain): keep the first
                        prev = b
                        continue
                    held[b] = stamp
                    parent[b] = prev
                    children[prev] = children.get(prev, 0) + 1
                    prev = b
                held[tip] = stamp  # the tip may have been held before (not a hash chain)
                if tip not in children:
                    heappush(heap, (stamp, tip))
                owners = self.owners
                if owners is not None:  # a block held before keeps its bit: or-ing it again is a no-op
                    bit = self.bit
                    get = owners.get
                    for b in chain[k:n]:
                        owners[b] = get(b, 0) | bit
            else:  # one new block, the tip: a new leaf
                heappush(heap, (stamp, tip))
                owners = self.owners
                if owners is not None:
                    owners[tip] = owners.get(tip, 0) | self.bit
        else:  # all held: touch the tip
            held[tip] = stamp
            if tip not in children:
                heappush(heap, (stamp, tip))
        count = len(held) - cap
        if count <= 0:
            if len(heap) > 4 * cap + 64:
                self._compact()
            return
        # evict `count` leaves, least recently stamped first
        parent = self.parent
        owners = self.owners
        keep = ~self.bit
        self.evictions += count  # all of them (or the error below)
        while count > 0 and heap:
            t, b = heappop(heap)
            if held.get(b) != t or b in children:
                continue  # stale: evicted, no longer a leaf, or touched since
            while True:  # evict b, then its parent while that is the next leaf the heap would give
                del held[b]
                if owners is not None:
                    m = owners[b] & keep
                    if m:
                        owners[b] = m
                    else:
                        del owners[b]
                count -= 1
                p = parent.pop(b, None)
                if p is None:
                    break
                pt = held[p]
                if t > pt:
                    held[p] = pt = t
                c = children[p]
                if c > 1:
                    children[p] = c - 1
                    break
                del children[p]
                if count > 0 and (not heap or (pt, p) < heap[0]):
                    t, b = pt, p  # what push then pop would give: skip both
                    continue
                heappush(heap, (pt, p))
                break
        if count > 0:  # pragma: no cover - the heap always holds every leaf
            raise RuntimeError("prefix index: no leaf left to evict")

    def _compact(self) -> None:
        """Drop stale heap entries (touched or no longer leaves); keeps the heap O(capacity)."""
        held, children = self.stamp, self.children
        self._heap = [(t, b) for t, b in self._heap if held.get(b) == t and b not in children]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        owners = self.owners
        if owners is not None:
            keep = ~self.bit
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
    every approximate replica at once: :meth:`lookup` reads it instead of each replica's blocks
    once more than ``_PER_REPLICA_MAX`` replicas are tracked. Only then is it kept (built from the
    replicas' blocks when the first replica past that is added, then by each insert and eviction);
    below, reading ``owners`` builds it afresh (O(blocks held))."""

    __slots__ = (
        "block_tokens",
        "replicas",
        "_clock",
        "listener",
        "_owners",
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
        # block -> bit mask of the approximate replicas holding it; None: not kept (few replicas)
        self._owners: dict[int, int] | None = None
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
            if self._owners is None and len(self._names) > _PER_REPLICA_MAX:  # lookup reads it now
                self._owners = {}
                for r in self.replicas.values():
                    if isinstance(r, ReplicaIndex):
                        r.keep_owners(self._owners)
        return ReplicaIndex(capacity_blocks, self._owners, bit)

    @property
    def owners(self) -> dict[int, int]:
        """Block -> bit mask of the approximate replicas holding it (the kept map; a fresh one built
        from the replicas' blocks while it is not kept: do not write it)."""
        if self._owners is not None:
            return self._owners
        out: dict[int, int] = {}
        for r in self.replicas.values():
            if isinstance(r, ReplicaIndex):
                bit = r.bit
                for b in r.stamp:
                    out[b] = out.get(b, 0) | bit
        return out

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
            if r is None:
                continue
            if n <= 0:
                hints[name] = 0
                continue
            h = hints.get(name, 0)
            if type(r) is ReplicaIndex:  # match's first checks, inline
                held = r.stamp
                if chain[0] not in held:
                    hints[name] = 0
                    continue
                if 0 < h < n:
                    if chain[h - 1] in held and chain[h] not in held:
                        continue  # the hint is right
                elif chain[n - 1] in held:  # a hint outside (0, n) (e.g. the run's whole chain
                    hints[name] = n  # before: past this step's lookup cap): all of it
                    continue
            hints[name] = r.match(chain, n, h)
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
        owners = self._owners
        assert owners is not None  # kept whenever this path runs (more than _PER_REPLICA_MAX replicas)
        get = owners.get
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
            if type(r) is ReplicaIndex:
                if 0 < h < n:
                    if chain[h - 1] in held and chain[h] not in held:
                        if guess is not hints:
                            hints[name] = h
                        continue  # the hint is right
                elif chain[n - 1] in held:  # a hint outside (0, n): the whole chain held, or search
                    hints[name] = n
                    continue
            hints[name] = r.match(chain, n, h)
        return hints

    def record(self, replica: str, chain: Sequence[int], n: int | None = None, hint: int = 0) -> None:
        """A step with this chain was sent to ``replica``: it holds ``chain[:n]`` (all by default);
        ``hint``: the chain's match there, if known (:meth:`ReplicaIndex.match`)."""
        r = self.replicas.get(replica)
        if r is None:
            return
        if n is None or n > len(chain):
            n = len(chain)
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


@dataclass(slots=True)
class RunChain:
    """A run's chain so far (:class:`TextChainer`): its block ids and where hashing stopped."""

    chain: list[int] = field(default_factory=list)
    segments: int = 0  # segments hashed
    tail: str = ""  # characters after the last full block
    fingerprint: object = None  # of the last hashed segment (None: none yet)
    first: object = None  # of the first segment
    chars: int = 0  # characters hashed (full blocks + tail)
    data: bytes = b""  # token chains (router.core.prefix_precise.TokenChainer): the hashed tokens
    tokens: object = None  # the sidecar's tokeniser state (router.server.protocols.chat_tokens), opaque here


def _fingerprint(seg: str) -> tuple[int, str, str]:
    return (len(seg), seg[:32], seg[-32:])


class TextChainer:
    """Character-block hash chains of text prompts, incremental per run (module docstring)."""

    __slots__ = ("block_chars",)
    # True for a chainer whose chain is whole blocks of the prompt's real tokens less its last one
    # (router.server.protocols.chat_tokens.ChatTokenChainer): the engine then caps no match at the estimated
    # prompt tokens' ``(prompt - 1) // block``
    exact = False

    def __init__(self, block_chars: int):
        if block_chars < 1:
            raise ValueError(f"block_chars must be >= 1, got {block_chars}")
        self.block_chars = block_chars

    def extend(self, rc: RunChain, segments: Segments) -> list[int]:
        """Bring ``rc`` up to ``segments`` (hashing only new segments when the old ones still lead)
        and return its chain (the list is ``rc.chain``; do not mutate it). Reads ``len(segments)``
        and only the segments it needs by index (the first, the last hashed one, the new ones), so
        a lazy sequence costs O(new text)."""
        k = rc.segments
        n = len(segments)
        fp = getattr(segments, "fingerprint", None)  # the view's own cheap fingerprint, if any
        if k and (
            n < k
            or (fp(0) if fp and k == 1 else _fingerprint(segments[k - 1])) != rc.fingerprint
            or (fp(0) if fp else _fingerprint(segments[0])) != rc.first
        ):
            rc.chain, rc.segments, rc.tail, rc.fingerprint, rc.first, rc.chars = [], 0, "", None, None, 0
            k = 0
        if k == n:
            return rc.chain
        if n == k + 1:  # the usual step: one new segment (no list, no join)
            last = segments[k]
            text = rc.tail + last + SEGMENT_SEP
            first_new = last
        else:
            new = [segments[i] for i in range(k, n)]  # each segment built once
            new.append("")  # the trailing separator
            text = rc.tail + SEGMENT_SEP.join(new)
            last, first_new = new[-2], new[0]
        bc = self.block_chars
        chain = rc.chain
        full = len(text) - len(text) % bc
        if full:
            u = (chain[-1] & _MASK64) if chain else 0  # the previous id, unsigned (the seed)
            append = chain.append
            if text.isascii():  # one encode; byte blocks = character blocks
                data = memoryview(text.encode("ascii"))  # blocks hashed in place, not copied
                for i in range(0, full, bc):
                    u = _xxh64(data[i : i + bc], u)
                    append(u - _TWO64 if u >= _TWO63 else u)
            else:
                for i in range(0, full, bc):
                    u = _xxh64(text[i : i + bc].encode("utf-8", "surrogatepass"), u)
                    append(u - _TWO64 if u >= _TWO63 else u)
        rc.tail = text[full:]
        rc.segments = n
        rc.fingerprint = fp(0) if fp and n == 1 else _fingerprint(last)  # `last` not built again
        if rc.first is None:
            rc.first = fp(0) if fp else _fingerprint(first_new)
        rc.chars = len(chain) * bc + len(rc.tail)
        return chain
