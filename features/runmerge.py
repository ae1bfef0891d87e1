"""Run-log files in reading order, and merging a run's ``run`` records: the last label wins.

:func:`list_runlog_files` lists what :func:`features.runlog.read_runlog` reads, in its order: given
files as given; a directory's ``*.parquet`` / ``*.jsonl`` run logs by name, then its ``labels-*``
files (``runroute label``, :mod:`features.labels`) by name, so labels come after the logs.

A run's outcome arrives after its steps and may be corrected later (a second
``POST /v1/runs/{id}/end``, ``runroute label``), so a run log may hold several ``run`` records of
one run. Algorithm of :func:`merge_runs`: group the run records by ``run_id`` in reading order;
every field takes the last non-null value, except the label pair ``outcome`` / ``reward``, which
comes whole from the last record that carries an ``outcome`` (a record without one leaves the
label alone; an explicit ``unknown`` retracts it). The merged record sits where the run's first
record was; other record kinds keep their rows and order. No knobs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

__all__ = ["merge_runs", "list_runlog_files", "LABEL_PREFIX"]

LABEL_PREFIX = "labels-"  # label files (runroute label) in a run-log directory; read after the logs


def merge_runs(df: pd.DataFrame) -> pd.DataFrame:
    """One ``run`` record per run_id: the last label wins (see the module docstring).

    Other record kinds keep their rows and order; the merged run sits where its first record was."""
    if "record" not in df or len(df) == 0:
        return df
    is_run = (df["record"] == "run").to_numpy()
    if is_run.sum() < 2:
        return df
    runs = df[is_run]
    if not runs["run_id"].duplicated().any():
        return df
    rid = runs["run_id"]
    merged = runs.groupby(rid, sort=False, dropna=False).last()  # last non-null value per column
    if "outcome" in runs:
        labelled = runs[runs["outcome"].notna()]
        if len(labelled):
            last = labelled.groupby(labelled["run_id"], sort=False).tail(1).set_index("run_id")
            both = merged.index.intersection(last.index)
            merged.loc[both, "outcome"] = last.loc[both, "outcome"]
            merged.loc[both, "reward"] = last.loc[both, "reward"] if "reward" in last else None
    merged = merged.reset_index()
    merged.index = runs.index[~rid.duplicated().to_numpy()]
    out = pd.concat([df[~is_run], merged[runs.columns]]).sort_index(kind="stable")
    return out.reset_index(drop=True)


def list_runlog_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[Path]:
    """The files :func:`features.runlog.read_runlog` reads, in its order: given files as given; a directory's
    ``*.parquet`` / ``*.jsonl`` run logs by name, then its ``labels-*`` files by name."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                (
                    x
                    for x in p.iterdir()
                    if x.suffix in (".parquet", ".jsonl")
                    and not x.name.endswith(".rejected.jsonl")
                    and not x.name.startswith(".")
                ),
                key=lambda x: (x.name.startswith(LABEL_PREFIX), x.name),
            )
            if not found:
                from features.runlog import RunLogError  # runlog imports this module

                raise RunLogError(f"{p}: directory holds no .parquet or .jsonl run logs")
            files.extend(found)
        else:
            files.append(p)
    return files
