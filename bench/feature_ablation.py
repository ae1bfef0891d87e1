"""Does a feature group help? Task-grouped CV of the escalation label per source, with and without it.

For each labelled source of the shipped samples (or the run logs given), every step row with a
``y_frontier`` label is a row; folds are by task (``group``: steps of one task never straddle
folds). A LightGBM classifier is fitted on the fs-2 features and on variants: ``+ buckets`` (fs-1's
16 tool-name hash-bucket features, ``crc32(name) % 8`` counts and shares over the earlier steps,
recomputed here from the same prefixes), ``- verbs`` (fs-2 without its verb classes), ``+ domain
z`` (fs-2 plus :mod:`features.domain_norm`'s per-domain z-scores, statistics from each domain's own
rows, no labels) and ``z for raw`` (the z-scores instead of the raw sizes/times/counts). The table
prints the AUC mean over folds with its standard error (std over folds / sqrt(folds)). A group
"helps" in a source when adding it raises (dropping it lowers) the AUC by more than the SE. Small
on purpose (CPU-light): ``--folds 5 --trees 100``.

    python bench/feature_ablation.py [--runs data/*.parquet] [--folds 5] [--trees 100]
    python bench/feature_ablation.py --tau2 ../shared/data/tau2bench   # per domain + leave-one-domain-out

With ``--tau2`` every tau2-bench file is imported (label: the run's failure, the outcome fallback:
no pairing), rows are split by domain (the task id's prefix), and besides the in-domain CV each
domain is also scored by a model trained on the other domains (leave-one-domain-out, one fit;
SE by a bootstrap over the held-out domain's tasks is left out: the in-domain SE is the yardstick).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _buckets(steps) -> np.ndarray:  # type: ignore[no-untyped-def]
    """fs-1's hash-bucket features (counts, shares over the earlier steps' tool calls) per row."""
    import zlib

    from features.extract import iter_frame_prefixes

    out = np.zeros((len(steps), 16))
    for i, p in iter_frame_prefixes(steps):
        c = np.zeros(8)
        for v in p.steps:
            for name in v.tool_calls:
                c[zlib.crc32(name.encode("utf-8")) % 8] += 1
        out[i, :8] = c
        out[i, 8:] = c / c.sum() if c.sum() else 0.0
    return out


def _variants(ds, steps, domains) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    from features.domain_norm import NORMALISED, DomainStats
    from features.extract import FEATURE_NAMES

    X = ds.X
    verbs = np.array([not n.startswith("verb_") for n in FEATURE_NAMES])
    raw = np.array([n not in NORMALISED for n in FEATURE_NAMES])
    Z = DomainStats().fit(X, domains).transform(X, domains)
    return {
        "fs-2": X,
        "+ buckets": np.hstack([X, _buckets(steps)]),
        "- verbs": X[:, verbs],
        "+ domain z": np.hstack([X, Z]),
        "z for raw": np.hstack([X[:, raw], Z]),
    }


def _auc_cv(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int, trees: int, seed: int
) -> list[float]:
    from lightgbm import LGBMClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    out = []
    for tr, te in GroupKFold(n_splits=folds).split(X, y, groups):
        if len(set(y[te].tolist())) < 2 or len(set(y[tr].tolist())) < 2:
            continue
        m = LGBMClassifier(
            n_estimators=trees,
            learning_rate=0.05,
            num_leaves=15,
            min_child_samples=10,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
            random_state=seed,
            verbose=-1,
            n_jobs=1,
        )
        m.fit(X[tr], y[tr])
        out.append(float(roc_auc_score(y[te], m.predict_proba(X[te])[:, 1])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--runs", nargs="*", default=[str(p) for p in sorted((root / "data").glob("*.parquet"))])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tau2", default=None, help="a tau2-bench directory: split by domain")
    a = ap.parse_args(argv)

    from features.runlog import RunLog, read_runlog
    from training.dataset import build_dataset

    if a.tau2:
        import pandas as pd

        from features.importers.tau2bench import import_tau2bench
        from features.runlog import RunLogError, conform

        frames = []
        for f in sorted(Path(a.tau2).glob("*.json")):
            try:
                frames.append(import_tau2bench(f))
            except RunLogError as e:  # a file in another layout: skipped, said
                print(f"skipped {f.name}: {e}", file=sys.stderr)
        df = conform(pd.concat(frames, ignore_index=True))
        log = RunLog.from_frame(df)
        ds = build_dataset(log)
        ds.meta["source"] = [str(g).split("/", 1)[0] for g in ds.meta["group"]]
    else:
        log = read_runlog(a.runs)
        ds = build_dataset(log)
    steps = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    meta = ds.meta
    configs = _variants(ds, steps, meta["source"].tolist())
    print(f"{'source':<14}{'rows':>7}{'tasks':>7}  " + "".join(f"{c:>20}" for c in configs))
    for src in sorted(meta["source"].unique()):
        m = (meta["source"] == src).to_numpy() & ~np.isnan(meta["y_frontier"].to_numpy())
        y = meta["y_frontier"].to_numpy()[m].astype(int)
        g = meta["group"].to_numpy()[m]
        if m.sum() < 50 or len(set(y.tolist())) < 2 or len(set(g.tolist())) < a.folds:
            continue
        cells = []
        for cols in configs.values():
            aucs = _auc_cv(cols[m], y, g, a.folds, a.trees, a.seed)
            se = float(np.std(aucs, ddof=1) / np.sqrt(len(aucs))) if len(aucs) > 1 else float("nan")
            cells.append(f"{np.mean(aucs):.3f} ± {se:.3f}")
        print(f"{src:<14}{int(m.sum()):>7}{len(set(g.tolist())):>7}  " + "".join(f"{c:>20}" for c in cells))
    if a.tau2:
        _lodo(ds, configs, a)
    return 0


def _lodo(ds, configs, a) -> None:  # type: ignore[no-untyped-def]
    from lightgbm import LGBMClassifier
    from sklearn.metrics import roc_auc_score

    meta = ds.meta
    y_all = meta["y_frontier"].to_numpy()
    ok = ~np.isnan(y_all)
    print("leave-one-domain-out (train on the others, score the held-out domain):")
    for dom in sorted(meta["source"].unique()):
        te = ok & (meta["source"] == dom).to_numpy()
        tr = ok & ~te
        cells = []
        for cols in configs.values():
            m = LGBMClassifier(
                n_estimators=a.trees,
                learning_rate=0.05,
                num_leaves=15,
                min_child_samples=10,
                random_state=a.seed,
                verbose=-1,
                n_jobs=1,
            )
            m.fit(cols[tr], y_all[tr].astype(int))
            cells.append(f"{roc_auc_score(y_all[te].astype(int), m.predict_proba(cols[te])[:, 1]):.3f}")
        print(f"{dom:<14}{int(te.sum()):>7}{'':>7}  " + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
