"""Benchmark: single-decision latency and training time of the predictors.

1. Latency: trains a bundle on ``--latency-runs`` synthetic runs (features.generate), then times
   ``ModelBundle.predict(prefix)`` (feature extraction + all six LightGBM predictions + calibration)
   in-process over ``--calls`` prefixes drawn from other synthetic runs (all step indices), and prints
   p50/p99/max, with the features-only share. Target: p99 < 0.5 ms.
2. Training time: generates about ``--train-steps`` synthetic steps (default 1,000,000) and times
   the training job without the cross-validated evaluation and without MLflow: run log -> features
   and labels (with the LRU cache replay) -> escalation model with its out-of-fold calibration ->
   cache-reuse model -> remaining steps/tokens quantile models -> bundle saved. Target: < 2 minutes
   on 2 cores. ``--train-steps 0`` skips it.

Usage: ``python bench/bench_predict.py [--calls 20000] [--train-steps 1000000] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cfg(out: Path, **kw: object):  # type: ignore[no-untyped-def]
    from training.train import TrainConfig

    return TrainConfig(runs=[out], out=out, evaluate=False, mlflow=False, holdout_share=0.0, **kw)


def latency(n_runs: int, calls: int, seed: int) -> dict[str, float]:
    from features.extract import extract, iter_frame_prefixes
    from features.generate import generate
    from features.runlog import RunLog
    from training.train import train_on_log

    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog.from_frame(generate(n_runs, seed))
        res = train_on_log(log, _cfg(Path(tmp) / "bundle"))
    bundle = res.bundle
    probe = RunLog.from_frame(generate(max(200, calls // 10), seed + 1))
    prefixes = [p for _, p in iter_frame_prefixes(probe.steps)]
    rng = np.random.default_rng(seed)
    order = rng.integers(0, len(prefixes), size=calls)
    for i in order[:500]:  # warm-up
        bundle.predict(prefixes[i])
    buf = np.empty(len(extract(prefixes[0])))
    t_all = np.empty(calls)
    t_feat = np.empty(calls)
    clock = time.perf_counter_ns
    for j, i in enumerate(order):
        p = prefixes[i]
        a = clock()
        bundle.predict(p)
        b = clock()
        extract(p, out=buf)
        c = clock()
        t_all[j] = (b - a) / 1e3
        t_feat[j] = (c - b) / 1e3
    steps = np.array([prefixes[i].step_index for i in order])
    return {
        "calls": calls,
        "mean_step_index": float(steps.mean()),
        "max_step_index": int(steps.max()),
        "decision_p50_us": float(np.percentile(t_all, 50)),
        "decision_p99_us": float(np.percentile(t_all, 99)),
        "decision_max_us": float(t_all.max()),
        "features_p50_us": float(np.percentile(t_feat, 50)),
        "features_p99_us": float(np.percentile(t_feat, 99)),
    }


def training_time(target_steps: int, seed: int) -> dict[str, float]:
    from features.generate import generate
    from features.runlog import RunLog
    from training.train import train_on_log

    probe = generate(500, seed)
    per_run = float((probe["record"] == "step").sum()) / 500
    n_runs = max(1, int(round(target_steps / per_run)))
    t = time.perf_counter()
    log = RunLog.from_frame(generate(n_runs, seed))
    gen_s = time.perf_counter() - t
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        t, c = time.perf_counter(), time.process_time()
        res = train_on_log(log, _cfg(Path(tmp) / "bundle"))
        train_s = time.perf_counter() - t
        main_cpu = time.process_time() - c
    tm = res.report["timings"]
    workers = tm.get("fit_cpu_s", 0.0) if len(log.steps) >= 200_000 else 0.0  # fits ran in worker processes
    out = {
        "runs": n_runs,
        "steps": len(log.steps),
        "generate_s": round(gen_s, 2),
        "train_s": round(train_s, 2),
        "cpu_s": round(main_cpu + workers, 1),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
    }
    out.update({k: v for k, v in res.report["timings"].items() if k != "total_s"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-runs", type=int, default=3000)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--train-steps", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}", flush=True)
    res: dict[str, object] = {}
    lat = latency(a.latency_runs, a.calls, a.seed)
    res["latency"] = lat
    print(
        f"single decision (features + 6 predictions), {lat['calls']} calls, mean step index "
        f"{lat['mean_step_index']:.1f}: p50 {lat['decision_p50_us']:.0f} us  p99 {lat['decision_p99_us']:.0f} us  "
        f"max {lat['decision_max_us']:.0f} us  (features alone p50 {lat['features_p50_us']:.0f} us, "
        f"p99 {lat['features_p99_us']:.0f} us)  target p99 < 500 us",
        flush=True,
    )
    if a.train_steps > 0:
        tr = training_time(a.train_steps, a.seed)
        res["training"] = tr
        print(
            f"training on {tr['steps']:,} synthetic steps ({tr['runs']:,} runs): {tr['train_s']:.1f} s "
            f"(features+labels {tr.get('features_s', 0):.1f} s, fit {tr.get('fit_final_s', 0):.1f} s; "
            f"generating the data took {tr['generate_s']:.1f} s, not counted)  target < 120 s; "
            f"CPU {tr['cpu_s']:.0f} s in all processes (= {tr['cpu_s'] / 2:.0f} s wall on 2 idle cores); "
            f"load average {tr['loadavg_1m_before']:.1f} -> {tr['loadavg_1m_after']:.1f}",
            flush=True,
        )
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
