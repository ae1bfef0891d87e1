"""Azure LLM inference trace 2023 (CSV) -> arrival records.

Input: ``AzureLLMInferenceTrace_{code,conv}.csv`` with columns ``TIMESTAMP`` (wall clock, e.g.
``2023-11-16 18:17:03.9799600``), ``ContextTokens``, ``GeneratedTokens``. ``path`` is one file or a
directory holding them.

Algorithm: parse timestamps (vectorised), ``arrival_s`` = seconds since the file's first request,
``prompt_tokens`` = ContextTokens, ``completion_tokens`` = GeneratedTokens; source
``azure-<kind>`` with kind = the part of the file name after the last ``_`` (``code``/``conv``).
A row with an unparsable time or a missing/negative/non-integer token count is a bad row (row = CSV
line number, header = line 1). Rows are kept in file order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.importers import check_path, report_bad

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["import_azure"]

_COLS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _import_file(p: Path, strict: bool, bad_rows: list[BadRow] | None) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    from features.runlog import RunLogError
    from features.schema import SCHEMA_VERSION

    try:
        raw = pd.read_csv(p, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise RunLogError(f"{p}: not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in _COLS if c not in raw.columns]
    if missing:
        raise RunLogError(f"{p}: not an Azure LLM trace (missing columns {missing})")
    ts = pd.to_datetime(raw["TIMESTAMP"].str.strip(), errors="coerce", format="mixed")
    ctx = pd.to_numeric(raw["ContextTokens"], errors="coerce")
    gen = pd.to_numeric(raw["GeneratedTokens"], errors="coerce")
    reasons = pd.Series("", index=raw.index, dtype=object)
    for name, v in (("GeneratedTokens", gen), ("ContextTokens", ctx)):
        reasons[(v < 0).fillna(False)] = f"negative '{name}'"
        reasons[v.isna() | (v.notna() & (v != np.floor(v)))] = f"'{name}' is not an integer"
    reasons[ts.isna()] = "unparsable TIMESTAMP"
    bad = reasons != ""
    for i in np.flatnonzero(bad.to_numpy()):
        report_bad(bad_rows, strict, p, int(i) + 2, str(reasons.iloc[i]), raw.iloc[i].to_dict())
    good = ~bad
    t = ts[good]
    kind = p.stem.rsplit("_", 1)[-1].lower()
    if t.empty:
        return pd.DataFrame()
    t0 = t.min()
    return pd.DataFrame(
        {
            "schema_version": SCHEMA_VERSION,
            "record": "arrival",
            "source": f"azure-{kind}",
            "arrival_s": ((t - t0).dt.total_seconds()).to_numpy(dtype=float),
            "prompt_tokens": ctx[good].astype("int64").to_numpy(),
            "completion_tokens": gen[good].astype("int64").to_numpy(),
        }
    )


def import_azure(
    path: str | Path, *, strict: bool = False, bad_rows: list[BadRow] | None = None
) -> pd.DataFrame:
    """Import one Azure trace CSV or a directory of ``*.csv`` traces (see module docstring)."""
    import pandas as pd

    from features.runlog import RunLogError, conform

    p = check_path(path, allow_dir=True)
    files = sorted(p.glob("*.csv")) if p.is_dir() else [p]
    if not files:
        raise RunLogError(f"{p}: directory holds no .csv traces")
    frames: list[Any] = []
    for f in files:
        if f.stat().st_size == 0:
            raise RunLogError(f"{f}: empty file")
        frames.append(_import_file(f, strict, bad_rows))
    frames = [f for f in frames if len(f)]
    if not frames:
        if bad_rows:
            from features.runlog import records_to_frame

            return records_to_frame([])
        raise RunLogError(f"{p}: no requests")
    df = pd.concat(frames, ignore_index=True)
    return conform(df)
