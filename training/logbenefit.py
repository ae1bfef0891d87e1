"""The benefit-of-escalation model learned from the deployment's own logs (inverse-propensity
weighted), with public paired data as a prior (the learning loop's model; issue 14's
``models.benefit`` is the serving bundle's).

Target, per step k of a run still on the local tier: ``P(success | stay local from k)`` and
``P(success | escalate at k)``; their difference times the value of success, minus the extra cost,
is the benefit rule the learned policy routes on (this module's :class:`IPWBenefitPredictor` exposes
the difference as ``p_frontier``, so :class:`router.policy.learned.LearnedPolicy` applies
``benefit = p x value_of_success - extra cost`` to it unchanged).

Rows (:class:`BenefitRows`: features ``X``, arm 0 = stay / 1 = escalate, outcome ``y``, weight):

- **from logs** (:func:`rows_from_logs`; the narrow interface: per-step features, logged action,
  propensity, run outcome): a run first on the frontier at step f gives one *escalate* row at f
  with weight ``1 / mu_f``; a run that never leaves the local tier gives a *stay* row at every step
  k with weight ``1 / prod_{j>=k} mu_j`` (the probability the logging policy kept it local from k
  on). Steps of a run that escalates later than k are neither (their continuation mixes both
  arms). Weights are clipped at ``clip`` and normalised to mean 1 per arm.
- **prior** (:func:`rows_from_pairs`): public paired runs (a weak run with its weak and strong
  outcome on the same task): every step gives a stay row (y = weak outcome) and an escalate row
  (y = strong outcome; under an outcome variant with ``w < 1``, two rows: strong with weight
  ``w``, weak with ``1 - w``), each of weight ``prior_weight``.

:class:`IPWBenefitModel` fits one LightGBM classifier per arm on the rows (sample weights). Knobs:
``prior_weight`` (weight of a prior row against a mean log row; the logs dominate as they grow),
``clip``, LightGBM ``n_estimators`` / ``num_leaves`` / ``min_child_samples``, ``seed``.

Issue 14's benefit model (per-domain models gated by evidence, new features) replaces the two
plain classifiers here; these row builders are the interface it is fed through.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from models.types import Predictions

if TYPE_CHECKING:
    import pandas as pd

    from features.prefix import RunPrefix
    from models.predictor import Predictor
    from training.eval.ope_replay import LoggedRuns
    from training.eval.outcome import VariantLike

__all__ = ["BenefitRows", "rows_from_logs", "rows_from_pairs", "IPWBenefitModel", "IPWBenefitPredictor"]


@dataclass
class BenefitRows:
    X: np.ndarray
    arm: np.ndarray
    y: np.ndarray
    w: np.ndarray
    source: np.ndarray  # "log" | "prior"

    @staticmethod
    def concat(parts: list[BenefitRows]) -> BenefitRows:
        parts = [p for p in parts if len(p.y)]
        if not parts:
            raise ValueError("no benefit rows: neither logged runs with outcomes nor paired prior runs")
        return BenefitRows(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("X", "arm", "y", "w", "source"))
        )

    def __len__(self) -> int:
        return len(self.y)


def _norm(w: np.ndarray, arm: np.ndarray) -> np.ndarray:
    out = w.copy()
    for a in (0, 1):
        m = arm == a
        if m.any() and out[m].mean() > 0:
            out[m] /= out[m].mean()
    return out


def rows_from_logs(logged: LoggedRuns, clip: float = 20.0) -> BenefitRows:
    """IPW rows from logged runs (module docstring); ``logged``: :class:`training.eval.ope_replay.LoggedRuns`."""
    Xs: list[np.ndarray] = []
    arms: list[Any] = []
    ys: list[Any] = []
    ws: list[Any] = []
    for i, (s, e) in enumerate(zip(logged.ptr[:-1], logged.ptr[1:], strict=True)):
        a, mu = logged.a[s:e], logged.mu[s:e]
        y = logged.success[i]
        f = np.flatnonzero(a == 1)
        if f.size:
            k = int(f[0])
            Xs.append(logged.X[s + k : s + k + 1])
            arms.append([1])
            ys.append([y])
            ws.append([min(clip, 1.0 / mu[k])])
        else:
            tail = np.cumprod(mu[::-1])[::-1]  # prod_{j>=k} mu_j
            Xs.append(logged.X[s:e])
            arms.append(np.zeros(e - s))
            ys.append(np.full(e - s, y))
            ws.append(np.minimum(clip, 1.0 / tail))
    if not Xs:
        return BenefitRows(
            np.zeros((0, logged.X.shape[1])), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, dtype=object)
        )
    arm = np.concatenate(arms)
    return BenefitRows(
        np.vstack(Xs),
        arm,
        np.concatenate(ys).astype(np.float64),
        _norm(np.concatenate(ws), arm),
        np.full(len(arm), "log", dtype=object),
    )


def rows_from_pairs(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    variant: VariantLike = "escalate-anytime",
    prior_weight: float = 1.0,
) -> BenefitRows:
    """Prior rows from paired weak runs (``outcome`` and ``strong_outcome`` known)."""
    import pandas as pd

    from features.extract import N_FEATURES, extract, iter_frame_prefixes
    from training.eval.outcome import parse_variant, records_from_frames

    v = parse_variant(variant)
    paired = runs[
        runs["outcome"].isin(["success", "failure"]) & runs["strong_outcome"].isin(["success", "failure"])
    ]
    st = steps[steps["run_id"].isin(set(paired["run_id"]))].sort_values(["run_id", "step"], kind="stable")
    if len(st) == 0:
        z = np.zeros(0)
        return BenefitRows(np.zeros((0, N_FEATURES)), z, z, z, np.zeros(0, dtype=object))
    weak = dict(zip(paired["run_id"], paired["outcome"] == "success", strict=True))
    strong = dict(zip(paired["run_id"], paired["strong_outcome"] == "success", strict=True))
    recs = records_from_frames(paired, st)
    started = {
        r: float(t) for r, t in zip(paired["run_id"], paired["started_at"], strict=True) if not pd.isna(t)
    }
    rows_X, arm, y, w = [], [], [], []
    rid_col = st["run_id"].tolist()
    k_col = st["step"].tolist()
    for pos, prefix in iter_frame_prefixes(st, started):
        rid, k = rid_col[pos], int(k_col[pos])
        x = extract(prefix)
        ok_w, ok_s = float(weak[rid]), float(strong[rid])
        tiers = np.zeros(recs[rid].n_steps, dtype=np.int64)
        tiers[k:] = 1
        wk = v.weight(k, tiers, recs[rid])
        rows_X.append(x)
        arm.append(0)
        y.append(ok_w)
        w.append(prior_weight)
        for val, share in ((ok_s, wk), (ok_w, 1.0 - wk)):
            if share > 0:
                rows_X.append(x)
                arm.append(1)
                y.append(val)
                w.append(prior_weight * share)
    n = len(y)
    return BenefitRows(
        np.vstack(rows_X),
        np.asarray(arm, float),
        np.asarray(y),
        np.asarray(w),
        np.full(n, "prior", dtype=object),
    )


class IPWBenefitModel:
    """Two weighted LightGBM classifiers, one per arm (module docstring)."""

    def __init__(
        self, n_estimators: int = 80, num_leaves: int = 8, min_child_samples: int = 20, seed: int = 0
    ):
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.seed = seed

    def fit(self, rows: BenefitRows) -> IPWBenefitModel:
        import lightgbm as lgb

        self.models_: dict[int, Any] = {}
        self.rates_: dict[int, float] = {}
        for a in (0, 1):
            m = rows.arm == a
            y, w = rows.y[m], rows.w[m]
            self.rates_[a] = float(np.average(y, weights=w)) if m.any() and w.sum() > 0 else 0.5
            if m.sum() < 2 * self.min_child_samples or len(np.unique(y)) < 2:
                self.models_[a] = None
                continue
            clf = lgb.LGBMClassifier(
                n_estimators=self.n_estimators,
                num_leaves=self.num_leaves,
                min_child_samples=self.min_child_samples,
                learning_rate=0.05,
                subsample=0.8,
                subsample_freq=1,
                colsample_bytree=0.7,
                random_state=self.seed,
                n_jobs=1,
                verbose=-1,
            )
            self.models_[a] = clf.fit(rows.X[m], y.astype(np.int64), sample_weight=w).booster_
        self.n_rows_ = {s: int((rows.source == s).sum()) for s in ("log", "prior")}
        h = hashlib.sha256(rows.X.tobytes() + rows.y.tobytes() + rows.w.tobytes()).hexdigest()[:12]
        self.version_ = f"benefit-{h}"
        return self

    def predict_arms(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(P(success | stay), P(success | escalate))`` per row."""
        X = np.asarray(X, dtype=np.float64).reshape(-1, X.shape[-1])
        out = []
        for a in (0, 1):
            b = self.models_[a]
            out.append(np.full(len(X), self.rates_[a]) if b is None else b.predict(X, num_threads=1))
        return out[0], out[1]


class IPWBenefitPredictor:
    """A :class:`models.predictor.Predictor`: ``base``'s predictions (cache reuse, remaining work)
    with ``p_frontier`` = ``P(success | escalate) - P(success | stay)`` clipped to [0, 1]."""

    def __init__(self, base: Predictor, model: IPWBenefitModel):
        self.base = base
        self.model = model
        self.version = f"{model.version_}+{getattr(base, 'version', 'none')}"

    def _with(self, pr: Predictions, uplift: float) -> Predictions:
        return Predictions(
            p_frontier=min(1.0, max(0.0, uplift)),
            cache_reuse_tokens=pr.cache_reuse_tokens,
            remaining_steps_p50=pr.remaining_steps_p50,
            remaining_steps_p90=pr.remaining_steps_p90,
            remaining_tokens_p50=pr.remaining_tokens_p50,
            remaining_tokens_p90=pr.remaining_tokens_p90,
        )

    def predict_features(self, x: np.ndarray) -> Predictions:
        s, e = self.model.predict_arms(np.asarray(x, dtype=np.float64).reshape(1, -1))
        return self._with(self.base.predict_features(x), float(e[0] - s[0]))

    def predict(self, prefix: RunPrefix) -> Predictions:
        from features.extract import extract

        return self.predict_features(extract(prefix))

    def predict_batch(self, X: np.ndarray) -> list[Predictions]:
        X = np.asarray(X, dtype=np.float64)
        s, e = self.model.predict_arms(X)
        return [self._with(p, float(u)) for p, u in zip(self.base.predict_batch(X), e - s, strict=True)]
