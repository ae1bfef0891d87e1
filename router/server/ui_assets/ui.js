// runroute live page: polls /ui/data (router/server/ui.py) and fills the cards. No dependencies.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "runroute-ui-key";
  const m = /(?:^|[#&])key=([^&]+)/.exec(window.location.hash);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", window.location.pathname);
  }
  let refreshS = 2;
  let waitingForKey = false;
  const plotUrls = {};

  function headers() {
    const k = sessionStorage.getItem(KEY);
    return k ? { Authorization: "Bearer " + k } : {};
  }
  function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%"; }
  function num(x, d) { return x === null || x === undefined ? "–" : Number(x).toFixed(d); }
  function setNum(id, value, text) {
    const el = $(id);
    el.dataset.value = value === null || value === undefined ? "" : String(value);
    el.textContent = text;
  }
  function cell(tr, text, value) {
    const td = document.createElement("td");
    td.textContent = text;
    if (value !== undefined) td.dataset.value = value === null ? "" : String(value);
    tr.appendChild(td);
    return td;
  }
  function rows(id, list, fill) {
    const body = $(id);
    body.replaceChildren();
    for (const item of list) {
      const tr = document.createElement("tr");
      fill(tr, item);
      body.appendChild(tr);
    }
  }
  function humanSeconds(s) {
    if (s < 120) return s.toFixed(0) + " s";
    if (s < 7200) return (s / 60).toFixed(0) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function render(d) {
    refreshS = d.refresh_s || refreshS;
    setNum("runs-total", d.runs_inflight_total, String(d.runs_inflight_total));
    rows("runs-rows", d.runs_inflight, (tr, r) => {
      tr.dataset.tier = r.tier; tr.dataset.domain = r.domain;
      cell(tr, r.tier); cell(tr, r.domain); cell(tr, String(r.runs), r.runs);
    });
    const fs = d.frontier_share;
    setNum("frontier-share", fs.runs, pct(fs.runs));
    setNum("frontier-budget", fs.budget, fs.budget === null ? "none set (ui.frontier_share_budget)" : pct(fs.budget));
    setNum("started-local", d.runs_started.local || 0, String(d.runs_started.local || 0));
    setNum("started-frontier", d.runs_started.frontier || 0, String(d.runs_started.frontier || 0));
    const bar = $("frontier-bar");
    bar.style.width = pct(fs.runs || 0);
    bar.classList.toggle("over", fs.budget !== null && fs.runs !== null && fs.runs > fs.budget);
    const line = $("budget-line");
    line.hidden = fs.budget === null;
    if (fs.budget !== null) line.style.left = pct(fs.budget);
    rows("cache-rows", d.replicas, (tr, r) => {
      tr.dataset.backend = r.backend;
      const td = cell(tr, pct(r.hit_rate), r.hit_rate);
      td.dataset.field = "hit_rate";
      const mini = document.createElement("span");
      mini.className = "mini";
      const fillEl = document.createElement("i");
      fillEl.style.width = pct(r.hit_rate || 0);
      mini.appendChild(fillEl);
      td.appendChild(mini);
      tr.insertBefore(document.createElement("td"), td).textContent = r.backend;
      cell(tr, pct(r.upper_bound), r.upper_bound).dataset.field = "upper_bound";
      cell(tr, r.healthy === null ? "–" : r.healthy ? "yes" : "no", r.healthy);
      cell(tr, num(r.inflight, 0), r.inflight).dataset.field = "inflight";
      cell(tr, num(r.running, 0) + " / " + num(r.waiting, 0));
      cell(tr, pct(r.kv_usage), r.kv_usage);
    });
    const a = d.admission;
    setNum("adm-active", a.active_runs, num(a.active_runs, 0));
    setNum("adm-util", a.utilisation_ratio, pct(a.utilisation_ratio));
    setNum("adm-short", a.predicted_short_step_seconds,
      a.predicted_short_step_seconds === null ? "–" : num(a.predicted_short_step_seconds, 2) + " s");
    const v = Object.entries(a.verdicts).map(([k, n]) => k + " " + n).join(", ");
    $("adm-verdicts").textContent = v || "none yet";
    rows("capacity-rows", d.capacity, (tr, c) => {
      cell(tr, humanSeconds(Number(c.horizon_s)));
      cell(tr, num(c.forecast_runs_per_second, 3), c.forecast_runs_per_second);
      cell(tr, num(c.recommended_replicas, 0), c.recommended_replicas);
      cell(tr, pct(c.expected_spill_ratio), c.expected_spill_ratio);
      cell(tr, pct(c.expected_reject_ratio), c.expected_reject_ratio);
    });
    const s = d.spend;
    setNum("spend-hour", s.per_hour_usd, num(s.per_hour_usd, 4));
    setNum("spend-total", s.total_usd, num(s.total_usd, 6));
    $("spend-window").textContent = humanSeconds(s.window_s);
    $("spend-tiers").textContent =
      Object.entries(s.by_tier).map(([t, x]) => t + " $" + num(x, 6)).join(", ") || "nothing spent yet";
    renderReport(d.report);
  }

  function renderReport(rep) {
    $("report-note").textContent = rep.plots.length
      ? rep.plots.length + " plots in " + rep.dir + (rep.scorecard_generated_at ? ", scorecard of " + rep.scorecard_generated_at : "")
      : "no scorecard plots in " + rep.dir + " (ui.report_dir): run `make demo`";
    const box = $("plots");
    const wanted = new Set(rep.plots.map((p) => p.name));
    for (const fig of Array.from(box.children)) if (!wanted.has(fig.dataset.name)) fig.remove();
    for (const p of rep.plots) {
      if (plotUrls[p.name]) continue;
      plotUrls[p.name] = "loading";
      fetch(p.url, { headers: headers() })
        .then((r) => (r.ok ? r.blob() : null))
        .then((blob) => {
          if (!blob) { delete plotUrls[p.name]; return; }
          plotUrls[p.name] = URL.createObjectURL(blob);
          const fig = document.createElement("figure");
          fig.dataset.name = p.name;
          const img = document.createElement("img");
          img.src = plotUrls[p.name];
          img.alt = p.name;
          const cap = document.createElement("figcaption");
          cap.textContent = p.name;
          fig.append(img, cap);
          box.appendChild(fig);
        });
    }
  }

  async function tick() {
    const status = $("status");
    try {
      const r = await fetch("/ui/data", { headers: headers(), cache: "no-store" });
      if (r.status === 401 || r.status === 403) {
        waitingForKey = true;  // polling resumes when a key is entered
        $("keyform").hidden = false;
        status.textContent = "needs a metrics or admin key";
        status.className = "status err";
        return;
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const d = await r.json();
      render(d);
      $("keyform").hidden = true;
      status.textContent = "updated " + new Date(d.generated_at * 1000).toLocaleTimeString();
      status.className = "status";
      status.dataset.generatedAt = String(d.generated_at);
    } catch (e) {
      status.textContent = "cannot reach the router: " + e.message;
      status.className = "status err";
    } finally {
      if (!waitingForKey) setTimeout(tick, refreshS * 1000);
    }
  }

  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("key").value);
    if (waitingForKey) { waitingForKey = false; tick(); }
  });
  tick();
})();
