"""Parity: one run log through the what-if simulator and through the live sidecar (real HTTP, a
scripted upstream, an injected clock) gives the same decision sequence step by step — tier,
replica, reason and admission verdict — for every policy, the learned one with a real bundle.

How the two sides are made to see the same world (what a parity test may fix, nothing else):

- the run log is built from the request bodies the driver sends, so the sidecar's prompt estimate
  (:mod:`features.tokens`) equals the logged prompt tokens the simulator reads;
- the simulation runs first; the scripted upstream then answers each (run, step) with the usage
  the simulation produced (prompt, cached, completion tokens, the logged tool call) and moves the
  injected clock to that step's simulated end, and the driver sends each step at its simulated
  arrival time, in the simulation's event order;
- steps never overlap (short steps, long tool pauses), so no backend is busy at a decision in
  either world, while runs overlap in time, so admission has several active runs to count;
- the sidecar does not scrape /metrics and the simulation models that (``SimConfig.scrape=False``);
- the sidecar embeds no task text (``context.embed: off``): the logged runs carry no embedding.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from features.runlog import read_runlog, records_to_frame
from features.schema import Run, Step
from features.tokens import message_tokens, prompt_tokens, text_tokens
from models.bundle import ModelBundle
from router.policy import build_policy
from router.policy.admission import AdmissionConfig, AdmissionController
from router.policy.explore import draw
from router.server.app import create_app, serve_in_thread
from router.server.protocols.chat import tool_key
from router.server.settings import RouterSettings
from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.whatif import SimConfig, Simulator, Workload

ROOT = Path(__file__).resolve().parents[1]
PROF = NodeProfile(
    name="parity", a=0.01, b=1e-5, c=0.0, d=1e-7, e=0.0, kv_bytes_per_token=1000, token_budget=8192
)
FRONT = FrontierConfig(ttft_sigma=0.0, tokens_per_s_sigma=0.0, ttft_p50_s=0.3, tokens_per_s_p50=200.0)
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("search_flights", "cancel_booking")
]
N_RUNS, N_STEPS = 7, 5
ADMISSION = {"max_runs_per_replica": 1, "slo_short_step_s": 2.0}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _conversations() -> dict[str, list[dict]]:
    """Per run and step: the new messages the driver appends (tool results), the tool call the
    model makes, its output tokens. Some results are errors and some calls repeat (stall signals)."""
    out: dict[str, list[dict]] = {}
    for r in range(N_RUNS):
        rid = f"run-{r}"
        steps = []
        for k in range(N_STEPS):
            name = TOOLS[(r + k) % 2]["function"]["name"]
            args = orjson.dumps({"q": "same" if (r % 3 == 0 and k >= 2) else f"q{r}-{k}"}).decode()
            result = (
                "error: not found"
                if (r + k) % 4 == 3
                else "ok " + "x" * (400 * (k + 1) * (1 + int(rid.split("-")[1]) % 3))
            )
            steps.append({"name": name, "args": args, "completion": 20 + 3 * k, "result": result})
        out[rid] = steps
    return out


def _opening(rid: str) -> list[dict]:
    return [
        {"role": "system", "content": f"You are the agent of {rid}. " + "rule " * 2500},
        {"role": "user", "content": f"task for {rid}: " + "word " * (100 + 20 * int(rid.split("-")[1]))},
    ]


def _live_domain(rid: str) -> str | None:
    from router.server.runs.context import RunContextSettings, resolve_domain

    return resolve_domain(RunContextSettings(), {}, {}, None, _opening(rid)[0]["content"])[0]


def _assistant(rid: str, k: int, s: dict) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c-{rid}-{k}",
                "type": "function",
                "function": {"name": s["name"], "arguments": s["args"]},
            }
        ],
    }


def _bodies_and_log(convs: dict[str, list[dict]]) -> tuple[dict, list]:
    """The request body of every (run, step) and the run log whose counts match the estimate."""
    bodies: dict[tuple[str, int], dict] = {}
    recs: list = []
    tools_chars = len(orjson.dumps(TOOLS))
    for i, (rid, steps) in enumerate(convs.items()):
        # the run record carries the domain the sidecar resolves for it (its system prompt's hash), so
        # the simulation sees the same run context (and the bundle's benefit model answers alike)
        recs.append(Run(run_id=rid, source="parity", started_at=7.0 * i, domain=_live_domain(rid)))
        msgs = _opening(rid)
        prev_total = None
        for k, s in enumerate(steps):
            new: list[dict] = []
            if k:
                prev = steps[k - 1]
                msgs.append(_assistant(rid, k - 1, prev))
                new = [{"role": "tool", "tool_call_id": f"c-{rid}-{k - 1}", "content": prev["result"]}]
                msgs.extend(new)
            body = {"model": "auto", "messages": [dict(m) for m in msgs], "tools": TOOLS}
            bodies[(rid, k)] = body
            p = prompt_tokens(msgs, previous_total=prev_total, tools_chars=0 if k else tools_chars)
            if k:
                assert p == prev_total + sum(message_tokens(m) for m in new)
            res = [m["content"] for m in new]
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    prompt_tokens=p,
                    completion_tokens=s["completion"],
                    tool_pause_s=60.0 + 5 * k if k else None,
                    tool_calls=[s["name"]],
                    tool_call_keys=[tool_key(s["name"], s["args"])],
                    tool_results_n=len(new),
                    tool_result_tokens=[text_tokens(len(c)) for c in res],
                    tool_result_errors=[c.lower().startswith("error") for c in res],
                    structured=True,
                    n_tools_offered=len(TOOLS),
                    wants_json=False,
                )
            )
            prev_total = p + s["completion"]
    return bodies, recs


def _sim_config() -> SimConfig:
    return SimConfig(
        profile=PROF, replicas=2, kv_cache_gb=4.0, frontier=FRONT, scrape=False, log_steps=True, seed=3
    )


def _settings(tmp: Path, upstream: str, policy: dict, bundle: Path, spill: bool) -> RouterSettings:
    cfg = _sim_config()
    os.environ["RR_PARITY_KEY"] = "sk-parity"
    return RouterSettings.load(
        None,
        local={
            "urls": [upstream, upstream],
            "model": cfg.local_model,
            "max_context": min(PROF.max_context, cfg.kv_blocks() * cfg.block_tokens),
            "prefill_s_per_token": PROF.b,
            "ttft_base_s": PROF.a,
            "gpu_usd_per_hour": cfg.gpu_hour_usd * PROF.gpus_per_replica,
        },
        frontier={
            "url": upstream,
            "model": FRONT.model,
            "name": FRONT.name,
            "api_key_env": "RR_PARITY_KEY",
            "max_context": FRONT.max_context,
            "price_in_per_m": FRONT.price_in_per_m,
            "price_cached_in_per_m": FRONT.price_cached_in_per_m,
            "price_out_per_m": FRONT.price_out_per_m,
            "ttft_base_s": FRONT.ttft_p50_s,
        },
        policy=policy,
        bundle={"path": str(bundle), "watch_s": 0},
        scrape={"interval_s": 0},
        fallback={"enabled": False},
        admission={**ADMISSION, "spill": spill, "sweep_s": 0},
        runlog={"dir": str(tmp / "logs")},
        # the simulation's run log carries no task embeddings, so the sidecar computes none either
        # (a first step must not depend on whether a background embedding beat its wait)
        context={"embed": "off"},
    )


def _admission(settings: RouterSettings) -> AdmissionConfig:
    return settings.admission.controller_config(settings.local)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A real bundle: the training job on the shipped tau-bench + tau2 samples."""
    from training.train import TrainConfig, run_training

    out = tmp_path_factory.mktemp("parity") / "bundle"
    run_training(
        TrainConfig(
            runs=[ROOT / "data" / "taubench_airline.parquet", ROOT / "data" / "tau2bench_airline.parquet"],
            out=out,
            evaluate=False,
            mlflow=False,
            calibration="sigmoid",  # keeps the small differences between these steps' scores
            calibration_cv=3,
        )
    )
    return out


def _simulate(policy_cfg: dict, bundle: ModelBundle, workload: Workload, adm: AdmissionConfig):
    starts = np.array([r.started_s for r in workload.runs])
    res = Simulator(
        workload,
        build_policy(policy_cfg, bundle),
        _sim_config(),
        starts,
        predictor=bundle,
        admission=AdmissionController(adm),
    ).run()
    return res


def _upstream(clock: Clock, script: dict):
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        rid = body["messages"][0]["content"].split("agent of ", 1)[1].split(".", 1)[0]
        k = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        rec = script[(rid, k)]
        clock.t = rec.arrival_s + rec.latency_s  # the step ends when the simulation says it did
        usage = {
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": rec.completion_tokens,
            "total_tokens": rec.prompt_tokens + rec.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": rec.cached_tokens or 0},
        }
        s = CONVS[rid][k]
        msg = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"c-{rid}-{k}",
                    "type": "function",
                    "function": {"name": s["name"], "arguments": s["args"]},
                }
            ],
        }
        out = {
            "id": f"cmpl-{rid}-{k}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}],
            "usage": usage,
        }
        await asyncio.sleep(0)
        return Response(orjson.dumps(out), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


CONVS = _conversations()
# the frontier budget: thresholds from the engine's online quantile (router.core.budget), checked
# beside POLICIES (the coverage bound below counts POLICIES only)
BUDGETED = {
    "kind": "learned",
    "name": "learned-budget",
    "frontier_budget": {"share": 0.5, "window": 10, "min_window": 1},
}
POLICIES = [
    {"kind": "always-local"},
    {"kind": "always-frontier"},
    {"kind": "per-step-threshold"},
    {"kind": "session-sticky"},
    {"kind": "stall-escalation"},
    {"kind": "learned"},
    {"kind": "oracle"},
    # an exploring logging policy whose budget closes part-way: the same draws, propensities and
    # budget state in both worlds (the budget is the step engine's, on each adapter's clock)
    {
        "kind": "learned",
        "name": "learned-explore",
        "explore": {
            "rate": 1.0,
            "escalate_hazard": 0.4,
            "max_step": 4,
            "budget_usd": 0.01,
            "budget_window_s": 1e6,
        },
    },
]


@pytest.mark.slow
@pytest.mark.parametrize("spill", [True, False], ids=["spill", "reject"])
def test_simulator_and_live_sidecar_decide_alike_for_every_policy(tmp_path, bundle, spill):
    bodies, recs = _bodies_and_log(CONVS)
    df = records_to_frame(recs)
    workload = Workload.from_frames(df[df.record == "step"], df[df.record == "run"])
    b = ModelBundle.load(bundle)
    clock = Clock()
    script: dict = {}
    checked = 0
    explored: set = set()
    verdicts: set[str] = set()
    index_readings: list[tuple] = []
    with serve_in_thread(_upstream(clock, script)) as upstream:
        for pol in [*POLICIES, BUDGETED]:
            cfg = dict(pol)
            if pol["kind"] in ("learned", "per-step-threshold"):
                # thresholds inside this workload's predictions, so both escalate and stay happen
                probe = _simulate(
                    {"kind": "always-local"},
                    b,
                    workload,
                    _admission(_settings(tmp_path, upstream, pol, bundle, spill)),
                )
                ps = sorted(r.predictions["p_frontier"] for r in probe.records)
                up, down = float(ps[int(len(ps) * 0.7)]), float(ps[int(len(ps) * 0.3)])
                cfg.update(
                    {"p_frontier_up": up, "p_frontier_down": down, "min_dwell_steps": 1}
                    if pol["kind"] == "learned"
                    else {"threshold": up}
                )
            settings = _settings(tmp_path / pol.get("name", pol["kind"]), upstream, cfg, bundle, spill)
            res = _simulate(cfg, b, workload, _admission(settings))
            want = {(r.run_id, r.step): (r.tier, r.replica, r.reason, r.admission) for r in res.records}
            if pol is BUDGETED:  # the budget's threshold let some runs escalate and kept others local
                assert {"escalate", "first-frontier"} & {v[2] for v in want.values()}, want
                assert {"first-local"} & {v[2] for v in want.values()}, want
            sim_rejected = {
                run.run_id for run, st in zip(workload.runs, res.run_status, strict=True) if st == 2
            }
            got = _drive_live(settings, res, workload, bodies, clock, script, sim_rejected)
            assert got["decisions"] == want, (pol["kind"], _diff(got["decisions"], want))
            for r in res.records:  # the same feature vector and predictions, step by step
                x, preds = got["features"][(r.run_id, r.step)]
                np.testing.assert_array_equal(
                    x, np.asarray(r.features, dtype=float), err_msg=str((r.run_id, r.step))
                )
                # the index's reading counts each world's own blocks (the simulator's token blocks,
                # the sidecar's character blocks): compared like with like, the rest exactly
                live_ix, sim_ix = preds.pop("cache_index_tokens", None), dict(r.predictions)
                sim_ix_v = sim_ix.pop("cache_index_tokens", None)
                assert preds == pytest.approx(sim_ix, rel=1e-12)
                index_readings.append((r.tier, live_ix, sim_ix_v))
                assert got["propensity"][(r.run_id, r.step)] == (r.propensity, r.explore)
            assert got["rejected"] == sim_rejected, pol["kind"]
            checked += len(want)
            if "explore" in pol:
                explored = {(r.run_id, r.propensity) for r in res.records if r.explore and r.propensity < 1}
                # runs that drew exploration but found the budget closed at their start
                drew = {r.run_id for r in res.records if draw(0, r.run_id, "run") < pol["explore"]["rate"]}
                assert drew - {r.run_id for r in res.records if r.explore}, "the budget never closed"
            verdicts |= {v[3] for v in want.values() if v[3]} | ({"reject"} if sim_rejected else set())
    _check_index_readings(
        index_readings, _settings(tmp_path, "http://x", {"kind": "always-local"}, bundle, spill)
    )
    assert checked >= len(POLICIES) * N_RUNS * 2
    assert explored  # the exploring policy explored some runs and propensities below 1 were compared
    # the workload exercises admission both ways: admitted runs and shed ones
    assert "admit-local" in verdicts and ({"spill"} if spill else {"reject"}) <= verdicts, verdicts


def _check_index_readings(readings: list[tuple], settings: RouterSettings) -> None:
    """Both worlds log the index's cache-reuse reading on the same steps (every local step, none
    elsewhere), each in whole blocks of its own mode, zero on the same steps (a run's first step, a
    move) and above zero on the same steps."""
    sim_bt = _sim_config().block_tokens
    live_bt = settings.local.prefix_block_chars // 4
    assert readings
    for tier, live, sim in readings:
        if tier != "local":
            assert live is None and sim is None
            continue
        assert live is not None and sim is not None
        assert live % live_bt == 0 and sim % sim_bt == 0, (live, sim)
        assert (live > 0) == (sim > 0), (live, sim)
    assert any(s for t, _, s in readings if t == "local")  # some steps were warm in both


def _drive_live(settings, res, workload, bodies, clock, script, sim_rejected) -> dict:
    """As the simulation ran: its served steps at their times, plus a first step of every run it
    rejected (the sidecar must answer 429 to it)."""
    for rec in res.records:
        script[(rec.run_id, rec.step)] = rec
    events = [(rec.arrival_s, 0, rec.run_id, rec.step) for rec in res.records]
    starts = {run.run_id: run.started_s for run in workload.runs}
    events += [(starts[rid], 1, rid, 0) for rid in sim_rejected]
    events.sort()
    last: dict[str, int] = {}
    for rec in res.records:
        last[rec.run_id] = max(last.get(rec.run_id, -1), rec.step)
    clock.t = 0.0
    app = create_app(settings, clock=clock, wall=clock)
    decisions: dict[tuple[str, int], tuple] = {}
    rejected: set[str] = set()
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        for arrival, _, rid, k in events:
            clock.t = arrival
            r = c.post("/v1/chat/completions", json=bodies[(rid, k)], headers={"x-run-id": rid})
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "run_rejected_overload"
                rejected.add(rid)
                continue
            assert r.status_code == 200, r.text
            if k == last[rid]:
                assert c.post(f"/v1/runs/{rid}/end", json={"outcome": "success"}).status_code == 200
        for rid in last:
            for e in app.state.proxy.runs[rid].entries:
                decisions[(rid, e["step"])] = (e["tier"], e["replica"], e["reason"], e["admission"])
    # the run log the sidecar wrote (flushed at shutdown): features and predictions per step
    log = read_runlog(sorted(Path(settings.runlog.dir).glob("runlog-*")))
    features = {
        (r.run_id, int(r.step)): (np.asarray(r.features, dtype=float), dict(r.predictions))
        for r in log.steps.itertuples()
    }
    propensity = {
        (r.run_id, int(r.step)): (float(r.propensity), bool(r.explore)) for r in log.steps.itertuples()
    }
    return {"decisions": decisions, "rejected": rejected, "features": features, "propensity": propensity}


def _diff(got: dict, want: dict) -> list:
    keys = sorted(set(got) | set(want))
    return [(k, got.get(k), want.get(k)) for k in keys if got.get(k) != want.get(k)][:8]
