"""No source from missingness: a classifier cannot tell which dataset an escalation row came from
by looking at which of its features are missing (issue 14, "no shortcuts").

The data is what the demo trains the escalation model on, at test size: the shipped tau-bench and
tau2 airline runs plus synthetic runs. A LightGBM classifier (it can read joint patterns, not only
single columns) predicts each source against the rest from the 0/1 missingness matrix, out of fold
with the folds grouped by run; its AUC must stay within 2 standard errors of 0.5, the standard error
(Hanley & McNeil at AUC 0.5) counted in *runs*, not rows, since rows of one run share their pattern:
with ~200 runs a side that bound is ~0.55. The same classifier on the unmasked matrix must find the
source (AUC well above the bound): the test can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from features.generate import generate
from features.runlog import RunLog, read_runlog
from features.samples import sample_path
from training.dataset import build_dataset, source_missing_shares


def _auc_se_at_half(n_pos: int, n_neg: int) -> float:
    """Hanley-McNeil standard error of an AUC of 0.5 with n_pos / n_neg independent units."""
    a = 0.5
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(var)


@pytest.fixture(scope="module")
def dataset():
    real = read_runlog(
        [str(sample_path("taubench_airline.parquet")), str(sample_path("tau2bench_airline.parquet"))]
    )
    syn = RunLog.from_frame(generate(200, seed=7))
    log = RunLog.from_frame(pd.concat([real.runs, real.steps, syn.runs, syn.steps], ignore_index=True))
    ds = build_dataset(log)
    lab = ds.meta["y_frontier"].notna().to_numpy()
    return ds.subset(lab)


def _source_aucs(M: np.ndarray, source: np.ndarray, run_id: np.ndarray) -> dict[str, tuple[float, float]]:
    from lightgbm import LGBMClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    out: dict[str, tuple[float, float]] = {}
    folds = list(GroupKFold(n_splits=5).split(M, groups=run_id))
    for s in sorted(set(source.tolist())):
        y = (source == s).astype(np.int64)
        p = np.zeros(len(y))
        for tr, te in folds:
            clf = LGBMClassifier(n_estimators=60, num_leaves=8, min_child_samples=20, verbose=-1, n_jobs=1)
            clf.fit(M[tr], y[tr])
            p[te] = clf.predict_proba(M[te])[:, 1]
        runs_pos = len(set(run_id[y == 1].tolist()))
        runs_neg = len(set(run_id[y == 0].tolist()))
        out[s] = (float(roc_auc_score(y, p)), _auc_se_at_half(runs_pos, runs_neg))
    return out


def test_source_not_predictable_from_missingness(dataset):
    ds = dataset
    src = ds.meta["source"].to_numpy(dtype=object)
    rid = ds.meta["run_id"].to_numpy(dtype=object)
    assert set(src.tolist()) == {"taubench", "tau2bench", "synthetic"}
    # the time features (missing only in tau-bench) are among the masked ones
    assert {"time_since_start_s", "tool_pause_s"} <= set(ds.escalation_masked)

    before = _source_aucs(np.isnan(ds.X).astype(np.float64), src, rid)
    after = _source_aucs(np.isnan(ds.escalation_X()).astype(np.float64), src, rid)
    print("source-vs-rest AUC from missingness, before / after (bound):")
    for s in before:
        auc_b, se = before[s]
        print(f"  {s}: {auc_b:.3f} / {after[s][0]:.3f} (<= {0.5 + 2 * se:.3f})")
    # before the fix the missingness pattern gives tau-bench away
    assert before["taubench"][0] > 0.9
    for s, (auc, se) in after.items():
        assert auc <= 0.5 + 2 * se, (
            f"{s} identifiable from missingness: AUC {auc:.3f} > 0.5 + 2 SE ({se:.3f})"
        )


def test_masked_features_have_equal_missing_shares_after(dataset):
    ds = dataset
    sh = source_missing_shares(ds.escalation_X(), ds.meta["source"].to_numpy(dtype=object), 50)
    spread = sh.max(axis=0) - sh.min(axis=0)
    assert float(spread.max()) <= 0.05, spread.sort_values().tail(3).to_dict()
    # unmasked features are untouched; the other models see the full matrix
    keep = [i for i, n in enumerate(sh.columns) if n not in ds.escalation_masked]
    np.testing.assert_array_equal(ds.escalation_X()[:, keep], ds.X[:, keep])
