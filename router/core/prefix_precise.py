"""Precise mode of the prefix index: a replica's blocks as its vLLM reports them (KV events).

:class:`router.core.prefix_index.PrefixIndex` holds, per local replica, either an approximate
:class:`~router.core.prefix_index.ReplicaIndex` (what the routers sent where, leaf-LRU at the
replica's capacity) or a :class:`PreciseReplicaIndex` (this module), filled by the replica's own
KV cache events (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, vLLM's
``--kv-events-config``; the subscriber is :mod:`router.server.state.kv_events`). Both answer the same
``match`` and both key blocks by the *router's own* chained block ids, so the engine reads them
alike.

Algorithm:

- **Token chains** (:class:`TokenChainer`): a prompt's token ids cut into full blocks of
  ``block_size`` tokens (vLLM's block size: a partial last block is never cached); block ``i``'s id
  = xxh64(the block's token ids as little-endian uint32, seed = id of block ``i-1``, 0 for the
  first) as a signed int64. vLLM's own block hash (sha256 or its builtin hash of the parent hash,
  the tokens and extra keys, seeded per process by ``PYTHONHASHSEED``) is never reproduced: an
  event carries the token ids of the blocks it stores and the vLLM hash of their parent, so the
  index computes its own id for each stored block and keeps a map vLLM hash -> own id (for
  removals and for the next event's parent). Incremental per run: the token bytes of the full
  blocks hashed so far are kept; a step whose tokens still start with them hashes only the new
  blocks, any other step re-hashes from the start.
- **Applying events** (:meth:`PreciseReplicaIndex.apply_stored` / ``apply_removed`` /
  ``clear``): a store of blocks whose parent the index does not know (its store was missed, or it
  was removed) cannot be keyed and is skipped (counted in ``unkeyed``): the index then
  under-states, never over-states. Blocks stored with extra keys (LoRA, cache salt, multimodal
  inputs) are skipped too: a plain prompt's blocks never hit them. A vLLM hash stored twice (two
  requests computed the same block at once) is held until removed twice (reference counts). Only
  the ``GPU`` medium (or none) counts: offloaded copies are not a prefix-cache hit of the replica.
- **Matching** (:meth:`PreciseReplicaIndex.match`): the leading blocks of the chain held, one
  dictionary lookup per block up to the first miss, like vLLM's own longest-hit search. Presence
  here is *not* prefix-closed (vLLM may free a prefix block before its suffix), so no binary
  search; the hint of the approximate mode is ignored. The caller caps the match at
  ``(prompt_tokens - 1) // block_size`` blocks (vLLM recomputes a prompt's last token).
- **Records** (:meth:`PreciseReplicaIndex.record`): a step sent to the replica changes nothing
  (the events will say what it stored); it is counted, so the subscriber can tell a replica whose
  events stopped while traffic went on (it then falls back to approximate).

Knobs: ``block_size`` (the replica's vLLM ``--block-size``; must equal the index's
``block_tokens``, else the replica stays approximate).

Pure and synchronous, no I/O; the clock is the caller's (``now`` arguments).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from sys import byteorder
from typing import Protocol

from xxhash import xxh64_intdigest as _xxh64

__all__ = [
    "PreciseReplicaIndex",
    "TokenChainer",
    "TokenRunChain",
    "TokenState",
    "token_block_ids",
    "MEDIUM_GPU",
]

MEDIUM_GPU = "GPU"
_MASK64, _TWO63, _TWO64 = (1 << 64) - 1, 1 << 63, 1 << 64
_SWAP = byteorder != "little"


def _u32_bytes(token_ids: Sequence[int]) -> bytes:
    a = array("I", token_ids)
    if _SWAP:  # pragma: no cover - big-endian hosts
        a.byteswap()
    return a.tobytes()


def _chain_bytes(data: bytes, block_size: int, parent: int, out: list[int]) -> int:
    """Append the ids of ``data``'s full blocks (uint32 tokens) to ``out``; returns the last id."""
    step = 4 * block_size
    full = len(data) - len(data) % step
    u = parent & _MASK64
    append = out.append
    last = parent
    for i in range(0, full, step):
        u = _xxh64(data[i : i + step], u)
        last = u - _TWO64 if u >= _TWO63 else u
        append(last)
    return last


def token_block_ids(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """The router's ids of the full ``block_size``-token blocks of ``token_ids``, chained after the
    block whose id is ``parent`` (0: the prompt's start)."""
    out: list[int] = []
    _chain_bytes(_u32_bytes(token_ids), block_size, parent, out)
    return out


@dataclass(slots=True)
class TokenRunChain:
    """A run's token chain so far (:class:`TokenChainer`): its block ids and the bytes they hash."""

    chain: list[int] = field(default_factory=list)
    data: bytes = b""  # the full blocks' token ids, uint32 little-endian


class TokenState(Protocol):
    """What :meth:`TokenChainer.extend` keeps per run (:class:`TokenRunChain`, or the engine's
    :class:`router.core.prefix_index.RunChain`)."""

    chain: list[int]
    data: bytes


class TokenChainer:
    """Token-block hash chains of tokenised prompts, incremental per run (module docstring)."""

    __slots__ = ("block_size",)

    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size

    def extend(self, rc: TokenState, token_ids: Sequence[int]) -> list[int]:
        """Bring ``rc`` up to ``token_ids`` and return its chain (``rc.chain``; do not mutate it)."""
        data = _u32_bytes(token_ids)
        k = len(rc.data)
        if k and (len(data) < k or data[:k] != rc.data):
            rc.chain, rc.data, k = [], b"", 0
        step = 4 * self.block_size
        full = len(data) - len(data) % step
        if full > k:
            _chain_bytes(data[k:full], self.block_size, rc.chain[-1] if rc.chain else 0, rc.chain)
            rc.data = data[:full]
        return rc.chain


class PreciseReplicaIndex:
    """One replica's blocks from its KV events (module docstring).

    ``stamp`` maps each held block (the router's id) to its reference count (a block is held iff
    it is a key: the same test as :class:`~router.core.prefix_index.ReplicaIndex`'s, which the
    engine inlines); ``by_hash`` maps vLLM's block hash to the router's id. Read them, do not
    write them.
    """

    __slots__ = (
        "block_size",
        "capacity",
        "stamp",
        "by_hash",
        "events",
        "unkeyed",
        "last_event",
        "records",
    )

    precise = True

    def __init__(self, block_size: int, capacity_blocks: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.capacity = capacity_blocks  # informational (/ready): vLLM evicts on its own
        self.stamp: dict[int, int] = {}
        self.by_hash: dict[Hashable, int] = {}
        self.events = 0  # events applied
        self.unkeyed = 0  # stored blocks skipped: parent unknown, extra keys, or a size mismatch
        self.last_event = 0.0  # the caller's clock at the latest event (0: none yet)
        self.records = 0  # steps sent here (PrefixIndex.record)

    def __len__(self) -> int:
        return len(self.stamp)

    def __contains__(self, block: int) -> bool:
        return block in self.stamp

    def match(self, chain: Sequence[int], n: int, hint: int = 0) -> int:
        """Leading blocks of ``chain[:n]`` held (linear up to the first miss; ``hint`` unused)."""
        held = self.stamp
        i = 0
        while i < n and chain[i] in held:
            i += 1
        return i

    def record(self, chain: Sequence[int], n: int, stamp: int, hint: int = 0) -> None:
        """A step was sent here: nothing is assumed held (the events say); counts it."""
        self.records += 1

    def apply_stored(
        self,
        block_hashes: Sequence[Hashable],
        parent_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
        medium: str | None = None,
        extra_keys: Sequence[object] | None = None,
        lora: object = None,
        now: float = 0.0,
    ) -> int:
        """``BlockStored``: key each stored block by the router's id; returns the blocks keyed."""
        self.events += 1
        if now:
            self.last_event = now
        nb = len(block_hashes)
        if medium not in (None, MEDIUM_GPU):
            return 0
        if block_size != self.block_size or lora is not None or len(token_ids) < nb * block_size:
            self.unkeyed += nb
            return 0
        if parent_hash is None:
            parent = 0
        else:
            p = self.by_hash.get(parent_hash)
            if p is None:
                self.unkeyed += nb
                return 0
            parent = p
        ids = token_block_ids(token_ids[: nb * block_size], block_size, parent)
        held, by_hash = self.stamp, self.by_hash
        keyed = 0
        for j, (h, b) in enumerate(zip(block_hashes, ids, strict=True)):
            if extra_keys is not None and j < len(extra_keys) and extra_keys[j] is not None:
                self.unkeyed += nb - j  # the rest chain after a block no plain prompt hits
                break
            by_hash[h] = b
            held[b] = held.get(b, 0) + 1
            keyed += 1
        return keyed

    def apply_removed(
        self, block_hashes: Sequence[Hashable], medium: str | None = None, now: float = 0.0
    ) -> int:
        """``BlockRemoved``: drop the blocks (one reference each); returns the blocks dropped."""
        self.events += 1
        if now:
            self.last_event = now
        if medium not in (None, MEDIUM_GPU):
            return 0
        held, by_hash = self.stamp, self.by_hash
        dropped = 0
        for h in block_hashes:
            b = by_hash.get(h)
            if b is None:
                continue
            c = held.get(b, 0) - 1
            if c > 0:
                held[b] = c
            else:
                held.pop(b, None)
                del by_hash[h]
            dropped += 1
        return dropped

    def clear(self, now: float = 0.0) -> None:
        """``AllBlocksCleared``, a restart or a resync: nothing held."""
        if now:
            self.last_event = now
        self.stamp.clear()
        self.by_hash.clear()
