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
3. Extraction cost against run length (``--lengths 20,200,1000``; empty skips it): for a seeded
   synthetic run of k steps (tool calls with repeats, errors, cache counters, both tiers), the full
   scan (``extract`` on a prefix without a current aggregate: what every step cost before running
   aggregates) against the router's and simulator's path (``RunPrefix.append`` of the finished step,
   then ``extract`` on the prefix whose aggregate is current). Target: the latter flat in k.
4. The boosters (``--boosters N``; 0 skips): the bundle ``--bundle`` (default ``./runroute-bundle``)
   predicts N rows (random, with NaNs, zeros and values on its splits' thresholds) through one
   merged booster (``models.forest``, the default) and through one C call per booster
   (``merge_boosters=False``): the largest difference of any output and the decisions flipped
   (P(frontier) against either threshold), then ``predict_features`` per row timed both ways,
   interleaved row by row, hot (back to back) and cold (a 32 MB buffer read between rows, untimed:
   the server's other work between two requests evicts the trees from the caches).

Usage: ``python bench/bench_predict.py [--calls 20000] [--train-steps 1000000] [--lengths 20,200,1000]
[--boosters 3000 --bundle DIR] [--json OUT]`` (``--calls 0`` skips the latency part)
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


def _long_run(k: int, seed: int) -> list:  # type: ignore[type-arg]
    from features.prefix import StepView

    rng = np.random.default_rng(seed)
    names = [f"tool_{i}" for i in range(20)]
    out = []
    for i in range(k):
        n = int(rng.integers(0, 3))
        calls = tuple(names[int(j)] for j in rng.integers(0, 20, n))
        out.append(
            StepView(
                prompt_tokens=1000 + 50 * i,
                completion_tokens=int(rng.integers(1, 300)),
                cached_tokens=int(rng.integers(0, 1000)) if rng.random() < 0.8 else None,
                tool_calls=calls,
                tool_call_keys=tuple(f"{c}:{int(rng.integers(0, 50))}" for c in calls),
                tool_results_n=n,
                tool_result_errors=tuple(bool(rng.random() < 0.2) for _ in calls),
                tool_result_tokens=tuple(int(rng.integers(1, 500)) for _ in calls),
                tool_pause_s=float(rng.random()) if i else None,
                arrival_s=float(i),
                latency_s=1.0,
                structured=bool(calls) or None,
                tier="local" if rng.random() < 0.8 else "frontier",
            )
        )
    return out


def extraction_scaling(lengths: list[int], seed: int) -> dict[str, dict[str, float]]:
    from features.extract import N_FEATURES, StepAggregate, extract
    from features.prefix import RunPrefix

    buf = np.empty(N_FEATURES)
    clock = time.perf_counter_ns
    res: dict[str, dict[str, float]] = {}
    for k in lengths:
        views = _long_run(k + 1, seed)
        p = RunPrefix(run_id="r", new_prompt_tokens=5000, new_tool_result_errors=(True,))
        for v in views[:k]:
            p.append(v)
        reps = max(200, 20_000 // max(k, 1))
        t_full = np.empty(reps)
        for j in range(reps):
            p.aggregate = None  # no current aggregate: the full scan
            a = clock()
            extract(p, out=buf)
            t_full[j] = clock() - a
        # the router/simulator path: the previous step is appended, then the new one extracted
        # (each timed append starts from k - 1 steps and a fresh aggregate, rebuilt untimed)
        t_inc = np.empty(reps)
        last = p.steps.pop()
        for j in range(reps):
            p.aggregate = StepAggregate.of(p.steps)
            a = clock()
            p.append(last)
            extract(p, out=buf)
            t_inc[j] = clock() - a
            p.steps.pop()
        res[str(k)] = {
            "full_scan_us": float(np.median(t_full)) / 1e3,
            "append_extract_us": float(np.median(t_inc)) / 1e3,
        }
    return res


def _probe_rows(bundle, n: int, seed: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Random rows; on each a few features set to a split's threshold (or one ulp either side),
    NaN or 0.0."""
    from features.extract import N_FEATURES

    rng = np.random.default_rng(seed)
    splits: list[tuple[int, float]] = []

    def walk(node: dict) -> None:  # type: ignore[type-arg]
        if "split_feature" in node:
            splits.append((int(node["split_feature"]), float(node["threshold"])))
            walk(node["left_child"])
            walk(node["right_child"])

    for b in bundle._boosters():
        for t in b.dump_model(num_iteration=-1)["tree_info"]:
            walk(t["tree_structure"])
    X = rng.normal(size=(n, N_FEATURES)) * rng.choice([1.0, 100.0, 10_000.0], size=N_FEATURES)
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    for i in range(n):
        for _ in range(int(rng.integers(1, 12))):
            f, thr = splits[int(rng.integers(len(splits)))]
            X[i, f] = [thr, np.nextafter(thr, np.inf), np.nextafter(thr, -np.inf)][int(rng.integers(3))]
    return X


def boosters(path: Path, n: int, seed: int) -> dict[str, float]:
    from dataclasses import astuple

    from models.bundle import ModelBundle

    merged = ModelBundle.load(path)
    if merged._merged is None:
        raise SystemExit(f"bench_predict: {path} cannot be merged (see the log line)")
    single = ModelBundle.load(path)
    single.merge_boosters, single._merged, single._unmerged = False, None, True
    X = _probe_rows(merged, n, seed)
    up, down = merged.thresholds["p_frontier_up"], merged.thresholds["p_frontier_down"]
    diff = flips = 0.0
    for x in X:
        a, b = merged.predict_features(x), single.predict_features(x)
        for u, v in zip(astuple(a), astuple(b), strict=True):
            if isinstance(u, float) and not (u == v or (u != u and v != v)):
                diff = max(diff, abs(u - v))
        flips += (a.p_frontier >= up) != (b.p_frontier >= up) or (a.p_frontier < down) != (
            b.p_frontier < down
        )
    junk = np.ones(32 << 17)  # 32 MB
    clock = time.perf_counter_ns
    res: dict[str, float] = {"rows": n, "max_abs_diff": diff, "decision_flips": flips}
    for cold in (False, True):
        t_m, t_s = np.empty(n), np.empty(n)
        for j, x in enumerate(X):
            for bundle, t in ((merged, t_m), (single, t_s)) if j % 2 else ((single, t_s), (merged, t_m)):
                if cold:
                    junk.sum()
                a = clock()
                bundle.predict_features(x)
                t[j] = clock() - a
        mode = "cold" if cold else "hot"
        for name, t in (("merged", t_m), ("per_booster", t_s)):
            res[f"{mode}_{name}_p50_us"] = float(np.percentile(t, 50)) / 1e3
            res[f"{mode}_{name}_p90_us"] = float(np.percentile(t, 90)) / 1e3
    return res


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
    ap.add_argument("--lengths", default="20,200,1000")
    ap.add_argument("--boosters", type=int, default=3000)
    ap.add_argument("--bundle", type=Path, default=Path(__file__).resolve().parents[1] / "runroute-bundle")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}", flush=True)
    res: dict[str, object] = {}
    lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    if lengths:
        sc = extraction_scaling(lengths, a.seed)
        res["extraction_scaling"] = sc
        for k, v in sc.items():
            print(
                f"feature extraction at step {k}: full scan {v['full_scan_us']:.1f} us; "
                f"append + extract with running aggregates {v['append_extract_us']:.1f} us",
                flush=True,
            )
    if a.boosters > 0:
        bo = boosters(a.bundle, a.boosters, a.seed)
        res["boosters"] = bo
        print(
            f"boosters of {a.bundle.name}, {a.boosters} rows: merged vs one call per booster: largest output "
            f"difference {bo['max_abs_diff']:.3g}, decisions flipped {bo['decision_flips']:.0f}; predict_features "
            f"per row hot p50 {bo['hot_merged_p50_us']:.1f} vs {bo['hot_per_booster_p50_us']:.1f} us "
            f"(p90 {bo['hot_merged_p90_us']:.1f} vs {bo['hot_per_booster_p90_us']:.1f}), cold p50 "
            f"{bo['cold_merged_p50_us']:.1f} vs {bo['cold_per_booster_p50_us']:.1f} us "
            f"(p90 {bo['cold_merged_p90_us']:.1f} vs {bo['cold_per_booster_p90_us']:.1f})",
            flush=True,
        )
    if a.calls <= 0:
        lat = None
    else:
        lat = latency(a.latency_runs, a.calls, a.seed)
        res["latency"] = lat
    if lat is not None:
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
