"""Shared parts of the multi-router tests (tests/test_multi_router*.py): a private redis-server,
``runroute serve`` subprocesses, the fakes, a small real bundle, the two-router cluster and helpers.
See tests/test_multi_router.py for the setup they make."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from router.policy.filters import DEFAULT_WEIGHTS, pick
from router.policy.types import BackendState
from router.server.settings import RouterSettings
from router.server.state.redis_store import RedisStore

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]
REDIS_BIN = shutil.which("redis-server")
REPLICAS = ("local-0", "local-1")
DEGRADED_METRIC = "runroute_store_degraded"
FAKE_BASE_MS = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- processes


class RedisProc:
    """A private redis-server (no persistence) on a fixed loopback port; kill/start at will."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.3) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout_s: float = 10.0) -> None:
        assert REDIS_BIN is not None
        self.proc = subprocess.Popen(
            [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--daemonize", "no", "--dir", str(self.workdir), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel backlog) but nothing answers, so
        clients see timeouts, not refusals; commands already sent run when :meth:`resume` is called."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class RouterProc:
    """``python -m runroute serve --config FILE --port P`` as a subprocess; log in ``log``."""

    def __init__(self, name: str, config: Path, port: int, log: Path):
        self.name, self.config, self.port, self.log = name, config, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 45.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNROUTE_")}  # env beats file
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runroute", "serve", "--config", str(self.config)]
                + ["--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router {self.name} exited ({self.proc.returncode}):\n{_tail(self.log)}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"router {self.name} not ready in {timeout_s} s:\n{_tail(self.log)}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no lifespan shutdown, nothing flushed; what survives is what Redis holds."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def router_config(tmp: Path, fakes, bundle_dir: Path, redis_url: str, **extra) -> dict:
    v0, v1, fr = fakes
    cfg = {
        "local": {"urls": [v0.url, v1.url], "model": "local-model", "names": list(REPLICAS)},
        "frontier": {
            "url": fr.base_url,
            "model": "frontier-model",
            "allow_no_key": True,
            "api_key_env": None,
        },
        # thresholds up 0.95 / down 0: with P ~0.15 no run ever moves on its own; kv weight 0 so only
        # the running count (scraped + this router's in-flight) and the hash decide a new run's replica
        "policy": {
            "kind": "learned",
            "p_frontier_up": 0.95,
            "p_frontier_down": 0.0,
            "scoring": {"warm": 1.0, "queue": 1.0, "running": 0.5, "kv": 0.0},
        },
        "bundle": {"path": str(bundle_dir), "watch_s": 0},
        "scrape": {"interval_s": 0.25, "timeout_s": 0.5},
        "fallback": {"enabled": False},
        "runlog": {"dir": str(tmp / "logs"), "parquet": False},
        "store": {"kind": "redis", "redis_url": redis_url, "ttl_s": 600},
    }
    if "admission" in RouterSettings.model_fields:
        # admission stays on (its shared counter goes through the same store, outage included) but
        # with capacity so large that it never sheds: these tests are about pins, and back-to-back
        # steps without tool pauses look like a heavy load to the live rate estimate
        cfg["admission"] = {"enabled": True, "replica_tokens_per_s": 1e9}
    cfg.update(extra)
    RouterSettings.load(None, **cfg)  # the file must be valid before a subprocess is spent on it
    return cfg


@dataclass
class Cluster:
    a: RouterProc
    b: RouterProc
    redis: RedisProc
    fakes: tuple
    client: httpx.Client
    served: dict[str, list[dict]] = field(default_factory=dict)
    log: list[dict] = field(default_factory=list)

    def router(self, which: str) -> RouterProc:
        return self.a if which == "a" else self.b

    def step(self, which: str, run_id: str, model: str = "auto") -> dict:
        """One step of ``run_id`` through router ``which``; returns what served it."""
        r = self.router(which)
        n = len(self.served.get(run_id, []))
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": f"agent for {run_id}"},
                *({"role": "user", "content": f"step {i} of {run_id}"} for i in range(n + 1)),
            ],
            "max_tokens": 4,
        }
        resp = self.client.post(r.url + "/v1/chat/completions", json=body, headers={"X-Run-Id": run_id})
        rec = {
            "router": which,
            "status": resp.status_code,
            "tier": resp.headers.get("x-runroute-tier"),
            "replica": resp.headers.get("x-runroute-replica"),
            "step": resp.headers.get("x-runroute-step"),
            "reason": resp.headers.get("x-runroute-reason"),
            "body": resp.text[:300] if resp.status_code != 200 else "",
        }
        self.served.setdefault(run_id, []).append(rec)
        self.log.append(rec)
        return rec

    def upstream_counts(self) -> dict[str, int]:
        """Chat requests each fake has answered so far, keyed by the backend name routers use."""
        names = (*REPLICAS, "frontier")
        return {n: f.server.stats.completed for n, f in zip(names, self.fakes, strict=True)}

    def assert_upstreams_match(self, since: int, before: dict[str, int]) -> None:
        """The backend each response names (x-runroute-replica) is the fake that answered it."""
        named: dict[str, int] = dict.fromkeys(before, 0)
        for rec in self.log[since:]:
            if rec["status"] == 200:
                named[rec["replica"]] += 1
        after = self.upstream_counts()
        assert {k: after[k] - before[k] for k in before} == named

    def metrics(self, which: str) -> str:
        return self.client.get(self.router(which).url + "/metrics").text


@contextmanager
def running_cluster(tmp: Path, redis: RedisProc, fakes, bundle_dir: Path, **extra) -> Iterator[Cluster]:
    """Two ``runroute serve`` processes sharing ``redis`` (config: :func:`router_config` + ``extra``),
    both logging to ``tmp/logs``; stopped (SIGTERM: run logs flushed) on exit."""
    cfg_path = tmp / "runroute.yaml"
    cfg_path.write_text(yaml.safe_dump(router_config(tmp, fakes, bundle_dir, redis.url, **extra)))
    a = RouterProc("a", cfg_path, free_port(), tmp / "router-a.log")
    b = RouterProc("b", cfg_path, free_port(), tmp / "router-b.log")
    client = httpx.Client(timeout=10.0)
    try:
        with ThreadPoolExecutor(2) as ex:  # start both at once: start-up is mostly imports
            for f in [ex.submit(a.start), ex.submit(b.start)]:
                f.result()
        yield Cluster(a, b, redis, fakes, client)
    finally:
        client.close()
        a.stop()
        b.stop()


# --------------------------------------------------------------------------- helpers


def hash_replica(run_id: str) -> str:
    """The replica a router picks for a new run when loads are equal (the policy's own code)."""
    cands = [BackendState(name=n, tier="local", model="local-model") for n in REPLICAS]
    return pick(cands, run_id, 0, DEFAULT_WEIGHTS).name


def fake_for(c: Cluster, replica: str):
    return c.fakes[REPLICAS.index(replica)]


def run_ids(tag: str, n: int, *, hash_to: str | None = None) -> list[str]:
    out, i = [], 0
    uid = uuid.uuid4().hex[:8]
    while len(out) < n:
        rid = f"{tag}-{uid}-{i}"
        i += 1
        if hash_to is None or hash_replica(rid) == hash_to:
            out.append(rid)
    return out


def start_load_pinned_run(c: Cluster, tag: str) -> tuple[str, str]:
    """Start a run on router A while its hash replica is busy there; returns (run id, replica).

    A slow request of another run holds the hash replica (router A counts it in flight and the
    scrape sees it running), so the new run is pinned to the other replica. The load then goes away
    and the scrapes settle: from then on a router without the pin would choose the hash replica.
    """
    target = REPLICAS[0]
    (busy_run,) = run_ids(f"{tag}-busy", 1, hash_to=target)
    (rid,) = run_ids(f"{tag}-load", 1, hash_to=target)
    fake = fake_for(c, target)
    # loads equal first (an earlier test's last requests may still show as running in a scrape),
    # so the busy run goes to its hash replica
    wait_for(
        lambda: all(
            (gauge(c.metrics(w), f'runroute_backend_running{{backend="{r}"}}') or 0) == 0
            for w in "ab"
            for r in REPLICAS
        ),
        "the scrapes never saw the replicas idle",
    )
    fake.update(base_ms=2000.0)
    try:
        with ThreadPoolExecutor(1) as ex:
            slow = ex.submit(c.step, "a", busy_run)
            deadline = time.monotonic() + 5
            while fake.server.running < 1:
                assert time.monotonic() < deadline, ("the slow request never reached its replica", slow)
                time.sleep(0.01)
            wait_for(  # both routers' scrapes see it running, too
                lambda: all(
                    (gauge(c.metrics(w), f'runroute_backend_running{{backend="{target}"}}') or 0) >= 1
                    for w in "ab"
                ),
                "the scrapes never saw the slow request running",
            )
            first = c.step("a", rid)
            assert slow.result()["replica"] == target
    finally:
        fake.update(base_ms=FAKE_BASE_MS)
    other = REPLICAS[1]
    assert first["status"] == 200 and first["replica"] == other, (
        f"precondition: a new run should avoid the busy replica {target}: {first}"
    )
    wait_for(  # the scrapes settle: the replicas look equal again
        lambda: all(
            gauge(c.metrics(w), f'runroute_backend_running{{backend="{target}"}}') in (0.0, None)
            for w in "ab"
        ),
        "the slow request never left the scrapes",
    )
    return rid, other


def assert_one_place(c: Cluster, run_id: str, *, tier: str | None = None, replica: str | None = None):
    recs = c.served[run_id]
    bad = [r for r in recs if r["status"] != 200]
    assert not bad, f"{run_id}: non-200 steps {bad}"
    places = {(r["tier"], r["replica"]) for r in recs}
    assert len(places) == 1, f"{run_id} moved: {[(r['router'], r['tier'], r['replica']) for r in recs]}"
    (t, rep) = places.pop()
    if tier is not None:
        assert t == tier, f"{run_id}: served on {t}, expected {tier}"
    if replica is not None:
        assert rep == replica, f"{run_id}: served by {rep}, expected {replica}"
    return t, rep


def redis_pins(url: str, ids: list[str]) -> dict[str, tuple[str | None, str | None, int] | None]:
    async def go():
        s = RedisStore(url, timeout_s=1.0)
        try:
            out = {}
            for rid in ids:
                st_ = await s.get(rid)
                out[rid] = None if st_ is None else (st_.tier, st_.replica, st_.steps_seen)
            return out
        finally:
            await s.close()

    return asyncio.run(go())


def gauge(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def wait_for(cond, what: str, timeout_s: float = 15.0, every_s: float = 0.05) -> None:
    """Poll ``cond()`` until true, at most ``timeout_s`` (a bound, not a speed target)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(every_s)
