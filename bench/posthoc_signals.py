"""What the post-hoc signals the router sees on the local tier add, on the shipped tau2 trajectories.

Usage (from the repository root)::

    .venv/bin/python bench/posthoc_signals.py [--folds 5] [--trees 80]

Signals (each a group of existing features, computed from what the router itself saw of the run's
earlier steps, :mod:`features.extract`): **tool errors** (``tool_errors``, ``tool_error_streak``,
``new_tool_errors``: error tool results), **repeated calls** (``repeated_tool_calls``,
``max_key_repeats``, ``last_call_repeated``: identical calls), **answer shape** (``out_tokens_last``,
``out_tokens_mean``, ``out_tokens_max``, ``structured_share``: empty, short or unstructured answers).
Malformed tool calls and calls naming no offered tool cannot be measured here: the logged
trajectories hold only calls that parsed, and the tool names offered are not logged.

On the weak runs of ``data/paired/tau2bench_all.parquet`` (every step a row), for two labels
(``weak failed``: the run's own outcome; ``needs frontier``: the per-run pairing label), a LightGBM
classifier in task-grouped ``--folds``-fold CV (steps of one task never straddle folds) with all
features and with each group masked (set to NaN): AUC mean over folds and its SE (std / sqrt(folds));
"adds" = AUC(all) - AUC(without the group). Also each group's prevalence: the share of weak-failed
and of weak-succeeded runs in which the signal fired at any step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GROUPS = {
    "tool errors": ("tool_errors", "tool_error_streak", "new_tool_errors"),
    "repeated calls": ("repeated_tool_calls", "max_key_repeats", "last_call_repeated"),
    "answer shape": ("out_tokens_last", "out_tokens_mean", "out_tokens_max", "structured_share"),
}
FIRES = {"tool errors": "tool_errors", "repeated calls": "repeated_tool_calls"}


def main() -> int:
    import numpy as np
    from lightgbm import LGBMClassifier
    from rich.console import Console
    from rich.table import Table
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    from features.extract import FEATURE_NAMES
    from features.runlog import read_runlog
    from features.samples import sample_path
    from training.dataset import build_dataset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--trees", type=int, default=80)
    a = ap.parse_args()
    con = Console(width=160)
    t0 = time.perf_counter()
    log = read_runlog(sample_path("paired/tau2bench_all.parquet"))
    ds = build_dataset(log)
    runs = log.runs.set_index("run_id")
    rid = ds.meta["run_id"].astype(str).to_numpy()
    weak = runs["pair_label"].notna()
    keep = np.array([bool(weak.get(r, False)) for r in rid])
    X = ds.escalation_X()[keep]
    rid, groups = rid[keep], ds.meta["group"].astype(str).to_numpy()[keep]
    labels = {
        "weak failed": np.array([runs.at[r, "outcome"] != "success" for r in rid], dtype=int),
        "needs frontier": np.array([bool(runs.at[r, "needs_frontier"]) for r in rid], dtype=int),
    }
    idx = {n: i for i, n in enumerate(FEATURE_NAMES)}

    def cv_auc(Xv: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        aucs = []
        for tr, te in GroupKFold(n_splits=a.folds).split(Xv, y, groups):
            if len(set(y[te])) < 2:
                continue
            clf = LGBMClassifier(
                n_estimators=a.trees, learning_rate=0.05, num_leaves=15, verbose=-1, random_state=0
            )
            clf.fit(Xv[tr], y[tr])
            aucs.append(roc_auc_score(y[te], clf.predict_proba(Xv[te])[:, 1]))
        x = np.array(aucs)
        return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))

    tab = Table(
        title=f"post-hoc local-tier signals: task-grouped {a.folds}-fold CV AUC on {len(set(rid))} weak runs"
    )
    tab.add_column("label")
    tab.add_column("all features")
    for g in GROUPS:
        tab.add_column(f"without {g} (adds)")
    for name, y in labels.items():
        base, se = cv_auc(X, y)
        cells = [name, f"{base:.3f} +- {se:.3f}"]
        for cols in GROUPS.values():
            Xm = X.copy()
            Xm[:, [idx[c] for c in cols]] = np.nan
            m, s = cv_auc(Xm, y)
            cells.append(f"{m:.3f} +- {s:.3f} ({base - m:+.3f})")
        tab.add_row(*cells)
    con.print(tab)
    fail = labels["weak failed"].astype(bool)
    prev = Table(title="prevalence: share of runs in which the signal fired at any step")
    for c in ("signal", "weak-failed runs", "weak-succeeded runs"):
        prev.add_column(c)
    import pandas as pd

    for g, col in FIRES.items():
        fired = pd.Series(X[:, idx[col]] > 0).groupby(rid).max()
        f = pd.Series(fail).groupby(rid).max()
        prev.add_row(g, f"{fired[f].mean():.3f}", f"{fired[~f].mean():.3f}")
    later = X[:, idx["step_index"]] > 0  # step 0 has no earlier answer: its out_tokens_last is 0
    out0 = pd.Series(later & (X[:, idx["out_tokens_last"]] == 0)).groupby(rid).max()
    f = pd.Series(fail).groupby(rid).max()
    prev.add_row(
        "empty answer (0 output tokens, after step 0)", f"{out0[f].mean():.3f}", f"{out0[~f].mean():.3f}"
    )
    con.print(prev)
    con.print(f"total {time.perf_counter() - t0:.1f}s (2-core machine shared with other work)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
