"""A refused bundle reload leaves the old bundle serving (issue 25, N6): a bundle whose files check
out (sha256 matches its manifest) but one of whose parts is broken is refused at reload, because
every part is exercised before the swap; the old bundle keeps answering reads and chats."""

from __future__ import annotations

import json
import shutil

import joblib
from test_sidecar_errors import Harness

from models.bundle import BUNDLE_FILE, MANIFEST_FILE, file_sha256

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


def _break_benefit(d) -> None:
    """The bundle at ``d`` with ``benefit = "not a model"`` and a manifest that matches the file."""
    payload = joblib.load(d / BUNDLE_FILE)
    payload["benefit"] = "not a model"
    joblib.dump(payload, d / BUNDLE_FILE, compress=3)
    man = json.loads((d / MANIFEST_FILE).read_text())
    man["bundle_sha256"] = file_sha256(d / BUNDLE_FILE)
    (d / MANIFEST_FILE).write_text(json.dumps(man))


async def test_refused_reload_keeps_the_old_bundle_serving(tmp_path, bundle_dir):
    live = tmp_path / "live"
    shutil.copytree(bundle_dir, live)
    h = Harness(tmp_path, bundle={"path": str(live), "watch_s": 0}, policy={"kind": "learned"})
    h.app = _without_injected_bundle(h, tmp_path, live)
    async with h as c:
        v1 = (await c.get("/ready")).json()["bundle"]
        assert v1 is not None
        _break_benefit(live)
        r = await c.post("/admin/reload")
        assert r.status_code == 409 and r.json()["error"]["code"] == "bundle_refused"
        assert f"still serving {v1}" in r.json()["error"]["message"]
        ready = (await c.get("/ready")).json()
        assert ready["bundle"] == v1 and ready["bundle_error"]
        hdr = {"x-run-id": "r-after", "x-runroute-domain": "airline"}
        step = await c.post("/v1/chat/completions", json={"messages": MSGS}, headers=hdr)
        assert step.status_code == 200, step.text
        got = await c.get("/v1/runs/r-after")
        assert got.status_code == 200 and got.json()["n_steps"] == 1
        assert (await c.get("/metrics")).status_code == 200


def _without_injected_bundle(h, tmp_path, live):
    """The harness's app, rebuilt to load its bundle from ``live`` (a reloadable source)."""
    from test_sidecar_errors import settings

    from router.server.app import create_app

    s = settings(tmp_path, bundle={"path": str(live), "watch_s": 0}, policy={"kind": "learned"})
    return create_app(s, upstream=h.up)
