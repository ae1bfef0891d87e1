"""ServeGen per-client rate traces (CSV, no header) -> rate-window records.

Input (alibaba/ServeGen ``data/language/<model>/chunk-<client>-trace.csv``): one row per 10-minute
window, columns ``start_s, rate (req/s), cv, distribution name, param1, param2`` (the fitted
inter-arrival distribution, empty when the rate is 0). ``path`` is one file, a model directory of
them (e.g. ``m-large``) or a directory of model directories (``language``).

Algorithm: read each file (vectorised), one :class:`features.schema.RateWindow` per row:
``client`` = ``<model dir>/<chunk number>`` from the path, ``start_s``, ``duration_s`` =
``window_s`` (600, ServeGen's window), ``rate``, ``cv``; source ``servegen-<model dir>``. The
distribution and its parameters are not part of the run-log schema and are not kept. A row with a
non-numeric or negative start/rate/cv is a bad row (row = CSV line number).

Knobs: ``window_s`` (600), ``max_clients`` / ``max_windows`` to cut samples (None = all).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.importers import check_path, report_bad

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["import_servegen"]

_CHUNK = re.compile(r"chunk-(\d+)-trace$")


def _files(p: Path) -> list[Path]:
    def key(f: Path) -> tuple[str, int, str]:
        m = _CHUNK.search(f.stem)
        return (f.parent.name, int(m.group(1)) if m else -1, f.name)

    if p.is_dir():
        files = list(p.glob("*-trace.csv")) or list(p.glob("*/*-trace.csv"))
        return sorted(files, key=key)
    return [p]


def _import_file(
    p: Path, strict: bool, bad_rows: list[BadRow] | None, window_s: float, max_windows: int | None
) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    from features.runlog import RunLogError
    from features.schema import SCHEMA_VERSION

    if p.stat().st_size == 0:
        raise RunLogError(f"{p}: empty file")
    try:
        raw = pd.read_csv(p, header=None, dtype=str, keep_default_na=False, nrows=max_windows)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise RunLogError(f"{p}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if raw.shape[1] < 3:
        raise RunLogError(f"{p}: not a ServeGen trace (expected start_s, rate, cv, ... columns)")
    start = pd.to_numeric(raw[0], errors="coerce")
    rate = pd.to_numeric(raw[1], errors="coerce")
    cv = pd.to_numeric(raw[2].replace("", np.nan), errors="coerce")
    reasons = pd.Series("", index=raw.index, dtype=object)
    reasons[(cv < 0).fillna(False)] = "negative cv"
    reasons[(raw[2] != "") & cv.isna()] = "cv is not a number"
    reasons[(rate < 0).fillna(False)] = "negative rate"
    reasons[rate.isna()] = "rate is not a number"
    reasons[start.isna()] = "start_s is not a number"
    bad = reasons != ""
    for i in np.flatnonzero(bad.to_numpy()):
        report_bad(bad_rows, strict, p, int(i) + 1, str(reasons.iloc[i]), raw.iloc[i].tolist())
    good = ~bad
    m = _CHUNK.search(p.stem)
    client = f"{p.parent.name}/{m.group(1) if m else p.stem}"
    return pd.DataFrame(
        {
            "schema_version": SCHEMA_VERSION,
            "record": "rate",
            "source": f"servegen-{p.parent.name}",
            "client": client,
            "start_s": start[good].to_numpy(dtype=float),
            "duration_s": float(window_s),
            "rate": rate[good].to_numpy(dtype=float),
            "cv": cv[good].to_numpy(dtype=float),
        }
    )


def import_servegen(
    path: str | Path,
    *,
    strict: bool = False,
    bad_rows: list[BadRow] | None = None,
    window_s: float = 600.0,
    max_clients: int | None = None,
    max_windows: int | None = None,
) -> pd.DataFrame:
    """Import ServeGen trace CSVs (see module docstring)."""
    import pandas as pd

    from features.runlog import RunLogError, conform, records_to_frame

    p = check_path(path, allow_dir=True)
    files = _files(p)
    if not files:
        raise RunLogError(f"{p}: directory holds no ServeGen chunk-*-trace.csv files")
    if max_clients is not None:
        files = files[:max_clients]
    frames: list[Any] = [_import_file(f, strict, bad_rows, window_s, max_windows) for f in files]
    frames = [f for f in frames if len(f)]
    if not frames:
        if bad_rows:
            return records_to_frame([])
        raise RunLogError(f"{p}: no windows")
    df = pd.concat(frames, ignore_index=True)
    return conform(df)
