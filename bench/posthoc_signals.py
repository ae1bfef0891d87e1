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

The sidecar's own post-hoc kinds (:func:`router.server.hotpath.posthoc.scan`, what it records on a local
answer) replayed on every logged weak step: the kinds measurable here are ``tool_call_repeated`` (a
call identical to the previous step's: the logged ``tool_call_keys``) and ``answer_empty`` (no call,
0 completion tokens); ``answer_truncated`` needs the request's token cap and malformed / unoffered
calls need the raw arguments and the offered names, none of which the trajectories log. Their
counts enter the vector as the sidecar stores them (``sig_other`` so far, ``new_sig_other`` since
the previous step); "adds" = AUC(with them) - AUC(all features as logged), same folds.
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
    from features.prefix import POSTHOC_KINDS
    from router.server.hotpath.posthoc import scan

    steps = log.steps.set_index(["run_id", "step"]).sort_index()
    kinds_at: dict[tuple[str, int], tuple[str, ...]] = {}
    for (r, k), row in steps.iterrows():
        prev = steps.loc[(r, k - 1)] if k > 0 and (r, k - 1) in steps.index else None
        kinds_at[(str(r), int(k))] = scan(
            names=tuple(row["tool_calls"] if row["tool_calls"] is not None else ()),
            keys=tuple(row["tool_call_keys"] if row["tool_call_keys"] is not None else ()),
            args=(),
            prompt_tokens=int(row["prompt_tokens"]) if row["prompt_tokens"] == row["prompt_tokens"] else None,
            completion_tokens=int(row["completion_tokens"] or 0),
            offered=None,
            cap=None,
            previous_keys=tuple(prev["tool_call_keys"])
            if prev is not None and prev["tool_call_keys"] is not None
            else (),
        )
    step_no = ds.meta["step"].to_numpy()[keep]
    Xp = X.copy()
    so, nso = idx["sig_other"], idx["new_sig_other"]
    for i, (r, k) in enumerate(zip(rid, step_no, strict=True)):  # kinds of the earlier steps
        earlier = [len(kinds_at.get((r, j), ())) for j in range(int(k))]
        Xp[i, so] = float(sum(earlier))
        Xp[i, nso] = float(earlier[-1]) if earlier else 0.0
    tab.add_column("with the sidecar's post-hoc kinds (adds)")
    for name, y in labels.items():
        base, se = cv_auc(X, y)
        cells = [name, f"{base:.3f} +- {se:.3f}"]
        for cols in GROUPS.values():
            Xm = X.copy()
            Xm[:, [idx[c] for c in cols]] = np.nan
            m, s = cv_auc(Xm, y)
            cells.append(f"{m:.3f} +- {s:.3f} ({base - m:+.3f})")
        m, s = cv_auc(Xp, y)
        cells.append(f"{m:.3f} +- {s:.3f} ({m - base:+.3f})")
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
    for kind in POSTHOC_KINDS:
        hit = pd.Series([kind in kinds_at.get((r, int(k)), ()) for r, k in zip(rid, step_no, strict=True)])
        fired = hit.groupby(rid).max()
        prev.add_row(f"sidecar {kind}", f"{fired[f].mean():.3f}", f"{fired[~f].mean():.3f}")
    con.print(prev)
    con.print(f"total {time.perf_counter() - t0:.1f}s (2-core machine shared with other work)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
