"""Reading and writing run logs (Parquet, JSONL) with validation at the boundary.

Reading validates every row, vectorised over the table (fast enough for millions of steps):
each bad row is reported with its file, row number (1-based; the line number for JSONL) and a
reason. With ``strict=True`` any bad row raises :class:`RunLogError`. Otherwise bad rows are
*quarantined*: written to a sibling ``<file>.rejected.jsonl`` (row, reason, the raw record) and
counted in the result. Nothing is dropped silently. A ``(run_id, step)`` that occurs twice is a bad
row ("duplicate (run_id, step)") within one file and, in :func:`read_runlog`, across files too
(each router process writes its own file, so a step two routers numbered alike shows only there);
the first occurrence, in file order, is kept.

Run records are *merged*, never quarantined as duplicates (a later end call or ``runroute label``
updates a run): :func:`features.runmerge.merge_runs` keeps one per run, the last label winning;
directories are read in :func:`features.runmerge.list_runlog_files` order (logs, then labels).

Writing is atomic (temporary file + rename), so a crash never leaves a half-written file.
Parquet is written in row groups of :data:`ROW_GROUP_ROWS` (131,072) records, so a reader that
splits by row group (``runroute train --dask``) holds ~150 MB of one file at a time per task, not a
million rows (pyarrow's default group).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from features.runmerge import LABEL_PREFIX, list_runlog_files, merge_runs
from features.schema import ARROW_SCHEMA, COLUMNS, RECORD_MODELS, SCHEMA_VERSION, SchemaVersionError

__all__ = [
    "RunLogError",
    "BadRow",
    "ReadResult",
    "RunLog",
    "read_records",
    "read_runlog",
    "write_records",
    "write_frame",
    "records_to_frame",
    "conform",
    "validate_rows",
    "merge_runs",
    "LABEL_PREFIX",
    "list_runlog_files",
    "ROW_GROUP_ROWS",
]

ROW_GROUP_ROWS = 131_072


class RunLogError(ValueError):
    """A run log cannot be read or written; the message is one line meant for a person."""


@dataclass(frozen=True)
class BadRow:
    path: str
    row: int  # 1-based row (JSONL: line number)
    reason: str
    raw: Any = None

    def __str__(self) -> str:
        return f"{self.path}:{self.row}: {self.reason}"


@dataclass
class ReadResult:
    frame: pd.DataFrame
    bad_rows: list[BadRow] = field(default_factory=list)
    rejected_path: Path | None = None
    rows: list[int] = field(default_factory=list)  # the file row of each frame row (1-based)


@dataclass
class RunLog:
    """A loaded run log split by record kind. ``steps`` is sorted by (run_id, step)."""

    runs: pd.DataFrame
    steps: pd.DataFrame
    arrivals: pd.DataFrame
    rates: pd.DataFrame
    bad_rows: list[BadRow] = field(default_factory=list)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, bad_rows: list[BadRow] | None = None) -> RunLog:
        def pick(kind: str) -> pd.DataFrame:
            return df[df["record"] == kind].reset_index(drop=True)

        steps = pick("step")
        if len(steps):
            steps = steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
        return cls(
            runs=pick("run"),
            steps=steps,
            arrivals=pick("arrival"),
            rates=pick("rate"),
            bad_rows=list(bad_rows or []),
        )


def _empty_frame() -> pd.DataFrame:
    return ARROW_SCHEMA.empty_table().to_pandas()


def conform(df: pd.DataFrame, *, exact: bool = True) -> pd.DataFrame:
    """Add every missing run-log column (as nulls); with ``exact``, return exactly those columns in order."""
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    return df[list(COLUMNS)] if exact else df


def records_to_frame(records: Iterable[Any]) -> pd.DataFrame:
    """Pydantic records or plain dicts -> a frame with exactly the run-log columns."""
    rows = [r.model_dump() if hasattr(r, "model_dump") else dict(r) for r in records]
    if not rows:
        return _empty_frame()
    return conform(pd.DataFrame.from_records(rows))


_MAP_COLUMNS = tuple(f.name for f in ARROW_SCHEMA if pa.types.is_map(f.type))


def _to_table(df: pd.DataFrame) -> pa.Table:
    df = conform(df.copy())
    # nested columns: a missing value may have become float NaN when records of different kinds
    # were mixed (pandas fills absent keys with NaN); Arrow wants None there
    for f in ARROW_SCHEMA:
        if pa.types.is_list(f.type) or pa.types.is_map(f.type):
            df[f.name] = [
                None if (v is None or (isinstance(v, float) and np.isnan(v))) else v for v in df[f.name]
            ]
    # the map columns (predictions, answer_uncertainty): dict -> list of (k, v) for the Arrow map type
    for col in _MAP_COLUMNS:
        df[col] = [None if p is None else list(dict(p).items()) for p in df[col]]
    return pa.Table.from_pandas(df, schema=ARROW_SCHEMA, preserve_index=False)


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        # Arrow map columns come back as a list of (key, value) tuples
        if v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
            return {k: _jsonable(x) for k, x in v}
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if np.isnan(v) else float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if v is pd.NA or v is pd.NaT:
        return None
    return v


def _frame_to_jsonl_bytes(df: pd.DataFrame) -> bytes:
    out = bytearray()
    for rec in df.to_dict(orient="records"):
        clean = {k: _jsonable(v) for k, v in rec.items()}
        clean = {k: v for k, v in clean.items() if v is not None}
        out += orjson.dumps(clean) + b"\n"
    return bytes(out)


def write_frame(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a run-log frame to Parquet (``.parquet``) or JSONL (``.jsonl``), atomically."""
    p = Path(path)
    if p.suffix == ".jsonl":
        data = _frame_to_jsonl_bytes(df)
        _atomic_write(p, lambda tmp: Path(tmp).write_bytes(data))
    elif p.suffix == ".parquet":
        table = _to_table(df)
        _atomic_write(
            p, lambda tmp: pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        )
    else:
        raise RunLogError(f"{p}: unknown run-log format (use .parquet or .jsonl)")
    return p


def write_records(records: Iterable[Any], path: str | os.PathLike[str]) -> Path:
    return write_frame(records_to_frame(records), path)


# ----------------------------------------------------------------------------- reading


def _read_jsonl(p: Path) -> tuple[pd.DataFrame, list[BadRow], list[int]]:
    """Parse JSONL; returns frame, parse errors, and the line number of each parsed row."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    bad: list[BadRow] = []
    with open(p, "rb") as fh:
        for i, line in enumerate(fh, start=1):
            s = line.strip()
            if not s:
                continue
            try:
                obj = orjson.loads(s)
            except orjson.JSONDecodeError as e:
                bad.append(
                    BadRow(
                        str(p), i, f"invalid JSON ({e.args[0].split(':')[0]})", s.decode("utf-8", "replace")
                    )
                )
                continue
            if not isinstance(obj, dict):
                bad.append(BadRow(str(p), i, "a record must be a JSON object", obj))
                continue
            rows.append(obj)
            lines.append(i)
    if not rows:
        return _empty_frame(), bad, lines
    df = pd.DataFrame.from_records(rows)
    unknown = sorted(set(df.columns) - set(COLUMNS))
    if unknown:
        # unknown fields make the row invalid (extra="forbid"), reported per row below
        df["__unknown__"] = [",".join(k for k in unknown if k in r) for r in rows]
        df = df.drop(columns=unknown)
    return conform(df, exact=False), bad, lines


def _read_parquet(p: Path) -> pd.DataFrame:
    try:
        table = pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as e:
        raise RunLogError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    missing = [c for c in ("record", "schema_version") if c not in table.column_names]
    if missing:
        raise RunLogError(f"{p}: not a run log (missing columns {missing})")
    df = table.to_pandas()
    for col in _MAP_COLUMNS:
        if col in df:
            df[col] = [None if v is None else dict(v) for v in df[col]]
    return conform(df, exact=False)


def _isnull(s: pd.Series) -> np.ndarray:
    return s.isna().to_numpy()


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def validate_rows(df: pd.DataFrame) -> dict[int, str]:
    """Vectorised row checks mirroring the pydantic models; returns {row position: reason}."""
    reasons: dict[int, str] = {}

    def flag(mask: np.ndarray, reason: str) -> None:
        for i in np.flatnonzero(mask):
            reasons.setdefault(int(i), reason)

    n = len(df)
    if n == 0:
        return reasons
    if "__unknown__" in df:
        m = df["__unknown__"].fillna("").astype(str).to_numpy()
        flag(m != "", "unknown field(s)")
        for i in np.flatnonzero(m != ""):
            reasons[int(i)] = f"unknown field(s): {m[i]}"
    rec = df["record"].astype(object).to_numpy()
    flag(~np.isin(rec, list(RECORD_MODELS)), "unknown record kind (expected run, step, arrival or rate)")
    ver = _num(df["schema_version"])
    flag(ver.isna().to_numpy(), "missing schema_version")
    is_step = rec == "step"
    is_run = rec == "run"
    is_arr = rec == "arrival"
    is_rate = rec == "rate"

    def required(mask: np.ndarray, cols: Sequence[str]) -> None:
        for c in cols:
            flag(mask & _isnull(df[c]), f"missing required field '{c}'")

    required(is_run, ["run_id", "source"])
    required(is_step, ["run_id", "step", "prompt_tokens", "completion_tokens"])
    required(is_arr, ["source", "arrival_s"])
    required(is_rate, ["source", "start_s", "duration_s", "rate"])
    for c in (
        "step",
        "prompt_tokens",
        "cached_tokens",
        "prefix_reuse_tokens",
        "completion_tokens",
        "tool_results_n",
        "n_steps",
        "prompt_tokens_est",
        "n_tools_offered",
    ):
        v = _num(df[c])
        bad_type = (~_isnull(df[c])) & v.isna().to_numpy()
        flag(bad_type, f"'{c}' is not a number")
        flag((v < 0).fillna(False).to_numpy(), f"negative '{c}'")
    for c in ("tool_pause_s", "ttft_s", "latency_s", "rate", "cv"):
        v = _num(df[c])
        flag((~_isnull(df[c])) & v.isna().to_numpy(), f"'{c}' is not a number")
        flag((v < 0).fillna(False).to_numpy(), f"negative '{c}'")
    prop = _num(df["propensity"])
    flag((~_isnull(df["propensity"])) & prop.isna().to_numpy(), "'propensity' is not a number")
    flag(((prop < 0) | (prop > 1)).fillna(False).to_numpy(), "'propensity' must be in [0, 1]")
    proto = df["protocol"].astype(object).to_numpy()
    flag(
        ~_isnull(df["protocol"]) & ~np.isin(proto, ["chat", "responses", "messages"]),
        "protocol must be chat, responses or messages",
    )
    flag(is_rate & (_num(df["duration_s"]) <= 0).fillna(False).to_numpy(), "'duration_s' must be > 0")
    pt, ct = _num(df["prompt_tokens"]), _num(df["cached_tokens"])
    flag((ct > pt).fillna(False).to_numpy(), "cached_tokens > prompt_tokens")
    flag(
        (_num(df["prefix_reuse_tokens"]) > pt).fillna(False).to_numpy(), "prefix_reuse_tokens > prompt_tokens"
    )
    out = df["outcome"].astype(object).to_numpy()
    flag(
        is_run
        & ~np.isin(out, np.array(["success", "failure", "unknown"], dtype=object))
        & ~_isnull(df["outcome"]),
        "outcome must be success, failure or unknown",
    )
    tier = df["tier"].astype(object).to_numpy()
    flag(~_isnull(df["tier"]) & ~np.isin(tier, ["local", "frontier"]), "tier must be local or frontier")
    sa, ea = _num(df["started_at"]), _num(df["ended_at"])
    flag((ea < sa).fillna(False).to_numpy(), "ended_at is before started_at")
    rid = df["run_id"].astype(object).to_numpy()
    flag((is_run | is_step) & np.array([isinstance(x, str) and x == "" for x in rid]), "empty run_id")
    # duplicates: a (run_id, step) twice (run records are merged, see merge_runs)
    dup_step = is_step & df.duplicated(subset=["record", "run_id", "step"], keep="first").to_numpy()
    flag(dup_step, "duplicate (run_id, step)")
    return reasons


def _raw_row(df: pd.DataFrame, i: int) -> dict[str, Any]:
    rec = df.iloc[i].to_dict()
    clean = {k: _jsonable(v) for k, v in rec.items() if not k.startswith("__")}
    return {k: v for k, v in clean.items() if v is not None}


def read_records(
    path: str | os.PathLike[str], *, strict: bool = False, quarantine: bool = True
) -> ReadResult:
    """Read and validate one run-log file (``.parquet`` or ``.jsonl``).

    Raises :class:`RunLogError` for a missing/empty/unreadable file, and
    :class:`~features.schema.SchemaVersionError` for a newer schema version.
    """
    p = Path(path)
    if not p.exists():
        raise RunLogError(f"{p}: no such file")
    if p.is_dir():
        raise RunLogError(f"{p}: is a directory (pass the files in it)")
    if p.stat().st_size == 0:
        raise RunLogError(f"{p}: empty file")
    if p.suffix == ".jsonl" or p.suffixes[-2:] == [".jsonl", ".gz"]:
        df, bad, lines = _read_jsonl(p)
    elif p.suffix == ".parquet":
        df, bad, lines = _read_parquet(p), [], []
    else:
        raise RunLogError(f"{p}: unknown run-log format (use .parquet or .jsonl)")
    if len(df) == 0 and not bad:
        raise RunLogError(f"{p}: no records")
    if len(df):
        ver = _num(df["schema_version"])
        newest = ver.max()
        if pd.notna(newest) and newest > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{p}: written with run-log schema version {int(newest)}, this runroute reads up to "
                f"{SCHEMA_VERSION}; upgrade runroute"
            )
        flag_old = (ver < 1).fillna(False)
        if flag_old.any():
            raise SchemaVersionError(f"{p}: unknown run-log schema version {int(ver[flag_old].iloc[0])}")
    reasons = validate_rows(df)
    rownum = (lambda i: lines[i]) if lines else (lambda i: i + 1)
    for i, reason in sorted(reasons.items()):
        bad.append(BadRow(str(p), rownum(i), reason, _raw_row(df, i)))
    bad.sort(key=lambda b: b.row)
    if bad and strict:
        first = bad[0]
        raise RunLogError(f"{first} ({len(bad)} bad row(s) in all; strict mode)")
    good = df.drop(index=df.index[list(reasons)]) if reasons else df
    rows = [rownum(int(i)) for i in good.index]
    good = good.drop(columns=[c for c in good.columns if c.startswith("__")]).reset_index(drop=True)
    if len(good):
        good["__row"] = rows
        good = merge_runs(good)  # a run's several run records -> one (the last label wins)
        rows = [int(r) for r in good.pop("__row").tolist()]
    rejected_path = _quarantine(p, bad) if bad and quarantine else None
    # normalise types (JSONL rows come in as objects)
    for c in ("step", "prompt_tokens", "completion_tokens", "tool_results_n"):
        if c in good and len(good):
            good[c] = _num(good[c]).astype("Int64")
    if "schema_version" in good and len(good):
        good["schema_version"] = SCHEMA_VERSION
    return ReadResult(frame=good, bad_rows=bad, rejected_path=rejected_path, rows=rows)


def _quarantine(p: Path, bad: list[BadRow]) -> Path:
    rejected_path = p.with_name(p.name + ".rejected.jsonl")
    payload = b"".join(
        orjson.dumps({"file": b.path, "row": b.row, "reason": b.reason, "raw": b.raw}, default=str) + b"\n"
        for b in bad
    )
    _atomic_write(rejected_path, lambda tmp: Path(tmp).write_bytes(payload))
    return rejected_path


def _cross_file_duplicates(results: list[ReadResult], files: list[Path]) -> dict[int, list[BadRow]]:
    """Step rows whose (run_id, step) an earlier file already holds (several router processes
    each write their own file, so only a reader of all of them can see a step numbered twice).
    Returns, per file index, the bad rows; they are removed from that file's frame."""
    first: dict[tuple[Any, Any], tuple[int, int]] = {}
    out: dict[int, list[BadRow]] = {}
    for fi, res in enumerate(results):
        f = res.frame
        if not len(f) or "record" not in f:
            continue
        is_step = (f["record"] == "step").to_numpy()
        rids, steps = f["run_id"].to_numpy(), f["step"].to_numpy()
        drop = []
        for i in np.flatnonzero(is_step):
            key = (rids[i], int(steps[i]))
            seen = first.get(key)
            if seen is None:
                first[key] = (fi, int(res.rows[i]) if i < len(res.rows) else int(i) + 1)
            elif seen[0] != fi:  # within one file read_records already flagged it
                row = int(res.rows[i]) if i < len(res.rows) else int(i) + 1
                reason = f"duplicate (run_id, step) (first in {files[seen[0]]}:{seen[1]})"
                out.setdefault(fi, []).append(BadRow(str(files[fi]), row, reason, _raw_row(f, int(i))))
                drop.append(i)
        if drop:
            res.frame = f.drop(index=f.index[drop]).reset_index(drop=True)
            res.rows = [r for j, r in enumerate(res.rows) if j not in set(drop)]
    return out


def read_runlog(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    strict: bool = False,
    quarantine: bool = True,
) -> RunLog:
    """Read one or more files (or directories of ``*.parquet``/``*.jsonl``) into a :class:`RunLog`."""
    files = list_runlog_files(paths)
    results = [read_records(f, strict=strict, quarantine=False) for f in files]
    dups = _cross_file_duplicates(results, files)
    if dups and strict:
        first = next(iter(dups.values()))[0]
        raise RunLogError(f"{first} ({sum(len(v) for v in dups.values())} duplicate row(s); strict mode)")
    frames, bad = [], []
    for fi, (f, res) in enumerate(zip(files, results, strict=True)):
        rows = sorted(res.bad_rows + dups.get(fi, []), key=lambda b: b.row)
        if rows and quarantine:
            res.rejected_path = _quarantine(f, rows)
        frames.append(res.frame)
        bad.extend(rows)
    df = (
        pd.concat([f for f in frames if len(f)], ignore_index=True)
        if any(len(f) for f in frames)
        else _empty_frame()
    )
    return RunLog.from_frame(merge_runs(df) if len(frames) > 1 else df, bad)
