"""ops/: the alert rules pass ``promtool check rules`` and their unit test (``promtool test rules``);
the Grafana dashboard JSON passes structural checks written from Grafana's dashboard JSON model
(no Grafana server here: it is not in Debian's archive); every dashboard and alert query parses
(promtool) and reads only metrics the router exposes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from router.server.metrics.specs import SPECS

OPS = Path(__file__).resolve().parents[1] / "ops"
DASH = OPS / "grafana" / "dashboards" / "runroute.json"
RULES = OPS / "prometheus" / "runroute-alerts.yml"
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap", "piechart"}
GRAFANA_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    assert path, "promtool not found: apt-get install -y prometheus (.ci/run installs it)"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def exposed_names() -> set[str]:
    out = set()
    for s in SPECS:
        out.add(s.exposed)
        if s.kind == "histogram":
            out |= {s.name + "_bucket", s.name + "_sum", s.name + "_count"}
    return out


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(runroute_[a-z0-9_]+)", expr))


def dashboard() -> dict:
    return json.loads(DASH.read_text())


def targets(d: dict) -> list[tuple[dict, dict]]:
    return [(p, t) for p in d["panels"] for t in p.get("targets", [])]


def test_alert_rules_check_and_unit_tests_pass():
    p = promtool("check", "rules", str(RULES))
    assert p.returncode == 0 and "SUCCESS: 4 rules found" in p.stdout, p.stdout + p.stderr
    t = promtool("test", "rules", "runroute-alerts.test.yml", cwd=RULES.parent)
    assert t.returncode == 0 and "SUCCESS" in t.stdout, t.stdout + t.stderr
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert names == {
        "RunrouteOverloaded",
        "RunrouteStoreDegraded",
        "RunrouteBundleRefused",
        "RunrouteCacheHitCollapse",
    }


def test_promtool_rules_check_can_fail(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(rate(a[5m]) >\n")
    assert promtool("check", "rules", str(bad)).returncode != 0


def test_dashboard_json_is_structurally_valid():
    d = dashboard()
    for key, typ in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list), ("time", dict)):
        assert isinstance(d.get(key), typ), key
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", d["uid"]) and d["schemaVersion"] >= 36
    assert d.get("id") is None  # provisioning assigns ids
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES and p.get("title"), p
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["w"] >= 1 and g["h"] >= 1
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip()
            for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                assert var in variables or var in GRAFANA_VARS, (p["title"], var)


def test_dashboard_has_the_operator_panels():
    d = dashboard()
    exprs = " ".join(t["expr"] for _, t in targets(d))
    for needed in (
        "runroute_step_latency_seconds_bucket",
        "runroute_cross_turn_cached_tokens_total",
        "runroute_cross_turn_reusable_tokens_total",
        "runroute_escalations_total",
        "runroute_spend_usd_total",
        "runroute_admission_verdicts_total",
        "runroute_capacity_forecast_runs_per_second",
        "runroute_flaps_total",
    ):
        assert needed in exprs, needed
    assert "histogram_quantile(0.95" in exprs and "histogram_quantile(0.5" in exprs
    assert "by (le, tier, kind)" in exprs  # p50/p95 by tier and short/long


def test_every_query_parses_and_reads_exposed_metrics(tmp_path):
    """Each dashboard query (Grafana variables substituted) becomes a recording rule for promtool to
    parse; dashboard and alert queries may read only what router/server/metrics/registry.py exposes."""
    d = dashboard()
    names = exposed_names()
    rules = []
    for i, (p, t) in enumerate(targets(d)):
        expr = (
            t["expr"]
            .replace("$__rate_interval", "5m")
            .replace("$__range", "1h")
            .replace("$__interval", "1m")
            .replace("$job", ".*")
        )
        rules.append({"record": f"dashboard:panel{p['id']}:{i}", "expr": expr})
        assert metric_names(t["expr"]) <= names, (p["title"], metric_names(t["expr"]) - names)
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = promtool("check", "rules", str(f))
    assert res.returncode == 0, res.stdout + res.stderr
    for g in yaml.safe_load(RULES.read_text())["groups"]:
        for r in g["rules"]:
            assert metric_names(r["expr"]) <= names, (r["alert"], metric_names(r["expr"]) - names)


@pytest.mark.parametrize("name", ["dashboards/runroute.yaml", "datasources/prometheus.yaml"])
def test_provisioning_files(name):
    doc = yaml.safe_load((OPS / "grafana" / "provisioning" / name).read_text())
    assert doc["apiVersion"] == 1
    if name.startswith("dashboards"):
        (prov,) = doc["providers"]
        assert prov["type"] == "file" and prov["options"]["path"]
    else:
        (ds,) = doc["datasources"]
        assert ds["type"] == "prometheus" and ds["url"].startswith("http")
