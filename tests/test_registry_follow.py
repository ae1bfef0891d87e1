"""The MLflow registry the router follows: train twice, promote, a running router switches v1 -> v2
by following ``@champion`` and refuses a corrupt v3 while v2 keeps serving — against a sqlite
tracking store and against an MLflow tracking server process backed by PostgreSQL. Also: the
logged model loads without this package's training code, its dataset inputs, and
``RUNROUTE_BUNDLE__MLFLOW_URI=... runroute serve`` on embedded defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from registry_support import (
    corrupt_version,
    free_port,
    mlflow_server,
    postgres_database,
    toy_log,
    train,
    wait_for,
)

from models.bundle import resolve_registered
from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings, SettingsError

CHAMP = "models:/runroute-bundle@champion"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fakes():
    with (
        fake_in_thread("vllm", name="v0", model="local-model", base_ms=1.0) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
    ):
        yield v0, fr


def _settings(tmp_path: Path, fakes, tracking_uri: str) -> RouterSettings:
    v0, fr = fakes
    return RouterSettings.load(
        None,
        local={"urls": [v0.url], "model": "local-model"},
        frontier={"url": fr.base_url, "model": "frontier-model", "allow_no_key": True},
        policy={"kind": "learned"},
        bundle={"mlflow_uri": CHAMP, "mlflow_tracking_uri": tracking_uri, "watch_s": 0.1},
        scrape={"interval_s": 0},
        runlog={"dir": str(tmp_path / "logs")},
    )


def _chat(url: str, run: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"hello from {run}"}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-run-id": run}, timeout=30)


def _ready(url: str) -> dict:
    return httpx.get(f"{url}/ready", timeout=10).json()


def _refused(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith('runroute_bundle_reloads_total{result="refused"}'):
            return float(line.split()[-1])
    return 0.0


def follow_champion(tmp_path: Path, fakes, uri: str, artifact_root: Path) -> None:
    from mlflow import MlflowClient

    log = toy_log(tmp_path / "toy.parquet")
    v1 = train(log, tmp_path / "b1", uri, weak=True)
    assert v1.mlflow["version"] == "1" and v1.mlflow["promoted"], v1.mlflow  # the first champion
    with serve_in_thread(create_app(_settings(tmp_path, fakes, uri)), timeout_s=120) as url:
        r = _ready(url)
        assert (r["bundle"], r["bundle_registry_version"]) == (v1.bundle.version, "1")
        assert _chat(url, "run-a").status_code == 200

        v2 = train(log, tmp_path / "b2", uri, promote_if_better=True)
        assert v2.mlflow["version"] == "2" and v2.mlflow["promoted"], v2.mlflow  # beats v1 on the holdout
        wait_for(
            lambda: _ready(url)["bundle_registry_version"] == "2", "the router to follow @champion to v2"
        )
        assert _ready(url)["bundle"] == v2.bundle.version != v1.bundle.version
        assert _chat(url, "run-b").status_code == 200

        # registered without --promote-if-better: the alias does not move
        v3 = train(log, tmp_path / "b3", uri)
        assert v3.mlflow["version"] == "3" and not v3.mlflow["promoted"], v3.mlflow
        assert resolve_registered(CHAMP, uri) == "2"
        # v3's stored bytes go bad, then an operator moves the alias to it by hand
        corrupt_version(uri, "runroute-bundle", "3", artifact_root)
        MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias(
            "runroute-bundle", "champion", "3"
        )
        resp = httpx.post(f"{url}/admin/reload", timeout=60)
        assert resp.status_code == 409, resp.text
        err = resp.json()["error"]
        assert err["code"] == "bundle_refused" and "sha256" in err["message"]
        wait_for(lambda: _refused(url) >= 1, "the refusal to be counted")
        r = _ready(url)
        assert (r["bundle"], r["bundle_registry_version"]) == (v2.bundle.version, "2")
        assert "sha256" in r["bundle_error"]
        ok = _chat(url, "run-c")
        assert ok.status_code == 200 and ok.headers["x-runroute-run-id"] == "run-c"  # v2 keeps serving


def test_router_follows_champion_sqlite(tmp_path, fakes):
    from training.mlflow_log import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(uri, "runroute-train", tmp_path / "artifacts")
    follow_champion(tmp_path, fakes, uri, tmp_path / "artifacts")


def test_router_follows_champion_tracking_server_on_postgres(tmp_path, fakes):
    art = tmp_path / "artifacts"
    art.mkdir()
    with postgres_database() as db, mlflow_server(db, art) as server:
        follow_champion(tmp_path, fakes, server, art)


def test_logged_model_is_self_contained_with_dataset_inputs(tmp_path):
    from mlflow import MlflowClient

    from models.bundle import file_sha256
    from training.mlflow_log import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(uri, "runroute-train", tmp_path / "artifacts")
    log = toy_log(tmp_path / "toy.parquet")
    res = train(log, tmp_path / "b1", uri)
    client = MlflowClient(tracking_uri=uri)
    inputs = client.get_run(res.mlflow["run_id"]).inputs.dataset_inputs
    by_ctx = {}
    for di in inputs:
        tags = {t.key: t.value for t in di.tags}
        by_ctx[tags["mlflow.data.context"]] = (di.dataset, tags)
    assert set(by_ctx) == {"run-log", "training", "holdout"}
    ds, tags = by_ctx["run-log"]
    assert tags["sha256"] == file_sha256(log) and ds.digest == tags["sha256"][:32] and ds.name == log.name
    assert by_ctx["training"][1]["sha256"] == res.dataset.sha256()
    assert int(by_ctx["holdout"][1]["n_steps"]) == len(res.holdout) > 0

    # load it in a fresh interpreter, elsewhere, with this package's serving and training code blocked:
    # only the model's logged code and its requirements are used
    script = f"""
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('training', 'runroute', 'router'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import mlflow, mlflow.pyfunc
from mlflow.models import Model
mlflow.set_tracking_uri({uri!r})
local = mlflow.artifacts.download_artifacts('models:/runroute-bundle/1', dst_path='model')
model = mlflow.pyfunc.load_model(local)
import models.bundle
info = Model.load(local)
example = info.load_input_example(local)
out = model.predict(example)
print(json.dumps({{"code": models.bundle.__file__, "cols": list(out.columns), "n": len(out),
    "inputs": [c["name"] for c in info.signature.inputs.to_dict()],
    "reqs": open(local + '/requirements.txt').read().split()}}))
"""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    p = subprocess.run(
        [sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(got["code"]).resolve().is_relative_to(elsewhere.resolve())  # the logged code, not ours
    assert got["n"] == 3 and "p_frontier" in got["cols"]
    from features.extract import FEATURE_NAMES

    assert got["inputs"] == list(FEATURE_NAMES)
    pins = {r.split("==")[0] for r in got["reqs"] if "==" in r}
    assert {"runroute", "lightgbm", "scikit-learn", "numpy", "pandas", "pydantic", "mlflow"} <= pins


def test_env_registry_source_replaces_the_embedded_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNROUTE_BUNDLE__MLFLOW_URI", CHAMP)
    monkeypatch.setenv("RUNROUTE_BUNDLE__PATH", "")
    s = RouterSettings.load(
        None,
        frontier={"url": "http://127.0.0.1:9", "allow_no_key": True},
        bundle={"path": str(tmp_path / "bundle")},
    )
    assert s.bundle.path is None and s.bundle.mlflow_uri == CHAMP
    monkeypatch.delenv("RUNROUTE_BUNDLE__MLFLOW_URI")
    monkeypatch.setenv("RUNROUTE_BUNDLE__PATH", str(tmp_path / "b"))
    s = RouterSettings.load(
        None, frontier={"url": "http://127.0.0.1:9", "allow_no_key": True}, bundle={"mlflow_uri": CHAMP}
    )
    assert s.bundle.mlflow_uri is None and s.bundle.path == tmp_path / "b"
    monkeypatch.delenv("RUNROUTE_BUNDLE__PATH")
    with pytest.raises(SettingsError, match="models:/NAME@ALIAS"):
        RouterSettings.load(
            None,
            frontier={"url": "http://127.0.0.1:9", "allow_no_key": True},
            bundle={"mlflow_uri": "runs:/x"},
        )


def test_runroute_serve_on_embedded_defaults_from_the_registry(tmp_path):
    """``RUNROUTE_BUNDLE__MLFLOW_URI=models:/runroute-bundle@champion runroute serve``: no config,
    no bundle trained, the champion serves."""
    from training.mlflow_log import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(uri, "runroute-train", tmp_path / "artifacts")  # not ./mlruns of the checkout
    res = train(toy_log(tmp_path / "toy.parquet"), tmp_path / "b1", uri)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RUNROUTE_")},
        "RUNROUTE_BUNDLE__MLFLOW_URI": CHAMP,
        "RUNROUTE_BUNDLE__PATH": "",
        "MLFLOW_TRACKING_URI": uri,
    }
    cli = Path(sys.executable).parent / "runroute"
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.Popen(
        [str(cli), "serve", "--port", str(port)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready():
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode(errors="replace")[-3000:])
            try:
                return httpx.get(url + "/ready", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return None

        r = wait_for(ready, "runroute serve on embedded defaults", timeout_s=150, every_s=0.5)
        assert r["bundle"] == res.bundle.version and r["bundle_registry_version"] == "1", r
        assert _chat(url, "cli-run").status_code == 200
        assert not (work / "runroute-bundle").exists()  # nothing was trained at start-up
    finally:
        os.killpg(proc.pid, 2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)
