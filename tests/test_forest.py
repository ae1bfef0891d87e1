"""The merged booster (models/forest.py) against LightGBM's own predictions, booster by booster.

The merged predictor must give the same doubles as each booster alone (the tolerance is zero: the
trees are LightGBM's own, each output adds its trees in the same order, and the transforms are
computed as LightGBM computes them), on rows that exercise every branch of LightGBM's numerical
decision: NaN, 0.0, values within kZeroThreshold of 0, values exactly on a split's threshold and
one ulp either side, infinities; on boosters of the three missing types (None, Zero, NaN), both
default directions, different tree counts (the padding), one-leaf trees, and the objectives the
bundle uses (binary with a sigmoid scale, regression_l1, quantile) plus others of identity output.
What it cannot merge is refused, and the bundle then keeps one call per booster with a log line.
"""

from __future__ import annotations

import logging
import pickle

import lightgbm as lgb
import numpy as np
import pytest

from features.extract import N_FEATURES
from models.bundle import ModelBundle, _RowPredictor
from models.cache_reuse import CacheReuseRegressor
from models.escalation import EscalationClassifier
from models.forest import MergedPredictor, Unsupported, merged_model_string, output_transform
from models.remaining import RemainingWorkRegressor

NF = N_FEATURES
K_ZERO = float(np.float32(1e-35))  # LightGBM's kZeroThreshold


def _train(
    params: dict,
    rounds: int,
    X: np.ndarray,
    y: np.ndarray,
    categorical: list[int] | None = None,
    **ds: object,
) -> lgb.Booster:
    base = {"verbose": -1, "num_threads": 1, "min_data_in_leaf": 5, "num_leaves": 15, "seed": 1}
    data = lgb.Dataset(
        X,
        label=y,
        params={"verbose": -1, "min_data_in_leaf": 5, **ds},
        categorical_feature=categorical or "auto",
    )
    return lgb.train({**base, **params}, data, num_boost_round=rounds)


def _features(rng: np.random.Generator, n: int) -> np.ndarray:
    X = rng.normal(size=(n, NF)) * rng.choice([0.01, 1.0, 100.0], size=NF)
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.15] = 0.0
    X[:, 3] = rng.integers(0, 4, n)  # a few-valued column: many equal values, splits between them
    return X


@pytest.fixture(scope="module")
def boosters() -> list[lgb.Booster]:
    rng = np.random.default_rng(7)
    X = _features(rng, 1500)
    signal = np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * 0.01 + np.isnan(X[:, 2]) + X[:, 3]
    yb = (signal + rng.normal(size=len(X)) > 0.5).astype(float)
    yr = np.abs(signal * 10 + rng.normal(size=len(X)))
    Xz = np.nan_to_num(X)  # zero_as_missing: Zero-type nodes
    return [
        _train({"objective": "binary", "sigmoid": 0.7}, 40, X, yb),
        _train({"objective": "regression_l1", "num_leaves": 31}, 25, X, yr),
        _train({"objective": "quantile", "alpha": 0.5}, 30, X, yr),
        _train(
            {"objective": "quantile", "alpha": 0.9, "zero_as_missing": True}, 30, Xz, yr, zero_as_missing=True
        ),
        _train({"objective": "huber"}, 12, X, yr),
        _train({"objective": "regression", "min_data_in_leaf": 5000}, 5, X, yr),  # one-leaf trees
        _train({"objective": "binary"}, 20, Xz, yb, zero_as_missing=True),
    ]


def _hard_rows(boosters: list[lgb.Booster], n: int, seed: int) -> np.ndarray:
    """Random rows, then on each a few features set to a split's threshold, one ulp either side
    of it, NaN, +-0.0, +-kZeroThreshold and values inside it, +-1e301 or +-inf."""
    rng = np.random.default_rng(seed)
    splits: list[tuple[int, float]] = []

    def walk(node: dict) -> None:
        if "split_feature" in node:
            splits.append((int(node["split_feature"]), float(node["threshold"])))
            walk(node["left_child"])
            walk(node["right_child"])

    for b in boosters:
        for t in b.dump_model(num_iteration=-1)["tree_info"]:
            walk(t["tree_structure"])
    assert splits
    # 1e300: dump_model writes an infinite threshold as +-1e300 (values past it must go as LightGBM
    # sends them, which a walk of the dumped trees would not)
    specials = [np.nan, 0.0, -0.0, K_ZERO, -K_ZERO, 1e-36, -1e-36, 2 * K_ZERO, np.inf, -np.inf, 1e301, -1e301]
    X = _features(rng, n)
    for i in range(n):
        for _ in range(int(rng.integers(1, 8))):
            f, thr = splits[int(rng.integers(len(splits)))]
            X[i, f] = [thr, np.nextafter(thr, np.inf), np.nextafter(thr, -np.inf)][int(rng.integers(3))]
        for _ in range(int(rng.integers(0, 3))):
            X[i, int(rng.integers(NF))] = specials[int(rng.integers(len(specials)))]
    return X


def test_merged_outputs_are_lightgbms_own(boosters):
    X = _hard_rows(boosters, 4000, seed=11)
    row = np.zeros((1, NF))
    merged = MergedPredictor(boosters, row)
    got = np.empty((len(X), len(boosters)))
    for i, x in enumerate(X):
        row[0] = x
        got[i] = merged()
    want = np.column_stack([b.predict(X, num_iteration=-1) for b in boosters])
    np.testing.assert_array_equal(got, want)  # tolerance zero: the same doubles
    # and the same as the form it replaces (one single-row C call per booster)
    singles = [_RowPredictor(b, row) for b in boosters]
    for x in X[:500]:
        row[0] = x
        assert merged() == [f() for f in singles]


def test_one_merged_output_moves_with_its_own_trees_only(boosters):
    """A test that can fail: a booster's trees put on the wrong output, or a tree dropped or added,
    changes that output (here: each booster alone, merged with the others, against itself)."""
    X = _hard_rows(boosters, 300, seed=5)
    row = np.zeros((1, NF))
    merged = MergedPredictor(boosters[::-1], row)  # another order, another padding
    for x in X:
        row[0] = x
        want = [float(b.predict(x[None], num_iteration=-1)[0]) for b in boosters[::-1]]
        assert merged() == want
    text, _ = merged_model_string(boosters[:2])
    assert text.count("\nTree=") == 2 * max(b.num_trees() for b in boosters[:2])


def test_output_transforms():
    assert output_transform("binary sigmoid:1") == 1.0
    assert output_transform("binary sigmoid:0.7") == 0.7
    for identity in ("regression", "regression_l1", "quantile", "huber", "fair", "mape"):
        assert output_transform(identity) is None
    for other in (
        "regression sqrt",
        "poisson",
        "gamma",
        "tweedie",
        "cross_entropy",
        "multiclass num_class:3",
        "",
    ):
        with pytest.raises(Unsupported):
            output_transform(other)


def test_what_cannot_be_merged_is_refused():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(600, NF))
    X[:, 0] = rng.integers(0, 6, 600)
    y = X[:, 0] % 2 + rng.normal(size=600) * 0.1
    row = np.zeros((1, NF))
    cat = _train({"objective": "regression"}, 5, X, y, categorical=[0])
    with pytest.raises(Unsupported, match="categorical"):
        MergedPredictor([cat], row)
    linear = _train({"objective": "regression", "linear_tree": True}, 5, X, y)
    with pytest.raises(Unsupported, match="linear"):
        MergedPredictor([linear], row)
    poisson = _train({"objective": "poisson"}, 5, X, np.abs(y))
    with pytest.raises(Unsupported, match="poisson"):
        MergedPredictor([poisson], row)
    multi = _train({"objective": "multiclass", "num_class": 3}, 5, X, (X[:, 0] % 3))
    with pytest.raises(Unsupported, match="multi-class"):
        MergedPredictor([multi], row)
    rf = _train(
        {"objective": "regression", "boosting": "rf", "bagging_freq": 1, "bagging_fraction": 0.5}, 5, X, y
    )
    with pytest.raises(Unsupported, match="average_output"):
        MergedPredictor([rf], row)
    with pytest.raises(Unsupported, match="no boosters"):
        MergedPredictor([], row)


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    rng = np.random.default_rng(3)
    X = _features(rng, 800)
    y = (np.nan_to_num(X[:, 0]) + rng.normal(size=len(X)) > 0).astype(int)
    g = np.arange(len(X)) // 8
    return ModelBundle(
        escalation=EscalationClassifier(n_estimators=30, n_jobs=1).fit(X, y, groups=g),
        cache_reuse=CacheReuseRegressor(prompt_col=1, n_estimators=25, n_jobs=1).fit(
            X, np.abs(np.nan_to_num(X[:, 1])) * 0.5
        ),
        remaining_steps=RemainingWorkRegressor(n_estimators=20, n_jobs=1).fit(X, rng.integers(1, 20, len(X))),
        remaining_tokens=RemainingWorkRegressor(n_estimators=15, n_jobs=1).fit(
            X, rng.integers(0, 9000, len(X))
        ),
        thresholds={"p_frontier_up": 0.6, "p_frontier_down": 0.45},
    )


def _boosters_of(b: ModelBundle) -> list[lgb.Booster]:
    return [
        b.escalation.booster_,
        b.cache_reuse.booster_,
        *b.remaining_steps.boosters_,
        *b.remaining_tokens.boosters_,
    ]


def test_bundle_merged_equals_one_call_per_booster(bundle, tmp_path):
    d = bundle.save(tmp_path / "b")
    merged = ModelBundle.load(d)
    assert merged._merged is not None  # built at load
    one_by_one = ModelBundle.load(d)
    one_by_one.merge_boosters = False
    one_by_one._merged, one_by_one._unmerged = None, True
    X = _hard_rows(_boosters_of(merged), 3000, seed=3)
    a, b = merged.predict_batch(X), one_by_one.predict_batch(X)
    assert one_by_one._merged is None and one_by_one._fast is not None
    assert [repr(p) for p in a] == [repr(p) for p in b]  # repr: NaN equals NaN
    # the switch off at construction: never merges, same predictions
    off = ModelBundle(**{**_fields(merged), "merge_boosters": False})
    assert [repr(p) for p in off.predict_batch(X[:200])] == [repr(p) for p in a[:200]]
    assert off._merged is None and off._unmerged
    # pickled (C handles are per process): rebuilt, same predictions
    again = pickle.loads(pickle.dumps(merged))
    assert again._merged is None
    assert [repr(p) for p in again.predict_batch(X[:200])] == [repr(p) for p in a[:200]]


def _fields(b: ModelBundle) -> dict:
    return {
        k: getattr(b, k)
        for k in (
            "escalation",
            "cache_reuse",
            "remaining_steps",
            "remaining_tokens",
            "benefit",
            "thresholds",
            "manifest",
        )
    }


def test_bundle_without_optional_models_merges_what_it_has(bundle):
    X = _hard_rows(_boosters_of(bundle), 300, seed=9)
    for drop in (
        {"cache_reuse": None},
        {"remaining_steps": None},
        {"remaining_tokens": None, "cache_reuse": None},
    ):
        on = ModelBundle(**{**_fields(bundle), **drop})
        off = ModelBundle(**{**_fields(bundle), **drop, "merge_boosters": False})
        assert [repr(p) for p in on.predict_batch(X)] == [repr(p) for p in off.predict_batch(X)]
        assert on._merged is not None


def test_bundle_that_cannot_merge_keeps_one_call_per_booster(bundle, caplog):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, NF))
    X[:, 0] = rng.integers(0, 5, 400)
    cat = _train({"objective": "regression"}, 5, X, X[:, 0] + rng.normal(size=400), categorical=[0])
    b = ModelBundle(**_fields(bundle))
    b.remaining_steps = RemainingWorkRegressor(n_estimators=5, n_jobs=1).fit(
        X[:, :NF], rng.integers(1, 9, 400)
    )
    b.remaining_steps.boosters_[0] = cat
    with caplog.at_level(logging.WARNING, logger="models.bundle"):
        got = b.predict_batch(X[:50])
    assert b._merged is None and b._unmerged
    assert any(
        "one LightGBM call per booster" in r.message and "categorical" in r.message for r in caplog.records
    )
    off = ModelBundle(**{**_fields(b), "remaining_steps": b.remaining_steps, "merge_boosters": False})
    assert [repr(p) for p in got] == [repr(p) for p in off.predict_batch(X[:50])]
