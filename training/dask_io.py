"""Reading run logs into a Dask job and bringing rows back (:mod:`training.dask_train`, steps 1 and 7).

- :func:`read_partitioned`: the Parquet run logs as a ``dask.dataframe``, one task per row group,
  shuffled on ``run_id`` so no partition splits a run.
- :func:`clean_partition`: one partition validated like a file (the serial reader's rules), its run
  records merged, its steps cut to the columns features and labels read (:data:`KEEP_COLUMNS`).
- :func:`to_client`: a dask DataFrame's rows on the client, partition by partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from features.logged import STEP_COLUMNS
from training.dask_replay import REPLAY_COLS

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

__all__ = [
    "KEEP_COLUMNS",
    "read_partitioned",
    "clean_partition",
    "steps_of",
    "runs_of",
    "to_client",
    "parquet_rows",
]

# the step columns build_dataset reads (the prefix builders' columns, the labels', the logged features)
KEEP_COLUMNS = frozenset((*STEP_COLUMNS, "record", *REPLAY_COLS, "features", "feature_spec_version"))


def read_partitioned(files: list[Path], npartitions: int, shuffle_method: str = "p2p") -> Any:
    """The run logs as a dask DataFrame whose partitions each hold whole runs (shuffled on run_id).
    Read one Parquet row group per task (runroute writes 131,072-row groups): a task that read a
    pyarrow-default million-row group held 3.4 GB on one worker before the shuffle."""
    import dask
    import dask.dataframe as dd

    # strings as the serial reader has them (pandas' default str dtype, NaN for missing), not
    # string[pyarrow] with pd.NA, so validation and features see the same values
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.read_parquet([str(f) for f in files], split_row_groups=True)
        return ddf.shuffle(on="run_id", npartitions=npartitions, shuffle_method=shuffle_method)


def clean_partition(part: pd.DataFrame) -> _Cleaned:
    """One partition validated like a file: (steps sorted by run and step, run records, bad reasons)."""
    from features.runlog import conform, validate_rows
    from features.runmerge import merge_runs

    df = conform(part.reset_index(drop=True), exact=False)
    if "predictions" in df:
        df["predictions"] = [None if v is None else dict(v) for v in df["predictions"]]
    reasons = validate_rows(df)
    good = df.drop(index=df.index[list(reasons)]) if reasons else df
    good = merge_runs(good.reset_index(drop=True))
    for c in ("step", "prompt_tokens", "completion_tokens", "tool_results_n"):
        good[c] = pd.to_numeric(good[c]).astype("Int64")
    steps = good[good["record"] == "step"]
    steps = steps[[c for c in steps.columns if c in KEEP_COLUMNS]]  # only what features and labels read
    steps = steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    runs = good[good["record"] == "run"].reset_index(drop=True)
    return _pack_lists(steps), runs, [reasons[i] for i in sorted(reasons)]


# A list cell read from Parquet is a numpy array (a view into Arrow's buffer): ~120 bytes of object
# per cell, 5 such columns per step, held by every validated partition until its features are built.
# Between tasks the list columns are kept as one Arrow table (the values, compact) and unpacked again
# by steps_of, to the same numpy-array cells.
_Cleaned = tuple[tuple[pd.DataFrame, Any], pd.DataFrame, list[str]]


def _pack_lists(steps: pd.DataFrame) -> tuple[pd.DataFrame, Any]:
    import numpy as np
    import pyarrow as pa

    cols = [
        c
        for c in steps.columns
        if steps[c].dtype == object and any(isinstance(v, np.ndarray) for v in steps[c].head(1000))
    ]
    if not cols:
        return steps, None
    table = pa.Table.from_pandas(steps[cols], preserve_index=False)
    return steps.drop(columns=cols), table


def steps_of(cleaned: _Cleaned) -> pd.DataFrame:
    """The steps of a :func:`clean_partition` result (list columns unpacked to their cells)."""
    steps, table = cleaned[0]
    if table is None:
        return steps
    out = steps.copy()
    for c in table.column_names:
        out[c] = table.column(c).to_pandas().to_numpy(dtype=object)
    return out


def runs_of(cleaned: _Cleaned) -> tuple[pd.DataFrame, list[str]]:
    """The run records and bad-row reasons of a :func:`clean_partition` result."""
    return cleaned[1], cleaned[2]


def to_client(client: Client, ddf: dd.DataFrame) -> pd.DataFrame:
    """A dask DataFrame's rows on the client, in partition order, joined there: ``.compute()`` joins
    the partitions in one task on a worker first, and at 5M steps the held-out rows made that
    worker peak at 9.1 GB."""
    parts = client.gather(client.compute(ddf.to_delayed()))
    return pd.concat(parts, ignore_index=True) if parts else ddf._meta.reset_index(drop=True)


def parquet_rows(path: str | Path) -> int:
    """Records in one Parquet file (its footer only)."""
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)
