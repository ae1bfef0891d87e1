"""vLLM KV events -> the prefix index's precise mode (:mod:`router.core.prefix_precise`).

Each local replica that has a ``kv_events_endpoint`` (vLLM started with ``--enable-prefix-caching``
and ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
"tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'``) gets a ZMQ SUB socket
here, read by an asyncio task on the sidecar's event loop (off the request path; the index is
only touched on that loop, so no lock).

Wire format (vLLM's ``ZmqEventPublisher``): multipart ``[topic, seq, payload]``; ``seq`` an 8-byte
big-endian counter from 0 per publisher process; ``payload`` a msgpack ``KVEventBatch(ts, events,
data_parallel_rank)``, each event a tagged struct ``BlockStored(block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...)``,
``BlockRemoved(block_hashes, medium, group_idx)`` or ``AllBlocksCleared()``. msgspec encodes a
struct as an array (``array_like``: the tag first, then the fields in order, trailing defaults
omitted) or as a map (``type`` = the tag); both are read. A block hash is bytes or an int.

Sequence handling per replica (:class:`KvEventFeed`):

- the first batch puts the replica in precise mode (an empty index); when its ``seq`` is not 0 and
  a replay endpoint is set, the publisher's buffer is replayed from 0 first (blocks stored before
  the router started); otherwise those blocks stay unknown (the index under-states);
- ``seq`` = expected: applied; ``seq`` > expected (a **gap**: batches dropped at the high-water
  mark, a reconnect): the missing batches are asked of the replay socket (a DEALER: ``[b"",
  start seq]``; the answer ``[b"", topic, seq, payload]`` ..., then seq -1; vLLM before 0.32
  left the topic out) and applied in order; when the
  replay cannot cover the gap (no replay endpoint, no answer within ``replay_timeout_s``, or its
  buffer no longer reaches back) the replica's index is **cleared** (resync: it then under-states
  until the blocks are stored again) and counted;
- ``seq`` < expected: the publisher restarted (a replica restart empties its cache): cleared;
- ``AllBlocksCleared`` (vLLM's ``/reset_prefix_cache``): cleared;
- **fallback**: a precise replica that was sent steps but published nothing for ``silence_s``
  goes back to approximate mode (events lost or turned off; reason ``silent``) until its next
  batch; a replica without an endpoint is approximate for good (reason ``no kv_events_endpoint``),
  one with an endpoint that never published is approximate (reason ``no events yet``).

Only data-parallel rank 0's or unranked batches are expected on one endpoint (vLLM offsets the
port per rank); the ``group_idx`` of hybrid models is ignored except 0 / none.

Knobs: :class:`KvEventsConfig` (per replica endpoint, replay endpoint, topic; ``silence_s``,
``replay_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from router.core.prefix_index import PrefixIndex
from router.core.prefix_precise import PreciseReplicaIndex

__all__ = ["KvEventFeed", "KvEventsConfig", "KvEventSubscriber", "decode_batch", "ReplicaEvents"]

log = logging.getLogger(__name__)
END_SEQ = -1


@dataclass(frozen=True)
class ReplicaEvents:
    """Where one replica publishes: its PUB endpoint (``tcp://host:5557``), replay endpoint (a
    ROUTER, optional) and topic (vLLM's ``topic``, "" = all)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass
class KvEventsConfig:
    replicas: dict[str, ReplicaEvents] = field(default_factory=dict)
    silence_s: float = 30.0
    replay_timeout_s: float = 2.0


# ------------------------------------------------------------------ decoding
def _fields(ev: Any, names: tuple[str, ...]) -> tuple[str, list[Any]]:
    """(tag, field values in ``names`` order, missing trailing ones None) of an array- or map-encoded event."""
    if isinstance(ev, dict):
        tag = ev.get("type", "")
        return str(tag), [ev.get(n) for n in names]
    if isinstance(ev, (list, tuple)) and ev:
        vals = list(ev[1 : 1 + len(names)])
        vals += [None] * (len(names) - len(vals))
        return str(ev[0]), vals
    return "", [None] * len(names)


_STORED = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED = ("block_hashes", "medium", "group_idx")


def _key(h: Any) -> Hashable:
    return (
        bytes(h)
        if isinstance(h, (bytes, bytearray, memoryview))
        else h
        if not isinstance(h, list)
        else tuple(h)
    )


def decode_batch(payload: bytes) -> tuple[float, list[tuple[str, list[Any]]], int | None]:
    """(ts, [(tag, fields)], data_parallel_rank) of a msgpack ``KVEventBatch``; a ``BlockStored``'s
    fields in :data:`_STORED` order, a ``BlockRemoved``'s in :data:`_REMOVED` order."""
    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if isinstance(obj, dict):
        ts, events, rank = obj.get("ts", 0.0), obj.get("events") or [], obj.get("data_parallel_rank")
    else:
        ts, events = obj[0], obj[1] or []
        rank = obj[2] if len(obj) > 2 else None
    out: list[tuple[str, list[Any]]] = []
    for ev in events:
        tag = ev.get("type", "") if isinstance(ev, dict) else (ev[0] if ev else "")
        names = _STORED if tag == "BlockStored" else _REMOVED if tag == "BlockRemoved" else ()
        out.append(_fields(ev, names))
    return float(ts or 0.0), out, rank


# ------------------------------------------------------------------ one replica's sequence
class KvEventFeed:
    """One replica's event stream applied to the index (module docstring); socket-free, so the
    sequence rules are tested without ZMQ. ``replay(start)`` (optional): the batches ``[(seq,
    payload)]`` the publisher still buffers from ``start`` on, None when it did not answer."""

    def __init__(
        self,
        index: PrefixIndex,
        replica: str,
        replay: Callable[[int], list[tuple[int, bytes]] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.index, self.replica, self.replay, self.clock = index, replica, replay, clock
        self.expected: int | None = None  # the next seq; None before the first batch
        self.batches = 0
        self.gaps = 0  # gaps seen
        self.replayed = 0  # batches recovered from the replay socket
        self.resyncs = 0  # clears for lost batches or a publisher restart
        self.fallbacks = 0  # precise -> approximate for silence
        self.errors = 0  # undecodable payloads
        self.reason = "no events yet"
        self._records_seen = 0
        self._silent_since: float | None = None

    @property
    def mode(self) -> str:
        return (
            "precise"
            if isinstance(self.index.replicas.get(self.replica), PreciseReplicaIndex)
            else "approximate"
        )

    def _precise(self) -> PreciseReplicaIndex:
        r = self.index.replicas.get(self.replica)
        if not isinstance(r, PreciseReplicaIndex):
            r = self.index.set_precise(self.replica)
            self._records_seen, self._silent_since = r.records, None
            self.reason = "kv events"
        return r

    def on_message(self, seq: int, payload: bytes) -> str:
        """Apply one published batch; returns what happened (``applied``, ``replayed``, ``resync``,
        ``restart``, ``error``)."""
        first = self.expected is None
        r = self._precise()
        what = "applied"
        if first:
            if seq > 0 and self.replay is not None:
                what = self._catch_up(r, 0, seq, clear=False)
        elif seq > self.expected:  # type: ignore[operator]
            self.gaps += 1
            what = self._catch_up(r, self.expected, seq, clear=True)  # type: ignore[arg-type]
        elif seq < self.expected:  # type: ignore[operator]
            self.resyncs += 1
            r.clear(self.clock())
            what = "restart"
        if not self._apply(r, payload):
            what = "error"
        self.expected = seq + 1
        return what

    def _catch_up(self, r: PreciseReplicaIndex, start: int, seq: int, clear: bool) -> str:
        got = self.replay(start) if self.replay is not None else None
        if got is not None:
            want = [(s, p) for s, p in got if start <= s < seq]
            contiguous = all(s == want[0][0] + i for i, (s, _) in enumerate(want)) and (
                not want or want[-1][0] == seq - 1
            )
            # a gap needs all of it; the first batch takes the buffer's contiguous tail (its start
            # may be gone: those blocks stay unknown, their children unkeyed)
            if contiguous and want and (want[0][0] == start or not clear):
                for _, p in want:
                    self._apply(r, p)
                self.replayed += len(want)
                return "replayed"
        if clear:
            self.resyncs += 1
            r.clear(self.clock())
            return "resync"
        return "applied"  # the first batch without its history: start from here

    def _apply(self, r: PreciseReplicaIndex, payload: bytes) -> bool:
        try:
            _, events, _rank = decode_batch(payload)
        except Exception:  # noqa: BLE001 - a bad payload is counted, the stream goes on
            self.errors += 1
            return False
        now = self.clock()
        self.batches += 1
        for tag, f in events:
            if tag == "BlockStored":
                hashes, parent, tokens, bs, lora_id, medium, lora_name, extra, group = f
                if group not in (None, 0):
                    continue
                r.apply_stored(
                    [_key(h) for h in hashes or ()],
                    None if parent is None else _key(parent),
                    tokens or (),
                    int(bs or 0),
                    medium,
                    extra,
                    lora_name if lora_name is not None else lora_id,
                    now,
                )
            elif tag == "BlockRemoved":
                hashes, medium, group = f
                if group not in (None, 0):
                    continue
                r.apply_removed([_key(h) for h in hashes or ()], medium, now)
            elif tag == "AllBlocksCleared":
                r.clear(now)
        self._records_seen, self._silent_since = r.records, None
        return True

    def check(self, silence_s: float) -> None:
        """The watchdog: a precise replica sent steps without publishing for ``silence_s`` goes
        back to approximate mode."""
        r = self.index.replicas.get(self.replica)
        if not isinstance(r, PreciseReplicaIndex):
            return
        now = self.clock()
        if r.records == self._records_seen:
            return
        if self._silent_since is None:
            self._silent_since = now
        elif now - self._silent_since >= silence_s:
            self.index.set_approximate(self.replica)
            self.fallbacks += 1
            self.reason = "silent"
            self.expected = None  # the next batch starts afresh (and replays what it can)
            self._silent_since = None

    def state(self) -> dict[str, Any]:
        r = self.index.replicas.get(self.replica)
        return {
            "mode": self.mode,
            "reason": self.reason,
            "batches": self.batches,
            "gaps": self.gaps,
            "replayed": self.replayed,
            "resyncs": self.resyncs,
            "fallbacks": self.fallbacks,
            "errors": self.errors,
            "unkeyed_blocks": r.unkeyed if isinstance(r, PreciseReplicaIndex) else None,
        }


# ------------------------------------------------------------------ sockets
class KvEventSubscriber:
    """A ZMQ SUB per configured replica, each read by an asyncio task (:meth:`start` /
    :meth:`stop` on the sidecar's loop); :meth:`state` for ``/ready``, :meth:`modes` for the metric."""

    def __init__(
        self,
        index: PrefixIndex,
        config: KvEventsConfig,
        clock: Callable[[], float] = time.monotonic,
        on_mode: Callable[[str, str], None] | None = None,
    ):
        self.index, self.config, self.clock = index, config, clock
        self.on_mode = on_mode  # told (replica, mode) at start and at every change (the metric)
        self._modes: dict[str, str] = {}
        self.feeds: dict[str, KvEventFeed] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._ctx: Any = None

    def start(self) -> None:
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        for name, ev in self.config.replicas.items():
            if name not in self.index.replicas:
                continue
            feed = self.feeds[name] = KvEventFeed(self.index, name, clock=self.clock)
            self._tasks.append(asyncio.get_running_loop().create_task(self._run(feed, ev)))
        self._tell()

    def _tell(self) -> None:
        if self.on_mode is None:
            return
        for n, m in self.index.modes().items():
            if self._modes.get(n) != m:
                self._modes[n] = m
                self.on_mode(n, m)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def state(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for n, mode in self.index.modes().items():
            feed = self.feeds.get(n)
            out[n] = feed.state() if feed is not None else {"mode": mode, "reason": "no kv_events_endpoint"}
        return out

    async def _replay(self, ev: ReplicaEvents, start: int) -> list[tuple[int, bytes]] | None:
        import zmq

        assert ev.replay_endpoint is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(ev.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            out: list[tuple[int, bytes]] = []
            deadline = self.clock() + self.config.replay_timeout_s
            while True:
                left = deadline - self.clock()
                if left <= 0 or not await sock.poll(int(left * 1000)):
                    return None
                frames = await sock.recv_multipart()
                if len(frames) not in (3, 4):
                    continue
                # vLLM 0.32: [b"", topic, seq, payload] (end: seq -1); older: [b"", seq, payload]
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    return out
                out.append((seq, frames[-1]))
        finally:
            sock.close(linger=0)

    async def _run(self, feed: KvEventFeed, ev: ReplicaEvents) -> None:
        import zmq

        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, ev.topic.encode())
        sock.connect(ev.endpoint)
        tick_ms = int(max(0.05, min(1.0, self.config.silence_s / 4)) * 1000)
        try:
            while True:
                if await sock.poll(tick_ms):
                    frames = await sock.recv_multipart()
                    if len(frames) != 3:
                        feed.errors += 1
                        continue
                    seq = int.from_bytes(frames[1], "big")
                    need_replay = ev.replay_endpoint is not None and (
                        (feed.expected is None and seq > 0)
                        or (feed.expected is not None and seq > feed.expected)
                    )
                    if need_replay:  # fetched here (async), handed to the synchronous feed
                        got = await self._replay(ev, 0 if feed.expected is None else feed.expected)
                        feed.replay = lambda _start, got=got: got  # type: ignore[misc]
                    feed.on_message(seq, frames[2])
                    feed.replay = None
                feed.check(self.config.silence_s)
                self._tell()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the replica falls back; the sidecar keeps serving
            log.exception("kv events of %s: subscriber stopped", feed.replica)
            self.index.set_approximate(feed.replica)
            feed.reason = "subscriber error"
            self._tell()
        finally:
            sock.close(linger=0)


def parse_replicas(
    names: Sequence[str], endpoints: Sequence[str | None], replay: Sequence[str | None], topic: str = ""
) -> dict[str, ReplicaEvents]:
    """Settings' per-replica lists -> :class:`ReplicaEvents` (a replica with no endpoint is left out)."""
    out: dict[str, ReplicaEvents] = {}
    for i, n in enumerate(names):
        e = endpoints[i] if i < len(endpoints) else None
        if e:
            out[n] = ReplicaEvents(e, replay[i] if i < len(replay) and replay[i] else None, topic)
    return out
