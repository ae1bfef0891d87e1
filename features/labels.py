"""Late outcome labels for logged runs: ``runroute label --outcomes FILE --runs DIR``.

Algorithm of :func:`label_runs`:

1. Read the outcomes file (``.csv``, ``.jsonl`` or ``.parquet``; columns ``run_id``, ``outcome``
   and optionally ``reward``; any other column is refused as a whole-file error).
2. Check every row and report each bad one with its file, row (1-based; the line number for CSV
   with its header and for JSONL) and reason: missing or empty ``run_id``; ``outcome`` not one of
   ``success`` / ``failure`` / ``unknown``; ``reward`` not a finite number; a run id the run log in
   ``DIR`` does not know (no ``run`` or ``step`` record of it). A run id repeated in the file keeps
   its last row (file order).
3. With any bad row nothing is written (unless ``skip_bad``: the good rows are written and the bad
   ones reported). The good rows become ``run`` records (``run_id``, the run's logged ``source``,
   ``outcome``, ``reward``) in one new file ``DIR/labels-<seq>-<UTC stamp>.jsonl``: written to a
   hidden temporary file, fsynced, then published under its final name with ``os.link`` (which
   refuses an existing name, so two concurrent label commands never share a file: the loser takes
   the next sequence number), and the directory is fsynced. A SIGKILL at any point leaves either
   the complete new file or none, and never touches an earlier label file or log.
4. Readers (:func:`features.runlog.read_runlog` on ``DIR``) read label files after the logs, in
   sequence order, and merge a run's records so that the last label wins
   (:mod:`features.runmerge`).

Knobs: ``skip_bad`` (write the good rows despite bad ones).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from features.runlog import LABEL_PREFIX, BadRow, RunLogError, list_runlog_files
from features.schema import SCHEMA_VERSION

__all__ = ["LabelResult", "label_runs", "read_outcomes", "known_runs", "OUTCOMES"]

OUTCOMES = ("success", "failure", "unknown")
_COLUMNS = ("run_id", "outcome", "reward")


@dataclass
class LabelResult:
    """What :func:`label_runs` did: the file written (None when nothing was), the rows written,
    how many of those runs had a label before, and the bad rows."""

    path: Path | None
    written: int
    relabelled: int
    bad_rows: list[BadRow] = field(default_factory=list)


def _frame(path: Path) -> tuple[Any, Any, list[BadRow]]:
    """The outcomes file as a frame, each row's 1-based row number, and unparsable JSONL lines."""
    import numpy as np
    import pandas as pd

    if not path.exists():
        raise RunLogError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise RunLogError(f"{path}: empty file")
    bad: list[BadRow] = []
    if path.suffix == ".jsonl":
        rows, nums = [], []
        with open(path, "rb") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    bad.append(BadRow(str(path), i, "invalid JSON"))
                    continue
                if not isinstance(obj, dict):
                    bad.append(BadRow(str(path), i, "a row must be a JSON object"))
                    continue
                rows.append(obj)
                nums.append(i)
        return pd.DataFrame.from_records(rows), np.asarray(nums, dtype=np.int64), bad
    if path.suffix == ".csv":
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (ValueError, pd.errors.ParserError) as e:
            raise RunLogError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
        df = df.replace({"": None})
        offset = 2  # the header is line 1
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            df = pq.read_table(path).to_pandas()
        except (pa.ArrowInvalid, OSError) as e:
            raise RunLogError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        offset = 1
    else:
        raise RunLogError(f"{path}: unknown outcomes format (use .csv, .jsonl or .parquet)")
    return df, np.arange(len(df), dtype=np.int64) + offset, bad


def read_outcomes(
    path: str | os.PathLike[str],
) -> tuple[dict[str, tuple[str, float | None, int]], list[BadRow]]:
    """``{run_id: (outcome, reward, row)}`` of the file's good rows (last row of a run wins) and
    its bad rows; raises :class:`~features.runlog.RunLogError` for a file-level problem. The checks
    are vectorised (a million labels take seconds, not minutes)."""
    import numpy as np
    import pandas as pd

    p = Path(path)
    df, nums, bad = _frame(p)
    unknown = sorted(str(c) for c in set(df.columns) - set(_COLUMNS))
    if unknown:
        raise RunLogError(f"{p}: unknown column(s) {', '.join(unknown)}; expected run_id, outcome[, reward]")
    if len(df) and not {"run_id", "outcome"} <= set(df.columns):
        raise RunLogError(f"{p}: needs the columns run_id and outcome (reward optional)")
    if not len(df) and not bad:
        raise RunLogError(f"{p}: no rows")
    if not len(df):
        return {}, bad
    rid = df["run_id"].astype(object).to_numpy()
    out = df["outcome"].astype(object).to_numpy()
    rew_raw = df["reward"].astype(object) if "reward" in df else pd.Series([None] * len(df), dtype=object)
    rew = pd.to_numeric(rew_raw, errors="coerce").to_numpy(dtype=np.float64)
    is_bool = np.fromiter((isinstance(v, (bool, np.bool_)) for v in rew_raw), bool, len(df))
    given = rew_raw.notna().to_numpy()
    ok_id = np.fromiter((isinstance(v, str) and bool(v.strip()) for v in rid), bool, len(df))
    ok_out = np.isin(out, np.array(OUTCOMES, dtype=object))
    ok_rew = ~given | (np.isfinite(rew) & ~is_bool)
    for i in np.flatnonzero(~(ok_id & ok_out & ok_rew)):
        if not ok_id[i]:
            reason = "missing or empty run_id"
        elif not ok_out[i]:
            reason = f"outcome must be success, failure or unknown (got {out[i]!r})"
        else:
            reason = f"reward must be a finite number (got {rew_raw.iloc[i]!r})"
        raw = {k: v for k, v in df.iloc[i].to_dict().items() if v is not None}
        bad.append(BadRow(str(p), int(nums[i]), reason, raw))
    keep = np.flatnonzero(ok_id & ok_out & ok_rew)
    good = {
        str(rid[i]): (str(out[i]), None if not given[i] else float(rew[i]), int(nums[i]))
        for i in keep.tolist()
    }
    bad.sort(key=lambda b: b.row)
    return good, bad


def known_runs(directory: Path) -> tuple[dict[str, str], set[str], set[str]]:
    """What a run-log directory knows, reading only four columns: ``{run_id: source}`` of its run
    records (the last record's source), the run ids with a run or step record, and the run ids
    whose latest labelled run record says success or failure."""
    import pyarrow.parquet as pq

    sources: dict[str, str] = {}
    ids: set[str] = set()
    label: dict[str, str] = {}
    cols = ["record", "run_id", "source", "outcome"]
    for f in list_runlog_files(directory):
        if f.suffix == ".parquet":
            names = pq.read_schema(f).names
            t = pq.read_table(f, columns=[c for c in cols if c in names]).to_pydict()
            n = len(t["record"])
            recs: Iterable[tuple[Any, ...]] = zip(*(t.get(c, [None] * n) for c in cols), strict=True)
        else:
            recs = _jsonl_ids(f, cols)
        for kind, rid, src, out in recs:
            if kind not in ("run", "step") or not isinstance(rid, str):
                continue
            ids.add(rid)
            if kind == "run":
                if isinstance(src, str):
                    sources[rid] = src
                if isinstance(out, str):
                    label[rid] = out
    return sources, ids, {r for r, o in label.items() if o in ("success", "failure")}


def _jsonl_ids(f: Path, cols: list[str]) -> Iterable[tuple[Any, ...]]:
    with open(f, "rb") as fh:
        for line in fh:
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the run-log reader reports it; an unreadable line names no run
            if isinstance(obj, dict):
                yield tuple(obj.get(c) for c in cols)


def _next_seq(directory: Path) -> int:
    seqs = [0]
    for x in directory.glob(f"{LABEL_PREFIX}*"):
        part = x.name[len(LABEL_PREFIX) :].split("-", 1)[0]
        if part.isdigit():
            seqs.append(int(part))
    return max(seqs) + 1


def _publish(directory: Path, payload: bytes) -> Path:
    """Write ``payload`` to a new ``labels-<seq>-<stamp>.jsonl`` atomically and exclusively."""
    fd, tmp = tempfile.mkstemp(prefix=f".{LABEL_PREFIX}", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for _ in range(1000):
            final = directory / f"{LABEL_PREFIX}{_next_seq(directory):06d}-{stamp}.jsonl"
            try:
                os.link(tmp, final)
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover - a thousand concurrent label commands
            raise RunLogError(f"{directory}: could not find a free label file name")
    finally:
        Path(tmp).unlink(missing_ok=True)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return final


def label_runs(
    outcomes: str | os.PathLike[str], directory: str | os.PathLike[str], *, skip_bad: bool = False
) -> LabelResult:
    """Label the runs of the run-log ``directory`` from ``outcomes`` (module docstring)."""
    d = Path(directory)
    if not d.is_dir():
        raise RunLogError(f"{d}: not a run-log directory (labels are written beside the logs)")
    good, bad = read_outcomes(outcomes)
    sources, ids, labelled = known_runs(d)
    for rid, (_, _, row) in list(good.items()):
        if rid not in ids:
            bad.append(BadRow(str(outcomes), row, f"unknown run id {rid!r} (not in the run log at {d})"))
            del good[rid]
    bad.sort(key=lambda b: b.row)
    if (bad and not skip_bad) or not good:
        return LabelResult(path=None, written=0, relabelled=0, bad_rows=bad)
    before = len(labelled & set(good))
    payload = b"".join(
        orjson.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "record": "run",
                "run_id": rid,
                "source": sources.get(rid, "runroute"),
                "outcome": out,
                "reward": rew,
            }
        )
        + b"\n"
        for rid, (out, rew, _) in good.items()
    )
    path = _publish(d, payload)
    return LabelResult(path=path, written=len(good), relabelled=before, bad_rows=bad)
