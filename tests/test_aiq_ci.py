"""Every AIQ carries a task-bootstrap interval and every policy a paired difference to
per-step-threshold (training.eval.compare._bootstrap_aiq), on hand-made per-run values."""

from __future__ import annotations

import numpy as np

from training.eval.compare import _bootstrap_aiq
from training.eval.curves import aiq


def _vals(tasks, succ, cost):
    return (list(tasks), np.asarray(succ, dtype=float), np.asarray(cost, dtype=float))


def _rows_and_vals(seed: int = 0):
    rng = np.random.default_rng(seed)
    n = 120
    tasks = [f"t{i // 3}" for i in range(n)]  # 40 tasks, 3 runs each
    weak = (rng.random(n) < 0.4).astype(float)
    strong = (rng.random(n) < 0.8).astype(float)
    esc = rng.random(n) < 0.3
    good = np.where(esc | (weak == 0), strong, weak)  # escalates the right runs more often
    vals = {
        "always-local": _vals(tasks, weak, np.full(n, 0.01)),
        "always-frontier": _vals(tasks, strong, np.full(n, 0.10)),
        "per-step-threshold": _vals(tasks, np.where(esc, strong, weak), np.where(esc, 0.10, 0.01)),
        "good": _vals(tasks, good, np.where(esc | (weak == 0), 0.10, 0.01)),
    }
    rows = []
    lo_c, hi_c = vals["always-local"][2].sum(), vals["always-frontier"][2].sum()
    q_l = float(np.nanmean(vals["always-local"][1]))
    for p, (_, s, c) in vals.items():
        q = float(np.nanmean(s))
        rows.append({"policy": p, "success_rate": q, "aiq": aiq([(c.sum(), q)], (lo_c, q_l), lo_c, hi_c)})
    return rows, vals


def test_aiq_interval_holds_the_estimate_and_paired_differences_are_signed():
    rows, vals = _rows_and_vals()
    _bootstrap_aiq(rows, {}, vals, {}, n_boot=200)
    by = {r["policy"]: r for r in rows}
    for r in rows:
        assert r["aiq_ci_low"] <= r["aiq"] + 1e-9 and r["aiq"] <= r["aiq_ci_high"] + 1e-9, r
        assert r["aiq_se"] > 0 or r["policy"] == "always-local", r
    ref = by["per-step-threshold"]
    assert (
        ref["success_diff_vs_ref"] == 0
        and ref["success_diff_vs_ref_ci_low"] == 0 == ref["success_diff_vs_ref_ci_high"]
    )
    g = by["good"]  # better on every run where they differ: the paired interval excludes 0
    assert g["success_diff_vs_ref"] > 0 and g["success_diff_vs_ref_ci_low"] > 0
    assert g["success_diff_vs_ref_ci_low"] <= g["success_diff_vs_ref"] <= g["success_diff_vs_ref_ci_high"]
    # the paired interval is narrower than the two separate intervals side by side would suggest
    assert g["aiq_diff_vs_ref_ci_high"] - g["aiq_diff_vs_ref_ci_low"] < (
        g["aiq_ci_high"] - g["aiq_ci_low"]
    ) + (ref["aiq_ci_high"] - ref["aiq_ci_low"])


def test_no_reference_no_paired_figures_and_one_task_no_interval():
    rows, vals = _rows_and_vals()
    rows = [r for r in rows if r["policy"] != "per-step-threshold"]
    vals.pop("per-step-threshold")
    _bootstrap_aiq(rows, {}, vals, {}, n_boot=50)
    assert all("success_diff_vs_ref" not in r and r["aiq_ci_low"] is not None for r in rows)
    one = {p: (["t"] * len(v[0]), v[1], v[2]) for p, v in vals.items()}
    rows2 = [{"policy": p} for p in one]
    _bootstrap_aiq(rows2, {}, one, {}, n_boot=50)
    assert all("aiq_ci_low" not in r for r in rows2)
