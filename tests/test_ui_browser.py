"""The live page ``/ui`` in a real headless Chromium (Debian's chromium + chromium-driver, installed
by .ci/run; selenium pointed at /usr/bin/chromedriver, nothing downloaded): after a scripted load
through the real sidecar over the protocol fakes, the page loads with no console errors, its
numbers equal what ``/metrics`` (and ``GET /v1/runs``) say, the scorecard's plot is shown, the data
needs the metrics key, and a screenshot is written to the test's output folder (issue 27).
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runroute.ui_shot import browser, open_ui, unavailable

MK = "metrics-key"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def _metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {MK}"}).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _sum(m: dict, name: str, **where: str) -> float:
    return sum(v for labels, v in m.get(name, []) if all(labels.get(k) == x for k, x in where.items()))


def _drive(url: str, rid: str, turns: int, model: str = "auto") -> None:
    """A chat tool loop of ``turns`` tool results (the fakes answer text after 3)."""
    msgs: list[dict] = [
        {"role": "system", "content": "You are a support agent. " + " ".join(f"r{i}" for i in range(150))},
        {"role": "user", "content": f"find the refund policy for {rid}"},
    ]
    for _ in range(turns + 1):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": model, "messages": msgs, "tools": TOOLS, "max_tokens": 16},
            headers={"x-run-id": rid, "x-runroute-domain": "airline" if rid.endswith("a") else "retail"},
        )
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        msgs.append({k: v for k, v in msg.items() if v is not None})
        calls = msg.get("tool_calls") or []
        if not calls:
            return
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})


READ_DOM = """
const ids = {};
for (const id of ["runs-total", "started-local", "started-frontier", "frontier-share", "frontier-budget",
                  "adm-active", "spend-total"]) ids[id] = document.getElementById(id).dataset.value;
const runs = Array.from(document.querySelectorAll("#runs-rows tr")).map(
  (tr) => [tr.dataset.tier, tr.dataset.domain, tr.children[2].dataset.value]);
const cache = Array.from(document.querySelectorAll("#cache-rows tr")).map(
  (tr) => [tr.dataset.backend, tr.querySelector("td[data-field=hit_rate]").dataset.value]);
return {ids, runs, cache, plots: document.querySelectorAll("#plots img").length};
"""


def test_live_page_in_chromium_matches_metrics(sidecar, tmp_path, request):
    why = unavailable()
    if why is not None:  # .ci/run installs both: a missing one is a broken environment
        pytest.fail(f"no headless Chromium: {why}")
    from selenium.webdriver.common.by import By

    report = tmp_path / "report"
    report.mkdir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(report / "aiq.png")
    plt.close(fig)
    (report / "scorecard.json").write_text('{"generated_at": "2026-12-01T00:00:00Z"}')
    ui = {"report_dir": str(report), "frontier_share_budget": 0.2, "refresh_s": 0.5}
    with sidecar(server={"metrics_keys": [MK]}, ui=ui) as (url, app):
        # the data and the plots need the metrics key; the page itself holds no figures
        assert httpx.get(url + "/ui").status_code == 200
        assert httpx.get(url + "/ui/data").status_code == 401
        assert httpx.get(url + "/ui/plots/aiq.png").status_code == 401
        for i, rid in enumerate(("r1a", "r2r", "r3a", "r4r")):
            _drive(url, rid, turns=3 if i < 3 else 1)
        _drive(url, "r5a", turns=1, model="frontier-model")  # a frontier run
        assert httpx.post(url + "/v1/runs/r2r/end", json={"outcome": "success"}).status_code == 200
        with browser() as driver:
            open_ui(driver, url, key=MK)
            # the page polls every 0.5 s; the load is over, so wait for one more render and read it
            gen = driver.find_element(By.ID, "status").get_attribute("data-generated-at")
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(driver, 10).until(
                lambda d: d.find_element(By.ID, "status").get_attribute("data-generated-at") != gen
            )
            WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#plots img"))
            # the figures are final now (the load is over); let one more poll render before reading
            gen = driver.find_element(By.ID, "status").get_attribute("data-generated-at")
            WebDriverWait(driver, 10).until(
                lambda d: d.find_element(By.ID, "status").get_attribute("data-generated-at") != gen
            )
            m = _metrics(url)
            active = httpx.get(url + "/v1/runs", params={"state": "active"}).json()["data"]
            # one read of the rendered DOM (the page re-renders every refresh_s)
            dom = driver.execute_script(READ_DOM)
            num = {k: (None if v in (None, "") else float(v)) for k, v in dom["ids"].items()}
            assert num["runs-total"] == len(active) == 4
            rows = {(t, d): float(n) for t, d, n in dom["runs"]}
            want: dict[tuple[str, str], float] = {}
            for r in active:
                key = (r["tiers"][-1], r["domain"])
                want[key] = want.get(key, 0) + 1
            assert rows == want
            local = _sum(m, "runroute_runs_started_total", tier="local")
            frontier = _sum(m, "runroute_runs_started_total", tier="frontier")
            assert num["started-local"] == local and num["started-frontier"] == frontier and frontier >= 1
            assert num["frontier-share"] == pytest.approx(frontier / (local + frontier))
            assert num["frontier-budget"] == 0.2
            assert num["adm-active"] == _sum(m, "runroute_admission_active_runs")
            assert num["spend-total"] == pytest.approx(_sum(m, "runroute_spend_usd_total"))
            assert num["spend-total"] > 0
            seen = 0
            for b, hit in dom["cache"]:
                cached = _sum(m, "runroute_cross_turn_cached_tokens_total", backend=b)
                prompt = _sum(m, "runroute_cross_turn_prompt_tokens_total", backend=b)
                if prompt:
                    assert float(hit) == pytest.approx(cached / prompt) and 0 < float(hit) <= 1
                    seen += 1
                else:
                    assert hit in (None, "")
            assert seen >= 1 and dom["plots"] == 1
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
            shot = tmp_path / "ui.png"
            driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
            print(f"screenshot of /ui: {shot}")


def test_demo_screenshot_step_says_why_it_skips(monkeypatch, tmp_path):
    """Without a browser the demo's screenshot step prints the reason and writes nothing (the
    step with Chromium present ran in `make demo`: runroute-report/ui.png)."""
    import runroute.ui_shot
    from runroute.demo import _screenshot_ui

    monkeypatch.setattr(
        runroute.ui_shot, "unavailable", lambda: "/usr/bin/chromium not found (apt-get install chromium)"
    )
    said: list[str] = []
    _screenshot_ui("http://127.0.0.1:9", tmp_path / "ui.png", said.append)
    assert said == ["ui screenshot skipped: /usr/bin/chromium not found (apt-get install chromium)"]
    assert not (tmp_path / "ui.png").exists()
