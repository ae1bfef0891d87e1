"""A run's context in the sidecar: its domain and its task embedding (contract C2), set once per run.

Domain (:func:`resolve_domain`, at a run's first step on this router), the first that applies:

1. the ``x-runroute-domain`` request header (the client says it; the deployment's most reliable
   source);
2. ``context.tenant_domains[tenant]``: the request's tenant (the ``admission`` tenant: header
   ``x-runroute-tenant``, else the request's user) mapped in settings;
3. ``metadata.domain`` in the request body (OpenAI ``metadata``; Anthropic ``metadata``);
4. ``context.agent_domains[agent]``: the ``x-runroute-agent`` header (an agent name) mapped in
   settings, else the agent name itself;
5. ``sys-<8 hex>``: a short hash (SHA-256) of the run's system prompt when it has one: runs of one
   agent share a system prompt, so they share a domain even when nobody configured it;
6. None (the predictor's global prior serves the run).

A value is cleaned to at most 64 characters of ``[A-Za-z0-9._:/-]`` (others become ``_``), so it
is safe in logs, metrics labels and the run log.

Task embedding (:class:`TaskEmbedder`): at a run's first step the text of its first user message
(the protocol adapter's ``opening``: chat, Responses and Messages alike) is embedded with
``features.embed.embed_texts`` off the event loop: in one spawned worker process
(``embed_executor: process``, the default: the model loaded there once, the text over a pipe, 384
floats back; the GIL is never shared) or on one background thread (``thread``: numpy releases the
GIL in the model's matrix products, but the thread holds it between them, ~150 Python-level steps
per pass; under the realistic bench's load, with the sidecar pinned to one core, that thread was 29%
of the sidecar's CPU and shared the GIL with the event loop; issue 26). An injected ``embed_fn``
always runs on a thread. The worker process runs under Linux's ``SCHED_IDLE`` policy
(``context.embed_sched: idle``, the default; it gets the CPU only when nothing else of normal
priority wants it, so on a saturated core every step is served before any embedding) or, where
that is refused and with ``embed_sched: nice``, at ``context.embed_nice`` more niceness. Its CPU is
the sidecar's (a child process: the benches' CPU per request counts the process tree); one per
process, shared by the apps it builds; it loads the model at the normal priority first, and exits with the sidecar however that ends
(it checks its parent's pid every second).

Embeddings are cached by a hash (BLAKE2b, 16 bytes) of the embedded text (``context.embed_cache``
vectors, least recently used first out; 384 float32 each, 1.5 KB): runs of one agent often open
with the same task text (a retried task, a benchmark's repeated tasks), and a text already queued is
not queued twice (the runs share its future). A cached vector is ready at the run's first step. The first step waits at most ``context.embed_wait_ms`` (default 15 ms: its added
latency stays under issue 14's 20 ms per-run budget, measured +17 ms p50; the vector is ready in
time for some first steps on this shared machine, for most with 40 ms) for the vector, so a fast embedding already informs the first decision, and only
where the vector can change the step's predictions (:func:`embedding_informs`: not for a predictor
that does not read the run context, nor for a run whose domain the bundle's benefit model does not
serve on the embedding; issue 26); otherwise it goes on without,
and a later step of the run takes the vector once the worker has it (one ``done()`` check per
step, nothing else). Such a log-only text is not sent at once but waits for a batch
(``context.embed_batch`` texts, default 8, in one forward pass; sent when the batch is full or
``context.embed_defer_ms``, default 2 s, after its first text; :meth:`TaskEmbedder.start`): one
MiniLM pass over a short task text costs ~14 ms of CPU alone and ~6 ms per text in a batch of 8
(the matrix products run at a better rate on 8x the rows), plus ~2 ms of pipe and pickling per
pass, so on a sidecar where no served domain reads the vector the embedding's CPU per request
falls by about half for short task texts (``bench/overhead.py --realistic``: 0.22-0.34 ->
0.08-0.15 ms) and by about a fifth for tau2-bench's longer ones (``bench/embed_cost.py``; issue 26). A run that ends before its vector sends its batch at
once and gets the vector in a second ``run`` record (:meth:`router.server.runs.lifecycle.RunLifecycle.end`;
readers merge a run's records); shutdown drops the texts still waiting (live runs, which write no
record at shutdown) and waits for the embeddings already sent (:meth:`TaskEmbedder.drain`). The text is never stored or logged; the vector goes to
``RunPrefix.task_embedding`` and to the run log's ``Run.task_embedding`` when the run ends. At most
``context.embed_queue`` embeddings wait at once, and at most ``context.embed_max_per_s`` (10) start
per second (a token bucket: ~20 ms of CPU each, so at most ~0.2 core however many runs start; a
benchmark of one-step runs at 200 new runs/s paid 6 ms of CPU per request without it); a run over
either bound gets none (``TaskEmbedder.dropped``), and a first step that finds another embedding
still queued does not wait (its vector could not be ready in time). The model's weights are loaded in the background at
start-up (``warm``), so the first run does not pay for them. The worker runs at a lower CPU
priority (above; in thread mode ``context.embed_nice``, +10 niceness: on Linux the thread's own, the
event loop's thread keeps its priority): on a saturated core the kernel gives the serving thread the
CPU and the embedding waits; its queue and rate bounds above stay the backstop.

Knobs (``context.*``): ``embed`` (``auto``: on when ``features.embed.available()``; ``on``; ``off``),
``embed_executor`` (``process`` | ``thread``), ``embed_sched`` (``idle`` | ``nice``), ``embed_nice``, ``embed_cache``, ``embed_wait_ms``, ``embed_queue``, ``embed_max_per_s``, ``embed_batch``, ``embed_defer_ms``, ``tenant_domains``, ``agent_domains``, ``domain_header``,
``agent_header``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from router.policy.types import RunState
    from router.server.hotpath.proxy import RunHistory
    from router.server.protocols.base import Adapter, ClientRequest
    from router.server.state.store import RunStateStore

__all__ = [
    "RunContextSettings",
    "resolve_domain",
    "clean_domain",
    "lower_priority",
    "idle_priority",
    "TaskEmbedder",
    "embedding_informs",
    "RunContext",
]

log = logging.getLogger("runroute.context")

#: The task-embedding function: texts -> (n, d) vectors (``features.embed.embed_texts``).
EmbedFn = Callable[[Sequence[str]], np.ndarray]
_T = TypeVar("_T")

_BAD = re.compile(r"[^A-Za-z0-9._:/-]")


class RunContextSettings(BaseModel):
    """``context``: how the sidecar knows a run's domain and task embedding (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    embed: Literal["auto", "on", "off"] = "auto"
    embed_executor: Literal["process", "thread"] = "process"
    embed_sched: Literal["idle", "nice"] = "idle"  # the worker process's CPU policy (module docstring)
    embed_cache: int = Field(default=4096, ge=0)  # vectors kept by text hash (0 = no cache)
    embed_wait_ms: float = Field(default=15.0, ge=0, le=1000)
    embed_queue: int = Field(default=64, ge=1)
    embed_max_per_s: float = Field(default=10.0, ge=0)  # new-run embeddings per second (0 = no cap)
    embed_nice: int = Field(default=10, ge=0, le=19)  # niceness added to the embedding worker
    embed_batch: int = Field(default=8, ge=1, le=64)  # log-only texts per forward pass (1 = none)
    embed_defer_ms: float = Field(default=2000.0, ge=0, le=60_000)  # a log-only text's longest wait
    domain_header: str = "x-runroute-domain"
    agent_header: str = "x-runroute-agent"
    tenant_domains: dict[str, str] = Field(default_factory=dict)
    agent_domains: dict[str, str] = Field(default_factory=dict)


def clean_domain(v: object) -> str | None:
    """A domain value made safe (module docstring); None for empty / non-string values."""
    if not isinstance(v, str):
        return None
    v = v.strip()
    if not v:
        return None
    return _BAD.sub("_", v[:64])


def resolve_domain(
    cfg: RunContextSettings,
    headers: Mapping[str, str],
    body: Mapping[str, object],
    tenant: str | None,
    system: str | None,
) -> tuple[str | None, str]:
    """``(domain, how)`` of a run's first request; ``how`` names the rule that gave it (module
    docstring): ``header``, ``tenant``, ``metadata``, ``agent``, ``system-prompt`` or ``none``."""
    d = clean_domain(headers.get(cfg.domain_header))
    if d:
        return d, "header"
    if tenant is not None and tenant in cfg.tenant_domains:
        d = clean_domain(cfg.tenant_domains[tenant])
        if d:
            return d, "tenant"
    meta = body.get("metadata")
    if isinstance(meta, dict):
        d = clean_domain(meta.get("domain"))
        if d:
            return d, "metadata"
    agent = headers.get(cfg.agent_header)
    if agent:
        d = clean_domain(cfg.agent_domains.get(agent, agent))
        if d:
            return d, "agent"
    if system:
        return "sys-" + hashlib.sha256(system.encode("utf-8", "replace")).hexdigest()[:8], "system-prompt"
    return None, "none"


def lower_priority(nice: int) -> None:
    """Add ``nice`` to the calling thread's niceness (Linux: niceness is per thread, so the event
    loop's thread keeps its own); a platform or sandbox that forbids it leaves it as is."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:  # pragma: no cover - a sandbox that forbids it: serve on as is
        log.warning("task embedding: could not lower the worker's priority: %s", e)


def idle_priority(sched: str = "idle", nice: int = 0) -> str:
    """Lower the calling process's CPU priority (every thread it has now; later ones inherit):
    ``SCHED_IDLE`` (Linux) when ``sched`` is ``idle``, else (or when that is refused) ``nice`` more
    niceness. Returns what was applied: ``idle``, ``nice`` or ``none``."""
    if sched == "idle" and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            tids = [0]
        try:
            for tid in tids:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return "idle"
        except OSError as e:  # pragma: no cover - a sandbox that forbids it: niceness instead
            log.warning("task embedding: SCHED_IDLE refused (%s); using niceness", e)
    if nice <= 0 or not hasattr(os, "setpriority"):
        return "none"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    except OSError as e:  # pragma: no cover
        log.warning("task embedding: could not lower the worker's priority: %s", e)
        return "none"
    return "nice"


def _die_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Worker process: exit when the sidecar is gone, however it ended (a killed sidecar must not
    leave its embedding worker behind): a daemon thread checks the parent's pid every ``every_s``.
    (Not ``PR_SET_PDEATHSIG``: it follows the spawning *thread*, and the worker outlives the app
    thread that first used it.)"""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch, name="runroute-embed-parent", daemon=True).start()


def _load_model(sched: str = "nice", nice: int = 0, parent: int | None = None) -> None:
    """Worker-process initialiser: follow the parent's death (``parent``: its pid, in a worker
    process), load the model's weights once (at start-up, at the normal priority: under
    ``SCHED_IDLE`` on a busy host the load could take minutes), then lower its priority."""
    from features.embed import get_embedder

    if parent is not None:
        _die_with_parent(parent)
    get_embedder().load()
    idle_priority(sched, nice)


_pools: dict[tuple[str, int], ProcessPoolExecutor] = {}
_pools_lock = threading.Lock()


def _worker_pool(sched: str, nice: int) -> ProcessPoolExecutor:
    """The process's embedding worker (one per priority setting, shared by every app the process
    builds: a test session builds hundreds; a sidecar one), spawned on first use."""
    with _pools_lock:
        pool = _pools.get((sched, nice))
        if pool is None:
            import multiprocessing

            pool = _pools[(sched, nice)] = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_load_model,
                initargs=(sched, nice, os.getpid()),
            )
        return pool


def _drop_worker_pool(pool: Executor) -> None:
    with _pools_lock:
        for k, v in list(_pools.items()):
            if v is pool:
                del _pools[k]


def _worker_policy() -> str:
    """Worker-process task: the worker's scheduling policy (``idle`` / ``other``) and niceness."""
    pol = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else -1
    name = "idle" if pol == getattr(os, "SCHED_IDLE", -2) else "other"
    return f"{name}:{os.getpriority(os.PRIO_PROCESS, 0)}"


def _embed_batch(texts: list[str]) -> np.ndarray:
    """Worker-process task: the vectors of a batch of texts, ``(len(texts), d)``."""
    from features.embed import embed_texts

    return embed_texts(texts)


def _fan_out(batch: Future[Any], futs: list[Future[np.ndarray]]) -> None:
    """One pass's outcome to each text's future: its row, or the pass's failure (a cancelled pass,
    the pool shut down, fails them: never a ``CancelledError`` into a step). A future cancelled
    meanwhile is left as it is."""
    err = RuntimeError("task embedding cancelled") if batch.cancelled() else batch.exception()
    vecs = batch.result() if err is None else None
    for i, f in enumerate(futs):
        if not f.set_running_or_notify_cancel():
            continue
        if vecs is not None:
            f.set_result(vecs[i])
        elif err is not None:
            f.set_exception(err)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _log_failure(fut: Future[_T]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("task embedding: the model could not be loaded: %s", fut.exception())


class TaskEmbedder:
    """The background task embedding of runs (module docstring). ``embed_fn`` is injected (tests;
    it runs on a thread); the default is ``features.embed.embed_texts``."""

    def __init__(self, cfg: RunContextSettings, embed_fn: EmbedFn | None = None):
        self.wait_s = cfg.embed_wait_ms / 1000.0
        self.queue_max = cfg.embed_queue
        self.nice = cfg.embed_nice
        self.sched = cfg.embed_sched
        self.cache_max = cfg.embed_cache
        self.batch = cfg.embed_batch
        self.defer_s = cfg.embed_defer_ms / 1000.0
        self._deferred: list[tuple[str, Future[np.ndarray]]] = []  # log-only texts for the next pass
        self._flush_at: asyncio.TimerHandle | None = None
        self.passes = 0  # forward passes sent to the worker (a deferred batch is one)
        self._running: set[Future[np.ndarray]] = set()  # every text's embedding not yet settled
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()  # text hash -> vector
        self._inflight: dict[bytes, Future[np.ndarray]] = {}  # text hash -> its queued embedding
        self._cache_lock = threading.Lock()  # filled from the executor's thread
        self.hits = 0  # first steps answered from the cache or a queued embedding of the same text
        self.rate = cfg.embed_max_per_s
        self._tokens = max(1.0, self.rate)  # the token bucket (burst: one second's worth)
        self._refilled = time.monotonic()
        self._fn = embed_fn
        self.process = embed_fn is None and cfg.embed_executor == "process"
        self._pool: Executor | None = None
        self._warming: Future[Any] | None = None
        self.submitted = 0  # written on the event loop only
        self.finished = 0  # written on the executor's thread only
        self.dropped = 0
        self.done = 0
        self.failed = 0
        self.not_waited = 0  # first steps that went on without a wait the vector could not inform

    @staticmethod
    def enabled(cfg: RunContextSettings) -> bool:
        """Whether the settings turn embedding on (``auto``: when the model is installed)."""
        if cfg.embed == "off":
            return False
        if cfg.embed == "on":
            return True
        try:
            from features.embed import available
        except ImportError:  # pragma: no cover - an install without features.embed
            return False
        return bool(available())

    def _embed(self, texts: list[str]) -> np.ndarray:  # thread mode
        fn = self._fn
        if fn is None:
            from features.embed import embed_texts

            fn = self._fn = embed_texts
        return fn(texts)

    def _settled(self, fut: Future[np.ndarray]) -> None:
        with self._cache_lock:
            self._running.discard(fut)
        self.finished += 1
        if fut.cancelled() or fut.exception() is not None:
            self.failed += 1
            if not fut.cancelled():
                log.warning("task embedding failed: %s", fut.exception())
        else:
            self.done += 1

    @staticmethod
    def result(fut: Future[np.ndarray] | None) -> np.ndarray | None:
        """The vector of a finished embedding; None when it failed, is not done or there is none."""
        if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
            return None
        return fut.result()

    @property
    def pending(self) -> int:
        """Embeddings queued or running (the deferred ones included)."""
        return self.submitted - self.finished

    @property
    def deferred(self) -> int:
        """Log-only texts waiting for their batch's pass."""
        return len(self._deferred)

    def _executor(self) -> Executor:
        if self._pool is None:
            if self.process:
                self._pool = _worker_pool(self.sched, self.nice)
            else:
                self._pool = ThreadPoolExecutor(
                    max_workers=1,
                    thread_name_prefix="runroute-embed",
                    initializer=lower_priority,
                    initargs=(self.nice,),
                )
        return self._pool

    def _submit(self, fn: Callable[..., _T], *args: object) -> Future[_T] | None:
        try:
            return self._executor().submit(fn, *args)
        except Exception as e:  # noqa: BLE001 - a broken worker: start a fresh one next time
            log.warning("task embedding: executor failed (%s); restarting it", e)
            pool, self._pool = self._pool, None
            if pool is not None:
                if self.process:
                    _drop_worker_pool(pool)
                pool.shutdown(wait=False, cancel_futures=True)
            return None

    def warm(self) -> None:
        """Start the worker and load the model's weights in the background (the first run does
        not pay for it)."""
        if self._fn is not None:
            return
        fut = self._submit(int) if self.process else self._submit(_load_model)
        if fut is not None:
            fut.add_done_callback(_log_failure)
        self._warming = fut

    @property
    def ready(self) -> bool:
        """Whether the background start-up (:meth:`warm`) has finished (or none was started)."""
        return self._warming is None or self._warming.done()

    def _take(self) -> bool:
        """One token of the rate bucket (always, without a cap)."""
        if self.rate <= 0:
            return True
        now = time.monotonic()
        self._tokens = min(max(1.0, self.rate), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    @staticmethod
    def key(text: str) -> bytes:
        """The cache key of a text: BLAKE2b, 16 bytes, of its UTF-8."""
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def cached(self, text: str) -> np.ndarray | None:
        """The cached vector of ``text`` (None when not cached)."""
        key = self.key(text)
        with self._cache_lock:
            v = self._cache.get(key)
            if v is not None:
                self._cache.move_to_end(key)
            return v

    def _remember(self, key: bytes, fut: Future[np.ndarray]) -> None:
        with self._cache_lock:
            self._inflight.pop(key, None)
            if self.cache_max <= 0 or fut.cancelled() or fut.exception() is not None:
                return
            self._cache[key] = fut.result()
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_max:
                self._cache.popitem(last=False)

    def start(self, text: str | None, defer: bool = False) -> Future[np.ndarray] | None:
        """Queue one run's embedding; None when there is no text or the queue is full. A text
        cached or already queued gets that vector or that embedding (no new work).

        ``defer``: nothing waits for this vector but the run log (the first step's predictions
        cannot read it, :func:`embedding_informs`), so it waits for a batch: up to
        ``context.embed_batch`` such texts go to the worker as one forward pass, sent when the batch
        is full or ``context.embed_defer_ms`` after its first text (module docstring). Otherwise,
        or with batch 1 or no wait, or outside an event loop, the text is sent at once."""
        if not text:
            return None
        key = self.key(text)
        with self._cache_lock:
            v = self._cache.get(key)
            if v is not None:
                self._cache.move_to_end(key)
            queued = self._inflight.get(key)
        if v is not None:
            self.hits += 1
            done: Future[np.ndarray] = Future()
            done.set_result(v)
            return done
        if queued is not None:
            self.hits += 1
            if not defer and any(f is queued for _, f in self._deferred):
                self._flush()  # a run that can use it now: its batch goes at once
            return queued
        if self.pending >= self.queue_max or not self._take():
            self.dropped += 1
            return None
        fut: Future[np.ndarray] = Future()
        self.submitted += 1
        with self._cache_lock:
            self._running.add(fut)
        if self.cache_max > 0:
            with self._cache_lock:
                self._inflight[key] = fut
            fut.add_done_callback(lambda f: self._remember(key, f))
        fut.add_done_callback(self._settled)
        loop = _running_loop() if defer and self.batch > 1 and self.defer_s > 0 else None
        if loop is None:
            self._send([(text, fut)])
            return fut
        self._deferred.append((text, fut))
        if len(self._deferred) >= self.batch:
            self._flush()
        elif self._flush_at is None:
            self._flush_at = loop.call_later(self.defer_s, self._flush)
        return fut

    def _flush(self) -> None:
        """Send the deferred texts as one pass (event loop thread)."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        items, self._deferred = self._deferred, []
        if items:
            self._send(items)

    def _cancel_deferred(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        items, self._deferred = self._deferred, []
        for _, f in items:
            f.cancel()

    def _send(self, items: list[tuple[str, Future[np.ndarray]]]) -> None:
        """One forward pass over ``items``' texts in the worker; each future gets its row."""
        texts = [t for t, _ in items]
        batch = self._submit(_embed_batch, texts) if self.process else self._submit(self._embed, texts)
        futs = [f for _, f in items]
        if batch is None:
            failed: Future[np.ndarray] = Future()
            failed.set_exception(RuntimeError("task embedding: no worker"))
            _fan_out(failed, futs)
            return
        self.passes += 1
        batch.add_done_callback(lambda b: _fan_out(b, futs))

    async def first(self, fut: Future[np.ndarray] | None) -> np.ndarray | None:
        """The vector when it is ready within the first step's budget, else None (it stays queued)."""
        if fut is None:
            return None
        ahead = self.pending - len(self._deferred)  # in the worker: this one and any before it
        if not fut.done() and self.wait_s > 0 and ahead <= 1:  # queued behind others: no use
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.wait_s)
            except (TimeoutError, asyncio.TimeoutError):
                return None
            except Exception:  # noqa: BLE001 - a failed embedding: the run goes on without
                return None
        return self.result(fut)

    def needed(self, fut: Future[np.ndarray]) -> None:
        """The run of a deferred text ended (its vector goes to a second run record): send its
        batch now rather than when the batch fills or its wait ends."""
        if any(f is fut for _, f in self._deferred):
            self._flush()

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: the deferred texts are dropped (their runs are live, and a live run writes no
        run record at shutdown; an ended run's text was sent when it ended, :meth:`needed`), and
        every embedding sent waits (at most ``timeout_s``), so a run that ended before its vector
        still gets it logged (:meth:`router.server.runs.lifecycle.RunLifecycle.end`) before the run
        log closes. Nothing new goes to the worker at shutdown: a worker process's exit waits for
        its pool's queued work, and the worker runs at the lowest CPU priority."""
        self._cancel_deferred()
        with self._cache_lock:
            running = [asyncio.wrap_future(f) for f in self._running]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
            await asyncio.sleep(0)  # the late run records' callbacks, scheduled before the waiters

    def close(self) -> None:
        """Stop this embedder's thread (deferred texts not sent are cancelled); the process's
        shared worker (:func:`_worker_pool`) stays for the process's other apps and exits with
        the process."""
        self._cancel_deferred()
        if self._pool is not None and not self.process:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None


def embedding_informs(predictor: object, domain: str | None, keep_features: bool = False) -> bool:
    """Whether the task embedding can change ``predictor``'s predictions for a step of a run of
    ``domain`` in the step engine (:meth:`router.core.engine.StepEngine._plan`); True unless it
    provably cannot, i.e. the first step's wait for it can change nothing but the step's latency:

    - a predictor that does not declare ``reads_run_context`` gets the feature vector only
      (``predict_features``; the vector carries no embedding, :mod:`features.extract`) when it
      ``needs_features`` (default True) or the engine extracts the vector anyway
      (``keep_features``: the engine's knob, True in the sidecar); otherwise it gets the whole
      prefix (``predict``): True;
    - a :class:`models.bundle.ModelBundle` (that exact class) reads the embedding only through its
      benefit model (``_benefit_fields``), and that only for a domain the benefit model serves in
      ``model`` mode (``BenefitModel.predict``: an unknown domain, no domain or a ``prior``
      domain answers base rates) with a head that has embedding inputs (``LogitHead.components``);
    - any other predictor that reads the run context: True.

    Nothing else in a step reads the vector: the policies and the snapshot read the predictions and
    the feature vector, the step record logs those (the run record's ``task_embedding`` is read at
    the run's end, from the embedding itself). So where this is False, the step's predictions,
    decision and record are the same with and without the vector
    (``tests/test_run_context.py``)."""
    if not getattr(predictor, "reads_run_context", False):
        return not (keep_features or getattr(predictor, "needs_features", True))
    from models.bundle import ModelBundle

    if type(predictor) is not ModelBundle:
        return True
    benefit = predictor.benefit
    if benefit is None or domain is None:
        return False
    d = benefit.domains.get(domain)
    if d is None or d.mode != "model" or d.local is None or d.frontier is None:
        return False
    return any(h.components is not None and h.e_mean is not None for h in (d.local, d.frontier))


class RunContext:
    """The proxy's per-step hook for the run context: at a run's first step on this router its
    domain and task embedding (module docstring); at every step the signals posted since the
    run's previous step (from the run-state store)."""

    def __init__(self, cfg: RunContextSettings, embed_fn: EmbedFn | None = None):
        self.cfg = cfg
        self.embedder = (
            TaskEmbedder(cfg, embed_fn) if embed_fn is not None or TaskEmbedder.enabled(cfg) else None
        )

    def start(self) -> None:
        if self.embedder is not None:
            self.embedder.warm()

    def needed(self, fut: Future[np.ndarray]) -> None:
        """A run ended before its deferred embedding: send it now (:meth:`TaskEmbedder.needed`)."""
        if self.embedder is not None:
            self.embedder.needed(fut)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Shutdown: the embeddings still running finish (:meth:`TaskEmbedder.drain`)."""
        if self.embedder is not None:
            await self.embedder.drain(timeout_s)

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()

    async def step(
        self,
        hist: RunHistory,
        headers: Mapping[str, str],
        proto: Adapter,
        req: ClientRequest,
        tenant: str | None,
        store: RunStateStore,
        run: RunState,
        predictor: object | None = None,
        keep_features: bool = False,
    ) -> tuple[str, ...]:
        """Set the run's context on ``hist`` (the proxy's :class:`router.server.hotpath.proxy.RunHistory`) and return the
        signals new since its previous step. ``run`` (the pin, :class:`router.policy.types.RunState`)
        says how many signals the run's previous step saw, on whichever router served it; a track
        that missed those steps takes the older signals from the store, so "so far" and "new" are the
        same on every router.

        ``predictor``: the serving predictor this step's decision will read (None: not said, the
        first step waits as before) and ``keep_features`` the engine's knob; where the run's task
        embedding cannot change its predictions (:func:`embedding_informs`), the first step does not wait for the vector (it is taken when
        it is already there; otherwise a later step takes it and the run log gets it, as after a
        wait that timed out)."""
        sig = await store.signals(hist.run_id)  # first: right after begin_step, which read them
        seen = min(run.signals_seen, len(sig))
        if len(hist.signals) != seen:  # another router served the run's previous steps
            hist.signals = tuple(sig[:seen])
        run.signals_seen = len(sig)
        emb = self.embedder
        if not hist.context_done:
            hist.context_done = True
            system, first, _ = proto.opening(req)
            hist.domain, hist.domain_source = resolve_domain(self.cfg, headers, req.body, tenant, system)
            if emb is not None:
                informs = predictor is None or embedding_informs(predictor, hist.domain, keep_features)
                hist.embed_future = fut = emb.start(first, defer=not informs)
                if informs:
                    hist.task_embedding = await emb.first(fut)
                else:  # the vector cannot change this step's predictions: no wait (embedding_informs)
                    hist.task_embedding = TaskEmbedder.result(fut)
                    if fut is not None and hist.task_embedding is None:
                        emb.not_waited += 1
        elif hist.task_embedding is None and hist.embed_future is not None and hist.embed_future.done():
            hist.task_embedding = TaskEmbedder.result(hist.embed_future)
            hist.embed_future = None
        return tuple(sig[seen:]) if len(sig) > seen else ()
