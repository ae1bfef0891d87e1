"""``GET /metrics`` against the standard tools: ``promtool check metrics`` on a live sidecar's
exposition (text and OpenMetrics), every request counted incl. rejections before routing, output
tokens, cached tokens, spend, no ``_created`` series, deprecated aliases, the README list current.

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it); a missing promtool
fails these tests rather than skipping them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.metrics.specs import DEPRECATED, SPECS
from router.server.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[1]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: apt-get install -y prometheus (.ci/run installs it)"
    return path


def check_metrics(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A sidecar (always-frontier policy; a concrete local model goes local) after a mixed load."""
    tmp = tmp_path_factory.mktemp("metrics")
    with (
        fake_in_thread("vllm", name="v0", model="local-model", base_ms=1.0) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
    ):
        s = RouterSettings.load(
            None,
            local={"urls": [v0.url], "model": "local-model"},
            frontier={
                "url": fr.base_url,
                "model": "frontier-model",
                "allow_no_key": True,
                "price_in_per_m": 2.0,
                "price_out_per_m": 8.0,
            },
            policy={"kind": "always-frontier"},
            scrape={"interval_s": 0.1},
            server={"api_keys": ["k1"], "max_body_bytes": 20000},
            runlog={"dir": str(tmp / "logs")},
        )
        with serve_in_thread(create_app(s)) as url:
            auth = {"authorization": "Bearer k1"}
            msgs = [{"role": "system", "content": "be brief " * 50}, {"role": "user", "content": "hi"}]
            c = httpx.Client(base_url=url, headers=auth, timeout=30)
            for model in ("auto", "local-model"):
                for step in range(3):
                    r = c.post(
                        "/v1/chat/completions",
                        json={
                            "model": model,
                            "messages": msgs + [{"role": "user", "content": f"s{step}"}] * step,
                        },
                        headers={"x-run-id": f"run-{model}"},
                    )
                    assert r.status_code == 200, r.text
            assert httpx.post(f"{url}/v1/chat/completions", json={"model": "auto"}).status_code == 401
            assert c.post("/v1/chat/completions", content=b"{").status_code in (400, 422)
            assert c.post("/v1/chat/completions", json={"model": "auto", "messages": "x"}).status_code == 422
            assert c.post("/v1/chat/completions", content=b"x" * 30000).status_code == 413
            assert c.get("/no/such/path").status_code == 404
            assert c.get("/v1/runs/unknown-run").status_code == 404
            text = c.get("/metrics").text
            om = c.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
            yield {"text": text, "om": om, "url": url, "settings": s}


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total, found = total + float(m.group(3)), True
    assert found, f"no sample {name}{labels}"
    return total


def test_promtool_accepts_the_exposition(served):
    """promtool lints the text format (its parser reads that format only); the OpenMetrics body
    goes through prometheus_client's strict OpenMetrics parser."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    p = check_metrics(served["text"])
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr
    fams = {f.name for f in text_string_to_metric_families(served["om"].text)}
    assert {s.name for s in SPECS} <= fams


def test_promtool_flags_a_bad_name():
    """The check can fail: a counter without _total and a non-base unit are reported."""
    bad = "# HELP x_latency_milliseconds t\n# TYPE x_latency_milliseconds counter\nx_latency_milliseconds 1\n"
    p = check_metrics(bad)
    assert p.returncode != 0 and "_total" in (p.stdout + p.stderr)


def test_every_request_is_counted_with_tokens_and_spend(served):
    t = served["text"]
    chat = "/v1/chat/completions"
    for code in ("401", "413", "422"):
        assert value(t, "runroute_requests_total", handler=chat, tier="none", code=code) >= 1
    assert value(t, "runroute_requests_total", handler="unmatched", code="404") == 1
    assert value(t, "runroute_requests_total", handler="/v1/runs/{run_id}", code="404") == 1
    assert value(t, "runroute_requests_total", handler=chat, tier="frontier", code="200") == 3
    assert value(t, "runroute_requests_total", handler=chat, tier="local", code="200") == 3
    assert value(t, "runroute_output_tokens_total", tier="frontier", model="frontier-model") > 0
    assert value(t, "runroute_cached_prompt_tokens_total", tier="local", backend="local-0") > 0
    assert value(t, "runroute_spend_usd_total", tier="frontier", model="frontier-model") > 0
    assert value(t, "runroute_runs_started_total", tier="frontier") == 1
    assert value(t, "runroute_decisions_total", tier="frontier") == 3
    xp = value(t, "runroute_cross_turn_prompt_tokens_total", tier="local")
    bound = value(t, "runroute_cross_turn_reusable_tokens_total", tier="local")
    assert 0 < bound <= xp
    assert "_created" not in t
    # the deprecated aliases carry the same figures under the old names and labels
    assert value(t, "runroute_cache_hit_tokens_total", replica="local-0") == value(
        t, "runroute_cached_prompt_tokens_total", backend="local-0"
    )
    assert not {a.old for a in DEPRECATED} & {s.exposed for s in SPECS}  # a name is exposed once
    assert f"# HELP {DEPRECATED[0].old} DEPRECATED" in t


def test_openmetrics_is_negotiated(served):
    om = served["om"]
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF") and "# UNIT runroute_step_latency_seconds seconds" in om.text
    assert "_created" not in om.text


def test_deprecated_names_can_be_turned_off():
    from router.server.metrics.registry import RouterMetrics

    body, _ = RouterMetrics(deprecated_names=False).render()
    text = body.decode()
    exposed = {s.exposed for s in SPECS}
    for a in DEPRECATED:
        if a.old not in exposed:
            assert f"# TYPE {a.old.removesuffix('_total')} " not in text, a.old
    p = check_metrics(text)
    assert p.returncode == 0, p.stdout


def test_readme_metric_list_is_current():
    from router.server.metrics.doc import main

    assert main(["--check", str(ROOT / "docs" / "metrics.md")]) == 0
