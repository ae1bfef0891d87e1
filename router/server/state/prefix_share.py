"""One prefix index across router replicas: every router's placements published through Redis.

Algorithm (only with ``store.kind: redis`` and the prefix index on):

- **Publish.** The engine's :class:`~router.core.prefix_index.PrefixIndex` tells its ``listener``
  of every step it records (replica, block chain); the listener packs the chain (int64s) and
  appends it to an in-memory batch (O(chain) in C, no I/O on the request path). Every ``flush_s``
  a background task writes the batch to one Redis stream (``XADD key MAXLEN ~ maxlen``, one
  pipeline) with this router's id. A full batch (``max_pending``) drops its oldest entries
  (counted in ``dropped``): sharing is best effort, placement never waits for it.
- **Apply.** Another background task reads the stream (``XREAD BLOCK``), from its start at
  start-up (so a new or restarted router learns the recent placements, up to ``maxlen``), and
  applies every other router's record to its own index (:meth:`PrefixIndex.apply`: the same LRU
  update a local record makes). So each router's index holds what all routers sent where, a
  moment late.
- **Outages.** A Redis error is counted (``errors``) and retried after ``retry_s``; the local
  index keeps serving.

The stream lives under its own key (``key``, default ``<store.key_prefix>prefix-index:events``),
apart from the run-state keys. Knobs (constructor): ``key``, ``maxlen``, ``flush_s``,
``block_ms``, ``max_pending``, ``retry_s``, ``router_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from array import array
from collections.abc import Sequence
from typing import Any

from router.core.prefix_index import PrefixIndex

__all__ = ["PrefixShare"]


class PrefixShare:
    """Publishes this router's prefix-index records to Redis and applies the others' (module doc)."""

    def __init__(
        self,
        index: PrefixIndex,
        url: str,
        *,
        key: str = "runroute:prefix-index:events",
        maxlen: int = 100_000,
        flush_s: float = 0.02,
        block_ms: int = 200,
        max_pending: int = 10_000,
        retry_s: float = 1.0,
        router_id: str | None = None,
    ):
        import redis.asyncio as aioredis

        self.index = index
        self.key = key
        self.maxlen = maxlen
        self.flush_s = flush_s
        self.block_ms = block_ms
        self.max_pending = max_pending
        self.retry_s = retry_s
        self.router_id = router_id or uuid.uuid4().hex[:12]
        self._r: Any = aioredis.Redis.from_url(url, socket_timeout=max(1.0, block_ms / 1000 + 1.0))
        self._pending: list[tuple[str, bytes]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.published = 0
        self.applied = 0
        self.dropped = 0
        self.errors = 0
        index.listener = self._local

    def _local(self, replica: str, chain: Sequence[int], n: int) -> None:
        pend = self._pending
        pend.append((replica, array("q", chain[:n]).tobytes()))
        if len(pend) > self.max_pending:
            drop = len(pend) - self.max_pending
            del pend[:drop]
            self.dropped += drop

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._flush_loop()), asyncio.create_task(self._read_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        with contextlib.suppress(Exception):
            await self._flush()
        with contextlib.suppress(Exception):
            await self._r.aclose()

    async def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        pipe = self._r.pipeline(transaction=False)
        for replica, packed in batch:
            pipe.xadd(
                self.key,
                {"r": self.router_id, "p": replica, "c": packed},
                maxlen=self.maxlen,
                approximate=True,
            )
        await pipe.execute()
        self.published += len(batch)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            try:
                await self._flush()
            except Exception:  # noqa: BLE001 - best effort: count, keep serving, retry later
                self.errors += 1
                await asyncio.sleep(self.retry_s)

    async def _read_loop(self) -> None:
        last = "0-0"  # from the stream's start: learn the recent placements of every router
        me = self.router_id.encode()
        while True:
            try:
                reply = await self._r.xread({self.key: last}, count=1000, block=self.block_ms)
            except Exception:  # noqa: BLE001 - best effort: count, keep serving, retry later
                self.errors += 1
                await asyncio.sleep(self.retry_s)
                continue
            for _key, entries in reply or ():
                for eid, fields in entries:
                    last = eid
                    if fields.get(b"r") == me:
                        continue
                    chain = array("q")
                    chain.frombytes(fields.get(b"c", b""))
                    self.index.apply(fields.get(b"p", b"").decode(), chain)
                    self.applied += 1
