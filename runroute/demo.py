"""The main job: ``runroute demo`` (and the comparison engine behind ``runroute bench``).

Algorithm of :func:`run_demo` (every knob is a field of :class:`DemoConfig`, all defaults embedded):

1. **Import**: read the shipped samples ``data/*.parquet`` (validated) and print the per-source
   summary table (:mod:`features.importers.summary`).
2. **Split by task, seeded** (never by row): ``tau2_holdout_share`` of the tau2 airline tasks are
   held out; the held-out tau2 set is the paired gpt-oss-120b runs of those tasks (weak and strong
   outcomes known). Every run of those task ids, of *any* source (tau2 other agents, tau-bench's
   airline tasks with the same ids), is kept out of training. A second held-out set is a synthetic
   workload from :func:`features.generate.generate` with its own seed (``synthetic_holdout_seed``);
   the training set = tau-bench + tau2 runs of the other tasks + ``synthetic_train_runs`` synthetic
   runs of another seed. The bundle is trained by :func:`training.train.run_training` with MLflow
   tracking in ``<out>/mlflow.db`` (artifacts in ``<out>/mlruns``).
3. **Compare policies** (:func:`compare_policies`, the same ``build_policy`` objects the router runs)
   on each held-out set through the what-if simulator (:class:`router.sim.whatif.Simulator`):
   timing, cache, cost, flaps, admission; the learned and per-step-threshold policies are also swept
   over ``sweep_thresholds``. The synthetic set is replayed twice: at ``sim.arrival_rate`` (light
   load) and at ``busy_arrival_rate`` (the local replicas near saturation, where run affinity and
   admission matter). Then (``live``) a short segment through the real HTTP sidecar
   (``router.server.app.create_app`` under uvicorn on loopback) with fake vLLM replicas and a fake frontier
   (:func:`live_segment`), bounded by ``live_budget_s``.
4. **Quality**: :mod:`training.outcome` turns each policy's per-step tiers into success and cost
   (the outcome model and its variants, for the sensitivity of the ranking).
5. **Report**: :mod:`training.report` writes ``report.md``, ``scorecard.json`` and PNG plots, and
   the scorecard table is printed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from training.outcome import DEFAULT_VARIANTS, FRONTIER, LOCAL, REJECTED, Prices

__all__ = [
    "DemoConfig",
    "SimSettings",
    "LiveSettings",
    "POLICIES",
    "compare_policies",
    "live_segment",
    "run_demo",
    "DATA_DIR",
]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
Progress = Callable[[str], None]

# label -> policy config (router.policy.config); the order is the order of every table
POLICIES: dict[str, dict[str, Any]] = {
    "always-local": {"kind": "always-local"},
    "always-frontier": {"kind": "always-frontier"},
    "per-step-threshold": {"kind": "per-step-threshold"},
    "session-sticky": {"kind": "session-sticky"},
    "stall-escalation": {"kind": "stall-escalation"},
    "learned": {"kind": "learned"},
    "oracle": {"kind": "oracle"},
}
SWEPT = ("learned", "per-step-threshold")


class SimSettings(BaseModel):
    """The simulated deployment every policy is compared on."""

    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(default=2, ge=1, description="local vLLM replicas")
    kv_cache_gb: float = Field(default=16.0, gt=0, description="KV cache per replica (GB)")
    gpu: str = Field(default="a100", description="node profile family (router.sim.profiles)")
    arrival_rate: float = Field(
        default=0.1, gt=0, description="run starts per second (Poisson) in the held-out replay"
    )
    slo_short_s: float = Field(default=5.0, gt=0, description="per-step SLO of short steps (s)")
    admission: bool = Field(
        default=True, description="consult router.policy.admission at each run's first step (spill/reject)"
    )
    seed: int = 0


class LiveSettings(BaseModel):
    """The short live segment through the real sidecar with fake backends."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    runs_per_policy: int = Field(default=4, ge=1, description="runs driven concurrently per policy")
    max_steps: int = Field(default=10, ge=1, description="steps per run at most")
    budget_s: float = Field(default=60.0, gt=0, description="wall-clock budget of the whole segment")
    max_prompt_tokens: int = Field(default=8000, ge=64, description="prompts are capped at this size")
    max_completion_tokens: int = Field(default=96, ge=1, description="completions are capped at this size")


class DemoConfig(BaseModel):
    """Every knob of the demo; the defaults are what ``make demo`` runs."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(default=Path("runroute-report"), description="report directory")
    data_dir: Path = Field(default=DATA_DIR, description="shipped samples")
    seed: int = 0
    tau2_holdout_share: float = Field(default=0.4, gt=0, lt=1, description="share of tau2 tasks held out")
    synthetic_train_runs: int = Field(default=800, ge=0)
    synthetic_holdout_runs: int = Field(default=400, ge=1)
    synthetic_train_seed: int = 101
    synthetic_holdout_seed: int = 202
    target_frontier_share: float = Field(default=0.3, ge=0, le=1, description="training's threshold target")
    train_evaluate: bool = Field(default=False, description="run training's grouped CV (slow on 2 cores)")
    n_estimators: int = Field(default=80, ge=1)
    mlflow: bool = True
    sweep_thresholds: list[float] = Field(
        default_factory=lambda: [round(x, 2) for x in np.linspace(0.0, 1.0, 11)],
        description="p_frontier thresholds swept for learned / per-step-threshold",
    )
    sweep_train_quantiles: int = Field(
        default=10,
        ge=0,
        description="add this many quantiles of the per-run max P(frontier) on the *training* runs to the sweep "
        "(resolution where the calibrated probabilities bunch up; never computed on held-out data)",
    )
    prices: Prices = Field(default_factory=Prices)
    variants: list[str] = Field(default_factory=lambda: list(DEFAULT_VARIANTS))
    sim: SimSettings = Field(default_factory=SimSettings)
    busy_arrival_rate: float | None = Field(
        default=1.0,
        gt=0,
        description="also replay the synthetic held-out set at this run-start rate (None: skip)",
    )
    live: LiveSettings = Field(default_factory=LiveSettings)
    limit_tau2_tasks: int | None = Field(default=None, description="tests: use only this many tau2 tasks")
    limit_taubench_runs: int | None = Field(
        default=None, description="tests: use only this many tau-bench runs"
    )


def _noop(_: str) -> None:
    return None


# ----------------------------------------------------------------------------------- comparison


def _spilled_from_sim(res: Any, workload: Any) -> set[str]:
    """Runs admission control spilled whole to the frontier (their first step's outcome)."""
    from router.sim.whatif import SPILLED

    out: set[str] = set()
    g = 0
    for spec in workload.runs:
        if len(spec.steps) and res.outcome[g] == SPILLED:
            out.add(spec.run_id)
        g += len(spec.steps)
    return out


def _tiers_from_sim(res: Any, workload: Any) -> dict[str, np.ndarray]:
    from router.sim.whatif import REJECTED as S_REJ
    from router.sim.whatif import SERVED_LOCAL

    code = np.where(res.outcome == SERVED_LOCAL, LOCAL, np.where(res.outcome == S_REJ, REJECTED, FRONTIER))
    out: dict[str, np.ndarray] = {}
    g = 0
    for spec in workload.runs:
        n = len(spec.steps)
        out[spec.run_id] = code[g : g + n].astype(np.int64)
        g += n
    return out


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[~np.isnan(x)]
    return None if x.size == 0 else float(np.percentile(x, q))


def _sim_figures(res: Any) -> dict[str, Any]:
    from router.sim.whatif import REJECTED as S_REJ
    from router.sim.whatif import scorecard

    card = scorecard(res)
    served = res.outcome != S_REJ
    lat = res.latency[served]
    short = res.short[served]
    return {
        "runs_completed": card["runs_completed"],
        "runs_rejected": card["runs_rejected"],
        "runs_spilled": card["runs_spilled"],
        "run_completion_s_p50": card["run_completion_s_p50"],
        "run_completion_s_p95": card["run_completion_s_p95"],
        "step_latency_s_p95": card["step_latency_s_p95"],
        "short_step_latency_s_p95": card["short_step_latency_s_p95"],
        "long_step_latency_s_p95": _pct(lat[~short], 95),
        "ttft_s_p95": card["ttft_s_p95"],
        "cache_hit_rate": card["cache_hit_rate"],
        "cache_hit_upper_bound": card["cache_hit_upper_bound"],
        "flaps_per_run": card["flaps_per_run"],
        "slo_attainment": card["slo_attainment"],
        "sim_cost_usd": card["cost_usd"],
    }


def _policy_cfg(label: str, base: dict[str, Any], threshold: float | None, band: float) -> dict[str, Any]:
    cfg = dict(base, name=label)
    if threshold is None:
        return cfg
    if base["kind"] == "learned":
        cfg.update(p_frontier_up=threshold, p_frontier_down=max(0.0, threshold - band))
    elif base["kind"] == "per-step-threshold":
        cfg.update(threshold=threshold)
    return cfg


def compare_policies(
    runs: Any,
    steps: Any,
    *,
    bundle: Any,
    prices: Prices,
    sim: SimSettings,
    policies: dict[str, dict[str, Any]] | None = None,
    sweep_thresholds: Sequence[float] = (),
    variants: Sequence[str] = DEFAULT_VARIANTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every policy on one workload through the simulator, scored with the outcome model.

    Returns ``{"policies": [row...], "sweeps": {label: [point...]}, "sim": {...}, "n_runs", ...}``;
    a row holds the simulator figures (:func:`_sim_figures`), the outcome figures
    (:func:`training.outcome.policy_outcomes`) and the frontier-relative figures (cost at 95% of
    always-frontier success, AIQ), see :func:`training.report.SCORECARD_DOC`.
    """
    from router.policy.admission import AdmissionController
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.calibrate import admission_config_for_profile
    from router.sim.frontier import FrontierConfig
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload, admission_from_controller
    from training.outcome import aiq, cost_at_quality, policy_outcomes, records_from_frames

    say = progress or _noop
    pols = dict(policies or POLICIES)
    workload = Workload.from_frames(steps, runs)
    records = records_from_frames(runs, steps)
    starts = run_starts(
        f"rate={sim.arrival_rate}",
        len(workload.runs),
        seed=sim.seed,
        mean_steps_per_run=workload.mean_steps_per_run(),
    )
    frontier = FrontierConfig(
        price_in_per_m=prices.frontier_in_per_m,
        price_cached_in_per_m=prices.frontier_cached_in_per_m,
        price_out_per_m=prices.frontier_out_per_m,
    )
    base = SimConfig(
        profile=load_profile(None, sim.gpu),
        replicas=sim.replicas,
        kv_cache_gb=sim.kv_cache_gb,
        frontier=frontier,
        gpu_hour_usd=prices.gpu_hour_usd,
        slo_short_s=sim.slo_short_s,
        slo_ttft_s=sim.slo_short_s,
        seed=sim.seed,
    )
    band = 0.0
    if bundle is not None and getattr(bundle, "thresholds", None):
        band = max(
            0.0, float(bundle.thresholds["p_frontier_up"]) - float(bundle.thresholds["p_frontier_down"])
        )

    def simulate(label: str, cfg: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray], set[str]]:
        policy = build_policy(cfg, bundle)
        hook = None
        if sim.admission:
            acfg = admission_config_for_profile(base.profile, sim.kv_cache_gb, sim.slo_short_s)
            ctrl = AdmissionController(acfg)
            hook = admission_from_controller(ctrl)
        res = Simulator(workload, policy, base, starts, predictor=bundle, admission=hook).run()
        res.policy = label
        return res, _tiers_from_sim(res, workload), _spilled_from_sim(res, workload)

    rows: list[dict[str, Any]] = []
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for label, pcfg in pols.items():
        if pcfg["kind"] in ("learned", "per-step-threshold") and bundle is None:
            say(f"{label}: skipped (needs a model bundle)")
            continue
        res, tiers, spilled = simulate(label, _policy_cfg(label, pcfg, None, band))
        out = policy_outcomes(records, tiers, prices, variants, spilled)
        row = {"policy": label, "kind": pcfg["kind"], **_sim_figures(res), **out}
        if pcfg["kind"] == "learned":
            row["thresholds"] = {
                "p_frontier_up": float(bundle.thresholds["p_frontier_up"]),
                "p_frontier_down": float(bundle.thresholds["p_frontier_down"]),
            }
        elif pcfg["kind"] == "per-step-threshold":
            row["thresholds"] = {"threshold": float(bundle.thresholds["p_frontier_up"])}
        rows.append(row)
        say(f"{label}: {len(res.outcome)} steps simulated in {res.wall_s:.1f}s")
        if label in SWEPT and sweep_thresholds:
            pts = []
            for th in sweep_thresholds:
                r2, t2, sp2 = simulate(label, _policy_cfg(label, pcfg, float(th), band))
                o2 = policy_outcomes(records, t2, prices, variants, sp2)
                pts.append(
                    {
                        "threshold": float(th),
                        "success_rate": o2["success_rate"],
                        "success_by_variant": o2["success_by_variant"],
                        "cost_usd": o2["cost_usd"],
                        "escalation_rate": o2["escalation_rate"],
                        "flaps_per_run": _sim_figures(r2)["flaps_per_run"],
                    }
                )
            sweeps[label] = pts
            say(f"{label}: swept {len(pts)} thresholds")

    # frontier-relative figures, per outcome variant (headline = the first variant)
    by = {r["policy"]: r for r in rows}
    al, af = by.get("always-local"), by.get("always-frontier")
    for r in rows:
        r["aiq_by_variant"] = {}
        r["cost_at_95pct_frontier_success_by_variant"] = {}
    for v in variants:
        if al is None or af is None:
            break
        q_l, q_f = al["success_by_variant"][v], af["success_by_variant"][v]
        c_l, c_f = al["cost_usd"], af["cost_usd"]
        target = None if q_f is None else 0.95 * q_f
        for r in rows:
            cq = [(r["cost_usd"], r["success_by_variant"][v])]
            cq += [(p["cost_usd"], p["success_by_variant"][v]) for p in sweeps.get(r["policy"], [])]
            r["cost_at_95pct_frontier_success_by_variant"][v] = cost_at_quality(cq, target)
            r["aiq_by_variant"][v] = None if q_l is None else aiq(cq, (c_l, q_l), c_l, c_f)
    head = variants[0] if variants else None
    for r in rows:
        r["cost_at_95pct_frontier_success_usd"] = r["cost_at_95pct_frontier_success_by_variant"].get(head)
        r["aiq"] = r["aiq_by_variant"].get(head)
    n_steps = int(sum(len(s.steps) for s in workload.runs))
    return {
        "n_runs": len(workload.runs),
        "n_steps": n_steps,
        "n_quality_runs": int(sum(1 for r in records.values() if r.quality_known)),
        "n_needs_frontier": int(sum(1 for r in records.values() if r.needs_frontier)),
        "policies": rows,
        "sweeps": sweeps,
        "sim": {
            **sim.model_dump(),
            "node_profile": base.profile.name,
            "arrivals": f"Poisson, {sim.arrival_rate:g} run starts/s (seed {sim.seed})",
        },
    }


# ----------------------------------------------------------------------------------- live segment


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look something up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def _words(n: int, tag: str) -> str:
    """About ``n`` tokens for the fake's tokeniser (a space + a word of <= 4 characters is one token)."""
    n = max(1, int(n))
    # 3-character words: 4 bytes with the space, so the router's bytes/4 estimate matches the fake's count
    salt = sum(map(ord, tag)) % 97
    return " ".join(f"{chr(97 + (i + salt) % 26)}{(i * 7 + salt) % 100:02d}" for i in range(n))


def _drive_run(
    url: str, run: dict[str, Any], live: LiveSettings, deadline: float, tag: str
) -> list[dict[str, Any]]:
    """Replay one logged run's shape through the sidecar: growing messages, tool results, pauses 0."""
    import httpx

    steps = run["steps"][: live.max_steps]
    out: list[dict[str, Any]] = []
    p0 = min(int(steps[0]["prompt"]), live.max_prompt_tokens)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": _words(int(p0 * 0.8), "sys")},
        {"role": "user", "content": _words(max(8, int(p0 * 0.2)), tag)},
    ]
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for k, s in enumerate(steps):
            if time.monotonic() > deadline:
                break
            body: dict[str, Any] = {
                "model": "auto",
                "messages": msgs,
                "max_tokens": max(1, min(int(s["completion"]), live.max_completion_tokens)),
            }
            if s["tool"]:
                body["tools"] = _TOOLS
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body, headers={"X-Run-Id": run["run_id"] + tag})
            lat = time.perf_counter() - t0
            if r.status_code != 200:
                out.append({"step": k, "status": r.status_code, "latency_s": lat, "tier": None})
                break
            j = r.json()
            u = j.get("usage") or {}
            det = u.get("prompt_tokens_details") or {}
            m = j["choices"][0]["message"]
            out.append(
                {
                    "step": k,
                    "status": 200,
                    "latency_s": lat,
                    "tier": r.headers.get("x-runroute-tier"),
                    "replica": r.headers.get("x-runroute-replica"),
                    "reason": r.headers.get("x-runroute-reason"),
                    "prompt_tokens": int(u.get("prompt_tokens") or 0),
                    "completion_tokens": int(u.get("completion_tokens") or 0),
                    "cached_tokens": int(det.get("cached_tokens") or 0),
                    "short": int(u.get("completion_tokens") or 0) <= 64 or bool(m.get("tool_calls")),
                }
            )
            msgs.append({k2: v for k2, v in m.items() if v is not None})
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            grow = 16
            if nxt is not None:
                grow = max(8, int(nxt["prompt"]) - int(s["prompt"]) - int(s["completion"]))
                room = live.max_prompt_tokens - int(u.get("prompt_tokens") or 0) - int(s["completion"])
                grow = max(8, min(grow, room))
            if m.get("tool_calls"):
                calls = m["tool_calls"]
                err = bool(nxt and nxt["error"])
                for i, tc in enumerate(calls):
                    prefix = "error: tool failed. " if (err and i == len(calls) - 1) else ""
                    msgs.append(
                        {
                            "role": "tool",
                            "tool_call_id": tc.get("id", f"c{i}"),
                            "content": prefix + _words(max(4, grow // len(calls)), f"t{k}"),
                        }
                    )
            else:
                msgs.append({"role": "user", "content": _words(grow, f"u{k}")})
    return out


def _live_figures(steps_by_run: list[list[dict[str, Any]]]) -> dict[str, Any]:
    ok = [s for run in steps_by_run for s in run if s.get("status") == 200]
    lat = np.array([s["latency_s"] for s in ok], dtype=float)
    short = np.array([s["short"] for s in ok], dtype=bool)
    loc2 = [s for s in ok if s["tier"] == "local" and s["step"] >= 1]
    ptok = sum(s["prompt_tokens"] for s in loc2)
    # upper bound: the prompt repeats the run's previous prompt + output (capped at this prompt)
    upper = 0
    for run in steps_by_run:
        for a, b in zip(run, run[1:], strict=False):
            if b.get("status") == 200 and b["tier"] == "local" and a.get("status") == 200:
                upper += min(a["prompt_tokens"] + a["completion_tokens"], max(b["prompt_tokens"] - 1, 0))
    runs_ok = [r for r in steps_by_run if r]
    esc = sum(1 for r in runs_ok if any(s.get("tier") == "frontier" for s in r))
    switches = 0
    for r in runs_ok:
        seq = [(s.get("tier"), s.get("replica")) for s in r if s.get("status") == 200]
        switches += sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
    return {
        "runs": len(runs_ok),
        "steps": len(ok),
        "errors": sum(1 for run in steps_by_run for s in run if s.get("status") != 200),
        "step_latency_s_p50": _pct(lat, 50),
        "step_latency_s_p95": _pct(lat, 95),
        "short_step_latency_s_p95": _pct(lat[short], 95) if short.any() else None,
        "long_step_latency_s_p95": _pct(lat[~short], 95) if (~short).any() else None,
        "cache_hit_rate": (sum(s["cached_tokens"] for s in loc2) / ptok) if ptok else None,
        "cache_hit_upper_bound": (upper / ptok) if ptok else None,
        "escalation_rate": esc / len(runs_ok) if runs_ok else None,
        "flaps_per_run": switches / len(runs_ok) if runs_ok else None,
        "reasons": dict(Counter(s["reason"] for s in ok if s.get("reason"))),
    }


def _runs_for_live(runs: Any, steps: Any, n: int) -> list[dict[str, Any]]:
    st = steps.sort_values(["run_id", "step"], kind="stable")
    ids = [r for r in runs["run_id"].tolist() if r in set(st["run_id"].tolist())][:n]
    out = []
    for rid in ids:
        g = st[st["run_id"] == rid]
        ss = []
        for row in g.itertuples(index=False):
            calls = row.tool_calls
            errs = row.tool_result_errors
            ss.append(
                {
                    "prompt": int(row.prompt_tokens),
                    "completion": int(row.completion_tokens),
                    "tool": calls is not None and len(calls) > 0,
                    "error": errs is not None and not isinstance(errs, float) and any(bool(e) for e in errs),
                }
            )
        out.append({"run_id": str(rid), "steps": ss})
    return out


def live_segment(
    runs: Any,
    steps: Any,
    *,
    bundle_dir: Path,
    prices: Prices,
    live: LiveSettings,
    log_dir: Path,
    policies: Sequence[str],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Drive a few held-out runs through the real sidecar (uvicorn, loopback) per policy.

    Backends: two fake vLLM replicas and one fake frontier (:mod:`router.fakes`), priced like the
    simulator. The oracle is left out (the live request path has no labels). Every server started
    here is stopped before returning. Returns per-policy measured figures.
    """
    say = progress or _noop
    t_start = time.monotonic()
    deadline = t_start + live.budget_s
    sample = _runs_for_live(runs, steps, live.runs_per_policy)
    if not sample:
        return {"skipped": "no held-out runs with steps for the live segment"}
    key_env = "RUNROUTE_DEMO_FAKE_FRONTIER_KEY"  # the settings read the frontier key from the env
    old_key = os.environ.get(key_env)
    os.environ[key_env] = "sk-demo-fake"
    try:
        return _live(
            sample,
            key_env=key_env,
            bundle_dir=bundle_dir,
            prices=prices,
            live=live,
            log_dir=log_dir,
            policies=policies,
            say=say,
            t_start=t_start,
            deadline=deadline,
        )
    finally:
        if old_key is None:
            os.environ.pop(key_env, None)
        else:
            os.environ[key_env] = old_key


def _live(
    sample: list[dict[str, Any]],
    *,
    key_env: str,
    bundle_dir: Path,
    prices: Prices,
    live: LiveSettings,
    log_dir: Path,
    policies: Sequence[str],
    say: Progress,
    t_start: float,
    deadline: float,
) -> dict[str, Any]:
    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    vk: dict[str, Any] = dict(
        model="local-model",
        base_ms=5.0,
        prefill_ms_per_token=0.02,
        decode_ms_per_token=0.5,
        max_tokens_cap=512,
        max_model_len=65536,
    )
    fk: dict[str, Any] = dict(
        model="frontier-model",
        api_key="sk-demo-fake",
        ttft_ms=150.0,
        tokens_per_s=400.0,
        max_tokens_cap=512,
        price_in_per_m=prices.frontier_in_per_m,
        price_cached_in_per_m=prices.frontier_cached_in_per_m,
        price_out_per_m=prices.frontier_out_per_m,
    )
    per_policy: dict[str, Any] = {}
    errors: list[str] = []
    with (
        fake_in_thread("vllm", name="fake-vllm-0", **vk) as v0,
        fake_in_thread("vllm", name="fake-vllm-1", **vk) as v1,
        fake_in_thread("frontier", **fk) as fr,
    ):
        slots = [p for p in policies if p != "oracle"]
        for i, label in enumerate(slots):
            left = deadline - time.monotonic()
            if left <= 1.0:
                per_policy[label] = {"skipped": "live budget spent"}
                continue
            pdeadline = time.monotonic() + left / (len(slots) - i)
            settings = RouterSettings.load(
                None,
                local={"urls": [v0.url, v1.url], "model": "local-model"},
                frontier={
                    "url": fr.base_url,
                    "model": "frontier-model",
                    "api_key_env": key_env,
                    "price_in_per_m": prices.frontier_in_per_m,
                    "price_cached_in_per_m": prices.frontier_cached_in_per_m,
                    "price_out_per_m": prices.frontier_out_per_m,
                },
                policy=dict(POLICIES[label]),
                bundle={"path": str(bundle_dir), "watch_s": 0},
                scrape={"interval_s": 0.2},
                runlog={"dir": str(log_dir / label)},
            )
            app = create_app(settings)
            results: list[list[dict[str, Any]]] = [[] for _ in sample]
            with serve_in_thread(app) as url:

                def work(
                    j: int,
                    url: str = url,
                    label: str = label,
                    dl: float = pdeadline,
                    res: list[list[dict[str, Any]]] = results,
                ) -> None:
                    try:
                        res[j] = _drive_run(url, sample[j], live, dl, f"-{label}")
                    except Exception as e:  # noqa: BLE001 - counted and reported, never silent
                        errors.append(f"{label} run {j}: {type(e).__name__}: {e}")

                threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(len(sample))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=max(1.0, pdeadline - time.monotonic() + 35.0))
            per_policy[label] = _live_figures(results)
            f = per_policy[label]
            say(f"live {label}: {f['steps']} steps, p95 {f['step_latency_s_p95'] or 0:.3f}s")
    return {
        "policies": per_policy,
        "runs": [r["run_id"] for r in sample],
        "wall_s": round(time.monotonic() - t_start, 2),
        "backends": {"vllm": vk, "frontier": {k: v for k, v in fk.items() if k != "api_key"}},
        "settings": live.model_dump(),
        "driver_errors": errors,
    }


# ----------------------------------------------------------------------------------- demo


def _split_tau2(runs: Any, share: float, seed: int, limit: int | None) -> tuple[list[str], list[str]]:
    """Held-out / training tau2 task ids: a seeded permutation of the tasks with paired runs."""
    paired = runs[(runs["source"] == "tau2bench") & runs["strong_outcome"].notna()]
    tasks = sorted(set(paired["task_id"].dropna().astype(str).tolist()))
    rng = np.random.default_rng(seed)
    tasks = [tasks[i] for i in rng.permutation(len(tasks))]
    if limit is not None:
        tasks = tasks[:limit]
    n_hold = max(1, int(round(share * len(tasks))))
    return sorted(tasks[:n_hold]), sorted(tasks[n_hold:])


def run_demo(cfg: DemoConfig, console: Any = None) -> dict[str, Any]:
    """Run the whole demo (module docstring); returns the scorecard dict that was written."""
    import pandas as pd
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from features.generate import generate
    from features.importers.summary import print_summary
    from features.runlog import RunLog, read_runlog, write_frame
    from training.report import print_scorecard, write_report

    # 160 columns when not a terminal (pipes, CI logs): rich's default 80 wraps every table cell
    con = console or Console(width=None if Console().is_terminal else 160)
    t0 = time.perf_counter()
    out = cfg.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    stages = ["import", "split + synthetic", "train", "simulate tau2", "simulate synthetic", "live", "report"]
    if cfg.busy_arrival_rate is not None:
        stages.insert(5, "simulate synthetic (busy)")
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=con,
        transient=False,
    ) as bar:
        task = bar.add_task("demo", total=len(stages))
        last = [time.perf_counter()]

        def stage(name: str) -> None:
            now = time.perf_counter()
            bar.update(task, description=f"demo: {name}")
            last[0] = now

        def done(name: str) -> None:
            timings[name] = round(time.perf_counter() - last[0], 2)
            bar.advance(task)

        def say(msg: str) -> None:
            bar.console.print(f"  [dim]{msg}[/dim]")

        # 1. import
        stage("import")
        files = sorted(cfg.data_dir.glob("*.parquet"))
        if not files:
            from runroute.errors import CliError

            raise CliError(f"no shipped samples in {cfg.data_dir} (data/*.parquet)")
        log = read_runlog([str(f) for f in files])
        frames = [f for f in (log.runs, log.steps, log.arrivals, log.rates) if len(f)]
        allrec = pd.concat(frames, ignore_index=True)
        bar.console.print(f"[bold]1. Import[/bold]: {len(files)} shipped samples in {cfg.data_dir}")
        summary = print_summary(allrec, title="shipped samples (data/*.parquet)", console=bar.console)
        done("import")

        # 2. split by task + synthetic sets
        stage("split + synthetic")
        runs, steps = log.runs, log.steps
        hold_tasks, train_tasks = _split_tau2(runs, cfg.tau2_holdout_share, cfg.seed, cfg.limit_tau2_tasks)
        hold_set = set(hold_tasks)
        keep_tasks = set(train_tasks)
        is_tau = runs["source"].isin(["tau2bench", "taubench"])
        task_s = runs["task_id"].astype(str)
        tau2_hold_runs = runs[
            (runs["source"] == "tau2bench") & task_s.isin(hold_set) & runs["strong_outcome"].notna()
        ]
        tau_train = runs[is_tau & ~task_s.isin(hold_set)]
        if cfg.limit_tau2_tasks is not None:
            tau_train = tau_train[
                (tau_train["source"] != "tau2bench") | tau_train["task_id"].astype(str).isin(keep_tasks)
            ]
        if cfg.limit_taubench_runs is not None:
            tb = tau_train[tau_train["source"] == "taubench"].head(cfg.limit_taubench_runs)
            tau_train = pd.concat([tau_train[tau_train["source"] != "taubench"], tb])
        excluded = runs[is_tau & task_s.isin(hold_set) & ~runs["run_id"].isin(tau2_hold_runs["run_id"])]
        train_ids = set(tau_train["run_id"])
        data_dir = out / "data"
        train_parts = [tau_train, steps[steps["run_id"].isin(train_ids)]]
        syn_train = (
            generate(cfg.synthetic_train_runs, seed=cfg.synthetic_train_seed)
            if cfg.synthetic_train_runs
            else None
        )
        if syn_train is not None:
            train_parts.append(syn_train)
        train_df = pd.concat(train_parts, ignore_index=True)
        write_frame(train_df, data_dir / "train.parquet")
        tau2_hold = RunLog.from_frame(
            pd.concat(
                [tau2_hold_runs, steps[steps["run_id"].isin(set(tau2_hold_runs["run_id"]))]],
                ignore_index=True,
            )
        )
        write_frame(
            pd.concat([tau2_hold.runs, tau2_hold.steps], ignore_index=True), data_dir / "holdout_tau2.parquet"
        )
        syn_hold_df = generate(cfg.synthetic_holdout_runs, seed=cfg.synthetic_holdout_seed)
        write_frame(syn_hold_df, data_dir / "holdout_synthetic.parquet")
        syn_hold = RunLog.from_frame(syn_hold_df)
        split = {
            "method": "by task, seeded permutation of the tau2 airline tasks with paired runs; never by row",
            "seed": cfg.seed,
            "tau2_heldout_tasks": hold_tasks,
            "tau2_train_tasks": train_tasks,
            "tau2_heldout_runs": int(len(tau2_hold_runs)),
            "tau2_heldout_runs_without_steps": int(
                (~tau2_hold_runs["run_id"].isin(set(steps["run_id"].tolist()))).sum()
            ),
            "excluded_from_training_runs": int(len(excluded)),
            "excluded_from_training_by_source": {
                k: int(v) for k, v in excluded["source"].value_counts().items()
            },
            "synthetic_heldout": {"runs": cfg.synthetic_holdout_runs, "seed": cfg.synthetic_holdout_seed},
            "synthetic_train": {"runs": cfg.synthetic_train_runs, "seed": cfg.synthetic_train_seed},
            "training_runs": int((train_df["record"] == "run").sum()),
            "training_steps": int((train_df["record"] == "step").sum()),
            "training_runs_by_source": {
                k: int(v)
                for k, v in train_df.loc[train_df["record"] == "run", "source"].value_counts().items()
            },
        }
        leak = set(tau_train["task_id"].astype(str)) & hold_set
        if leak:  # a programming error: the split must never leak
            raise RuntimeError(f"held-out tasks leaked into training: {sorted(leak)[:3]}")
        bar.console.print(
            f"[bold]2. Split[/bold]: held out {len(hold_tasks)} tau2 tasks ({len(tau2_hold_runs)} paired "
            f"gpt-oss-120b runs) + {cfg.synthetic_holdout_runs} synthetic runs (seed {cfg.synthetic_holdout_seed}); "
            f"training on {split['training_runs']} runs ({split['training_steps']} steps); "
            f"{len(excluded)} runs of held-out task ids kept out of training"
        )
        done("split + synthetic")

        # training
        stage("train")
        from training.train import TrainConfig, run_training

        mlflow_db = out / "mlflow.db"
        tcfg = TrainConfig(
            runs=[data_dir / "train.parquet"],
            out=out / "bundle",
            report_json=out / "train_report.json",
            target_frontier_share=cfg.target_frontier_share,
            holdout_share=0.0,
            evaluate=cfg.train_evaluate,
            n_folds=3,
            calibration_cv=3,
            n_estimators=cfg.n_estimators,
            random_state=cfg.seed,
            mlflow=cfg.mlflow,
            tracking_uri=f"sqlite:///{mlflow_db}" if cfg.mlflow else None,
            experiment="runroute-demo",
            registered_model="runroute-demo-bundle",
        )
        with _quiet_mlflow() if cfg.mlflow else contextlib.nullcontext():
            if cfg.mlflow:
                _mlflow_experiment(str(tcfg.tracking_uri), tcfg.experiment, out / "mlruns")
            tres = run_training(tcfg, progress=say)
        bundle = tres.bundle
        training = {
            "bundle_dir": str(out / "bundle"),
            "bundle_version": bundle.version,
            "thresholds": dict(bundle.thresholds),
            "thresholds_report": tres.report.get("thresholds"),
            "timings": tres.report.get("timings"),
            "mlflow": {k: str(v) for k, v in (tres.mlflow or {}).items()},
            "tracking_uri": tcfg.tracking_uri,
            "n_steps": tres.report.get("n_steps"),
            "n_escalation_runs": tres.report.get("n_escalation_runs"),
            "escalation": {
                k: v for k, v in (tres.report.get("escalation") or {}).items() if k != "baselines"
            },
        }
        sweep = sorted(
            set(cfg.sweep_thresholds) | set(_train_quantiles(bundle, tres.dataset, cfg.sweep_train_quantiles))
        )
        training["sweep_thresholds"] = sweep
        bar.console.print(
            f"[bold]   Trained[/bold] bundle {bundle.version} on {training['n_steps']} steps; thresholds "
            f"up {bundle.thresholds['p_frontier_up']:.3f} / down {bundle.thresholds['p_frontier_down']:.3f}"
        )
        done("train")

        # 3. compare
        sets: dict[str, Any] = {}
        scores: dict[int, Any] = {}
        plan: list[tuple[str, Any, str, SimSettings]] = [
            ("tau2-airline-heldout", tau2_hold, "simulate tau2", cfg.sim),
            ("synthetic-heldout", syn_hold, "simulate synthetic", cfg.sim),
        ]
        if cfg.busy_arrival_rate is not None:
            busy = cfg.sim.model_copy(update={"arrival_rate": cfg.busy_arrival_rate})
            plan.append(("synthetic-heldout-busy", syn_hold, "simulate synthetic (busy)", busy))
        for name, sl, stg, simset in plan:
            stage(stg)
            sets[name] = compare_policies(
                sl.runs,
                sl.steps,
                bundle=bundle,
                prices=cfg.prices,
                sim=simset,
                sweep_thresholds=sweep,
                variants=cfg.variants,
                progress=say,
            )
            if id(sl) not in scores:
                scores[id(sl)] = _model_scores(bundle, sl)
            sets[name]["model_scores"] = scores[id(sl)]
            done(stg)

        pairs_only = _run_level_pairs(runs, steps)

        stage("live")
        if cfg.live.enabled:
            try:
                live = live_segment(
                    syn_hold.runs,
                    syn_hold.steps,
                    bundle_dir=out / "bundle",
                    prices=cfg.prices,
                    live=cfg.live,
                    log_dir=out / "live-logs",
                    policies=list(POLICIES),
                    progress=say,
                )
            except Exception as e:  # noqa: BLE001 - the report says why the segment is missing
                live = {"skipped": f"live segment failed: {type(e).__name__}: {e}"}
        else:
            live = {"skipped": "disabled (--no-live)"}
        done("live")

        stage("report")
        card = {
            "schema": "runroute-scorecard/1",
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "runroute demo",
            "prices": cfg.prices.table(),
            "outcome_variants": cfg.variants,
            "split": split,
            "training": training,
            "sets": sets,
            "live": live,
            "run_level_pairs": pairs_only,
            "import_summary": summary,
            "config": json.loads(cfg.model_dump_json()),
        }
        timings["total_before_report_s"] = round(time.perf_counter() - t0, 2)
        card["timings"] = timings
        write_report(card, out)
        done("report")
    timings["total_s"] = round(time.perf_counter() - t0, 2)
    card["timings"] = timings
    write_report(card, out)  # again, with the final wall time (cheap: plots are re-drawn)
    print_scorecard(card, con)
    con.print(f"wrote {out / 'report.md'}, {out / 'scorecard.json'} and plots in {timings['total_s']:.0f} s")
    return card


@contextlib.contextmanager
def _quiet_mlflow() -> Any:
    """MLflow's INFO lines and advisory warnings (pyfunc type hints, cloudpickle) off the demo's console
    for the block; the logger level and warning hooks are restored afterwards.

    Warnings are dropped at display time (``showwarning``) rather than by a filter, because importing
    parts of mlflow prepends its own ``("once", UserWarning)`` filter, which would shadow ours."""
    import logging
    import warnings

    with contextlib.suppress(ImportError):
        import mlflow  # noqa: F401 - first: importing it configures the "mlflow" logger's level
    lg = logging.getLogger("mlflow")
    old = lg.level
    lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            shown = warnings.showwarning

            def show(
                message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
            ) -> None:
                if f"{os.sep}mlflow{os.sep}" not in str(filename):
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            yield
    finally:
        lg.setLevel(old)


def _run_level_pairs(runs: Any, steps: Any) -> dict[str, Any]:
    """Paired runs without step records (SWE-bench Pro): the only policies they can score are the two
    ends and the oracle (nothing to predict from), so report those bounds per (source, weak, strong)."""
    with_steps = set(steps["run_id"].tolist()) if len(steps) else set()
    step_sources = set(runs.loc[runs["run_id"].isin(with_steps), "source"].tolist())
    pr = runs[runs["strong_outcome"].notna() & ~runs["source"].isin(step_sources)]
    out: dict[str, Any] = {}
    for (src, weak, strong), g in pr.groupby(["source", "model", "strong_model"], dropna=True):
        w = (g["outcome"] == "success").to_numpy()
        st = (g["strong_outcome"] == "success").to_numpy()
        out[f"{src}: {weak} vs {strong}"] = {
            "runs": int(len(g)),
            "always_local_success": float(w.mean()),
            "always_frontier_success": float(st.mean()),
            "oracle_success": float((w | st).mean()),
            "oracle_escalation_rate": float((~w & st).mean()),
        }
    return out


def _train_quantiles(bundle: Any, ds: Any, n: int) -> list[float]:
    """``n`` quantiles (evenly spaced, exclusive of 0 and 1) of each training run's maximum P(frontier),
    and a point just above each."""
    if n <= 0 or ds is None or len(ds) == 0:
        return []
    import pandas as pd

    p = bundle.escalation.predict_proba(ds.X)[:, 1]
    mx = pd.Series(p).groupby(ds.meta["run_id"].to_numpy()).max().to_numpy()
    qs = np.unique(np.round(np.quantile(mx, np.linspace(0, 1, n + 2)[1:-1]), 4))
    # both sides of each quantile: calibrated probabilities bunch on steps, and a threshold at a step
    # (p >= q escalates the whole mass) behaves unlike one just above it
    return sorted({float(q) for q in qs} | {min(1.0, round(float(q) + 1e-4, 4)) for q in qs})


def _model_scores(bundle: Any, log: Any) -> dict[str, Any]:
    """The bundle's predictors scored on a held-out set (escalation AUC/Brier/ECE, cache MAE, pinball)."""
    from training.dataset import build_dataset
    from training.train import bundle_scores

    try:
        return bundle_scores(bundle, build_dataset(log))
    except ValueError as e:  # e.g. no step records or no labels: say so in the report
        return {"skipped": str(e)}


def _mlflow_experiment(tracking_uri: str, name: str, artifacts: Path) -> None:
    """Create the MLflow experiment with its artifacts under ``artifacts`` (a database tracking store
    otherwise puts them in ./mlruns of whatever the working directory is)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(name) is None:
        artifacts.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(name, artifact_location=artifacts.resolve().as_uri())


def bench_runs(
    files: Sequence[Path],
    bundle_dir: Path,
    *,
    prices: Prices | None = None,
    sim: SimSettings | None = None,
    sweep_thresholds: Sequence[float] | None = None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``runroute bench``: every policy on the given run logs with the given bundle (no training)."""
    from features.runlog import read_runlog
    from models.bundle import ModelBundle

    log = read_runlog([str(f) for f in files])
    if len(log.steps) == 0:
        raise ValueError("the run logs hold no step records to compare policies on")
    bundle = ModelBundle.load(bundle_dir)
    pr = prices or Prices()
    sw = sweep_thresholds if sweep_thresholds is not None else [round(x, 2) for x in np.linspace(0, 1, 21)]
    t0 = time.perf_counter()
    res = compare_policies(
        log.runs,
        log.steps,
        bundle=bundle,
        prices=pr,
        sim=sim or SimSettings(),
        sweep_thresholds=sw,
        variants=variants,
        progress=progress,
    )
    name = ", ".join(Path(f).name for f in files)
    return {
        "schema": "runroute-scorecard/1",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "runroute bench",
        "prices": pr.table(),
        "outcome_variants": list(variants),
        "training": {
            "bundle_dir": str(bundle_dir),
            "bundle_version": bundle.version,
            "thresholds": dict(bundle.thresholds),
        },
        "sets": {name: res},
        "live": {"skipped": "runroute bench runs the simulator only"},
        "bad_rows": len(log.bad_rows),
        "timings": {"total_s": round(time.perf_counter() - t0, 2)},
    }


def _isnum(v: Any) -> bool:
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
