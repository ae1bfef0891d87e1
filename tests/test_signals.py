"""Observed trouble over real HTTP: ``POST /v1/runs/{id}/signal`` (validation, 404, auth), the next
step's features and run-log record see the signal, a ``verifier_failed`` escalates the run when the
benefit rule says so and not while the dwell holds; with Redis two routers see each other's
signals; the run's domain and task embedding (set once, at its first step) reach the run log.

Real uvicorn on loopback, fake vLLM + fake frontier (router.fakes), the ``learned`` policy with a
stand-in predictor whose P(frontier) rises with the signal feature (the routing mechanics, not a
model, are under test here).
"""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest
from signal_support import NEW_VF, SignalPredictor, make_settings, read_log, signal_fakes, step_request

from features.extract import FEATURE_NAMES
from features.prefix import SIGNAL_KINDS
from models.predictor import FeaturePredictor
from models.types import Predictions
from router.server.app import create_app, serve_in_thread


@pytest.fixture(scope="module")
def fakes():
    with signal_fakes() as f:
        yield f


def test_signal_kinds_match_the_published_schema():
    from router.server.openapi import RunSignalRequest

    kinds = RunSignalRequest.model_json_schema()["properties"]["kind"]["enum"]
    assert tuple(kinds) == SIGNAL_KINDS


def test_signal_endpoint_refuses_bad_input_and_unknown_runs(tmp_path, fakes):
    app = create_app(make_settings(tmp_path, fakes), bundle=SignalPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/v1/runs/nobody/signal", json={"kind": "verifier_failed"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found"
        step_request(c, "r-bad", 0)
        cases = [
            (b"{not json", 400, "invalid_json"),
            (b"[1, 2]", 422, "body_not_object"),
            (b"", 422, "body_not_object"),
            (b'{"detail": {}}', 422, "invalid_signal_kind"),
            (b'{"kind": "exploded"}', 422, "invalid_signal_kind"),
            (b'{"kind": 7}', 422, "invalid_signal_kind"),
            (b'{"kind": "other", "detail": "text"}', 422, "invalid_signal_detail"),
            (b'{"kind": "other", "why": 1}', 422, "unknown_field"),
            (b'{"kind": "other", "detail": {"x": "' + b"a" * 70000 + b'"}}', 413, "body_too_large"),
        ]
        for body, status, code in cases:
            r = c.post("/v1/runs/r-bad/signal", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (body[:40], r.text)
            err = r.json()["error"]
            assert err["code"] == code and err["message"], err
        assert c.get("/v1/runs/r-bad").json()["signals"] == []  # nothing bad was stored
        ok = c.post("/v1/runs/r-bad/signal", json={"kind": "tests_failed", "detail": {"failed": 3}})
        assert ok.status_code == 200 and ok.json()["signals"] == 1
        assert c.get("/v1/runs/r-bad").json()["signals"] == ["tests_failed"]
        assert 'runroute_run_signals_total{kind="tests_failed"} 1.0' in c.get("/metrics").text
        paths = c.get("/openapi.json").json()["paths"]
        assert "post" in paths["/v1/runs/{run_id}/signal"]


def test_signal_answers_only_the_key_that_started_the_run(tmp_path, fakes):
    app = create_app(
        make_settings(tmp_path, fakes, server={"api_keys": ["ka", "kb"]}), bundle=SignalPredictor()
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        step_request(c, "r-auth", 0, {"authorization": "Bearer ka"})
        sig = {"kind": "verifier_failed"}
        assert c.post("/v1/runs/r-auth/signal", json=sig).status_code == 401
        other = c.post("/v1/runs/r-auth/signal", json=sig, headers={"authorization": "Bearer kb"})
        assert other.status_code == 404 and other.json()["error"]["code"] == "run_not_found"
        mine = c.post("/v1/runs/r-auth/signal", json=sig, headers={"authorization": "Bearer ka"})
        assert mine.status_code == 200


def test_verifier_failed_escalates_when_the_rule_allows_and_dwell_holds(tmp_path, fakes):
    """Step 0 local; verifier_failed -> step 1 escalates (the predictor's P rises with the signal);
    steps 2-3 want to come back but the dwell (3 steps) holds; step 4 de-escalates; a second
    verifier_failed right after -> step 5 wants to escalate again, and the dwell holds it local. A
    run with no signal stays local throughout."""
    app = create_app(make_settings(tmp_path, fakes), bundle=SignalPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        tiers, reasons = [], []
        for k in range(6):
            if k in (1, 5):
                r = c.post("/v1/runs/r-esc/signal", json={"kind": "verifier_failed"})
                assert r.status_code == 200
            resp = step_request(c, "r-esc", k)
            tiers.append(resp.headers["x-runroute-tier"])
            reasons.append(c.get("/v1/runs/r-esc").json()["steps"][-1]["reason"])
        for k in range(6):
            assert step_request(c, "r-calm", k).headers["x-runroute-tier"] == "local"
        for rid in ("r-esc", "r-calm"):
            assert c.post(f"/v1/runs/{rid}/end", json={"outcome": "failure"}).status_code == 200
    assert tiers == ["local", "frontier", "frontier", "frontier", "local", "local"], (tiers, reasons)
    assert reasons[1] == "escalate" and reasons[2] == reasons[3] == "hold-dwell"
    assert reasons[4] == "de-escalate" and reasons[5] == "hold-dwell"
    log = read_log(tmp_path)
    steps = log.steps[log.steps["run_id"] == "r-esc"].sort_values("step")
    sig = [list(s) if s is not None else None for s in steps["signals"].tolist()]
    assert sig == [None, ["verifier_failed"], None, None, None, ["verifier_failed"]]
    X = np.array(steps["features"].tolist())
    assert X[:, FEATURE_NAMES.index("sig_verifier_failed")].tolist() == [0, 1, 1, 1, 1, 2]
    assert X[:, NEW_VF].tolist() == [0, 1, 0, 0, 0, 1]
    runs = log.runs.set_index("run_id")
    assert list(runs.loc["r-esc", "signals"]) == ["verifier_failed", "verifier_failed"]
    assert runs.loc["r-calm", "signals"] is None


class FlatPredictor(FeaturePredictor):
    """P(frontier) 0.1 whatever happens: a bundle that never saw a signal."""

    version = "flat-test"

    def predict_features(self, x: np.ndarray) -> Predictions:
        return Predictions(p_frontier=0.1, remaining_tokens_p50=10000.0, remaining_steps_p50=3.0)


def test_trouble_boost_escalates_a_model_that_never_saw_signals(tmp_path, fakes):
    """policy.trouble_boost: verifier_failed raises P past the threshold; the move still pays and
    stays put (P stays raised while the trouble stands: no flap back). Without the knob, the same
    signal moves nothing."""
    pol = {"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.3, "value_of_success_usd": 5.0}
    tiers = {}
    for name, boost in (("off", {}), ("on", {"verifier_failed": 0.5})):
        s = make_settings(tmp_path / name, fakes, policy={**pol, "trouble_boost": boost})
        app = create_app(s, bundle=FlatPredictor())
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
            seen = []
            for k in range(4):
                if k == 2:
                    assert c.post("/v1/runs/r-tb/signal", json={"kind": "verifier_failed"}).status_code == 200
                seen.append(step_request(c, "r-tb", k).headers["x-runroute-tier"])
            tiers[name] = seen
            reasons = [st["reason"] for st in c.get("/v1/runs/r-tb").json()["steps"]]
            if name == "on":
                assert reasons[2] == "escalate" and reasons[3] == "pinned", reasons
    assert tiers == {"off": ["local"] * 4, "on": ["local", "local", "frontier", "frontier"]}
    with pytest.raises(Exception, match="unknown signal kind"):
        make_settings(tmp_path, fakes, policy={**pol, "trouble_boost": {"exploded": 1.0}})


def test_signal_after_the_end_is_logged_on_the_run(tmp_path, fakes):
    app = create_app(make_settings(tmp_path, fakes), bundle=SignalPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        step_request(c, "r-late", 0)
        assert c.post("/v1/runs/r-late/end", json={"outcome": "success"}).status_code == 200
        r = c.post("/v1/runs/r-late/signal", json={"kind": "verifier_failed"})
        assert r.status_code == 200 and r.json()["ended"] is True
    run = read_log(tmp_path).runs.set_index("run_id").loc["r-late"]
    assert list(run["signals"]) == ["verifier_failed"] and run["outcome"] == "success"


def test_two_routers_on_redis_see_each_others_signals(tmp_path, fakes):
    prefix = f"rr-sig-{uuid.uuid4().hex[:8]}:"
    store = {"kind": "redis", "key_prefix": prefix, "redis_url": "redis://127.0.0.1:6379/0"}
    try:
        import redis

        redis.Redis(socket_connect_timeout=0.5).ping()
    except Exception:  # noqa: BLE001
        pytest.skip("no Redis at 127.0.0.1:6379")
    a = create_app(make_settings(tmp_path / "a", fakes, store=store), bundle=SignalPredictor())
    b = create_app(make_settings(tmp_path / "b", fakes, store=store), bundle=SignalPredictor())
    with serve_in_thread(a) as ua, serve_in_thread(b) as ub:
        with httpx.Client(base_url=ua, timeout=10) as ca, httpx.Client(base_url=ub, timeout=10) as cb:
            step_request(ca, "r-two", 0)
            assert cb.post("/v1/runs/r-two/signal", json={"kind": "verifier_failed"}).status_code == 200
            assert step_request(ca, "r-two", 1).headers["x-runroute-tier"] == "frontier"  # A saw B's signal
            step_request(cb, "r-two", 2)  # B never served this run: the signal is old news there too
            assert cb.post("/v1/runs/r-two/signal", json={"kind": "tests_failed"}).status_code == 200
            step_request(ca, "r-two", 3)
            assert cb.get("/v1/runs/nope/signal").status_code in (404, 405)
            ca.post("/v1/runs/r-two/end", json={})
    import pandas as pd

    steps = pd.concat([read_log(tmp_path / d).steps for d in ("a", "b")]).sort_values("step")
    assert [list(v) if v is not None else None for v in steps["signals"]] == [
        None,
        ["verifier_failed"],
        None,
        ["tests_failed"],
    ]
    X = np.array(steps["features"].tolist())
    assert X[:, FEATURE_NAMES.index("sig_verifier_failed")].tolist() == [0, 1, 1, 1]
    assert X[:, NEW_VF].tolist() == [0, 1, 0, 0]
    assert X[:, FEATURE_NAMES.index("new_sig_tests_failed")].tolist() == [0, 0, 0, 1]
