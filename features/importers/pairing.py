"""Weak-vs-strong pairing: which tasks need the frontier model.

Algorithm: take the run records of the two models (``Run.model`` equal to ``weak_model`` /
``strong_model``), group them by (source, task_id), and score each model on a task by the mean of its
runs' success (reward == 1 -> 1, else 0; runs with an unknown outcome are ignored). A model *succeeds*
on a task when that mean is > ``threshold`` (0.5: the majority of its trials; a single trial is just
its outcome; a tie counts as failure). Only tasks that both models ran are labelled:

- ``needs_frontier``: the weak model fails and the strong one succeeds,
- ``both_fail``: both fail,
- ``weak_ok``: the weak model succeeds (whatever the strong one did).

:func:`label_weak_runs` writes the labels onto the weak model's run records: ``needs_frontier``
(True only for ``needs_frontier`` tasks), ``pair_label``, ``strong_model``, ``strong_outcome``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["pair_outcomes", "label_weak_runs", "PAIR_LABELS"]

PAIR_LABELS = ("needs_frontier", "both_fail", "weak_ok")


def _runs(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["record"] == "run"] if "record" in df.columns else df


def pair_outcomes(
    runs_df: pd.DataFrame, weak_model: str, strong_model: str, *, threshold: float = 0.5
) -> pd.DataFrame:
    """Per-task labels; columns: source, task_id, weak_success, strong_success, weak_runs,
    strong_runs, pair_label. Raises :class:`features.runlog.RunLogError` when a model has no runs."""
    import pandas as pd

    from features.runlog import RunLogError

    runs = _runs(runs_df)
    runs = runs[runs["outcome"].isin(["success", "failure"]) & runs["task_id"].notna()]
    present = sorted(str(m) for m in runs["model"].dropna().unique())
    scores = {}
    for role, model in (("weak", weak_model), ("strong", strong_model)):
        sel = runs[runs["model"] == model]
        if sel.empty:
            raise RunLogError(
                f"no runs with a known outcome for model '{model}' (models present: {', '.join(present)})"
            )
        g = sel.assign(ok=(sel["outcome"] == "success").astype(float)).groupby(["source", "task_id"])["ok"]
        scores[role] = pd.DataFrame({f"{role}_mean": g.mean(), f"{role}_runs": g.size()})
    both = scores["weak"].join(scores["strong"], how="inner").reset_index()
    both["weak_success"] = both["weak_mean"] > threshold
    both["strong_success"] = both["strong_mean"] > threshold
    label = pd.Series("both_fail", index=both.index, dtype=object)
    label[~both["weak_success"] & both["strong_success"]] = "needs_frontier"
    label[both["weak_success"]] = "weak_ok"
    both["pair_label"] = label
    return both[
        ["source", "task_id", "weak_success", "strong_success", "weak_runs", "strong_runs", "pair_label"]
    ]


def label_weak_runs(
    df: pd.DataFrame, weak_model: str, strong_model: str, *, threshold: float = 0.5
) -> pd.DataFrame:
    """Copy of the run-log frame with the pairing labels written onto the weak model's runs.

    Weak runs whose task the strong model did not run keep null labels."""
    pairs = pair_outcomes(df, weak_model, strong_model, threshold=threshold)
    out = df.copy()
    key = pairs.set_index(["source", "task_id"])
    is_weak = (out["record"] == "run") & (out["model"] == weak_model)
    idx = out.index[is_weak]
    keys = list(zip(out.loc[idx, "source"], out.loc[idx, "task_id"], strict=True))
    found = [k in key.index for k in keys]
    for col in ("needs_frontier", "pair_label", "strong_model", "strong_outcome"):
        out[col] = out[col].astype(object)
    for i, k, ok in zip(idx, keys, found, strict=True):
        if not ok:
            continue
        row = key.loc[k]
        out.at[i, "pair_label"] = row["pair_label"]
        out.at[i, "needs_frontier"] = bool(row["pair_label"] == "needs_frontier")
        out.at[i, "strong_model"] = strong_model
        out.at[i, "strong_outcome"] = "success" if bool(row["strong_success"]) else "failure"
    return out
