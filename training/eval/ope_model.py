"""The doubly robust estimator's outcome model ``Q(s_k, a)``, cross-fitted on the logs themselves.

Algorithm (:func:`fit_q`): rows are logged steps; inputs are the logged feature vector of the step
(fs spec of the log), the logged action ``a_k`` (1 = frontier) and whether the run was on the
frontier before; targets are the return from step k on under the logging policy's continuation:

- ``success``: the run's success (LightGBM classifier, probability);
- ``cost``: the logged cost of steps k..end (LightGBM regressor);
- ``escalated``: no model: ``Q(s_k, F) = 1`` and ``Q(s_k, L) = 0`` before a run's first frontier
  step, 0 after it (its reward is already counted).

The runs are split in ``folds`` groups (seeded); each fold's ``Q`` comes from models fitted on the
other folds (cross-fitting: a step's own outcome never enters its own prediction), evaluated at
both actions. A fold whose training rows hold one class only gets that class's rate. The model's
quality only changes the DR estimate's variance, never its expectation (the propensities carry
the correction). Knobs: ``folds`` (2), ``n_estimators`` (60), ``num_leaves`` (8), ``seed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from training.eval.ope_replay import LoggedRuns

__all__ = ["fit_q"]


def _inputs(X: np.ndarray, a: np.ndarray, before: np.ndarray) -> np.ndarray:
    return np.column_stack([X, a.astype(np.float64), before.astype(np.float64)])


def fit_q(
    logged: LoggedRuns, *, folds: int = 2, n_estimators: int = 60, num_leaves: int = 8, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{metric: (Q_L, Q_F)}`` per logged step (module docstring). ``logged``: a
    :class:`training.eval.ope_replay.LoggedRuns`."""
    import lightgbm as lgb

    n_runs, ptr = logged.n_runs, logged.ptr
    lens = np.diff(ptr)
    run = np.repeat(np.arange(n_runs), lens)
    a = logged.a.astype(np.int64)
    # frontier before step k within its run
    csum = np.cumsum(a)
    start = np.repeat(ptr[:-1], lens)
    before_cnt = csum - a - np.where(start > 0, csum[np.maximum(start - 1, 0)], 0)
    before = before_cnt > 0
    y_s = logged.success[run]
    # cost-to-go: reverse cumulative sum within each run
    rc = np.cumsum(logged.cost[::-1])[::-1]
    end = np.repeat(ptr[1:], lens)
    y_c = rc - np.r_[rc, 0.0][end]
    rng = np.random.default_rng(seed)
    fold_of_run = rng.integers(0, max(1, folds), size=n_runs)
    fold = fold_of_run[run]
    q_s: tuple[np.ndarray, np.ndarray] = (np.zeros(len(a)), np.zeros(len(a)))
    q_c: tuple[np.ndarray, np.ndarray] = (np.zeros(len(a)), np.zeros(len(a)))
    params: dict[str, Any] = dict(
        n_estimators=n_estimators,
        num_leaves=num_leaves,
        min_child_samples=20,
        learning_rate=0.1,
        subsample=0.8,
        subsample_freq=1,
        random_state=seed,
        n_jobs=1,
        verbose=-1,
    )
    X0 = _inputs(logged.X, np.zeros(len(a)), before)
    X1 = _inputs(logged.X, np.ones(len(a)), before)
    Xa = _inputs(logged.X, a, before)
    for f in range(max(1, folds)):
        test = fold == f if folds > 1 else np.ones(len(a), dtype=bool)
        train = ~test if folds > 1 else test
        if not test.any():
            continue
        ys = y_s[train]
        if train.sum() < 40 or len(np.unique(ys)) < 2:
            p = float(ys.mean()) if len(ys) else float(y_s.mean())
            q_s[0][test], q_s[1][test] = p, p
        else:
            clf = lgb.LGBMClassifier(**params).fit(Xa[train], ys.astype(np.int64))
            q_s[0][test] = np.asarray(clf.predict_proba(X0[test]))[:, 1]
            q_s[1][test] = np.asarray(clf.predict_proba(X1[test]))[:, 1]
        if train.sum() < 40:
            m = float(y_c[train].mean()) if train.any() else float(y_c.mean())
            q_c[0][test], q_c[1][test] = m, m
        else:
            reg = lgb.LGBMRegressor(**params).fit(Xa[train], y_c[train])
            q_c[0][test] = np.asarray(reg.predict(X0[test]))
            q_c[1][test] = np.asarray(reg.predict(X1[test]))
    not_yet = ~before
    q_e = (np.zeros(len(a)), not_yet.astype(np.float64))
    return {"success": q_s, "cost": q_c, "escalated": q_e}
