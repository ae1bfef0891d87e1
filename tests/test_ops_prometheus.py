"""The dashboard and the alert rules against a real Prometheus (Debian's ``prometheus`` package, the
same one that gives promtool) scraping a live sidecar: every dashboard query evaluates, the operator
panels return data, the alert rules load healthy. Prometheus negotiates OpenMetrics on its own,
so this also scrapes that exposition.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from registry_support import free_port, wait_for

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

OPS = Path(__file__).resolve().parents[1] / "ops"
pytestmark = pytest.mark.slow


def _agent_steps(c: httpx.Client, run: str, model: str, steps: int) -> None:
    msgs = [{"role": "system", "content": "rules " * 300}, {"role": "user", "content": f"task {run}"}]
    for k in range(steps):
        r = c.post("/v1/chat/completions", json={"model": model, "messages": msgs}, headers={"x-run-id": run})
        assert r.status_code == 200, r.text
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"continue {k}"}]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    exe = shutil.which("prometheus")
    assert exe, "prometheus not found: apt-get install -y prometheus (.ci/run installs it)"
    tmp = tmp_path_factory.mktemp("prom")
    with (
        fake_in_thread("vllm", name="v0", model="local-model", base_ms=1.0) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
    ):
        s = RouterSettings.load(
            None,
            local={"urls": [v0.url], "model": "local-model", "gpu_usd_per_hour": 2.5},
            frontier={"url": fr.base_url, "model": "frontier-model", "allow_no_key": True},
            policy={"kind": "always-local"},
            scrape={"interval_s": 0.2},
            runlog={"dir": str(tmp / "logs")},
        )
        with serve_in_thread(create_app(s)) as url:
            port = free_port()
            cfg = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(OPS / "prometheus" / "runroute-alerts.yml")],
                "scrape_configs": [
                    {"job_name": "runroute", "static_configs": [{"targets": [url[len("http://") :]]}]}
                ],
            }
            (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
            log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed below
            proc = subprocess.Popen(
                [
                    exe,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            api = f"http://127.0.0.1:{port}/api/v1"

            def query(q: str) -> dict:
                r = httpx.get(f"{api}/query", params={"query": q}, timeout=10)
                return r.json()

            def scrapes(n: int):
                def ok():
                    if proc.poll() is not None:
                        raise AssertionError((tmp / "prometheus.log").read_text()[-2000:])
                    try:
                        res = query('count_over_time(up{job="runroute"}[5m])')["data"]["result"]
                    except (httpx.HTTPError, KeyError, json.JSONDecodeError):
                        return False
                    return res and float(res[0]["value"][1]) >= n

                wait_for(ok, f"{n} scrapes of the sidecar", timeout_s=90, every_s=0.25)

            try:
                c = httpx.Client(base_url=url, timeout=30)
                scrapes(1)
                for i in range(4):  # traffic between scrapes so rate() sees increases
                    _agent_steps(c, f"run-{i}", "auto", 4)
                    _agent_steps(c, f"front-{i}", "frontier-model", 2)
                    scrapes(2 + i)
                assert query('up{job="runroute"}')["data"]["result"][0]["value"][1] == "1"
                yield query, api
            finally:
                os.killpg(proc.pid, 15)
                proc.wait(20)
                log.close()


def _dashboard_queries() -> list[tuple[str, str]]:
    d = json.loads((OPS / "grafana" / "dashboards" / "runroute.json").read_text())
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            q = (
                t["expr"]
                .replace("$__rate_interval", "20s")
                .replace("$__range", "5m")
                .replace("$__interval", "1s")
                .replace('"$job"', '"runroute"')
            )
            out.append((f"{p['title']} / {t['legendFormat']}", q))
    return out


def test_every_dashboard_query_evaluates_and_operator_panels_have_data(prom):
    query, _ = prom
    empty = []
    for title, q in _dashboard_queries():
        res = query(q)
        assert res["status"] == "success", (title, q, res)
        values = [float(r["value"][1]) for r in res["data"]["result"]]
        if not values:
            empty.append(title)
        assert all(not math.isinf(v) for v in values), (title, values)
    must = (
        "Step latency p50 / p95 by tier and short/long / p50 {{tier}} {{kind}}",
        "Cross-turn cache hit vs upper bound (local tier) / cache hit",
        "Cross-turn cache hit vs upper bound (local tier) / upper bound",
        "Spend per hour (USD) by tier and model / {{tier}} {{model}}",
        "Spend / hour (USD) / USD/h",
        "Admission verdicts / {{verdict}}",
        "Capacity forecast / replicas holding the SLO, {{horizon_s}}s",
        "Requests / s / steps/s",
        "Escalation and decision reasons / {{tier}}: {{reason}}",
    )
    assert not set(must) & set(empty), sorted(set(must) & set(empty))


def test_alert_rules_load_healthy_in_prometheus(prom):
    _, api = prom
    groups = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {
        "RunrouteOverloaded",
        "RunrouteStoreDegraded",
        "RunrouteBundleRefused",
        "RunrouteCacheHitCollapse",
    }
    wait_for(
        lambda: all(
            r["health"] == "ok"
            for g in httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
            for r in g["rules"]
        ),
        "every rule evaluated",
        timeout_s=30,
    )
    # a healthy sidecar fires none of them
    firing = httpx.get(f"{api}/alerts", timeout=10).json()["data"]["alerts"]
    assert not [a for a in firing if a["state"] == "firing"], firing
