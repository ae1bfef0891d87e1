"""Access (issue 17): runs belong to the key that started them, /admin needs the admin key, /metrics
optionally a metrics key, and /openapi.json is served and valid (schemathesis loads it)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from test_sidecar_errors import Harness, err

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
A, B, ADMIN, METRICS = "key-a", "key-b", "key-admin", "key-metrics"


def bearer(k: str) -> dict[str, str]:
    return {"authorization": f"Bearer {k}"}


KEYS = {"server": {"api_keys": [A, B], "admin_keys": [ADMIN], "metrics_keys": [METRICS]}}


async def test_runs_belong_to_the_key_that_started_them(tmp_path):
    async with Harness(tmp_path, **KEYS) as c:
        for rid in ("ra", "rb"):
            r = await c.post(
                "/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": rid, **bearer(A)}
            )
            assert r.status_code == 200
        # key B: read and end answer 404, as for a run that does not exist
        assert err(await c.get("/v1/runs/ra", headers=bearer(B))) == (404, "run_not_found")
        assert err(await c.post("/v1/runs/ra/end", json={}, headers=bearer(B))) == (404, "run_not_found")
        assert err(await c.get("/v1/runs/nope", headers=bearer(B))) == (404, "run_not_found")
        # the owner still reads, continues and ends it
        got = (await c.get("/v1/runs/ra", headers=bearer(A))).json()
        assert got["n_steps"] == 1
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "ra", **bearer(A)}
        )
        assert r.status_code == 200 and r.headers["x-runroute-step"] == "1"
        assert (await c.post("/v1/runs/ra/end", json={}, headers=bearer(A))).status_code == 200
        # run ids are per key (issue 25): B's "ra" is B's own run, A's stays A's
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "ra", **bearer(B)}
        )
        assert r.status_code == 200 and r.headers["x-runroute-step"] == "0"
        assert (await c.get("/v1/runs/ra", headers=bearer(A))).json()["n_steps"] == 2
        assert (await c.get("/v1/runs/rb", headers=bearer(A))).status_code == 200
        assert err(await c.get("/v1/runs/rb")) == (401, "invalid_api_key")


async def test_admin_needs_the_admin_key(tmp_path):
    async with Harness(tmp_path, **KEYS) as c:
        assert err(await c.post("/admin/reload")) == (401, "invalid_api_key")
        assert err(await c.post("/admin/reload", headers=bearer(A))) == (403, "admin_key_required")
        assert err(await c.post("/admin/reload", headers=bearer("junk"))) == (401, "invalid_api_key")
        # the admin key passes the check (no bundle source configured here: 409, not an auth error)
        assert err(await c.post("/admin/reload", headers=bearer(ADMIN))) == (409, "no_bundle_source")
    async with Harness(tmp_path, server={"api_keys": [A]}) as c:  # client keys but no admin key
        assert err(await c.post("/admin/reload", headers=bearer(A))) == (403, "admin_key_required")


async def test_admin_without_any_keys_is_loopback_only(tmp_path):
    h = Harness(tmp_path)
    async with h as c:
        assert err(await c.post("/admin/reload")) == (409, "no_bundle_source")  # ASGI client: 127.0.0.1
    remote = httpx.ASGITransport(app=h.app, client=("203.0.113.9", 5555))
    async with h:
        async with httpx.AsyncClient(transport=remote, base_url="http://r") as rc:
            assert err(await rc.post("/admin/reload")) == (403, "admin_loopback_only")


async def test_metrics_behind_a_key_when_configured(tmp_path):
    async with Harness(tmp_path, **KEYS) as c:
        assert err(await c.get("/metrics")) == (401, "invalid_api_key")
        assert err(await c.get("/metrics", headers=bearer(A))) == (401, "invalid_api_key")
        for k in (METRICS, ADMIN):
            r = await c.get("/metrics", headers=bearer(k))
            assert r.status_code == 200 and "runroute_" in r.text
    async with Harness(tmp_path) as c:
        assert (await c.get("/metrics")).status_code == 200  # open by default


def test_admin_keys_must_differ_from_client_keys(tmp_path):
    from test_sidecar_errors import settings

    from router.server.settings import SettingsError

    with pytest.raises(SettingsError, match="admin_keys must differ"):
        settings(tmp_path, server={"api_keys": [A], "admin_keys": [A]})


async def test_openapi_is_served_and_valid(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.get("/openapi.json")
        assert r.status_code == 200
        doc = r.json()
    assert doc["openapi"].startswith("3.")
    paths = set(doc["paths"])
    assert {"/v1/chat/completions", "/v1/runs/{run_id}", "/v1/runs/{run_id}/end", "/admin/reload"} <= paths
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/ChatCompletionRequest"
    req = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert req["properties"]["messages"]["minItems"] == 1
    schema = schemathesis.openapi.from_dict(doc)  # refuses an invalid document
    assert len([op for op in schema.get_all_operations()]) == sum(len(v) for v in doc["paths"].values())
