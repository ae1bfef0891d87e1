"""The training job on a Dask cluster: partitioned run logs -> per-partition features -> LightGBM's
Dask estimators -> the same bundle, thresholds, report and MLflow logging as :mod:`training.train`.

Algorithm (:func:`train_on_dask`):

1. Read the Parquet run logs as a ``dask.dataframe`` and shuffle it on ``run_id`` into
   ``npartitions`` partitions: every record of a run (its run record and all its steps) lands in one
   partition, so a partition never splits a run and prefixes are built where the steps are. Each
   partition is validated like a file (:func:`features.runlog` rules; bad rows are counted and
   reported, never used) and its run records merged (:mod:`training.dask_io`: one task per Parquet
   row group in, rows gathered partition by partition out).
2. The run records (small: one per run) come to the client, where the ``WEAK=STRONG`` pairings apply
   (they pair runs across tasks, so they need all runs) and go back to every worker once.
3. The prefix-cache replay behind the cache-reuse labels and the ``local_cache_pressure`` feature
   spans all runs of a source in arrival order (one cache), so it is ONE task
   (:func:`training.dataset.replay_cache_labels`, the serial code) over the few columns it reads;
   it returns each partition's slice.
4. Per partition, :func:`training.dataset.build_dataset` (the one feature code path:
   ``features.extract.iter_frame_prefixes`` + ``extract``) with those cache labels, plus the held-out
   flag (:func:`training.train.holdout_mask`, a stable hash of the group): the rows stay on the workers.
5. LightGBM's Dask estimators (``lightgbm.dask.DaskLGBMClassifier`` / ``DaskLGBMRegressor``, the
   hyper-parameters of :class:`training.config.TrainConfig`, large-data settings included) fit
   the escalation model (final + the out-of-fold calibration folds on the same groups
   ``models.escalation`` would pick), the cache-reuse model (share of the prompt, weighted by it) and
   the remaining-steps/tokens quantile models; each booster is put into the bundle's estimator.
6. :func:`training.train.finish_training` (the serial code): thresholds, held-out scores (the held-out
   rows come to the client), bundle, report, MLflow.

Not on Dask: the grouped cross-validated evaluation against baselines (``evaluate``; the report's
headline comes from the held-out split, as with ``--no-eval``). The held-out rows and the calibration
rows (at most ``calibration_max_rows``) are gathered to the client.

Knobs: ``npartitions`` (default: 4 per worker, at least one per 250k rows); everything else is
:class:`training.config.TrainConfig`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, N_FEATURES
from training.config import TrainConfig, TrainResult
from training.dask_io import clean_partition, parquet_rows, read_partitioned, runs_of, steps_of, to_client
from training.dask_replay import cache_columns, capped_runs, pack_replay_input, replay_keys, replay_packed
from training.dataset import Dataset

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

    from models.cache_reuse import CacheReuseRegressor
    from models.escalation import EscalationClassifier
    from models.remaining import RemainingWorkRegressor

_T = TypeVar("_T")

__all__ = ["train_on_dask", "read_partitioned", "PartitionedDataset"]

TRAIN_DTYPE = np.float32  # the training rows' features on the workers (LightGBM bins them anyway)
META_COLS = ("run_id", "group", "source", "step", "y_frontier", "y_cache", "y_rem_steps", "y_rem_tokens")
RUN_COLS = ("run_id", "source", "task_id", "needs_frontier", "outcome")


@dataclass
class PartitionedDataset(Dataset):
    """The training rows as they live on the workers: a few rows here (``X``/``meta``, for the MLflow
    input example), the row and run counts and a digest of all rows (:func:`_digest`)."""

    n_rows: int = 0
    runs: int = 0
    digest: str = ""

    def __len__(self) -> int:
        return self.n_rows

    @property
    def n_runs(self) -> int:
        return self.runs

    def sha256(self) -> str:
        return self.digest


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (run on each worker by ``client.run``: the
    peak after each stage says which stage set it)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _identity(x: _T) -> _T:
    return x


def _pick(xs: list[_T], i: int) -> _T:
    return xs[i]


def _slice(part: Any, i: int) -> Any:
    """Partition ``i``'s slice of one replay task's answer (:data:`training.dask_replay.ReplayPart`)."""
    return part[0][i]


def _steps_part(cleaned: Any) -> Any:
    """A validated partition's steps as it holds them (scalar columns, Arrow table of the list
    columns): the replay packs from these without unpacking a cell (:func:`training.dask_io.steps_of`
    made a numpy object per list cell, five per step, beside the validated partitions)."""
    return cleaned[0]


def _cap_counts(part: Any) -> Any:
    """A replay task's answer without its slices: the synthetic cap's inputs only."""
    return ([], part[1], part[2])


def _rows(
    cleaned: Any, runs: pd.DataFrame, cfg: TrainConfig, slices: list[Any], drop: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One partition's rows (step 4): :func:`training.dataset.build_dataset` (the one feature code
    path) on its validated steps with the replay's cache labels (its ``slices`` of every replay
    task, the cap's ``drop`` runs: :func:`training.dask_replay.cache_columns`), then (training rows,
    features as float32; held-out rows, features as float64, as the serial held-out set has them;
    the training rows' :func:`_digest`, taken on the float64 features before they are narrowed).
    Only the narrowed rows outlive the task."""
    from features.runlog import RunLog
    from training.dataset import build_dataset
    from training.train import holdout_mask

    steps = steps_of(cleaned)
    if steps.empty:
        return _empty_rows(TRAIN_DTYPE), _empty_rows(np.float64), _digest(np.zeros((0, N_FEATURES)), _META0)
    empty = steps.iloc[:0]
    ds = build_dataset(
        RunLog(runs=runs, steps=steps, arrivals=empty, rates=empty),
        cache_capacity_blocks=cfg.cache_capacity_blocks,
        block_tokens=cfg.block_tokens,
        cache_labels=cache_columns(steps, slices, drop),  # steps are in build_dataset's row order
    )
    del steps
    X, meta = ds.X, ds.meta[list(META_COLS)]
    held = holdout_mask(meta["group"].to_numpy(dtype=object), cfg.holdout_share)
    Xt, mt = X[~held], meta[~held]
    digest = _digest(Xt, mt)
    return _frame(Xt.astype(TRAIN_DTYPE), mt), _frame(X[held], meta[held]), digest


def _frame(X: np.ndarray, meta: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(X, columns=list(FEATURE_NAMES))
    for c in META_COLS:
        out[c] = meta[c].to_numpy()
    return out


def _empty_rows(dtype: type[np.floating[Any]]) -> pd.DataFrame:
    out = pd.DataFrame({n: pd.Series([], dtype=dtype) for n in FEATURE_NAMES})
    for c in META_COLS:
        out[c] = _META0[c]
    return out


_META0 = pd.DataFrame(
    {
        c: pd.Series(
            [],
            dtype=object if c in ("run_id", "group", "source") else np.int64 if c == "step" else np.float64,
        )
        for c in META_COLS
    }
)


def _digest(X: np.ndarray, meta: pd.DataFrame) -> pd.DataFrame:
    """sha256 of a partition's training rows (as :meth:`training.dataset.Dataset.sha256` hashes)."""
    h = hashlib.sha256()
    h.update(FEATURE_SPEC_VERSION.encode())
    h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    for c in ("y_frontier", "y_cache", "y_rem_steps", "y_rem_tokens"):
        h.update(meta[c].to_numpy(dtype=np.float64).tobytes())
    h.update("\0".join(meta["group"].astype(str)).encode())
    first = str(meta["run_id"].iloc[0]) if len(meta) else ""
    return pd.DataFrame({"first": [first], "sha": [h.hexdigest()], "n": [len(meta)]})


def _with_target(
    part: pd.DataFrame, kind: str, prompt_col: int, log_target: bool, masked: tuple[str, ...] = ()
) -> pd.DataFrame:
    """A Dask fit's rows: the features, the training target ``_z`` (and weight ``_w``) as the serial
    estimators derive it, and for the escalation model the run, step and group (its calibration
    folds); ``masked`` features set to missing. Only those columns: LightGBM holds this frame's
    features while it fits, so a copy of every column would double a worker's rows."""
    keep = list(FEATURE_NAMES) + (["run_id", "step", "group"] if kind == "escalation" else [])
    out = part[keep].copy()
    for c in masked:
        out[c] = np.asarray(np.nan, dtype=part[c].dtype)
    if kind == "cache":
        denom = np.maximum(np.nan_to_num(part.iloc[:, prompt_col].to_numpy(dtype=np.float64)), 1.0)
        out["_z"] = np.clip(part["y_cache"].to_numpy(dtype=np.float64) / denom, 0.0, 1.0)
        out["_w"] = denom
    elif kind == "escalation":
        out["_z"] = part["y_frontier"].to_numpy(dtype=np.float64).astype(np.int64)
    else:
        y = part[kind].to_numpy(dtype=np.float64)
        out["_z"] = np.log1p(y) if log_target else y
    return out


def _with_fold(part: pd.DataFrame, folds: pd.Series) -> pd.DataFrame:
    out = part.copy()
    out["_fold"] = part["group"].map(folds).fillna(-1).astype(np.int64).to_numpy()
    return out


def _dask_fit(
    client: Client,
    est: EscalationClassifier | CacheReuseRegressor | RemainingWorkRegressor,
    X: dd.DataFrame,
    y: dd.Series,
    objective: str,
    weight: dd.Series | None = None,
    **extra: float,
) -> Any:
    """One LightGBM Dask fit with ``est``'s hyper-parameters (``models.escalation.lgb_params``);
    returns the trained ``lightgbm.Booster``."""
    from lightgbm.dask import DaskLGBMClassifier, DaskLGBMRegressor

    from models.escalation import lgb_params

    p = lgb_params(est, objective, **extra)
    kw: dict[str, Any] = dict(
        objective=objective,
        n_estimators=est.n_estimators,
        learning_rate=p["learning_rate"],
        num_leaves=p["num_leaves"],
        min_child_samples=p["min_data_in_leaf"],
        max_bin=p["max_bin"],
        subsample=p["bagging_fraction"],
        subsample_freq=p["bagging_freq"],
        colsample_bytree=p["feature_fraction"],
        random_state=p.get("seed"),
        verbose=-1,
        client=client,
        **extra,
    )
    cls = DaskLGBMClassifier if objective == "binary" else DaskLGBMRegressor
    model = cls(**kw)
    model.fit(X, y, sample_weight=weight)
    return model.to_local().booster_


def train_on_dask(
    cfg: TrainConfig,
    client: Client,
    *,
    npartitions: int | None = None,
    progress: Callable[[str], None] | None = None,
    on_task: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Run the job described in the module docstring on ``client``'s cluster."""
    import dask
    import dask.dataframe as dd
    from distributed import as_completed, futures_of, wait

    from features.runmerge import list_runlog_files
    from training.train import Fitted, finish_training, sized_config

    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    peaks: dict[str, list[float]] = {}  # each worker's peak RSS (MB) so far, after each stage

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        peaks[name.removesuffix("_s")] = sorted(client.run(_peak_rss_mb).values(), reverse=True)
        say(
            f"{name.removesuffix('_s')}: {timings[name]:.0f} s; worker peak RSS so far {peaks[name.removesuffix('_s')]} MB"
        )
        return now

    files = list_runlog_files([str(p) for p in cfg.runs])
    if any(f.suffix != ".parquet" for f in files):
        raise ValueError("--dask reads Parquet run logs only (convert .jsonl with runroute import)")
    n_workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
    rows_guess = sum(parquet_rows(f) for f in files)
    P = npartitions or max(4 * n_workers, -(-rows_guess // 250_000))
    say(f"reading {len(files)} run-log file(s), ~{rows_guess} records, into {P} partitions by run")
    cleaned = client.persist(
        [dask.delayed(clean_partition)(d) for d in read_partitioned(files, P).to_delayed()]
    )
    runs_parts = dask.compute(*[dask.delayed(runs_of)(c) for c in cleaned])
    runs = pd.concat([r for r, _ in runs_parts if len(r)], ignore_index=True)
    bad = [b for _, bs in runs_parts for b in bs]
    for pair in cfg.pairs:
        from features.importers.pairing import label_weak_runs

        weak, strong = pair.split("=")
        runs = label_weak_runs(runs, weak, strong)
    all_runs = runs  # every run field: the benefit stage reads outcomes, pairs, domains, embeddings
    runs = runs.drop_duplicates("run_id")[list(RUN_COLS)].reset_index(drop=True)
    run_src = dict(zip(runs["run_id"].astype(str), runs["source"].astype(str), strict=True))
    t = lap("read_s", t0)

    keys = replay_keys(run_src, cfg.cache_replicas)
    say(
        f"cache replay: {len(keys)} task(s), one per (source, replica); then features on the workers ({len(runs)} runs)"
    )
    # the replay first, while the workers hold only the validated partitions (the features held
    # float64 rows of every step beside the replay's one task, which took a worker past 9 GB at 10M
    # steps); one task per (source, replica) pair, each on the next worker, each holding its pair's
    # steps only
    src_f = client.submit(_identity, run_src, pure=False)  # a task: recomputed if its worker dies
    packs = client.compute(
        [
            dask.delayed(pack_replay_input)(dask.delayed(_steps_part)(c), src_f, keys, cfg.cache_replicas)
            for c in cleaned
        ]
    )
    # each pair's part of every pack, apart: a replay task fetches its own pair's steps only
    by_key = [[client.submit(_pick, p, k, pure=False) for p in packs] for k in range(len(keys))]
    del packs
    # the workers that answer now (client.run asks each; the scheduler_info cache was once empty)
    addrs = sorted(client.run(_peak_rss_mb))
    place = [
        {"workers": [addrs[k % len(addrs)]], "allow_other_workers": True} if addrs else {}
        for k in range(len(keys))
    ]
    replays = [
        client.submit(
            replay_packed,
            by_key[k],
            src_f,
            cfg.cache_capacity_blocks,
            cfg.block_tokens,
            replicas=cfg.cache_replicas,
            node_gpu=cfg.node_gpu,
            kv_cache_gb=cfg.kv_cache_gb,
            pure=False,
            **place[k],
        )
        for k in range(len(keys))
    ]
    wait(replays)
    del by_key, src_f
    # the synthetic-label cap over every pair's counts (small: one number per labelled run)
    drop = capped_runs(client.gather(client.map(_cap_counts, replays, pure=False)))
    t = lap("replay_s", t)
    runs_f = client.submit(_identity, runs, pure=False)
    drop_f = client.submit(_identity, drop, pure=False)
    built = [
        dask.delayed(_rows)(c, runs_f, cfg, [dask.delayed(_slice)(r, i) for r in replays], drop_f)
        for i, c in enumerate(cleaned)
    ]
    train = dd.from_delayed(
        [dask.delayed(_pick)(b, 0) for b in built], meta=_empty_rows(TRAIN_DTYPE), verify_meta=False
    ).persist()
    held_rows = dd.from_delayed(
        [dask.delayed(_pick)(b, 1) for b in built], meta=_empty_rows(np.float64), verify_meta=False
    ).persist()
    digests_f = client.compute([dask.delayed(_pick)(b, 2) for b in built])
    # the client lets go of the validated partitions and the replay's answers now: each leaves its
    # worker as soon as the rows built from it are done (the rows stay on the workers)
    del cleaned, replays, built, runs_f, drop_f
    futs = futures_of(train)
    for k, _ in enumerate(as_completed(futs), 1):
        if on_task is not None:
            on_task(k, len(futs))
    n_train, n_held = (int(x) for x in dask.compute(train.shape[0], held_rows.shape[0]))
    n = n_train + n_held
    if n == 0:
        raise ValueError("the run logs hold no step records: nothing to train on")
    cfg = sized_config(cfg, n)
    t = lap("features_s", t)

    masked = _source_masked(train, held_rows)  # the serial escalation_X rule, on shares per source
    esc_rows = train[train["y_frontier"].notnull()].map_partitions(
        _with_target, "escalation", 0, False, masked, meta=_target_meta("escalation")
    )
    ids = [d[["run_id", "group", "source", "y_frontier"]] for d in (train, held_rows)]
    both = dd.concat(ids)
    stats = dask.compute(
        esc_rows["_z"].sum(),
        esc_rows["_z"].count(),
        both["run_id"].nunique(),
        train["run_id"].nunique(),
        both.loc[both["y_frontier"].notnull(), "run_id"].nunique(),
        both["group"].nunique(),
        both["source"].value_counts(),
    )
    n_pos, n_esc, n_runs, n_train_runs, n_esc_runs, n_groups, sources = stats
    digests = pd.concat(client.gather(digests_f), ignore_index=True)
    del digests_f
    if n_esc == 0 or n_pos in (0, n_esc):
        raise ValueError(
            "no run carries a needs-frontier label with both outcomes (need Run.needs_frontier, a "
            "pairing via --pairs WEAK=STRONG, or run outcomes)"
        )
    dg = digests.sort_values("first", kind="stable")
    digest = hashlib.sha256("".join(dg["sha"]).encode()).hexdigest()
    report: dict[str, Any] = {
        "feature_spec_version": FEATURE_SPEC_VERSION,
        "n_runs": int(n_runs),
        "n_steps": n,
        "n_train_steps": n - int(n_held),
        "n_holdout_steps": int(n_held),
        "n_escalation_runs": int(n_esc_runs),
        "n_groups": int(n_groups),
        "sources": {str(k): int(v) for k, v in sources.items()},
        "data_sha256": digest,
        "config": cfg.model_dump(mode="json"),
        "dask": {
            "workers": n_workers,
            "npartitions": P,
            "bad_rows": len(bad),
            "cv": "not run on Dask",
            "worker_peak_rss_mb": peaks,  # filled as the stages end (the report is written last)
        },
        "escalation_masked_features": list(masked),
    }
    if bad:
        say(f"{len(bad)} bad row(s) left out, e.g. {bad[0]}")

    say("fitting the escalation model (calibration folds, then final) with DaskLGBMClassifier")
    esc, cal, sliced = _fit_escalation(client, cfg, esc_rows, int(n_esc))
    t = lap("fit_escalation_s", t)
    say("fitting the cache-reuse and remaining-work models with DaskLGBMRegressor")
    cache_est = cfg.make_cache()
    c_rows = train[train["y_cache"].notnull()].map_partitions(
        _with_target, "cache", cache_est.prompt_col, False, meta=_target_meta("cache")
    )
    cache = None
    if int(c_rows["_z"].count().compute()) >= 2:
        cache_est.booster_ = _dask_fit(
            client, cache_est, c_rows[list(FEATURE_NAMES)], c_rows["_z"], cache_est.objective, c_rows["_w"]
        )
        cache_est.n_features_in_ = N_FEATURES
        cache = cache_est
    t = lap("fit_cache_s", t)
    rem = []
    for col in ("y_rem_steps", "y_rem_tokens"):
        est = cfg.make_remaining()
        z = train.map_partitions(_with_target, col, 0, est.log_target, meta=_target_meta(col))
        qs = tuple(float(q) for q in est.quantiles)
        est.boosters_ = [
            _dask_fit(client, est, z[list(FEATURE_NAMES)], z["_z"], "quantile", alpha=q) for q in qs
        ]
        est.quantiles_, est.n_features_in_ = qs, N_FEATURES
        rem.append(est)
    t = lap("fit_remaining_s", t)

    say("gathering the held-out rows")
    held_df = to_client(client, held_rows)
    held = Dataset(held_df[list(FEATURE_NAMES)].to_numpy(dtype=np.float64), held_df[list(META_COLS)])
    head = train.head(100, npartitions=-1)
    summary = PartitionedDataset(
        X=head[list(FEATURE_NAMES)].to_numpy(dtype=np.float64),
        meta=head[list(META_COLS)].reset_index(drop=True),
        n_rows=n - int(n_held),
        runs=int(n_train_runs),
        digest=digest,
    )
    paired = _paired_run_ids(all_runs)  # the benefit stage's rows: steps of runs with both outcomes
    # ... the first steps only: its heads fit on steps < train_steps and its evidence is read at
    # eval_step (training.benefit), and all steps of every paired run held 8 of 10 training rows on
    # the client (every synthetic run is paired)
    first = max(cfg.benefit.train_steps, cfg.benefit.eval_step + 1)
    bt = (
        to_client(client, train[train["run_id"].isin(paired) & (train["step"] < first)])
        if paired
        else head.iloc[:0]
    )
    benefit_train = Dataset(bt[list(FEATURE_NAMES)].to_numpy(dtype=np.float64), bt[list(META_COLS)])
    t = lap("gather_s", t)
    return finish_training(
        cfg,
        report,
        timings,
        t0,
        t,
        Fitted(esc, cache, rem[0], rem[1]),
        cal["run_id"].to_numpy(),
        cal["step"].to_numpy(),
        lambda: esc.predict_proba(cal[list(FEATURE_NAMES)].to_numpy(dtype=np.float64))[:, 1],
        summary,
        held,
        {},
        say,
        all_runs,
        benefit_train,
        threshold_rows=(
            cal["run_id"].to_numpy(),
            cal["step"].to_numpy(),
            lambda: esc.predict_proba(cal[list(FEATURE_NAMES)].to_numpy(dtype=np.float64))[:, 1],
        )
        if sliced
        else None,
    )


def _source_masked(*parts: dd.DataFrame) -> tuple[str, ...]:
    """:func:`training.dataset.masked_features` over the per-source missing shares of the labelled
    rows of ``parts`` (training and held-out rows; sources with enough rows), counted on the workers."""
    import dask

    from training.dataset import MISSING_MIN_ROWS, masked_features

    sums, sizes = [], []
    for rows in parts:
        lab = rows[rows["y_frontier"].notnull()]
        miss = lab[list(FEATURE_NAMES)].isnull().astype(np.int64)
        miss["source"] = lab["source"]
        sums.append(miss.groupby("source").sum())
        sizes.append(lab.groupby("source").size())
    got = dask.compute(*sums, *sizes)
    k = len(parts)
    nulls = pd.concat(got[:k]).groupby(level=0).sum()
    counts = pd.concat(got[k:]).groupby(level=0).sum()
    keep = counts[counts >= MISSING_MIN_ROWS].index
    shares = nulls.loc[nulls.index.isin(keep), list(FEATURE_NAMES)].div(counts[keep], axis=0)
    return masked_features(shares)


def _paired_run_ids(runs: pd.DataFrame) -> list[str]:
    """Run ids with their own outcome and a strong outcome of the same task (the benefit rows)."""
    if "strong_outcome" not in runs.columns:
        return []
    ok = runs["outcome"].isin(["success", "failure"]) & runs["strong_outcome"].isin(["success", "failure"])
    return sorted(set(runs.loc[ok, "run_id"].astype(str)))


def _target_meta(kind: str) -> pd.DataFrame:
    return _with_target(_empty_rows(TRAIN_DTYPE), kind, 0, False)


def _fit_escalation(
    client: Client, cfg: TrainConfig, esc_rows: dd.DataFrame, n_esc: int
) -> tuple[EscalationClassifier, pd.DataFrame, bool]:
    """The escalation estimator with Dask-trained boosters: out-of-fold calibration on the groups and
    folds :class:`models.escalation.EscalationClassifier` picks (a random subset of groups holding
    about ``calibration_max_rows`` rows; groups dealt to folds by mean label), then the final fit on
    all labelled training rows. Above ``calibration_max_rows`` rows, the serial job's calibration
    slice (:func:`training.calibration.threshold_slice`) is the calibration subset and the final
    fit leaves it out, so the thresholds are set on the final model's scores of it. Returns
    (estimator, calibration rows with their raw OOF scores, whether they are such a slice)."""
    from models.escalation import fit_calibration_map, group_folds
    from training.calibration import threshold_slice

    est = cfg.make_escalation()
    by_group = esc_rows.groupby("group")["_z"].agg(["sum", "count"]).compute()
    ug = np.unique(by_group.index.to_numpy(dtype=object))
    by_group = by_group.loc[ug]
    cal_groups = ug
    cap = est.calibration_max_rows
    cut = threshold_slice(ug, n_esc, cap, cfg.threshold_slice_share, cfg.random_state)
    if cut is not None:  # the serial slice: the folds on it, the final model without it
        cal_groups = cut
    elif cap is not None and n_esc > cap:
        rng = np.random.default_rng(est.random_state)
        keep = rng.permutation(len(ug))[: max(2, int(len(ug) * cap / n_esc))]
        cal_groups = np.sort(ug[keep])
    cg = by_group.loc[cal_groups]
    pos, cnt = int(cg["sum"].sum()), int(cg["count"].sum())
    k = min(est.cv, len(cal_groups), pos, cnt - pos) if est.calibration != "none" else 0
    folds = pd.Series(np.full(len(cal_groups), -1, dtype=np.int64), index=cal_groups)
    if k >= 2:
        mean = (cg["sum"] / cg["count"]).to_numpy(dtype=np.float64)
        folds[:] = group_folds(mean, cal_groups, k, est.random_state)
    fx = esc_rows.map_partitions(_with_fold, folds, meta=_with_fold(esc_rows._meta, folds.iloc[:0]))
    cal = to_client(client, fx[fx["_fold"] >= 0]).sort_values(["run_id", "step"], kind="stable")
    cal = cal.reset_index(drop=True)
    oof = np.full(len(cal), np.nan)
    Xc = cal[list(FEATURE_NAMES)].to_numpy(dtype=np.float64)
    for f in range(k if k >= 2 else 0):
        tr = fx[(fx["_fold"] >= 0) & (fx["_fold"] != f)]
        te = (cal["_fold"] == f).to_numpy()
        if cal.loc[~te, "_z"].nunique() < 2:
            continue
        booster = _dask_fit(client, est, tr[list(FEATURE_NAMES)], tr["_z"], "binary")
        oof[te] = booster.predict(Xc[te])
    ok = ~np.isnan(oof)
    yc = cal["_z"].to_numpy(dtype=np.int64)
    method = est.calibration
    if method == "none" or ok.sum() < 2 or len(np.unique(yc[ok])) < 2:
        method = "none"
    est.calibration_used_, est.oof_raw_ = method, oof
    est.calib_x_, est.calib_y_ = fit_calibration_map(method, oof[ok], yc[ok])
    fit = esc_rows if cut is None else esc_rows[~esc_rows["group"].isin(cut.tolist())]
    est.booster_ = _dask_fit(client, est, fit[list(FEATURE_NAMES)], fit["_z"], "binary")
    est.classes_, est.n_features_in_ = np.array([0, 1]), N_FEATURES
    return est, cal, cut is not None
