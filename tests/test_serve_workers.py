"""``runroute serve --workers N`` (router/server/workers.py): N processes behind one port.

- Without Redis the CLI refuses N > 1 (the memory store lives inside one process: two workers would
  each pin a run on their own).
- With ``store.kind: redis`` (this module's private redis-server, as the multi-router tests use),
  two workers share run state: requests go out on fresh connections, several at once, so the kernel
  hands them to both workers; every run keeps one tier and one replica and its step numbers count
  0, 1, 2, ... with no gap or repeat, the run logs (one file per worker pid) show runs whose
  steps were served by both workers, and every ``/metrics`` scrape, whichever worker answers it,
  counts all the steps (one merged view).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from multi_router_support import ROOT, free_port, router_config, run_ids

pytestmark = pytest.mark.redis


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNROUTE_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_workers_refused_with_the_memory_store(tmp_path: Path) -> None:
    cfg = tmp_path / "runroute.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"local": {"urls": ["http://127.0.0.1:9"], "model": "m"}, "policy": {"kind": "always-local"}}
        )
    )
    cp = subprocess.run(
        [sys.executable, "-m", "runroute", "serve", "--config", str(cfg), "--port", "0", "--workers", "2"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cp.returncode != 0
    assert "store.kind: redis" in cp.stderr + cp.stdout


def _step(url: str, run_id: str, n: int, model: str = "auto") -> dict:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": f"agent for {run_id}"},
            *({"role": "user", "content": f"step {i} of {run_id}"} for i in range(n + 1)),
        ],
        "max_tokens": 4,
    }
    # a fresh connection per request (no keep-alive): each one goes to whichever worker accepts it
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Run-Id": run_id}, timeout=20)
    h = r.headers
    return {
        "status": r.status_code,
        "tier": h.get("x-runroute-tier"),
        "replica": h.get("x-runroute-replica"),
    } | {
        "step": h.get("x-runroute-step"),
        "reason": h.get("x-runroute-reason"),
    }


def _chat_requests(text: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "runroute_requests_total" and s.labels.get("handler") == "/v1/chat/completions"
    )


def test_two_workers_keep_each_run_on_one_replica(tmp_path, redis_proc, fakes, bundle_dir) -> None:
    cfg_path = tmp_path / "runroute.yaml"
    cfg_path.write_text(yaml.safe_dump(router_config(tmp_path, fakes, bundle_dir, redis_proc.url)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runroute", "serve", "--config", str(cfg_path), "--port", str(port)]
            + ["--workers", "2"],
            cwd=ROOT,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/ready", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the second worker may answer /ready a moment after the first
        auto, front = run_ids("wk-auto", 8), run_ids("wk-front", 2)
        served: dict[str, list[dict]] = {r: [] for r in auto + front}
        with ThreadPoolExecutor(8) as ex:
            for k in range(6):  # rounds; within a round the runs' steps go out concurrently
                jobs = {
                    rid: ex.submit(
                        _step, url, rid, k, "frontier-model" if (k == 0 and rid in front) else "auto"
                    )
                    for rid in served
                }
                for rid, f in jobs.items():
                    served[rid].append(f.result())
        time.sleep(2.5)  # every worker shares its series every second
        for _ in range(4):  # scrapes on fresh connections reach either worker: the same totals
            text = httpx.get(url + "/metrics", timeout=10).text
            assert _chat_requests(text) == len(served) * 6, text[:2000]
            assert 'runroute_store_degraded{pid="' in text  # gauges per worker
    finally:
        proc.terminate()
        proc.wait(30)
    for rid, recs in served.items():
        assert {r["status"] for r in recs} == {200}, recs
        assert len({(r["tier"], r["replica"]) for r in recs}) == 1, (rid, recs)
        assert [int(r["step"]) for r in recs] == list(range(6)), (rid, recs)
    for rid in front:
        assert served[rid][0]["tier"] == "frontier"
        assert {r["reason"] for r in served[rid][1:]} == {"pinned"}
    # one run log per worker; runs served by both
    by_pid: dict[str, set[str]] = {}
    for f in (tmp_path / "logs").glob("runlog-*.jsonl"):
        pid = f.name.split("-")[1]
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("record") == "step" and rec.get("run_id") in served:
                by_pid.setdefault(pid, set()).add(rec["run_id"])
    assert len(by_pid) == 2, {k: len(v) for k, v in by_pid.items()}
    a, b = by_pid.values()
    assert a & b, "no run had steps on both workers"


def test_merged_metrics_sum_counters_and_keep_gauges_per_worker(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from router.server.metrics.registry import RouterMetrics
    from router.server.metrics.workers import WorkerMetrics

    a, b = RouterMetrics(), RouterMetrics()
    a.request_served("/v1/runs", 200)
    b.request_served("/v1/runs", 200)
    b.request_served("/v1/runs", 404)
    (tmp_path / "metrics-1.prom").write_text(b.render(None)[0].decode())  # pid 1 is alive (init)
    (tmp_path / "metrics-999999999.prom").write_text(b.render(None)[0].decode())  # a dead worker
    share = WorkerMetrics(a, tmp_path)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(share.render(None)[0].decode())
        for s in fam.samples
    }
    ok = ("runroute_requests_total", (("code", "200"), ("handler", "/v1/runs"), ("tier", "none")))
    missing = ("runroute_requests_total", (("code", "404"), ("handler", "/v1/runs"), ("tier", "none")))
    assert got[ok] == 2.0 and got[missing] == 1.0  # summed over the live workers, the dead one left out
    pids = {dict(k[1]).get("pid") for k in got if k[0] == "runroute_store_degraded"}
    assert pids == {"1", str(os.getpid())}
