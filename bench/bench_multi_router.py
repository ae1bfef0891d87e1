"""Per-step latency through the whole sidecar: in-process store vs Redis store vs two routers.

What it measures: client-side end-to-end latency of ``POST /v1/chat/completions`` (non-streaming,
``max_tokens`` 4) for ``--runs`` agent runs of ``--steps`` steps each, one step at a time (so the
figure is the router's own path plus one loopback hop to a zero-latency fake vLLM, not queueing),
in three set-ups, each a real ``runroute serve --config`` subprocess (session-sticky policy, no
bundle):

- ``memory``: one router, ``store.kind: memory`` (the embedded default);
- ``redis``: one router, ``store.kind: redis`` (get + put of the run's pin per step over loopback);
- ``redis x2``: two routers on the same Redis, each run's steps alternating between them (every
  step reads the pin the other router wrote).

It prints p50/p99 per set-up in milliseconds and the added p50/p99 over ``memory``, after
``--warmup`` steps per router. Redis: a private ``redis-server`` on a free port when the binary is
installed (nothing is written to a shared server), else ``--url``.

Run: ``.venv/bin/python bench/bench_multi_router.py [--runs 40] [--steps 10] [--warmup 50]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.fakes.launch import fake_in_thread  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_router(cfg: dict, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNROUTE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen(
        [sys.executable, "-m", "runroute", "serve", "--config", str(path), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"router {name} exited; see {tmp / (name + '.log')}")
        try:
            if httpx.get(url + "/ready", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"router {name} not ready in 60 s")
        time.sleep(0.1)


def measure(client: httpx.Client, urls: list[str], runs: int, steps: int, warmup: int) -> list[float]:
    tag = uuid.uuid4().hex[:8]
    for i in range(warmup):
        for u in urls:
            client.post(
                u + "/v1/chat/completions",
                json={"model": "auto", "messages": [{"role": "user", "content": "warm"}], "max_tokens": 4},
                headers={"X-Run-Id": f"warm-{tag}-{i}"},
            )
    lat: list[float] = []
    for k in range(steps):
        for r in range(runs):
            url = urls[(k + r) % len(urls)]
            msgs = [{"role": "user", "content": f"step {j} of run {r}"} for j in range(k + 1)]
            t0 = time.perf_counter()
            resp = client.post(
                url + "/v1/chat/completions",
                json={"model": "auto", "messages": msgs, "max_tokens": 4},
                headers={"X-Run-Id": f"bench-{tag}-{r}"},
            )
            lat.append(time.perf_counter() - t0)
            if resp.status_code != 200:
                raise SystemExit(f"step failed: {resp.status_code} {resp.text[:200]}")
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0", help="Redis when redis-server is absent")
    args = ap.parse_args()

    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as d, httpx.Client(timeout=30.0) as client:
        tmp = Path(d)
        url = args.url
        binary = shutil.which("redis-server")
        if binary:
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            url = f"redis://127.0.0.1:{port}/0"
            time.sleep(0.3)
        try:
            with (
                fake_in_thread("vllm", name="v0", model="local-model", zero_latency=True) as v0,
                fake_in_thread("vllm", name="v1", model="local-model", zero_latency=True) as v1,
            ):
                base = {
                    "local": {"urls": [v0.url, v1.url], "model": "local-model"},
                    "policy": {"kind": "session-sticky"},
                    "scrape": {"interval_s": 1.0},
                    "runlog": {"dir": str(tmp / "logs"), "parquet": False},
                    # back-to-back steps look like overload to the live admission model: measure
                    # the store, not the shedding
                    "admission": {"enabled": False},
                }
                mem = {**base, "store": {"kind": "memory"}}
                red = {**base, "store": {"kind": "redis", "redis_url": url}}
                setups: list[tuple[str, list[str]]] = []
                for name, cfg, n in (("memory", mem, 1), ("redis", red, 1), ("redis x2", red, 2)):
                    urls = []
                    for i in range(n):
                        p, u = start_router(cfg, tmp, f"{name.replace(' ', '')}-{i}")
                        procs.append(p)
                        urls.append(u)
                    setups.append((name, urls))
                results = {
                    name: measure(client, urls, args.runs, args.steps, args.warmup) for name, urls in setups
                }
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()

    print(
        f"per-step latency through runroute serve, {args.runs} runs x {args.steps} steps, one step at a "
        f"time, zero-latency fake vLLM x2, redis {url}"
    )
    print(f"{'set-up':<10} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8}")
    b50, b99 = pct(results["memory"], 0.5), pct(results["memory"], 0.99)
    for name, lat in results.items():
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        print(
            f"{name:<10} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} {(p50 - b50) * 1e3:8.2f} {(p99 - b99) * 1e3:8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
