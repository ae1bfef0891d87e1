"""Background run-log writer of the sidecar: append-only JSONL, fsynced, rolled into Parquet.

Algorithm:

- The request path calls :meth:`RunLogWriter.submit` with a plain dict (one ``step`` or ``run``
  record of :mod:`features.schema`). ``submit`` never blocks and never drops: it appends to a
  bounded in-memory queue (a ``deque``: an atomic append, no lock, no thread wake-up); when the
  queue holds ``queue_max`` records the record goes to an *overflow list* instead and
  ``overflowed`` is counted (the ``runroute_runlog_overflow_total`` metric). The writer drains the
  queue and then the overflow list, so records that overflowed may be written after newer queued
  ones (each carries its ``run_id``/``step``; readers sort). Memory is the only bound on the
  overflow list; a full queue means the disk is slower than the traffic and is an alert
  condition, not silent loss.
- One writer thread wakes every ``flush_s / 2`` seconds, serialises the queued records with orjson
  (``schema_version`` added, ``prompt_text`` removed unless ``log_prompts``) and appends them to
  ``runlog-<pid>-<start>-<n>.jsonl`` (one file per process: the pid is in the name, so several
  router processes never share a file), then flushes and ``fsync``s (at least every ``flush_s``
  <= 1 s whenever something was written). A SIGKILL therefore loses at most the records of the
  last ``flush_s`` seconds. Records are validated against the schema when the file is rolled
  (``features.runlog.read_records``: bad rows go to ``<file>.rejected.jsonl`` with their reason,
  never dropped), not one by one on the way in, which keeps the writer's CPU per step small.
- When the file passes ``rotate_bytes`` and at :meth:`close`, the JSONL file is rolled into a
  Parquet file of the same stem (via :mod:`features.runlog`, atomic write) and the JSONL removed. A
  JSONL left behind by a crash stays readable by ``read_runlog`` (which accepts JSONL) and is
  rolled by the next writer started on the same directory (:meth:`roll_leftovers`).

Durability (``durability``):

- ``batched`` (the default, above): ``submit`` returns None at once; a SIGKILL loses at most the
  records submitted in the last ``flush_s`` seconds (the thread writes every ``flush_s / 2`` and
  fsyncs right after writing).
- ``ack``: ``submit`` (called on the event loop) also returns an ``asyncio.Future`` that resolves
  once the record is fsynced; the sidecar completes a step's response only after it, so an
  acknowledged step is never lost. Group commit: ``submit`` wakes the writer thread, which drains
  every queued record, writes them, fsyncs once and resolves all their futures in one
  ``call_soon_threadsafe``; records arriving during an fsync go in the next group, so one fsync
  covers many steps under load. The queue is not bounded in this mode (each waiting response
  bounds it); a write or fsync error fails the futures (the response still goes out, logged).

Knobs: ``directory``, ``durability``, ``flush_s``, ``queue_max``, ``rotate_bytes``, ``log_prompts``,
``parquet``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from features.schema import SCHEMA_VERSION

__all__ = ["RunLogWriter"]

log = logging.getLogger("runroute.runlog")


class RunLogWriter:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        flush_s: float = 0.5,
        queue_max: int = 10000,
        rotate_bytes: int = 64 * 1024 * 1024,
        log_prompts: bool = False,
        parquet: bool = True,
        durability: str = "batched",
    ):
        if not 0 < flush_s <= 1.0:
            raise ValueError("flush_s must be in (0, 1]")
        if durability not in ("batched", "ack"):
            raise ValueError("durability must be 'batched' or 'ack'")
        self.durability = durability
        self._ack = durability == "ack"
        self._wake = threading.Event()
        self._seq = 0  # records submitted to _q (event-loop thread)
        self._drained = 0  # records taken from _q (writer thread)
        self._acks: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.syncs = 0
        self._last_acked = 0
        self.dir = Path(directory)
        self.flush_s = flush_s
        self.rotate_bytes = rotate_bytes
        self.log_prompts = log_prompts
        self.parquet = parquet
        self.queue_max = queue_max
        self._q: deque[dict[str, Any]] = deque()
        self._overflow: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.overflowed = 0
        self.written = 0
        self.rejected = 0
        self.rolled: list[Path] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stamp = time.strftime("%Y%m%dT%H%M%S")
        self._n = 0
        self._fh: Any = None
        self.path: Path | None = None

    # ------------------------------------------------------------------ request path
    def submit(self, record: dict[str, object]) -> asyncio.Future[None] | None:
        """Hand one record to the writer; never blocks, never drops (see module doc). With
        ``durability: ack`` returns a future that resolves when the record is fsynced."""
        if self._ack:
            loop = self._loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._seq += 1
            self._acks.append((self._seq, fut))
            self._q.append(record)
            self._wake.set()
            return fut
        if len(self._q) < self.queue_max:
            self._q.append(record)
        else:
            with self._lock:
                self._overflow.append(record)
                self.overflowed += 1
        return None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RunLogWriter:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._open_new()
        self._thread = threading.Thread(target=self._run, name="runroute-runlog", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Drain everything, fsync, roll the file into Parquet."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._drain()
        self._sync()
        self._acked(None)
        self._roll()

    def roll_leftovers(self) -> list[Path]:
        """Roll JSONL files left by crashed writers (other pids) in this directory into Parquet."""
        out = []
        for p in sorted(self.dir.glob("runlog-*.jsonl")):
            if p == self.path or p.name.endswith(".rejected.jsonl") or _pid_alive(p):
                continue
            q = self._to_parquet(p)
            if q is not None:
                out.append(q)
        return out

    # ------------------------------------------------------------------ writer thread
    def _open_new(self) -> None:
        self._n += 1
        self.path = self.dir / f"runlog-{os.getpid()}-{self._stamp}-{self._n:04d}.jsonl"
        self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
        self._dirty = False

    def _run(self) -> None:
        if self._ack:
            while not self._stop.is_set():
                self._wake.wait(self.flush_s / 2)
                self._wake.clear()
                self._group()
            return
        while not self._stop.wait(self.flush_s / 2):
            self._drain()
            if self._dirty:
                self._sync()

    def _group(self) -> None:
        """One group commit: drain, write, fsync once, resolve every record's future."""
        err: BaseException | None = None
        try:
            self._drain()
            self._sync()
        except Exception as e:  # noqa: BLE001 - a disk error fails the waiters, the thread goes on
            log.error("run log: write/fsync failed: %s", e)
            err = e
        self._acked(err)

    def _acked(self, err: BaseException | None) -> None:
        """Resolve (on the event loop) the futures of every record drained so far."""
        loop, upto = self._loop, self._drained
        if loop is None or loop.is_closed() or (upto == self._last_acked and err is None):
            return
        self._last_acked = upto
        try:
            loop.call_soon_threadsafe(self._resolve, upto, err)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    def _resolve(self, upto: int, err: BaseException | None) -> None:
        acks = self._acks
        while acks and acks[0][0] <= upto:
            _, fut = acks.popleft()
            if not fut.done():
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(OSError(f"run log not durable: {err}"))

    def _drain(self) -> None:
        q = self._q
        while q:
            rec = q.popleft()
            self._write(rec)
            self._drained += 1
        if self._overflow:
            with self._lock:
                spill, self._overflow = self._overflow, []
            for rec in spill:
                self._write(rec)

    def _write(self, rec: dict[str, object]) -> None:
        if not self.log_prompts:
            rec.pop("prompt_text", None)
        rec.setdefault("schema_version", SCHEMA_VERSION)
        try:
            line = orjson.dumps(rec) + b"\n"
        except TypeError as e:  # not JSON-serialisable: quarantined, not dropped
            self.rejected += 1
            assert self.path is not None
            with open(self.path.with_name(self.path.stem + ".rejected.jsonl"), "ab") as fh:
                fh.write(orjson.dumps({"reason": str(e), "raw": repr(rec)}) + b"\n")
            return
        self._fh.write(line)
        self._dirty = True
        self.written += 1
        if self._fh.tell() >= self.rotate_bytes and not self._stop.is_set():
            self._sync()
            self._roll()
            self._open_new()

    def _sync(self) -> None:
        if self._fh is None:
            return
        if self._dirty:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._dirty = False
            self.syncs += 1

    def _roll(self) -> None:
        if self._fh is None or self.path is None:
            return
        self._fh.close()
        self._fh = None
        if self.parquet:
            q = self._to_parquet(self.path)
            if q is not None:
                self.rolled.append(q)

    def _to_parquet(self, p: Path) -> Path | None:
        if p.stat().st_size == 0:
            p.unlink()
            return None
        try:
            from features.runlog import read_records, write_frame

            res = read_records(p, strict=False, quarantine=True)
            q = write_frame(res.frame, p.with_suffix(".parquet"))
        except Exception as e:  # noqa: BLE001 - keep the JSONL: it is still the record
            log.error("run log: could not roll %s into Parquet (%s); JSONL kept", p, e)
            return None
        p.unlink()
        return q


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_alive(p: Path) -> bool:
    """Whether the writer that named log file ``p`` (``...-<pid>-...``) is another live process."""
    try:
        pid = int(p.name.split("-")[1])
    except (IndexError, ValueError):
        return False
    return pid != os.getpid() and pid_alive(pid)
