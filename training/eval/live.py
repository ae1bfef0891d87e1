"""The live segment: a few held-out runs per policy through the real HTTP sidecar, fake backends.

Algorithm of :func:`live_segment`:

1. Take the first ``runs_per_policy`` runs with steps of the held-out log and reduce each to its
   shape (:class:`router.fakes.agent.RunShape`: token counts, tools offered, failed tool results).
2. Start two fake vLLM replicas and one fake frontier in threads (``router.fakes.fake_in_thread``;
   the frontier priced like the simulator's) on loopback.
3. For each policy but the oracle (the live request path has no labels): build the sidecar with
   ``router.server.app.create_app`` (settings: the fakes, this policy, the bundle directory, run logs
   under ``log_dir/<policy>``), serve it under uvicorn in a thread (``serve_in_thread``) and drive
   every sampled run concurrently, one thread per run, with :func:`router.fakes.agent.drive_run`.
   Each policy gets an equal share of the budget left (``budget_s`` for the whole segment).
4. Reduce the step results to measured figures per policy (:func:`live_figures`: latency p50/p95,
   short vs long, cache hit rate beside its upper bound, escalation rate, flaps per run, reasons).

Every server started here is stopped before returning; driver exceptions are counted in
``driver_errors``, never silent. The frontier API key is a fake one, passed through the environment
variable the settings name (restored afterwards).

Knobs: :class:`training.eval.config.LiveSettings` (runs per policy, steps per run, budget, prompt
and completion caps) and the fake backends' latency knobs in :data:`VLLM_KNOBS` / :data:`FRONTIER_KNOBS`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.figures import run_figures, step_figures, switches, upper_bound_tokens
from router.fakes.agent import DriveLimits, RunShape, StepResult, StepShape, drive_run
from training.eval.compare import POLICIES, Progress
from training.eval.config import LiveSettings
from training.eval.outcome import Prices
from training.eval.scorecard import LiveFigures, LiveSegment, Skipped

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from router.fakes.launch import FakeThread
    from router.server.settings import RouterSettings

__all__ = ["live_segment", "live_figures", "run_shapes", "VLLM_KNOBS", "FRONTIER_KNOBS"]

VLLM_KNOBS: dict[str, Any] = dict(
    model="local-model",
    base_ms=5.0,
    prefill_ms_per_token=0.02,
    decode_ms_per_token=0.5,
    max_tokens_cap=512,
    max_model_len=65536,
)
FRONTIER_KNOBS: dict[str, Any] = dict(
    model="frontier-model", api_key="sk-demo-fake", ttft_ms=150.0, tokens_per_s=400.0, max_tokens_cap=512
)
_KEY_ENV = "RUNROUTE_DEMO_FAKE_FRONTIER_KEY"  # the settings read the frontier key from the env


def live_figures(steps_by_run: list[list[StepResult]]) -> LiveFigures:
    """Measured figures of one policy from every run's step results (:mod:`router.core.figures`'
    definitions; a step's upper bound repeats the run's previous answered prompt + output)."""
    ok: list[StepResult] = []
    upper: list[int] = []
    runs_ok = [r for r in steps_by_run if r]
    frontier_steps, run_switches = [], []
    for run in runs_ok:
        prev_context = 0  # the previous step's prompt + output when it was answered
        for s in run:
            if s.status == 200:
                ok.append(s)
                upper.append(upper_bound_tokens(prev_context, s.prompt_tokens))
            prev_context = s.prompt_tokens + s.completion_tokens if s.status == 200 else 0
        frontier_steps.append(sum(1 for s in run if s.tier == "frontier"))
        run_switches.append(switches((s.tier, s.replica) for s in run if s.status == 200))
    figs = step_figures(
        served=np.ones(len(ok), dtype=bool),
        local=np.array([s.tier == "local" for s in ok], dtype=bool),
        step=np.array([s.step for s in ok], dtype=np.int64),
        prompt=np.array([s.prompt_tokens for s in ok], dtype=np.int64),
        cached=np.array([s.cached_tokens for s in ok], dtype=np.int64),
        upper=np.array(upper, dtype=np.int64),
        latency=np.array([s.latency_s for s in ok], dtype=float),
        short=np.array([s.short for s in ok], dtype=bool),
    )
    esc, flaps = run_figures(np.array(frontier_steps), np.array(run_switches))
    return LiveFigures(
        runs=len(runs_ok),
        steps=len(ok),
        errors=sum(1 for run in steps_by_run for s in run if s.status != 200),
        step_latency_s_p50=figs["step_latency_s_p50"],
        step_latency_s_p95=figs["step_latency_s_p95"],
        short_step_latency_s_p95=figs["short_step_latency_s_p95"],
        long_step_latency_s_p95=figs["long_step_latency_s_p95"],
        cache_hit_rate=figs["cache_hit_rate"],
        cache_hit_upper_bound=figs["cache_hit_upper_bound"],
        escalation_rate=esc,
        flaps_per_run=flaps,
        reasons=dict(Counter(s.reason for s in ok if s.reason)),
    )


def run_shapes(runs: pd.DataFrame, steps: pd.DataFrame, n: int) -> list[RunShape]:
    """The shapes of the first ``n`` runs (in ``runs`` order) that have step records."""
    st = steps.sort_values(["run_id", "step"], kind="stable")
    have = set(st["run_id"].tolist())
    ids = [r for r in runs["run_id"].tolist() if r in have][:n]
    out = []
    for rid in ids:
        g = st[st["run_id"] == rid]
        shape = []
        for row in g.itertuples(index=False):
            calls, errs = row.tool_calls, row.tool_result_errors
            shape.append(
                StepShape(
                    prompt=int(row.prompt_tokens),
                    completion=int(row.completion_tokens),
                    tool=calls is not None and len(calls) > 0,
                    error=errs is not None and not isinstance(errs, float) and any(bool(e) for e in errs),
                )
            )
        out.append(RunShape(run_id=str(rid), steps=tuple(shape)))
    return out


def live_segment(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    bundle_dir: Path,
    prices: Prices,
    live: LiveSettings,
    log_dir: Path,
    policies: Sequence[str],
    progress: Progress | None = None,
    on_serving: Callable[[str, str], None] | None = None,
) -> LiveSegment | Skipped:
    """Drive a few held-out runs through the real sidecar per policy (the module docstring).

    ``on_serving(policy, url)``: called once, while the first policy's runs are being driven (the
    demo's screenshot of ``/ui`` under load); its exceptions are the caller's to handle."""
    say = progress or (lambda _: None)
    t_start = time.monotonic()
    sample = run_shapes(runs, steps, live.runs_per_policy)
    if not sample:
        return Skipped(skipped="no held-out runs with steps for the live segment")
    old_key = os.environ.get(_KEY_ENV)
    os.environ[_KEY_ENV] = FRONTIER_KNOBS["api_key"]
    try:
        return _live(sample, bundle_dir, prices, live, log_dir, policies, say, t_start, on_serving)
    finally:
        if old_key is None:
            os.environ.pop(_KEY_ENV, None)
        else:
            os.environ[_KEY_ENV] = old_key


def _settings(
    label: str,
    v0: FakeThread,
    v1: FakeThread,
    fr: FakeThread,
    prices: Prices,
    bundle_dir: Path,
    log_dir: Path,
) -> RouterSettings:
    from router.server.settings import RouterSettings

    return RouterSettings.load(
        None,
        local={"urls": [v0.url, v1.url], "model": VLLM_KNOBS["model"]},
        frontier={
            "url": fr.base_url,
            "model": FRONTIER_KNOBS["model"],
            "api_key_env": _KEY_ENV,
            "price_in_per_m": prices.frontier_in_per_m,
            "price_cached_in_per_m": prices.frontier_cached_in_per_m,
            "price_out_per_m": prices.frontier_out_per_m,
        },
        policy=dict(POLICIES[label]),
        bundle={"path": str(bundle_dir), "watch_s": 0},
        scrape={"interval_s": 0.2},
        runlog={"dir": str(log_dir / label)},
        ui={"report_dir": str(log_dir.parent)},  # its /ui shows the report folder's latest plots
    )


def _live(
    sample: list[RunShape],
    bundle_dir: Path,
    prices: Prices,
    live: LiveSettings,
    log_dir: Path,
    policies: Sequence[str],
    say: Progress,
    t_start: float,
    on_serving: Callable[[str, str], None] | None = None,
) -> LiveSegment:
    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread

    deadline = t_start + live.budget_s
    limits = DriveLimits(
        max_steps=live.max_steps,
        max_prompt_tokens=live.max_prompt_tokens,
        max_completion_tokens=live.max_completion_tokens,
    )
    fk = dict(
        FRONTIER_KNOBS,
        price_in_per_m=prices.frontier_in_per_m,
        price_cached_in_per_m=prices.frontier_cached_in_per_m,
        price_out_per_m=prices.frontier_out_per_m,
    )
    per_policy: dict[str, LiveFigures | Skipped] = {}
    errors: list[str] = []
    with (
        fake_in_thread("vllm", name="fake-vllm-0", **VLLM_KNOBS) as v0,
        fake_in_thread("vllm", name="fake-vllm-1", **VLLM_KNOBS) as v1,
        fake_in_thread("frontier", **fk) as fr,
    ):
        slots = [p for p in policies if p != "oracle"]
        for i, label in enumerate(slots):
            left = deadline - time.monotonic()
            if left <= 1.0:
                per_policy[label] = Skipped(skipped="live budget spent")
                continue
            pdeadline = time.monotonic() + left / (len(slots) - i)
            app = create_app(_settings(label, v0, v1, fr, prices, bundle_dir, log_dir))
            results: list[list[StepResult]] = [[] for _ in sample]
            with serve_in_thread(app) as url:

                def work(
                    j: int,
                    url: str = url,
                    label: str = label,
                    dl: float = pdeadline,
                    res: list[list[StepResult]] = results,
                ) -> None:
                    try:
                        res[j] = drive_run(url, sample[j], limits=limits, deadline=dl, tag=f"-{label}")
                    except Exception as e:  # noqa: BLE001 - counted and reported, never silent
                        errors.append(f"{label} run {j}: {type(e).__name__}: {e}")

                threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(len(sample))]
                for t in threads:
                    t.start()
                if on_serving is not None and i == 0:
                    on_serving(label, url)
                for t in threads:
                    t.join(timeout=max(1.0, pdeadline - time.monotonic() + 35.0))
            f = per_policy[label] = live_figures(results)
            say(f"live {label}: {f.steps} steps, p95 {f.step_latency_s_p95 or 0:.3f}s")
    return LiveSegment(
        policies=per_policy,
        runs=[r.run_id for r in sample],
        wall_s=round(time.monotonic() - t_start, 2),
        backends={"vllm": VLLM_KNOBS, "frontier": {k: v for k, v in fk.items() if k != "api_key"}},
        settings=live,
        driver_errors=errors,
    )
