"""Admission under overload, on loopback: admitted runs keep their short-step SLO, new runs shed.

Algorithm:

1. Start ``replicas`` fake vLLM servers with limited capacity (``concurrency`` requests served at
   once, the rest wait FIFO; per step ``base_ms + prefill_ms_per_token x uncached +
   decode_ms_per_token x out_tokens``), a fake frontier (``frontier_ttft_ms``, fast decode), and the
   sidecar (``always-local`` sticky policy, no bundle needed) with admission on or off.
2. Capacity (runs/s) = ``replicas x concurrency / (idle step time x mean steps per run)``: the run
   start rate at which the replicas' slots are busy all the time. New runs arrive as a Poisson
   process whose rate rises in steps (``multipliers`` x capacity, ``phase_s`` each, by default 0.5x,
   1x, 2x, 3x). Each run is a closed loop: ``steps`` steps (uniform), each waits for its answer
   then a tool pause (uniform ``pause_s``) before the next; priority ``batch`` with probability
   ``batch_share`` (else ``interactive``), tenant ``free`` with probability ``free_share`` (spill budget
   0: its shed runs are rejected) else ``paid``. Rejected runs are not retried (bounded run).
3. Each run's first response says what admission did (``x-runroute-admission``; 429 +
   ``run_rejected_overload`` + ``Retry-After``). Measured on the client: every step's latency and
   status, and ``GET /v1/capacity`` at each phase end.
4. The same seed runs twice, admission on then off, and two rich tables are printed: per mode
   (runs admitted / spilled / rejected, steps of admitted runs that failed, their short-step
   p50/p95/p99 and SLO attainment, wrong codes) and per phase (verdicts, admitted-step p95,
   the capacity endpoint's forecast and recommended replicas). Checks: with admission on, zero
   failed steps of admitted runs, their short-step p95 within the SLO, every shed run spilled
   (frontier, reason ``admission-spill-*``) or rejected with the right code; with it off, how far
   p95 goes beyond the SLO.

Usage: ``.venv/bin/python bench/admission_load.py [--seed 0] [--phase-s 10]`` (about 2 minutes);
exit status 1 when an admission-on check fails. ``run_load(LoadSpec(...), admission=True)`` is the
function the smaller pytest version (tests/test_admission_live.py) calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import orjson


@dataclass
class LoadSpec:
    seed: int = 0
    replicas: int = 2
    concurrency: int = 2
    base_ms: float = 20.0
    prefill_ms_per_token: float = 0.02
    decode_ms_per_token: float = 20.0
    out_tokens: int = 16
    prompt_words: int = 300
    steps: tuple[int, int] = (4, 6)
    pause_s: tuple[float, float] = (0.5, 1.5)
    phase_s: float = 10.0
    multipliers: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
    batch_share: float = 0.3
    free_share: float = 0.2
    slo_short_step_s: float = 1.0
    frontier_ttft_ms: float = 300.0
    drain_s: float = 60.0
    scrape_s: float = 0.5

    @property
    def step_s(self) -> float:
        """Idle service time of one step (the fakes' latency model, prefix cached)."""
        return (self.base_ms + self.decode_ms_per_token * self.out_tokens) / 1000.0

    @property
    def mean_steps(self) -> float:
        return (self.steps[0] + self.steps[1]) / 2.0

    @property
    def capacity_runs_per_s(self) -> float:
        return self.replicas * self.concurrency / (self.step_s * self.mean_steps)


@dataclass
class RunPlan:
    run_id: str
    start_s: float
    phase: int
    n_steps: int
    pauses: list[float]
    priority: str
    tenant: str


@dataclass
class StepObs:
    k: int
    status: int
    latency_s: float
    tier: str | None
    reason: str | None
    code: str | None = None
    err_type: str | None = None
    retry_after: str | None = None


@dataclass
class RunObs:
    plan: RunPlan
    verdict: str | None = None  # admit-local | spill | reject | frontier | error
    steps: list[StepObs] = field(default_factory=list)
    finished: bool = False


def plan_runs(spec: LoadSpec) -> list[RunPlan]:
    rng = random.Random(spec.seed)
    cap = spec.capacity_runs_per_s
    out: list[RunPlan] = []
    for ph, m in enumerate(spec.multipliers):
        t = ph * spec.phase_s
        end = t + spec.phase_s
        while True:
            t += rng.expovariate(m * cap)
            if t >= end:
                break
            n = rng.randint(*spec.steps)
            out.append(
                RunPlan(
                    run_id=f"r{spec.seed}-{len(out):04d}",
                    start_s=t,
                    phase=ph,
                    n_steps=n,
                    pauses=[rng.uniform(*spec.pause_s) for _ in range(n)],
                    priority="batch" if rng.random() < spec.batch_share else "interactive",
                    tenant="free" if rng.random() < spec.free_share else "paid",
                )
            )
    return out


def _prompt(run_id: str, words: int) -> str:
    return f"You are agent {run_id}. " + " ".join(f"w{i % 89}" for i in range(words))


async def _agent(sess: aiohttp.ClientSession, url: str, spec: LoadSpec, plan: RunPlan, t0: float) -> RunObs:
    obs = RunObs(plan)
    await asyncio.sleep(max(0.0, t0 + plan.start_s - time.monotonic()))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": _prompt(plan.run_id, spec.prompt_words)},
        {"role": "user", "content": f"task {plan.run_id}: find the answer"},
    ]
    hdr = {
        "x-run-id": plan.run_id,
        "x-run-priority": plan.priority,
        "x-tenant": plan.tenant,
        "content-type": "application/json",
    }
    for k in range(plan.n_steps):
        body = orjson.dumps({"model": "auto", "messages": msgs, "max_tokens": spec.out_tokens})
        ts = time.perf_counter()
        try:
            async with sess.post(url + "/v1/chat/completions", data=body, headers=hdr) as r:
                data = await r.read()
                status, h = r.status, r.headers
        except (aiohttp.ClientError, asyncio.TimeoutError):
            obs.steps.append(StepObs(k, 599, time.perf_counter() - ts, None, None, "client_error"))
            break
        lat = time.perf_counter() - ts
        st = StepObs(k, status, lat, h.get("x-runroute-tier"), h.get("x-runroute-reason"))
        if status != 200:
            try:
                err = orjson.loads(data)["error"]
                st.code, st.err_type = err.get("code"), err.get("type")
            except (orjson.JSONDecodeError, KeyError, TypeError):
                st.code = "unparsed"
            st.retry_after = h.get("retry-after")
        obs.steps.append(st)
        if k == 0:
            obs.verdict = h.get("x-runroute-admission") or ("reject" if status == 429 else None)
            if obs.verdict is None:
                obs.verdict = "frontier" if st.tier == "frontier" else "error"
        if status != 200:
            break
        content = orjson.loads(data)["choices"][0]["message"].get("content") or ""
        msgs.append({"role": "assistant", "content": content})
        msgs.append({"role": "user", "content": f"tool output {k}: ok"})
        await asyncio.sleep(plan.pauses[k])
    else:
        obs.finished = True
    if obs.steps and obs.steps[0].status == 200:
        async with sess.post(f"{url}/v1/runs/{plan.run_id}/end", json={"outcome": "success"}) as r:
            await r.read()
    return obs


def _settings(spec: LoadSpec, fakes: list[Any], frontier: Any, logdir: str, admission: bool) -> Any:
    from router.server.settings import RouterSettings

    cycle = spec.step_s + sum(spec.pause_s) / 2
    return RouterSettings.load(
        None,
        local={
            "urls": [f.url for f in fakes],
            "model": "local-model",
            "prefill_s_per_token": spec.prefill_ms_per_token / 1000,
            "ttft_base_s": spec.base_ms / 1000,
        },
        frontier={
            "url": frontier.base_url,
            "model": "frontier-model",
            "api_key_env": None,
            "allow_no_key": True,
        },
        policy={"kind": "always-local", "sticky": True},
        scrape={"interval_s": spec.scrape_s},
        runlog={"dir": logdir},
        fallback={"enabled": False},
        admission={
            "enabled": admission,
            "slo_short_step_s": spec.slo_short_step_s,
            "base_short_step_s": spec.step_s,
            "decode_s_per_token": spec.decode_ms_per_token / 1000,
            "replica_slots": spec.concurrency,
            "default_run_token_rate": spec.out_tokens / cycle,
            "tenant_spill_limits": {"free": 0},
            "rate_tau_s": 10.0,
            "forecast_bucket_s": 2.0,
            "forecast_alpha": 0.5,
            "sweep_s": 0,
        },
    )


@dataclass
class LoadResult:
    spec: LoadSpec
    admission: bool
    runs: list[RunObs]
    capacity: list[dict[str, Any]]  # GET /v1/capacity at each phase end
    wall_s: float


async def _drive(spec: LoadSpec, url: str, plans: list[RunPlan]) -> tuple[list[RunObs], list[dict[str, Any]]]:
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=spec.drain_s + spec.phase_s * len(spec.multipliers))
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as sess:
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(_agent(sess, url, spec, p, t0)) for p in plans]
        caps = []
        for ph in range(len(spec.multipliers)):
            await asyncio.sleep(max(0.0, t0 + (ph + 1) * spec.phase_s - time.monotonic()))
            async with sess.get(url + "/v1/capacity") as r:
                caps.append(await r.json())
        deadline = t0 + len(spec.multipliers) * spec.phase_s + spec.drain_s
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        obs = []
        for p, t in zip(plans, tasks, strict=True):
            obs.append(t.result() if t in done and t.exception() is None else RunObs(p, verdict="unfinished"))
        return obs, caps


def run_load(spec: LoadSpec, admission: bool) -> LoadResult:
    """One bounded load run (fakes + sidecar on loopback, all in this process); see the docstring."""
    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread

    knobs = dict(
        model="local-model",
        base_ms=spec.base_ms,
        prefill_ms_per_token=spec.prefill_ms_per_token,
        decode_ms_per_token=spec.decode_ms_per_token,
        max_concurrency=spec.concurrency,
    )
    plans = plan_runs(spec)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        fakes = [
            stack.enter_context(fake_in_thread("vllm", name=f"v{i}", **knobs)) for i in range(spec.replicas)
        ]
        fr = stack.enter_context(
            fake_in_thread(
                "frontier", model="frontier-model", ttft_ms=spec.frontier_ttft_ms, tokens_per_s=2000
            )
        )
        app = create_app(_settings(spec, fakes, fr, os.path.join(tmp, "logs"), admission))
        url = stack.enter_context(serve_in_thread(app))
        runs, caps = asyncio.run(_drive(spec, url, plans))
    return LoadResult(spec, admission, runs, caps, time.monotonic() - t_start)


# ---------------------------------------------------------------------------------------- figures
def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarise(res: LoadResult) -> dict[str, Any]:
    """The figures both tables and the checks read."""
    spec = res.spec
    adm = [r for r in res.runs if r.verdict == "admit-local"]
    spilled = [r for r in res.runs if r.verdict == "spill"]
    rejected = [r for r in res.runs if r.verdict == "reject"]
    other = [r for r in res.runs if r.verdict not in ("admit-local", "spill", "reject")]
    lat = [s.latency_s for r in adm for s in r.steps if s.status == 200]
    failed_adm = sum(1 for r in adm for s in r.steps if s.status != 200)
    bad_spill = sum(
        1
        for r in spilled
        for s in r.steps
        if s.status != 200 or s.tier != "frontier" or not (s.reason or "").startswith("admission-spill")
    )
    bad_reject = 0
    retry = []
    for r in rejected:
        s = r.steps[0]
        ok = s.status == 429 and s.code == "run_rejected_overload" and s.err_type == "rate_limit_error"
        ok = ok and s.retry_after is not None and s.retry_after.isdigit() and int(s.retry_after) >= 1
        bad_reject += 0 if ok else 1
        if s.retry_after and s.retry_after.isdigit():
            retry.append(int(s.retry_after))
    shed = {p: 0 for p in ("interactive", "batch")}
    seen = {p: 0 for p in ("interactive", "batch")}
    for r in res.runs:
        seen[r.plan.priority] += 1
        if r.verdict in ("spill", "reject"):
            shed[r.plan.priority] += 1
    p95 = _pct(lat, 95)
    return {
        "slo": spec.slo_short_step_s,
        "runs": len(res.runs),
        "admitted": len(adm),
        "spilled": len(spilled),
        "rejected": len(rejected),
        "other": len(other),
        "adm_steps": len(lat),
        "adm_failed_steps": failed_adm,
        "p50": _pct(lat, 50),
        "p95": p95,
        "p99": _pct(lat, 99),
        "slo_attainment": (sum(1 for x in lat if x <= spec.slo_short_step_s) / len(lat)) if lat else math.nan,
        "p95_over_slo": p95 / spec.slo_short_step_s if lat else math.nan,
        "bad_spill_steps": bad_spill,
        "bad_rejects": bad_reject,
        "retry_after": (min(retry), max(retry)) if retry else None,
        "shed_share": {p: (shed[p] / seen[p] if seen[p] else 0.0) for p in shed},
        "wall_s": res.wall_s,
    }


def phase_rows(res: LoadResult) -> list[dict[str, Any]]:
    spec = res.spec
    rows = []
    for ph, m in enumerate(spec.multipliers):
        runs = [r for r in res.runs if r.plan.phase == ph]
        lat = [s.latency_s for r in runs if r.verdict == "admit-local" for s in r.steps if s.status == 200]
        cap = res.capacity[ph] if ph < len(res.capacity) else None
        f5 = cap["forecast"][0] if cap else None
        rows.append(
            {
                "phase": ph,
                "x_capacity": m,
                "arrivals": len(runs),
                "admitted": sum(r.verdict == "admit-local" for r in runs),
                "spilled": sum(r.verdict == "spill" for r in runs),
                "rejected": sum(r.verdict == "reject" for r in runs),
                "p95": _pct(lat, 95),
                "active": cap["local"]["active_runs"] if cap else None,
                "forecast": f5["runs_per_s"] if f5 else None,
                "replicas": f5["recommended_replicas"] if f5 else None,
            }
        )
    return rows


def checks(on: dict[str, Any]) -> list[tuple[str, bool]]:
    return [
        ("zero failed steps of admitted runs", on["adm_failed_steps"] == 0),
        ("admitted short-step p95 within the SLO", on["p95"] <= on["slo"]),
        ("new runs were shed under overload", on["spilled"] + on["rejected"] > 0),
        ("spilled runs served by the frontier, reason admission-spill-*", on["bad_spill_steps"] == 0),
        ("rejects: 429 run_rejected_overload + Retry-After", on["bad_rejects"] == 0),
        (
            "batch shed at least as often as interactive",
            on["shed_share"]["batch"] >= on["shed_share"]["interactive"],
        ),
        ("no run outside admit/spill/reject", on["other"] == 0),
    ]


def print_tables(on: LoadResult, off: LoadResult) -> bool:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    spec = on.spec
    s_on, s_off = summarise(on), summarise(off)
    con.print(
        f"capacity {spec.capacity_runs_per_s:.2f} runs/s ({spec.replicas} replicas x {spec.concurrency} slots, "
        f"idle step {spec.step_s * 1000:.0f} ms, {spec.mean_steps:g} steps/run, pauses {spec.pause_s} s); "
        f"arrivals {' -> '.join(f'{m:g}x' for m in spec.multipliers)} for {spec.phase_s:g} s each; "
        f"short-step SLO {spec.slo_short_step_s:g} s; seed {spec.seed}"
    )
    t = Table(title="admission on vs off (same seed, same arrivals)")
    for c in ("mode", "runs", "admitted", "spilled", "rejected", "adm. steps", "adm. steps failed"):
        t.add_column(c, justify="right")
    for c in (
        "short p50 s",
        "short p95 s",
        "short p99 s",
        "SLO met",
        "p95 / SLO",
        "shed int/batch",
        "wall s",
    ):
        t.add_column(c, justify="right")
    for name, s in (("on", s_on), ("off", s_off)):
        t.add_row(
            name,
            str(s["runs"]),
            str(s["admitted"]),
            str(s["spilled"]),
            str(s["rejected"]),
            str(s["adm_steps"]),
            str(s["adm_failed_steps"]),
            f"{s['p50']:.3f}",
            f"{s['p95']:.3f}",
            f"{s['p99']:.3f}",
            f"{s['slo_attainment']:.1%}",
            f"{s['p95_over_slo']:.2f}x",
            f"{s['shed_share']['interactive']:.0%}/{s['shed_share']['batch']:.0%}",
            f"{s['wall_s']:.0f}",
        )
    con.print(t)
    for res, name in ((on, "on"), (off, "off")):
        pt = Table(title=f"per phase, admission {name}")
        for c in ("phase", "x capacity", "arrivals", "admitted", "spilled", "rejected", "adm. p95 s"):
            pt.add_column(c, justify="right")
        for c in ("active runs", "forecast 5 min runs/s", "recommended replicas"):
            pt.add_column(c, justify="right")
        for r in phase_rows(res):
            pt.add_row(
                str(r["phase"]),
                f"{r['x_capacity']:g}",
                str(r["arrivals"]),
                str(r["admitted"]),
                str(r["spilled"]),
                str(r["rejected"]),
                f"{r['p95']:.3f}",
                str(r["active"]),
                f"{r['forecast']:.2f}" if r["forecast"] is not None else "-",
                str(r["replicas"]),
            )
        con.print(pt)
    if s_on["retry_after"]:
        con.print(f"Retry-After on rejects: {s_on['retry_after'][0]}-{s_on['retry_after'][1]} s")
    ok = True
    for name, passed in checks(s_on):
        ok &= passed
        con.print(f"[{'green' if passed else 'red'}]{'PASS' if passed else 'FAIL'}[/] admission on: {name}")
    con.print(
        f"admission off: short-step p95 {s_off['p95']:.2f} s = {s_off['p95_over_slo']:.1f}x the SLO "
        f"({s_off['p95'] - spec.slo_short_step_s:+.2f} s beyond it); SLO met by {s_off['slo_attainment']:.0%} of steps"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase-s", type=float, default=10.0, help="seconds per arrival-rate step")
    ap.add_argument("--slo", type=float, default=1.0, help="short-step SLO (s)")
    ap.add_argument("--drain-s", type=float, default=60.0, help="max seconds to let runs finish")
    a = ap.parse_args(argv)
    spec = LoadSpec(seed=a.seed, phase_s=a.phase_s, slo_short_step_s=a.slo, drain_s=a.drain_s)
    on = run_load(spec, admission=True)
    off = run_load(spec, admission=False)
    return 0 if print_tables(on, off) else 1


if __name__ == "__main__":
    sys.exit(main())
