"""Several router processes sharing run state in a real Redis (issue 9 acceptance).

Setup (module scope, so the whole file stays well under a minute):

- this module's own ``redis-server`` on a free loopback port (the machine's shared Redis on 6379 is
  never touched: tests below kill and restart theirs), started with no persistence, so a restart
  comes back empty (the hardest case for pin recovery);
- two fake vLLM replicas and one fake frontier, in threads of the test process, started once;
- a small real ``ModelBundle`` (P(frontier) ~0.15 whatever the features), the learned policy with
  thresholds up=0.95 / down=0 (so a run never moves on its own: the only way a run changes tier or
  replica between steps is a router that lost or never saw its pin);
- two ``runroute serve --config FILE`` subprocesses (store kind ``redis``) on two free ports.

What served a step is read from the router's ``x-runroute-tier`` / ``x-runroute-replica`` headers
(the proxy does not relay the upstream's ``x-fake-backend``), cross-checked against the requests
each fake actually answered.

Each router's choice for a run it has no pin for is deterministic (rendezvous hash of the run id,
loads being equal), so "one replica per run" alone would pass even without shared state. The tests
therefore also pin runs where a router without the shared pin would *not* place them:
``frontier`` runs (step 0 names the frontier model, later steps say ``auto``: the learned policy
keeps a frontier pin, a router without it would start the run locally) and ``load`` runs (step 0
arrives while the run's hash replica is busy on router A, so it is pinned to the other replica; a
router without the pin would pick the hash replica once the load is gone).

The run-state key prefix is not configurable in ``RouterSettings.store`` (only ``kind``, ``redis_url``,
``ttl_s``), so isolation comes from the private Redis server plus unique run ids per test.
"""

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
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.fakes.launch import fake_in_thread
from router.policy.filters import DEFAULT_WEIGHTS, pick
from router.policy.types import BackendState, RunState
from router.server.settings import RouterSettings
from router.server.state import InProcessStore
from router.server.state_fallback import FallbackStore
from router.server.state_redis import RedisStore

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]
REDIS_BIN = shutil.which("redis-server")
REPLICAS = ("local-0", "local-1")
DEGRADED_METRIC = "runroute_store_degraded"
FAKE_BASE_MS = 1.0


def _free_port() -> int:
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


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory) -> Iterator[RedisProc]:
    if REDIS_BIN is None:  # .ci/run installs it: a missing one is a broken environment, never a skip
        pytest.fail("redis-server is not installed (apt-get install redis-server); Redis tests need it")
    r = RedisProc(_free_port(), tmp_path_factory.mktemp("redis"))
    r.start()
    try:
        yield r
    finally:
        r.kill()


@pytest.fixture(scope="module")
def fakes():
    knobs = dict(model="local-model", base_ms=FAKE_BASE_MS, prefill_ms_per_token=0.0, decode_ms_per_token=0.0)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("vllm", name="v1", **knobs) as v1,
        fake_in_thread("frontier", name="fr", model="frontier-model", zero_latency=True) as fr,
    ):
        yield v0, v1, fr


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    """A small real bundle whose P(frontier) stays ~0.15 (labels unrelated to the features)."""
    from features.extract import N_FEATURES
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, N_FEATURES))
    y = (rng.random(300) < 0.15).astype(int)
    est = EscalationClassifier(n_estimators=10, calibration="sigmoid", cv=3, n_jobs=1).fit(X, y)
    out = tmp_path_factory.mktemp("bundle") / "b"
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.95, "p_frontier_down": 0.0}).save(out)
    return out


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_proc, fakes, bundle_dir) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("routers")
    cfg_path = tmp / "runroute.yaml"
    cfg_path.write_text(yaml.safe_dump(router_config(tmp, fakes, bundle_dir, redis_proc.url)))
    a = RouterProc("a", cfg_path, _free_port(), tmp / "router-a.log")
    b = RouterProc("b", cfg_path, _free_port(), tmp / "router-b.log")
    client = httpx.Client(timeout=10.0)
    try:
        with ThreadPoolExecutor(2) as ex:  # start both at once: start-up is mostly imports
            for f in [ex.submit(a.start), ex.submit(b.start)]:
                f.result()
        yield Cluster(a, b, redis_proc, fakes, client)
    finally:
        client.close()
        a.stop()
        b.stop()


@pytest.fixture
def live(cluster: Cluster) -> Cluster:
    """The cluster with Redis and both routers up (an earlier test may have left one down)."""
    if not cluster.redis.ping():
        cluster.redis.kill()
        cluster.redis.start()
    for r in (cluster.a, cluster.b):
        if not r.alive():
            r.start()
    return cluster


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
    fake.update(base_ms=2000.0)
    try:
        with ThreadPoolExecutor(1) as ex:
            slow = ex.submit(c.step, "a", busy_run)
            deadline = time.monotonic() + 5
            while fake.server.running < 1:
                assert time.monotonic() < deadline, "the slow request never reached its replica"
                time.sleep(0.01)
            time.sleep(0.3)  # let both routers' scrapes see it running, too
            first = c.step("a", rid)
            assert slow.result()["replica"] == target
    finally:
        fake.update(base_ms=FAKE_BASE_MS)
    other = REPLICAS[1]
    assert first["status"] == 200 and first["replica"] == other, (
        f"precondition: a new run should avoid the busy replica {target}: {first}"
    )
    time.sleep(0.6)  # > 2 scrape intervals: the replicas look equal again
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


# --------------------------------------------------------------------------- 1. pins across routers


def test_steps_alternated_between_routers_keep_one_tier_and_replica(live: Cluster):
    c = live
    since, before = len(c.log), c.upstream_counts()
    auto = run_ids("alt-auto", 6)
    front = run_ids("alt-front", 2)
    load_run, load_replica = start_load_pinned_run(c, "alt")
    for rid in front:
        c.step("b", rid, model="frontier-model")  # step 0 on B names the frontier model
    for j, rid in enumerate(auto):
        c.step("ab"[j % 2], rid)
    everyone = auto + front + [load_run]
    for k in range(5):  # round-robin over runs, each run's steps alternating between the routers
        for j, rid in enumerate(everyone):
            c.step("ab"[(k + j) % 2], rid)
    for rid in auto:
        assert_one_place(c, rid, tier="local")
    for rid in front:
        assert_one_place(c, rid, tier="frontier")
        assert {r["reason"] for r in c.served[rid][1:]} == {"pinned"}
    assert_one_place(c, load_run, tier="local", replica=load_replica)
    assert load_replica != hash_replica(load_run)
    # both replicas are in use, and every step index is the run's shared count (no router restarted)
    assert {c.served[r][0]["replica"] for r in auto} | {load_replica} == set(REPLICAS)
    for rid in everyone:
        assert [int(r["step"]) for r in c.served[rid]] == list(range(len(c.served[rid]))), rid
        assert {r["router"] for r in c.served[rid]} == {"a", "b"}
    pins = redis_pins(c.redis.url, everyone)
    for rid in everyone:
        last = c.served[rid][-1]
        assert pins[rid] == (last["tier"], last["replica"], len(c.served[rid])), (rid, pins[rid])
    c.assert_upstreams_match(since, before)


# --------------------------------------------------------------------------- 2. shared admission budget


async def _admission_storm(
    url: str, key: str, limit: int, n_clients: int, hold_s: list[float], release: bool = True
) -> dict:
    """``n_clients`` concurrent starts spread over two routers' stores; each admitted run is held for a
    while, then released (unless ``release`` is false). Tracks the runs actually held at every moment."""
    routers = [FallbackStore(RedisStore(url, key_prefix=key + ":", timeout_s=2.0)) for _ in range(2)]
    held = peak = admitted = 0
    gate = asyncio.Event()

    async def client(i: int) -> None:
        nonlocal held, peak, admitted
        store = routers[i % 2]
        await gate.wait()
        if await store.try_admit("local", limit):
            admitted += 1
            held += 1
            peak = max(peak, held)
            await asyncio.sleep(hold_s[i % len(hold_s)])
            if not release:
                return
            held -= 1  # before the release reaches Redis: `held` never lags behind Redis' count
            await store.release("local")

    try:
        tasks = [asyncio.create_task(client(i)) for i in range(n_clients)]
        await asyncio.sleep(0)
        gate.set()  # every client starts at once
        await asyncio.gather(*tasks)
        left = await routers[0].active("local")
        degraded = any(r.degraded for r in routers)
    finally:
        for r in routers:
            await r.close()
    return {"peak": peak, "admitted": admitted, "left": left, "degraded": degraded}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(1, 12),
    n_clients=st.integers(1, 60),
    hold_ms=st.lists(st.integers(0, 5), min_size=1, max_size=5),
)
def test_admission_budget_is_shared_between_two_routers_stores(redis_proc, limit, n_clients, hold_ms):
    """In-process: the two routers' FallbackStore(RedisStore) instances against one Redis."""
    key = f"adm-{uuid.uuid4().hex[:8]}"
    out = asyncio.run(_admission_storm(redis_proc.url, key, limit, n_clients, [h / 1000 for h in hold_ms]))
    assert not out["degraded"]
    assert 1 <= out["peak"] <= min(limit, n_clients)
    assert out["left"] == 0  # every admission was given back, on whichever router took it


def test_admission_without_release_admits_exactly_the_limit(redis_proc):
    key = f"adm-{uuid.uuid4().hex[:8]}"
    out = asyncio.run(_admission_storm(redis_proc.url, key, 7, 80, [0.0, 0.001], release=False))
    assert out["admitted"] == 7 and out["peak"] == 7 and out["left"] == 7


ADM_LIMIT_PER_REPLICA = 2


@pytest.fixture(scope="module")
def adm_routers(tmp_path_factory, redis_proc, fakes, bundle_dir) -> Iterator[list[RouterProc]]:
    """Two routers with a hard admission cap (2 runs per replica, no spill), on their own Redis db."""
    tmp = tmp_path_factory.mktemp("adm")
    cfg = router_config(
        tmp,
        fakes,
        bundle_dir,
        redis_proc.url.rsplit("/", 1)[0] + "/1",  # own db: other tests' runs never count here
        # the latency model never sheds (huge capacity): only the hard cap limits admissions
        admission={
            "enabled": True,
            "max_runs_per_replica": ADM_LIMIT_PER_REPLICA,
            "spill": False,
            "replica_tokens_per_s": 1e9,
        },
    )
    path = tmp / "adm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rs = [RouterProc(n, path, _free_port(), tmp / f"router-{n}.log") for n in ("p", "q")]
    try:
        with ThreadPoolExecutor(2) as ex:
            for f in [ex.submit(r.start) for r in rs]:
                f.result()
        yield rs
    finally:
        for r in rs:
            r.stop()


def _adm_counter(redis_proc: RedisProc) -> int:
    async def go() -> int:
        s = RedisStore(redis_proc.url.rsplit("/", 1)[0] + "/1", timeout_s=1.0)
        try:
            return await s.active("local")  # admission.counter_key default
        finally:
            await s.close()

    return asyncio.run(go())


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(n_clients=st.integers(1, 32), routing=st.lists(st.booleans(), min_size=32, max_size=32))
def test_admission_budget_shared_over_http(redis_proc, adm_routers, n_clients, routing):
    """Concurrent new runs over two live routers: admitted runs never exceed the shared budget; an
    admitted run's next step on the other router is served (never refused for load); ending the
    runs, on either router, gives every slot back."""
    limit = ADM_LIMIT_PER_REPLICA * len(REPLICAS)
    assert _adm_counter(redis_proc) == 0
    ids = run_ids("adm-http", n_clients)
    body = {"model": "auto", "messages": [{"role": "user", "content": "go"}], "max_tokens": 2}

    def post(url: str, rid: str) -> httpx.Response:
        with httpx.Client(timeout=10.0) as cl:
            return cl.post(url + "/v1/chat/completions", json=body, headers={"X-Run-Id": rid})

    first = {rid: adm_routers[int(routing[i])] for i, rid in enumerate(ids)}
    with ThreadPoolExecutor(16) as ex:
        resps = dict(zip(ids, ex.map(lambda rid: post(first[rid].url, rid), ids), strict=True))
    codes = [r.status_code for r in resps.values()]
    assert set(codes) <= {200, 429}, codes
    for r in resps.values():
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "run_rejected_overload" and r.headers.get("retry-after")
    admitted = [rid for rid, r in resps.items() if r.status_code == 200]
    assert all(resps[rid].headers.get("x-runroute-admission") == "admit-local" for rid in admitted)
    assert 1 <= len(admitted) <= limit, codes
    assert _adm_counter(redis_proc) == len(admitted)  # one shared count, whichever router admitted
    other = {rid: adm_routers[1 - adm_routers.index(first[rid])] for rid in ids}
    for j, rid in enumerate(admitted):
        if j % 2 == 0:  # half the runs step once more on the other router; the rest are ended there
            nxt = post(other[rid].url, rid)  # by a router that never served them
            assert nxt.status_code == 200, nxt.text
            assert nxt.headers["x-runroute-replica"] == resps[rid].headers["x-runroute-replica"]
        end = httpx.post(other[rid].url + f"/v1/runs/{rid}/end", json={"outcome": "success"}, timeout=10)
        assert end.status_code == 200, end.text
    assert _adm_counter(redis_proc) == 0


# --------------------------------------------------------------------------- 3. router restart


def test_killed_router_restarts_with_pins_from_redis(live: Cluster):
    c = live
    since, counts = len(c.log), c.upstream_counts()
    auto = run_ids("kill-auto", 3)
    front = run_ids("kill-front", 1)
    load_run, load_replica = start_load_pinned_run(c, "kill")
    for rid in front:
        c.step("b", rid, model="frontier-model")
    for rid in auto:
        c.step("b", rid)
    everyone = auto + front + [load_run]
    for rid in everyone:
        c.step("b", rid)
    before = {rid: (c.served[rid][-1]["tier"], c.served[rid][-1]["replica"]) for rid in everyone}
    c.b.kill()
    t0 = time.monotonic()
    c.b.start()
    restart_s = time.monotonic() - t0
    for rid in everyone:  # the restarted router has no memory of these runs but Redis' pins
        rec = c.step("b", rid)
        assert rec["status"] == 200 and (rec["tier"], rec["replica"]) == before[rid], (rid, rec, before[rid])
        assert int(rec["step"]) == len(c.served[rid]) - 1  # the step count survived too
        c.step("a", rid)
    for rid in everyone:
        assert_one_place(c, rid)
    assert before[load_run] == ("local", load_replica) and before[front[0]][0] == "frontier"
    assert restart_s < 45
    c.assert_upstreams_match(since, counts)


# --------------------------------------------------------------------------- 4. Redis outage


def test_redis_outage_no_5xx_degraded_then_resync(live: Cluster):
    c = live
    since, counts = len(c.log), c.upstream_counts()
    old = run_ids("out-old", 3) + run_ids("out-oldfront", 1)
    load_run, load_replica = start_load_pinned_run(c, "out")
    c.step("a", old[-1], model="frontier-model")
    for rid in old[:-1]:
        c.step("a", rid)
    old.append(load_run)
    for rid in old:
        c.step("b", rid)  # both routers have now seen every run (their local mirrors hold the pins)
    (only_a,) = run_ids("out-only-a", 1)  # seen by router A alone, and not stepped during the outage
    c.step("a", only_a, model="frontier-model")
    c.step("a", only_a)
    gauges_before = {w: gauge(c.metrics(w), DEGRADED_METRIC) for w in "ab"}

    c.redis.kill()
    # new runs started during the outage, each on one router only, pinned where a router without
    # that pin would not put them (frontier)
    (new_a,) = run_ids("out-new-a", 1)
    (new_b,) = run_ids("out-new-b", 1)
    c.step("a", new_a, model="frontier-model")
    c.step("b", new_b, model="frontier-model")
    for k in range(3):
        for j, rid in enumerate(old):
            c.step("ab"[(k + j) % 2], rid)
        c.step("a", new_a)
        c.step("b", new_b)
    gauges_during = {w: gauge(c.metrics(w), DEGRADED_METRIC) for w in "ab"}
    for rid in old:
        assert_one_place(c, rid)  # includes: every step answered 200
    assert_one_place(c, new_a, tier="frontier")
    assert_one_place(c, new_b, tier="frontier")

    c.redis.start()  # empty: no persistence
    deadline = time.monotonic() + 15
    while True:  # each router probes Redis on its next operation (>= 1 s apart) and writes back
        c.step("a", new_a)
        c.step("b", new_b)
        pins = redis_pins(c.redis.url, [new_a, new_b])
        if all(p is not None for p in pins.values()):
            break
        assert time.monotonic() < deadline, f"pins not resynced to Redis: {pins}"
        time.sleep(0.3)
    time.sleep(0.2)  # the store clears `degraded` right after its last write-back
    # cross over: each router now learns the other's outage-time run from Redis, and router B the
    # pin of a run only router A had seen before Redis came back empty
    c.step("b", only_a)
    for _ in range(2):
        c.step("b", new_a)
        c.step("a", new_b)
        for j, rid in enumerate(old):
            c.step("ab"[j % 2], rid)
    for rid in [*old, new_a, new_b]:
        assert_one_place(c, rid)
    assert_one_place(c, only_a, tier="frontier")
    assert_one_place(c, new_a, tier="frontier")
    assert_one_place(c, new_b, tier="frontier")
    assert_one_place(c, load_run, replica=load_replica)
    pins = redis_pins(c.redis.url, [*old, new_a, new_b])
    for rid in [*old, new_a, new_b]:
        last = c.served[rid][-1]
        assert pins[rid] is not None and pins[rid][:2] == (last["tier"], last["replica"]), (rid, pins[rid])
    gauges_after = {w: gauge(c.metrics(w), DEGRADED_METRIC) for w in "ab"}
    c.assert_upstreams_match(since, counts)

    assert gauges_before == {"a": 0.0, "b": 0.0}
    assert gauges_during == {"a": 1.0, "b": 1.0}
    assert gauges_after == {"a": 0.0, "b": 0.0}


# --------------------------------------------------------------------------- 5. Redis loses its data


def test_redis_restart_without_persistence_keeps_admission_count_and_pins(redis_proc):
    """Two routers' stores hold admissions and pins; Redis dies and comes back empty. After the
    resync the shared counter again equals the admissions still held (before, during and after the
    outage, on either router), and a pin only one router knew is visible to the other."""

    async def scenario() -> None:
        prefix = f"reset-{uuid.uuid4().hex[:8]}:"

        def router_store() -> FallbackStore:
            primary = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            return FallbackStore(primary, InProcessStore(), retry_interval_s=0.05)

        a, b = router_store(), router_store()
        direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
        try:
            assert all([await a.try_admit("local", 10) for _ in range(3)])
            assert all([await b.try_admit("local", 10) for _ in range(2)])
            pin = RunState(run_id="seen-by-a", tier="frontier", replica="frontier", steps_seen=2)
            await a.put(pin)
            assert await direct.active("local") == 5

            redis_proc.kill()
            assert await a.try_admit("local", 10)  # degraded: counted locally
            await b.release("local")
            assert a.degraded and b.degraded
            redis_proc.start()  # empty

            for s in (a, b):
                for _ in range(100):
                    if await s.resync_now():
                        break
                    await asyncio.sleep(0.05)
                assert not s.degraded
            await direct.close()  # its pooled connection died with the old server
            direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            held = 3 + 2 + 1 - 1
            assert await direct.active("local") == held
            assert await b.get("seen-by-a") == pin
            # and the budget is enforced on the restored count by both routers
            results = await asyncio.gather(*(s.try_admit("local", 10) for s in (a, b) for _ in range(5)))
            assert sum(results) == 10 - held and await direct.active("local") == 10
        finally:
            for s in (a, b, direct):
                await s.close()

    asyncio.run(scenario())


def test_data_loss_without_an_outage_is_healed_once_per_router(redis_proc):
    """Redis is wiped while connected (FLUSHALL, failover to an empty replica): the next operations
    find the epoch changed, each router restores its share exactly once, even with concurrent
    admissions in flight, and no admission is counted against the wiped counter before that."""

    async def scenario() -> None:
        import redis.asyncio as aioredis

        prefix = f"wipe-{uuid.uuid4().hex[:8]}:"

        def router_store() -> FallbackStore:
            primary = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
            return FallbackStore(primary, InProcessStore(), retry_interval_s=0.05)

        a, b = router_store(), router_store()
        direct = RedisStore(redis_proc.url, key_prefix=prefix, timeout_s=1.0)
        raw = aioredis.Redis.from_url(redis_proc.url)
        try:
            assert all([await a.try_admit("local", 30) for _ in range(4)])
            assert all([await b.try_admit("local", 30) for _ in range(3)])
            await b.release("local")
            pin = RunState(run_id="pinned-by-b", tier="local", replica="local-1", steps_seen=4)
            await b.put(pin)
            keys = [k async for k in raw.scan_iter(match=prefix + "*")]
            assert len(keys) >= 3
            await raw.delete(*keys)
            results = await asyncio.gather(
                *(s.try_admit("local", 30) for s in (a, b) for _ in range(5)), b.get("pinned-by-b")
            )
            assert results[:-1] == [True] * 10 and results[-1] == pin
            assert await direct.active("local") == 4 + 2 + 10
            assert (a.resets, b.resets) == (1, 1) and not a.degraded and not b.degraded
            assert await a.get("pinned-by-b") == pin
        finally:
            for s in (a, b, direct):
                await s.close()
            await raw.aclose()

    asyncio.run(scenario())
