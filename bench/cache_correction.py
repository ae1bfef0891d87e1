"""What a learned correction adds to the cache-reuse prediction read from the prefix index.

Usage::

    .venv/bin/python bench/cache_correction.py [--data ../shared/data] [--kv-cache-gb 50]
        [--replicas 12] [--policy prefix-aware] [--held-out 0.2] [--limit-runs N]

Algorithm:

1. Import the whole Mooncake conversation trace and simulate it (trace arrivals, ``--policy``,
   ``--replicas`` x ``--kv-cache-gb``, a100 profile) through the what-if simulator, which places
   through the step engine's prefix index. Per step locally served: the feature vector the engine
   extracted (``plan.x``), the index's prediction (the matched prefix on the chosen replica,
   ``StepPlan.warm_tokens`` = matched blocks x the index's block size) and the simulated cached
   tokens (the node's cache model: what the replica's own cache held when the step was admitted).
2. Split by logged arrival time: steps arriving in the last ``--held-out`` share of the trace's
   time span are held out; the correction trains only on the earlier ones.
3. The correction: :class:`models.cache_reuse.CacheReuseRegressor` (LightGBM, L1, its defaults),
   inputs = the feature vector + the index's prediction, target = simulated cached - index
   prediction; the corrected prediction = index + correction, clipped to [0, prompt - 1].
4. MAE per step on the held-out steps (and on their runs' first steps): predicting 0, the index
   alone, index + correction, and the features-only learned model (the same regressor on the
   features alone, the cache model's old form). Nothing is tuned on the held-out steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--replicas", type=int, default=12)
    ap.add_argument("--kv-cache-gb", type=float, default=50.0)
    ap.add_argument("--policy", default="prefix-aware")
    ap.add_argument("--held-out", type=float, default=0.2)
    ap.add_argument("--limit-runs", type=int, default=None)
    a = ap.parse_args()

    from features.importers.mooncake import import_mooncake
    from features.runlog import RunLog
    from models.cache_reuse import CacheReuseRegressor
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.scorecard import SERVED_LOCAL
    from router.sim.simulator import Simulator
    from router.sim.whatif import SimConfig, Workload

    t0 = time.perf_counter()
    log = RunLog.from_frame(import_mooncake(a.data / "mooncake" / "conversation_trace.jsonl"))
    if a.limit_runs is not None:
        keep = log.steps["run_id"].drop_duplicates().iloc[: a.limit_runs]
        log = RunLog.from_frame(log.steps[log.steps["run_id"].isin(set(keep))])
    work = Workload.from_runlog(log)
    starts = run_starts("trace", len(work.runs), logged_starts=work.logged_starts())
    cfg = SimConfig(
        profile=load_profile(None, "a100"), kv_cache_gb=a.kv_cache_gb, replicas=a.replicas, log_steps=True
    )

    class _Sim(Simulator):
        def _step_done(self, run: Any, ttft: float, lat: float, cached: int, code: int, tier: str) -> None:
            i = run.g0 + run.k
            self.index_pred[i] = run.plan.warm_tokens if tier == "local" else 0
            if run.plan.x is not None:
                self.xs[i] = run.plan.x
            super()._step_done(run, ttft, lat, cached, code, tier)

    sim = _Sim(work, build_policy(a.policy), cfg, starts)
    n = len(sim.outcome)
    sim.index_pred = np.zeros(n)  # type: ignore[attr-defined]
    sim.xs = [None] * n  # type: ignore[attr-defined]
    res = sim.run()
    st = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    arrival = st["arrival_s"].to_numpy(dtype=np.float64)
    lo, hi = float(np.nanmin(arrival)), float(np.nanmax(arrival))
    cut = hi - a.held_out * (hi - lo)
    ok = (res.outcome == SERVED_LOCAL) & np.array([x is not None for x in sim.xs])
    X = np.vstack([x if x is not None else np.zeros_like(sim.xs[np.flatnonzero(ok)[0]]) for x in sim.xs])
    idx = sim.index_pred
    act = res.cached.astype(np.float64)
    prompt = res.prompt.astype(np.float64)
    train, test = ok & (arrival < cut), ok & (arrival >= cut)
    Xi = np.column_stack([X, idx])
    corr = CacheReuseRegressor().fit(Xi[train], (act - idx)[train])
    pred_c = np.clip(idx + corr.predict(Xi), 0, np.maximum(prompt - 1, 0))
    plain = CacheReuseRegressor().fit(X[train], act[train])
    pred_f = np.clip(plain.predict(X), 0, np.maximum(prompt - 1, 0))
    print(
        f"{len(work.runs):,} runs, {n:,} steps; {a.policy}, {a.replicas} x a100 {a.kv_cache_gb:g} GB; "
        f"train {int(train.sum()):,} local steps before t={cut:.0f} s, held out {int(test.sum()):,}"
    )
    for name, m in (("held-out steps", test), ("held-out first steps", test & (res.step_index == 0))):
        if not m.any():
            continue
        print(
            f"  {name} ({int(m.sum()):,}): MAE predicting 0 {act[m].mean():.0f}, index "
            f"{np.abs(idx[m] - act[m]).mean():.0f}, index + correction {np.abs(pred_c[m] - act[m]).mean():.0f}, "
            f"features-only model {np.abs(pred_f[m] - act[m]).mean():.0f} tokens; mean cached {act[m].mean():.0f}"
        )
    print(f"({time.perf_counter() - t0:.0f} s wall on the shared 2-core machine)")


if __name__ == "__main__":
    # The per-step belief is read by a subclass of Simulator, which the compiled simulator modules
    # refuse (router/native.py): run as a script, this bench uses them as pure Python (same results,
    # tests/test_native.py). Set before anything imports router; not on import (a test importing this
    # file would turn the build off for its whole process).
    os.environ["RUNROUTE_NATIVE"] = "0"
    main()
