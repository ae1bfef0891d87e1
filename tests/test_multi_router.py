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

import time

import pytest
from multi_router_support import (
    DEGRADED_METRIC,
    REPLICAS,
    Cluster,
    assert_one_place,
    gauge,
    hash_replica,
    redis_pins,
    run_ids,
    start_load_pinned_run,
    wait_for,
)

pytestmark = pytest.mark.redis

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
    c.b.start()
    for rid in everyone:  # the restarted router has no memory of these runs but Redis' pins
        rec = c.step("b", rid)
        assert rec["status"] == 200 and (rec["tier"], rec["replica"]) == before[rid], (rid, rec, before[rid])
        assert int(rec["step"]) == len(c.served[rid]) - 1  # the step count survived too
        c.step("a", rid)
    for rid in everyone:
        assert_one_place(c, rid)
    assert before[load_run] == ("local", load_replica) and before[front[0]][0] == "frontier"
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
    wait_for(  # the store clears `degraded` right after its last write-back
        lambda: all(gauge(c.metrics(w), DEGRADED_METRIC) == 0.0 for w in "ab"), "still degraded"
    )
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
