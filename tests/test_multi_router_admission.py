"""Two routers share one admission budget in Redis (in-process stores and live routers over HTTP)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multi_router_support import (
    REPLICAS,
    RedisProc,
    RouterProc,
    free_port,
    router_config,
    run_ids,
)

from router.server.state.fallback import FallbackStore
from router.server.state.redis_store import RedisStore

pytestmark = pytest.mark.redis

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
    rs = [RouterProc(n, path, free_port(), tmp / f"router-{n}.log") for n in ("p", "q")]
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
