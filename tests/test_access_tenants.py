"""Tenants are walls (issue 25, N1-N3): with client keys A and B (and an admin and a metrics key),
no request of A reads, continues, ends, signals or squats a run of B, in any of the ways an id can
name a run (the ``X-Run-Id`` header, an ended run's id, a Responses ``previous_response_id``, the
opening hash), and no answer tells B's ids from unused ones. Run with the in-process store and with
the Redis store (the shared server at 127.0.0.1:6379 under a key prefix of this test's own, removed
afterwards)."""

from __future__ import annotations

import itertools
import uuid

import orjson
import pytest
from test_sidecar_errors import USAGE, Harness, err

from router.server.hotpath.upstream import FakeCall, FakeReply

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
A, B, ADMIN, METRICS = "key-a", "key-b", "key-admin", "key-metrics"
KEYS = {"api_keys": [A, B], "admin_keys": [ADMIN], "metrics_keys": [METRICS]}
SECRET = "B's private task text " * 40


def bearer(k: str) -> dict[str, str]:
    return {"authorization": f"Bearer {k}"}


class Recorder:
    """A chat upstream that answers with unique ids and keeps every body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self._n = itertools.count()

    def __call__(self, call: FakeCall) -> FakeReply:
        body = orjson.loads(call.body)
        self.bodies.append(body)
        return FakeReply(
            body=orjson.dumps(
                {
                    "id": f"chatcmpl-{next(self._n)}",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": USAGE,
                }
            )
        )


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        yield {"kind": "memory"}
        return
    import redis

    prefix = f"t25-tenants-{uuid.uuid4().hex[:8]}:"
    yield {"kind": "redis", "redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    keys = list(r.scan_iter(match=prefix + "*"))  # only this test's own keys
    if keys:
        r.delete(*keys)
    r.close()


def harness(tmp_path, store, handler=None):
    # the local replicas speak chat only: a Responses step is translated, its chain expanded
    local = {"urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"], "protocols": ["chat"]}
    return Harness(tmp_path, handler or Recorder(), server=KEYS, store=store, local=local)


async def step(c, key, rid=None, msgs=MSGS):
    h = bearer(key) | ({"x-run-id": rid} if rid is not None else {})
    return await c.post("/v1/chat/completions", json={"messages": msgs}, headers=h)


async def test_an_ended_run_keeps_its_tenant(tmp_path, store):
    """N1: B's ended run r1 is not A's to take over: A's r1 is a new run of A's, B's history stays B's."""
    async with harness(tmp_path, store) as c:
        assert (await step(c, B, "r1")).status_code == 200
        assert (await c.post("/v1/runs/r1/end", json={}, headers=bearer(B))).status_code == 200
        r = await step(c, A, "r1")
        assert r.status_code == 200 and r.headers["x-runroute-step"] == "0"
        assert r.headers["x-runroute-run-id"] == "r1"
        mine = (await c.get("/v1/runs/r1", headers=bearer(A))).json()
        assert mine["run_id"] == "r1" and mine["n_steps"] == 1 and not mine["ended"]
        theirs = await c.get("/v1/runs/r1", headers=bearer(B))
        assert theirs.status_code == 200 and theirs.json()["ended"] and theirs.json()["n_steps"] == 1
        # B's next step on r1 starts B's new run: A's step is not in it, and A's run goes on
        assert (await step(c, B, "r1")).status_code == 200
        assert (await c.get("/v1/runs/r1", headers=bearer(A))).json()["n_steps"] == 1
        assert (await step(c, A, "r1")).headers["x-runroute-step"] == "1"


async def test_responses_chain_of_another_tenant_is_an_unknown_id(tmp_path, store):
    """N2: A's ``previous_response_id`` naming B's response behaves exactly as a made-up id:
    B's stored input never reaches A's upstream request, live or ended."""
    up = Recorder()
    async with harness(tmp_path, store, up) as c:
        r = await c.post("/v1/responses", json={"input": SECRET}, headers=bearer(B))
        assert r.status_code == 200
        rid_b, run_b = r.json()["id"], r.headers["x-runroute-run-id"]
        # B's own chain is expanded (the local backend speaks chat): B's input is in the request
        r = await c.post(
            "/v1/responses", json={"previous_response_id": rid_b, "input": "go on"}, headers=bearer(B)
        )
        assert r.status_code == 200 and r.headers["x-runroute-run-id"] == run_b
        assert SECRET.strip() in orjson.dumps(up.bodies[-1]).decode()
        for phase in ("live", "ended"):
            if phase == "ended":
                assert (await c.post(f"/v1/runs/{run_b}/end", json={}, headers=bearer(B))).status_code == 200
            answers = []
            for prev in (rid_b, f"resp_unknown_{phase}"):
                n = len(up.bodies)
                r = await c.post(
                    "/v1/responses",
                    json={"previous_response_id": prev, "input": "continue"},
                    headers=bearer(A),
                )
                sent = up.bodies[n:]
                assert r.status_code == 200, r.text
                assert all(SECRET.strip() not in orjson.dumps(b).decode() for b in sent)
                answers.append((r.status_code, len(sent), [len(b["messages"]) for b in sent]))
                assert r.headers["x-runroute-run-id"] != run_b
            assert answers[0] == answers[1], answers
        assert err(await c.get(f"/v1/runs/{run_b}", headers=bearer(A))) == (404, "run_not_found")


async def test_ids_cannot_be_probed_or_squatted(tmp_path, store):
    """N3: a step, read, end or signal of A on B's live id answers as on an unused id, and leaves
    B's run alone; whoever uses an id first does not block the other tenant."""
    async with harness(tmp_path, store) as c:
        assert (await step(c, B, "rb")).status_code == 200
        for rid in ("rb", "never-used"):  # the same answers for B's live id and an unused one
            assert err(await c.get(f"/v1/runs/{rid}", headers=bearer(A))) == (404, "run_not_found")
            assert err(await c.post(f"/v1/runs/{rid}/end", json={}, headers=bearer(A))) == (
                404,
                "run_not_found",
            )
            sig = await c.post(f"/v1/runs/{rid}/signal", json={"kind": "tests_failed"}, headers=bearer(A))
            assert err(sig) == (404, "run_not_found")
        probes = [await step(c, A, rid) for rid in ("rb", "never-used")]
        assert [(p.status_code, p.headers["x-runroute-step"]) for p in probes] == [(200, "0"), (200, "0")]
        # B's run did not see A's step, signal or end
        got = (await c.get("/v1/runs/rb", headers=bearer(B))).json()
        assert got["n_steps"] == 1 and not got["ended"] and got["signals"] == []
        assert (await step(c, B, "rb")).headers["x-runroute-step"] == "1"
        # squatting: A uses "sq" first; B's "sq" is B's own new run
        assert (await step(c, A, "sq")).status_code == 200
        r = await step(c, B, "sq")
        assert r.status_code == 200 and r.headers["x-runroute-step"] == "0"


async def test_colliding_openings_of_two_tenants_are_two_runs(tmp_path, store):
    """N3: the same opening without a run header from A and B: two runs with different hash ids,
    each continued by its own tenant; unknown ``previous_response_id`` values of two tenants too."""
    turn2 = [*MSGS, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    async with harness(tmp_path, store) as c:
        ra, rb = await step(c, A), await step(c, B)
        assert ra.status_code == rb.status_code == 200
        ida, idb = ra.headers["x-runroute-run-id"], rb.headers["x-runroute-run-id"]
        assert ida != idb and ida.startswith("h-") and idb.startswith("h-")
        for key, rid in ((A, ida), (B, idb)):
            r = await step(c, key, msgs=turn2)
            assert r.status_code == 200, r.text
            assert (r.headers["x-runroute-run-id"], r.headers["x-runroute-step"]) == (rid, "1")
        unknown = {"previous_response_id": "resp_nobody", "input": "x"}
        ua = await c.post("/v1/responses", json=unknown, headers=bearer(A))
        ub = await c.post("/v1/responses", json=unknown, headers=bearer(B))
        assert ua.status_code == ub.status_code == 200
        assert ua.headers["x-runroute-run-id"] != ub.headers["x-runroute-run-id"]


async def test_admin_and_metrics_keys_are_not_tenants(tmp_path, store):
    async with harness(tmp_path, store) as c:
        assert (await step(c, A, "ra")).status_code == 200
        for k in (ADMIN, METRICS):
            assert err(await step(c, k, "ra")) == (401, "invalid_api_key")
            assert err(await c.get("/v1/runs/ra", headers=bearer(k))) == (401, "invalid_api_key")
        assert (await c.get("/metrics", headers=bearer(METRICS))).status_code == 200
