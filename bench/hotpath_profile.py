"""The sidecar's own CPU per request, in process: the hot path without sockets, HTTP server or client.

Algorithm: the app of ``runroute serve`` (``create_app``) with the realistic bench's configuration
(``bench/realistic.py``: learned policy with the default bundle, admission, run log, metrics, a
local replica and a frontier) and an in-memory upstream answering what ``../shared/bench-peers``'
fake backend answers (JSON with usage, or its 16-chunk SSE stream). Requests are ASGI calls made
directly on the app (no uvicorn, no aiohttp), with the bodies of ``bench/realistic_load.py``
(``--runs`` runs of ``--steps`` steps, 2-200 KB, a tool result in every step): every run is first
primed up to a spread-out step (as the realistic bench does), then ``--requests`` steps are sent
round robin over the runs, ``--concurrency`` at a time. Printed: CPU microseconds per request
(``time.process_time`` of the measured phase: the loop's thread and the sidecar's own threads, plus
the CPU of this process's child processes over the phase from ``/proc``: the task-embedding worker
when ``--embed on`` runs it in a process; it includes building each body, the same for every tree),
the chat parse cache's hits and misses when the tree has one, the process's peak RSS, the cyclic
garbage its freezes kept (objects one collection finds after ``gc.unfreeze()`` at the end), wall microseconds and the garbage collector's
CPU time per request (``gc.callbacks``, with the count of collections per generation and the longest
pause of each; also over the priming, while the heap grows to ``--runs`` runs); with ``--profile N`` the top ``N`` functions of a cProfile of the measured phase
by own time and by cumulative time (cProfile slows Python code about 2x: read its shares, not its
times).

This is the part of ``overhead.py --realistic``'s CPU per request that the bare pass-through does
not have (the HTTP server and client, which both pay, are left out), so it is where the ratio to
the bare proxy is won; it is deterministic enough to compare two trees on a shared machine
(``--tree`` runs another checkout's code: its packages first on ``sys.path``).

``--read-only``: instead, only the chat adapter's body read (``--protocol messages`` /
``responses``: that adapter's, over the same conversations as its bodies) (parse + validation) over the same
bodies (steps in order, runs interleaved), this tree's code with its parse cache off and on,
alternated ``--repeat`` times: CPU microseconds per body, best of each.

Knobs: ``--runs`` (300), ``--steps`` (50), ``--requests`` (3000), ``--concurrency`` (8),
``--stream``, ``--embed`` (off | on: the task embedding, default off: it is per run, not per
request), ``--profile N``, ``--bundle`` (``runroute-bundle``), ``--seed``, ``--scrape-s`` (the
replicas' ``/metrics`` scrape interval, 1 s: a cost per second, not per request;
``bench/hotpath_instr.py`` sets it past the run, so that valgrind's slowdown does not multiply it).

Usage: ``.venv/bin/python bench/hotpath_profile.py [--profile 30] [--tree ../other-checkout]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _children_cpu() -> float:
    """utime + stime (s) of this process's descendants, from ``/proc`` (0 without /proc)."""
    from sut_procs import cpu_seconds

    me = os.getpid()
    try:
        st = Path(f"/proc/{me}/stat").read_text()
    except OSError:
        return 0.0
    f = st[st.rindex(")") + 2 :].split()
    return cpu_seconds(me) - (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--embed", choices=["off", "on"], default="off")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--bundle", type=Path, default=HERE.parent / "runroute-bundle")
    ap.add_argument("--tree", type=Path, default=HERE.parent)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scrape-s", type=float, default=1.0, help="the replicas' /metrics scrape interval")
    ap.add_argument(
        "--gc-step-s",
        type=float,
        default=None,
        help="runtime.gc_step_s: the periodic collection of what is not frozen (default: the sidecar's)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="measured phases (the best and all are printed)")
    ap.add_argument("--read-only", action="store_true", help="time only the chat body read, cache off vs on")
    ap.add_argument(
        "--protocol", choices=["chat", "messages", "responses"], default="chat", help="--read-only's"
    )
    return ap.parse_args(argv)


def _reply(stream: bool, raw_len: int) -> Any:
    import orjson

    from router.server.hotpath.upstream import FakeReply

    u = {"prompt_tokens": max(1, raw_len // 4), "completion_tokens": 16, "total_tokens": raw_len // 4 + 16}
    base = {"id": "chatcmpl-x", "created": 1700000000, "model": "fake-model"}
    if not stream:
        choice = {"index": 0, "message": {"role": "assistant", "content": " ".join(["tok"] * 16)}}
        choice.update(logprobs=None, finish_reason="stop")
        body = orjson.dumps({**base, "object": "chat.completion", "choices": [choice], "usage": u})
        return FakeReply(200, body)
    chunks = []
    for i in range(16):
        delta = {"content": "tok ", **({"role": "assistant"} if i == 0 else {})}
        ev = {**base, "object": "chat.completion.chunk"}
        ev["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        chunks.append(b"data: " + orjson.dumps(ev) + b"\n\n")
    last = {**base, "object": "chat.completion.chunk", "usage": u}
    last["choices"] = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    chunks.append(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
    return FakeReply(200, headers={"content-type": "text/event-stream"}, chunks=chunks)


class _Upstream:
    """The fake backend's answers, without keeping the calls (FakeUpstream keeps every one)."""

    def __init__(self, stream: bool) -> None:
        from router.server.hotpath.upstream import FakeUpstream

        self._f = FakeUpstream(lambda call: _reply(stream, len(call.body)))
        metrics = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
        self._f.get_replies = {"/metrics": (200, metrics), "/health": (200, b"")}

    async def start(self) -> None:
        return None

    async def post(self, tier: str, url: str, body: bytes, headers: Any) -> Any:
        r = await self._f.post(tier, url, body, headers)
        self._f.calls.clear()
        return r

    async def get(self, tier: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        return await self._f.get(tier, url, timeout_s)

    async def close(self) -> None:
        return None


async def _call(app: Any, body: bytes, run_id: str) -> int:
    """One POST /v1/chat/completions through the ASGI app; returns the status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-run-id", run_id.encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]

    await app(scope, receive, send)
    return status


async def _lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
            started.set()

    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    await inbox.put({"type": "lifespan.startup"})
    await started.wait()
    return task, inbox


class _GcTimer:
    """CPU time inside the garbage collector (``gc.callbacks``, ``time.thread_time``: a pause the
    OS gave to other processes is not counted), per generation."""

    def __init__(self) -> None:
        import gc

        self.t0 = 0.0
        self.reset()
        gc.callbacks.append(self._cb)

    def reset(self) -> None:
        self.n = [0, 0, 0]
        self.s = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.t0 = time.thread_time()
        else:
            g = info["generation"]
            dt = time.thread_time() - self.t0
            self.n[g] += 1
            self.s[g] += dt
            self.longest[g] = max(self.longest[g], dt)

    def report(self, requests: int) -> str:
        per = sum(self.s) * 1e6 / requests
        n, ms = self.n, "/".join(f"{x * 1e3:.1f}" for x in self.longest)
        return f"{per:.0f} us/req (collections gen0/1/2 {n[0]}/{n[1]}/{n[2]}, longest {ms} ms)"


async def _run(a: argparse.Namespace) -> int:
    from realistic_load import ChatBodies

    from router.server.app import create_app
    from router.server.settings import RouterSettings

    work = Path(tempfile.mkdtemp(prefix="runroute-hotpath-"))
    cfg: dict[str, Any] = {
        "local": {"urls": ["http://local.invalid"], "model": "fake-model"},
        "frontier": {"url": "http://frontier.invalid", "model": "fake-model-frontier", "allow_no_key": True},
        "policy": {"kind": "learned"},
        "bundle": {"path": str(a.bundle.resolve()), "watch_s": 0},
        "runlog": {"dir": str(work / "logs")},
        "scrape": {"interval_s": a.scrape_s},
        "server": {"max_body_bytes": 1 << 22},
        "context": {"embed": a.embed},
    }
    if a.gc_step_s is not None:
        cfg["runtime"] = {"gc_step_s": a.gc_step_s}
    s = RouterSettings.load(None, **cfg)
    app = create_app(s, upstream=_Upstream(a.stream))
    task, inbox = await _lifespan(app)
    bodies = ChatBodies("auto", a.steps, 2048, 204800, a.stream, "header")
    rng = random.Random(a.seed)
    start = [r * a.steps // a.runs for r in range(a.runs)]
    nxt = list(start)
    gen = [0] * a.runs
    sem = asyncio.Semaphore(a.concurrency)
    bad = 0

    async def one(r: int, k: int, g: int) -> None:
        nonlocal bad
        async with sem:
            st = await _call(app, bodies.body(r, g, k, f"rr-{r:04d}-g{g}"), f"rr-{r:04d}-g{g}")
        if st != 200:
            bad += 1

    # prime: each run's steps 0..start-1, runs concurrently, each in order
    async def prime(r: int) -> None:
        for k in range(start[r]):
            await one(r, k, 0)

    primed = sum(start)
    gct = _GcTimer()
    await asyncio.gather(*(prime(r) for r in range(a.runs)))
    priming_gc = gct.report(max(1, primed))
    order = list(range(a.runs))
    rng.shuffle(order)
    cursor = 0

    def next_request() -> tuple[int, int, int]:
        nonlocal cursor
        r = order[cursor % a.runs]
        cursor += 1
        k, g = nxt[r], gen[r]
        nxt[r] += 1
        if nxt[r] >= a.steps:
            nxt[r], gen[r] = 0, g + 1
        return r, k, g

    results = []
    prof = cProfile.Profile() if a.profile else None
    for _ in range(a.repeat):
        reqs = [next_request() for _ in range(a.requests)]
        # one request of a run at a time (an agent waits for its answer); runs interleave
        c0, w0, k0 = time.process_time(), time.perf_counter(), _children_cpu()
        gct.reset()
        if prof is not None:
            prof.enable()
        for i in range(0, len(reqs), a.concurrency):
            await asyncio.gather(*(one(*x) for x in reqs[i : i + a.concurrency]))
        if prof is not None:
            prof.disable()
        cpu, wall = time.process_time() - c0 + _children_cpu() - k0, time.perf_counter() - w0
        results.append((cpu * 1e6 / a.requests, wall * 1e6 / a.requests, gct.report(a.requests)))
    chat = getattr(getattr(app.state, "proxy", None), "adapters", {}).get("chat")
    pc = getattr(chat, "parse_cache", None)
    cache = f"; parse cache hits {pc.hits} misses {pc.misses}" if pc is not None else "; no parse cache"
    import resource

    cache += f"; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    import gc

    # cyclic garbage the sidecar's freezes kept (a frozen cycle waits for runtime.gc_full_s): what
    # one collection of everything finds unreachable now, with the live runs still held
    gc.unfreeze()
    cache += f"; unreachable after unfreezing everything: {gc.collect()} objects"
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 600)  # the run log rolls into Parquet (slow under valgrind)
    mode = "stream" if a.stream else "plain"
    import router

    where = Path(router.__file__).resolve().parents[1]
    if where != a.tree:
        raise SystemExit(f"hotpath: imported router from {where}, not {a.tree}")
    cpus = ", ".join(f"{r[0]:.0f}" for r in results)
    best = min(results)
    print(
        f"hotpath {mode} tree={a.tree.name} runs={a.runs} requests={a.requests}x{a.repeat} "
        f"concurrency={a.concurrency} embed={a.embed}: CPU {best[0]:.0f} us/req (best; all: {cpus}), "
        f"wall {best[1]:.0f} us/req, non-200 {bad}; garbage collector in the best: {best[2]}{cache}"
    )
    print(
        f"hotpath priming ({primed} requests, the heap growing to {a.runs} runs): garbage collector {priming_gc}"
    )
    if prof is not None:
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).strip_dirs().sort_stats(key).print_stats(a.profile)
            print(out.getvalue())
    return 0


def _read_only(a: argparse.Namespace) -> int:
    """``--read-only`` (module docstring)."""
    from realistic_load import ChatBodies, MessagesBodies, ResponsesBodies

    from router.server.protocols.chat import ChatAdapter
    from router.server.protocols.messages import MessagesAdapter
    from router.server.protocols.responses import ResponsesAdapter, ResponseStore

    kind: Any = {"messages": MessagesBodies, "responses": ResponsesBodies}.get(a.protocol, ChatBodies)
    adapter: Any = {
        "messages": MessagesAdapter,
        "responses": lambda: ResponsesAdapter(ResponseStore(16)),
    }.get(a.protocol, ChatAdapter)
    bodies = kind("auto", a.steps, 2048, 204800, False, "header")
    runs = min(a.runs, 60)
    raws = [bodies.body(r, 0, k, f"rr-{r:04d}") for k in range(a.steps) for r in range(runs)]
    kb = sum(map(len, raws)) / len(raws) / 1024
    res: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(max(1, a.repeat)):
        for mode in ("off", "on"):
            ad = adapter()
            if mode == "on":
                if not hasattr(ad, "use_parse_cache"):
                    raise SystemExit("hotpath: --read-only needs a tree with the parse cache")
                ad.use_parse_cache(4096, 1 << 30)
                if ad.parse_cache is None:
                    print(f"hotpath: this tree's {a.protocol} adapter has no incremental parse")
            c0 = time.process_time()
            for raw in raws:
                ad.read(raw, {}, None, 64)
            res[mode].append((time.process_time() - c0) * 1e6 / len(raws))
    fmt = {m: ", ".join(f"{v:.0f}" for v in vs) for m, vs in res.items()}
    print(
        f"hotpath read-only {a.protocol} tree={a.tree.name} bodies={len(raws)} ({runs} runs x {a.steps} steps, "
        f"mean {kb:.0f} KB): parse cache off {min(res['off']):.0f} us/body (all: {fmt['off']}), "
        f"on {min(res['on']):.0f} us/body (all: {fmt['on']})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    a.tree = a.tree.resolve()
    sys.path.insert(0, str(a.tree))
    sys.path.insert(1, str(HERE))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.read_only:
        return _read_only(a)
    return asyncio.run(_run(a))


if __name__ == "__main__":
    raise SystemExit(main())
