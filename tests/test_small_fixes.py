"""The smaller items of issue 25 (N10): run ids with "/" and raw UTF-8 in ``X-Run-Id``, a
``runlog.dir`` that is a file, ``port: true``, ``/ready`` while Redis is unreachable, ``Allow`` on
405, and ``/metrics`` documented as text."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from test_sidecar_errors import MSGS, Harness, err, settings

from router.server.settings import SettingsError


async def test_run_id_with_a_slash_is_found_by_its_url(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "a/b"})
        assert r.status_code == 200 and r.headers["x-runroute-run-id"] == "a%2Fb"
        for path in ("/v1/runs/a%2Fb", "/v1/runs/a%252Fb"):  # the decoded and the header form
            got = await c.get(path)
            assert got.status_code == 200 and got.json()["n_steps"] == 1, (path, got.text)
        assert (await c.post("/v1/runs/a%2Fb/signal", json={"kind": "other"})).status_code == 200
        end = await c.post("/v1/runs/a%2Fb/end", json={"outcome": "success"})
        assert end.status_code == 200 and end.json()["run_id"] == "a%2Fb"


async def test_raw_utf8_run_id_header_is_the_metadata_run(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={"x-run-id": "中文-run".encode()}
        )
        assert r.status_code == 200
        body = {"messages": MSGS, "metadata": {"run_id": "中文-run"}}
        r2 = await c.post("/v1/chat/completions", json=body)
        assert r2.headers["x-runroute-run-id"] == r.headers["x-runroute-run-id"]
        assert r2.headers["x-runroute-step"] == "1"


def test_runlog_dir_that_is_a_file_is_a_config_error(tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    cfg = {
        "local": {"urls": ["http://127.0.0.1:9"]},
        "frontier": {"url": "http://127.0.0.1:11", "allow_no_key": True},
        "policy": {"kind": "always-local"},
        "runlog": {"dir": str(f)},
        "server": {"port": 0},
    }
    path = tmp_path / "runroute.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run(
        [sys.executable, "-m", "runroute", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "runlog.dir" in p.stderr and "not a directory" in p.stderr and "Traceback" not in p.stderr


def test_port_true_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="port"):
        settings(tmp_path, server={"port": True})


async def test_ready_is_503_while_redis_is_unreachable(tmp_path):
    store = {"kind": "redis", "redis_url": "redis://127.0.0.1:1/0"}
    h = Harness(tmp_path, store=store)
    h.up.get_replies = {"/health": (200, b"{}"), "/v1/models": (200, b"{}")}
    async with h as c:
        r = await c.get("/ready")
        assert r.status_code == 503 and r.json()["store"] == "unreachable", r.text
    async with Harness(tmp_path) as c:  # the in-process store: nothing to reach
        c_ready = await c.get("/ready")
        assert c_ready.json()["store"] == "ok"


async def test_405_names_the_allowed_methods_and_metrics_is_text(tmp_path):
    async with Harness(tmp_path) as c:
        r = await c.put("/v1/chat/completions", json={})
        assert err(r) == (405, "method_not_allowed") and r.headers["allow"] == "POST"
        doc = (await c.get("/openapi.json")).json()
    content = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "application/json" not in content and any(k.startswith("text/plain") for k in content)
