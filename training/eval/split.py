"""The demo's split: by task, seeded, never by row; plus the synthetic training and held-out sets.

Algorithm of :func:`split_by_task`:

1. The tau2 airline tasks with paired runs (a weak outcome and a ``strong_outcome``) are permuted
   with ``seed``; the first ``holdout_share`` of them (at least one) are held out
   (:func:`split_tau2`). The held-out tau2 set is the paired runs of those tasks.
2. Every run of a held-out task id, of *any* source (tau2's other agents, tau-bench's airline tasks
   with the same ids), is kept out of training.
3. Training = tau-bench + tau2 runs of the other tasks + the real cache-label sources
   (``cache_sources``: the shipped Mooncake sample, the first 20 minutes of the conversation trace;
   no outcomes, so they train the cache-reuse and remaining-work models, never the escalation
   model) + ``synthetic_train_runs`` synthetic runs (:func:`features.generate.generate`,
   ``synthetic_train_seed``). A second held-out set is a synthetic workload of
   ``synthetic_holdout_runs`` runs with its own seed.
4. The three sets are written to ``data_dir`` (``train.parquet``, ``holdout_tau2.parquet``,
   ``holdout_synthetic.parquet``) and described in a :class:`training.eval.scorecard.Split`. A
   held-out task id found in training is a programming error and raises.

Knobs (keyword arguments, the fields of the demo's config): ``holdout_share``, ``seed``,
``synthetic_train_runs`` / ``synthetic_train_seed``, ``synthetic_holdout_runs`` /
``synthetic_holdout_seed``, and for tests ``limit_tau2_tasks`` / ``limit_taubench_runs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from training.eval.scorecard import Split, SyntheticSet

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DemoSets", "split_tau2", "split_by_task"]


@dataclass
class DemoSets:
    """The training frame (run + step records) and the two held-out run logs, with their description."""

    train: Any  # pandas DataFrame of run-log records
    tau2_holdout: Any  # features.runlog.RunLog
    synthetic_holdout: Any  # features.runlog.RunLog
    split: Split


def split_tau2(runs: pd.DataFrame, share: float, seed: int, limit: int | None) -> tuple[list[str], list[str]]:
    """Held-out / training tau2 task ids: a seeded permutation of the tasks with paired runs."""
    paired = runs[(runs["source"] == "tau2bench") & runs["strong_outcome"].notna()]
    tasks = sorted(set(paired["task_id"].dropna().astype(str).tolist()))
    rng = np.random.default_rng(seed)
    tasks = [tasks[i] for i in rng.permutation(len(tasks))]
    if limit is not None:
        tasks = tasks[:limit]
    n_hold = max(1, int(round(share * len(tasks))))
    return sorted(tasks[:n_hold]), sorted(tasks[n_hold:])


def split_by_task(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    data_dir: Path,
    holdout_share: float,
    seed: int,
    synthetic_train_runs: int,
    synthetic_train_seed: int,
    synthetic_holdout_runs: int,
    synthetic_holdout_seed: int,
    limit_tau2_tasks: int | None = None,
    limit_taubench_runs: int | None = None,
    cache_sources: tuple[str, ...] = ("mooncake",),
) -> DemoSets:
    """Split the shipped samples' runs and steps (the module docstring)."""
    import pandas as pd

    from features.generate import generate
    from features.runlog import RunLog, write_frame

    hold_tasks, train_tasks = split_tau2(runs, holdout_share, seed, limit_tau2_tasks)
    hold_set, keep_tasks = set(hold_tasks), set(train_tasks)
    is_tau = runs["source"].isin(["tau2bench", "taubench"])
    task_s = runs["task_id"].astype(str)
    tau2_hold_runs = runs[
        (runs["source"] == "tau2bench") & task_s.isin(hold_set) & runs["strong_outcome"].notna()
    ]
    tau_train = runs[is_tau & ~task_s.isin(hold_set)]
    if limit_tau2_tasks is not None:
        tau_train = tau_train[
            (tau_train["source"] != "tau2bench") | tau_train["task_id"].astype(str).isin(keep_tasks)
        ]
    if limit_taubench_runs is not None:
        tb = tau_train[tau_train["source"] == "taubench"].head(limit_taubench_runs)
        tau_train = pd.concat([tau_train[tau_train["source"] != "taubench"], tb])
    excluded = runs[is_tau & task_s.isin(hold_set) & ~runs["run_id"].isin(tau2_hold_runs["run_id"])]
    cache_train = runs[runs["source"].isin(list(cache_sources))]
    tau_train_ids = set(tau_train["run_id"]) | set(cache_train["run_id"])
    train_parts = [tau_train, cache_train, steps[steps["run_id"].isin(tau_train_ids)]]
    if synthetic_train_runs:
        train_parts.append(generate(synthetic_train_runs, seed=synthetic_train_seed))
    train_df = pd.concat(train_parts, ignore_index=True)
    write_frame(train_df, data_dir / "train.parquet")
    hold_ids = set(tau2_hold_runs["run_id"])
    tau2_hold = RunLog.from_frame(
        pd.concat([tau2_hold_runs, steps[steps["run_id"].isin(hold_ids)]], ignore_index=True)
    )
    write_frame(
        pd.concat([tau2_hold.runs, tau2_hold.steps], ignore_index=True), data_dir / "holdout_tau2.parquet"
    )
    syn_hold_df = generate(synthetic_holdout_runs, seed=synthetic_holdout_seed)
    write_frame(syn_hold_df, data_dir / "holdout_synthetic.parquet")
    leak = set(tau_train["task_id"].astype(str)) & hold_set
    if leak:  # a programming error: the split must never leak
        raise RuntimeError(f"held-out tasks leaked into training: {sorted(leak)[:3]}")
    is_run = train_df["record"] == "run"
    split = Split(
        method="by task, seeded permutation of the tau2 airline tasks with paired runs; never by row",
        seed=seed,
        tau2_heldout_tasks=hold_tasks,
        tau2_train_tasks=train_tasks,
        tau2_heldout_runs=int(len(tau2_hold_runs)),
        tau2_heldout_runs_without_steps=int(
            (~tau2_hold_runs["run_id"].isin(set(steps["run_id"].tolist()))).sum()
        ),
        excluded_from_training_runs=int(len(excluded)),
        excluded_from_training_by_source={k: int(v) for k, v in excluded["source"].value_counts().items()},
        synthetic_heldout=SyntheticSet(runs=synthetic_holdout_runs, seed=synthetic_holdout_seed),
        synthetic_train=SyntheticSet(runs=synthetic_train_runs, seed=synthetic_train_seed),
        training_runs=int(is_run.sum()),
        training_steps=int((train_df["record"] == "step").sum()),
        training_runs_by_source={k: int(v) for k, v in train_df.loc[is_run, "source"].value_counts().items()},
    )
    return DemoSets(
        train=train_df, tau2_holdout=tau2_hold, synthetic_holdout=RunLog.from_frame(syn_hold_df), split=split
    )
