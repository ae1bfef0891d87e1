"""The read endpoints with two tenants (two client keys): ``GET /v1/runs`` (scoped, filtered,
paged), ``GET /v1/responses/{id}`` and ``/input_items`` (scoped), and a frontier that refuses the
router's own key answering ``upstream_auth`` (issue 27). Real sidecar over the protocol fakes."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

A, B = "key-a", "key-b"
KEYS = {"server": {"api_keys": [A, B]}}
MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


def bearer(k: str) -> dict[str, str]:
    return {"authorization": f"Bearer {k}"}


def chat(url: str, key: str, rid: str, domain: str) -> None:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "auto", "messages": MSGS, "max_tokens": 4},
        headers={"x-run-id": rid, "x-runroute-domain": domain, **bearer(key)},
    )
    assert r.status_code == 200, r.text


def test_runs_list_is_per_tenant_filtered_and_paged(sidecar):
    with sidecar(**KEYS) as (url, app):
        for i in range(5):
            chat(url, A, f"a{i}", "airline" if i % 2 == 0 else "retail")
        chat(url, B, "b0", "airline")
        assert httpx.post(url + "/v1/runs/a1/end", json={}, headers=bearer(A)).status_code == 200

        def page(key: str, **params):
            r = httpx.get(url + "/v1/runs", params=params, headers=bearer(key))
            assert r.status_code == 200, r.text
            return r.json()

        ids_a = [r["run_id"] for r in page(A)["data"]]
        assert ids_a == ["a0", "a1", "a2", "a3", "a4"]  # in start order; b0 is not A's
        assert [r["run_id"] for r in page(B)["data"]] == ["b0"]
        assert [r["run_id"] for r in page(A, state="ended")["data"]] == ["a1"]
        assert [r["run_id"] for r in page(A, state="active", domain="airline")["data"]] == ["a0", "a2", "a4"]
        assert page(B, domain="retail")["data"] == []
        # paging: two at a time, the cursor is the previous page's last_id
        p1 = page(A, limit=2)
        assert [r["run_id"] for r in p1["data"]] == ["a0", "a1"] and p1["has_more"] is True
        p2 = page(A, limit=2, after=p1["last_id"])
        p3 = page(A, limit=2, after=p2["last_id"])
        assert [r["run_id"] for r in p2["data"] + p3["data"]] == ["a2", "a3", "a4"]
        assert p3["has_more"] is False
        row = p1["data"][0]
        assert row["n_steps"] == 1 and row["tiers"] and row["protocols"] == ["chat"]
        # a cursor naming another tenant's run reveals nothing
        r = httpx.get(url + "/v1/runs", params={"after": "b0"}, headers=bearer(A))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_after"
        for params, code in (
            ({"state": "sleeping"}, "invalid_state"),
            ({"limit": "0"}, "invalid_limit"),
            ({"limit": "x"}, "invalid_limit"),
            ({"limit": "101"}, "invalid_limit"),
        ):
            r = httpx.get(url + "/v1/runs", params=params, headers=bearer(A))
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (params, r.text)
        assert httpx.get(url + "/v1/runs").status_code == 401


def test_stored_responses_are_read_back_by_their_tenant_only(sidecar):
    with sidecar(**KEYS) as (url, app):
        ca = openai.OpenAI(base_url=url + "/v1", api_key=A, max_retries=0)
        cb = openai.OpenAI(base_url=url + "/v1", api_key=B, max_retries=0)
        first = ca.responses.create(model="auto", input="find the refund policy", max_output_tokens=8)
        second = ca.responses.create(
            model="auto",
            previous_response_id=first.id,
            input=[{"role": "user", "content": "and the baggage policy"}],
            max_output_tokens=8,
        )
        got = ca.responses.retrieve(second.id)
        assert got.id == second.id and got.previous_response_id == first.id
        assert [o.type for o in got.output] == [o.type for o in second.output]
        items = ca.responses.input_items.list(second.id)
        assert [it.type for it in items.data] == ["message"] and items.data[0].role == "user"
        # key B: the same 404 as for an id that was never stored
        for client in (cb,):
            with pytest.raises(openai.NotFoundError) as ei:
                client.responses.retrieve(second.id)
            assert ei.value.body["code"] == "response_not_found"
            with pytest.raises(openai.NotFoundError):
                client.responses.input_items.list(second.id)
        with pytest.raises(openai.NotFoundError):
            ca.responses.retrieve("resp_never_stored")
        # paging and order of input items
        many = ca.responses.create(
            model="auto",
            input=[{"role": "user", "content": f"part {i}"} for i in range(5)],
            max_output_tokens=8,
        )
        desc = httpx.get(f"{url}/v1/responses/{many.id}/input_items", params={"limit": 2}, headers=bearer(A))
        body = desc.json()
        assert body["has_more"] is True and len(body["data"]) == 2
        assert body["data"][0]["content"][0]["text"] == "part 4"  # newest first, as OpenAI's default
        rest = httpx.get(
            f"{url}/v1/responses/{many.id}/input_items",
            params={"limit": 10, "after": body["last_id"]},
            headers=bearer(A),
        ).json()
        assert [x["content"][0]["text"] for x in rest["data"]] == ["part 2", "part 1", "part 0"]
        asc = httpx.get(
            f"{url}/v1/responses/{many.id}/input_items", params={"order": "asc"}, headers=bearer(A)
        ).json()
        assert asc["data"][0]["content"][0]["text"] == "part 0"
        r = httpx.get(f"{url}/v1/responses/{many.id}/input_items", params={"order": "up"}, headers=bearer(A))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_order"


def test_a_frontier_refusing_the_routers_key_is_upstream_auth(sidecar, proto_fakes):
    os.environ["RR_TEST_WRONG_KEY"] = "sk-wrong"
    frontiers = [
        {
            "kind": "openai",
            "name": "openai",
            "url": proto_fakes["openai"].url,
            "model": "frontier-model",
            "api_key_env": "RR_TEST_WRONG_KEY",
            "default": True,
        }
    ]
    with sidecar(frontiers=frontiers, fallback={"enabled": False}) as (url, app):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "frontier-model", "messages": MSGS, "max_tokens": 4},
        )
        assert r.status_code == 502, r.text
        e = r.json()["error"]
        assert e["code"] == "upstream_auth" and "openai" in e["message"] and "router" in e["message"]
