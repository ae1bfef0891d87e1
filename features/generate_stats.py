"""The statistics the generator's calibration compares: :func:`summary_stats` of a run-log frame (the
same definitions as ``bench/calibrate_generator.py`` computes on the raw traces) and
:func:`log_odds_ratio`, the strength of a failure signal (a tool call repeating an earlier one, a
tool result that is an error) in failed vs successful runs.

:func:`log_median_ratio`: how much bigger tool results are in failed runs (log of the ratio of
medians). Algorithm of :func:`log_odds_ratio`: a 2x2 table (event yes/no x run failed yes/no) with 0.5 added
to every cell (Haldane-Anscombe: tau-bench's successful runs repeat a call only twice), log odds
ratio and its Woolf standard error sqrt(sum 1/cell).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["summary_stats", "log_odds_ratio", "log_median_ratio"]


def log_odds_ratio(event: np.ndarray, failed: np.ndarray) -> tuple[float, float]:
    """(log odds ratio of ``event`` in failed vs successful runs, its standard error)."""
    e, f = np.asarray(event, dtype=bool), np.asarray(failed, dtype=bool)
    a, b = float((e & f).sum()) + 0.5, float((~e & f).sum()) + 0.5
    c, d = float((e & ~f).sum()) + 0.5, float((~e & ~f).sum()) + 0.5
    return math.log((a / b) / (c / d)), math.sqrt(1 / a + 1 / b + 1 / c + 1 / d)


def log_median_ratio(sizes: np.ndarray, failed: np.ndarray) -> float:
    """log(median of ``sizes`` in failed runs / median in successful runs) (NaN if a side is empty)."""
    x, f = np.asarray(sizes, dtype=np.float64), np.asarray(failed, dtype=bool)
    if not f.any() or f.all():
        return float("nan")
    return float(math.log(max(np.median(x[f]), 1.0) / max(np.median(x[~f]), 1.0)))


def summary_stats(df: pd.DataFrame) -> dict[str, float]:
    """The statistics the calibration compares (same definitions as bench/calibrate_generator.py)."""
    import pandas as pd

    runs = df[df["record"] == "run"]
    steps = df[df["record"] == "step"].sort_values(["run_id", "step"], kind="stable")
    out: dict[str, float] = {}
    ok = runs["outcome"] == "success"
    out["n_runs"] = float(len(runs))
    out["success_rate"] = float(ok.mean())
    out["needs_frontier_rate"] = float((runs["pair_label"] == "needs_frontier").mean())
    out["both_fail_rate"] = float((runs["pair_label"] == "both_fail").mean())
    out["strong_success_rate"] = float((runs["strong_outcome"] == "success").mean())
    out["median_steps_success"] = float(runs.loc[ok, "n_steps"].median())
    out["median_steps_failure"] = float(runs.loc[~ok, "n_steps"].median())
    pt = steps["prompt_tokens"].to_numpy(dtype=float)
    ct = steps["completion_tokens"].to_numpy(dtype=float)
    k = steps["step"].to_numpy()
    later = k > 0
    out["prompt_repeat_share_median"] = float(
        np.median(steps["prefix_reuse_tokens"].to_numpy(float)[later] / pt[later])
    )
    n_calls = steps["tool_calls"].map(len).to_numpy()
    tool = n_calls > 0
    out["tool_step_share"] = float(tool.mean())
    out["short_step_share"] = float((ct <= 64).mean())
    out["tool_completion_median"] = float(np.median(ct[tool]))
    out["text_completion_median"] = float(np.median(ct[~tool]))
    out["first_prompt_median"] = float(np.median(pt[~later]))
    out["prompt_p50"] = float(np.percentile(pt, 50))
    out["prompt_p95"] = float(np.percentile(pt, 95))
    res_tok = np.concatenate([np.asarray(x) for x in steps["tool_result_tokens"] if len(x)] or [np.zeros(0)])
    res_err = np.concatenate([np.asarray(x) for x in steps["tool_result_errors"] if len(x)] or [np.zeros(0)])
    out["tool_result_tokens_median"] = (
        float(np.median(res_tok[~res_err.astype(bool)])) if len(res_tok) else float("nan")
    )
    out["tool_error_share"] = float(res_err.mean()) if len(res_err) else float("nan")
    keys = pd.DataFrame({"run_id": steps["run_id"].to_numpy(), "key": steps["tool_call_keys"].to_numpy()})
    keys = keys[tool].explode("key")
    dup = keys.duplicated(["run_id", "key"]).to_numpy()
    out["repeated_call_share"] = float(dup.mean()) if len(keys) else float("nan")
    failed_run = dict(zip(runs["run_id"], runs["outcome"] != "success", strict=True))
    key_failed = np.array([failed_run.get(r, False) for r in keys["run_id"]], dtype=bool)
    out["repeat_log_odds_failure"] = log_odds_ratio(dup, key_failed)[0] if len(keys) else float("nan")
    n_res = steps["tool_result_errors"].map(len).to_numpy()
    res_failed = np.repeat(np.array([failed_run.get(r, False) for r in steps["run_id"]], dtype=bool), n_res)
    ok_res = ~res_err.astype(bool)
    out["result_size_log_ratio_failure"] = (
        log_median_ratio(res_tok[ok_res], res_failed[ok_res]) if len(res_tok) else float("nan")
    )
    out["error_log_odds_failure"] = (
        log_odds_ratio(res_err.astype(bool), res_failed)[0] if len(res_err) else float("nan")
    )
    prev_tool = np.concatenate([[False], tool[:-1]]) & later
    pause = steps["tool_pause_s"].to_numpy(dtype=float)
    out["tool_pause_median_s"] = float(np.nanmedian(pause[prev_tool])) if prev_tool.any() else float("nan")
    after_text = later & ~np.concatenate([[False], tool[:-1]])
    out["user_pause_median_s"] = float(np.nanmedian(pause[after_text])) if after_text.any() else float("nan")
    out["latency_median_s"] = float(np.nanmedian(steps["latency_s"].to_numpy(dtype=float)))
    return out
