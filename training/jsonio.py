"""JSON output helpers shared by the training job, MLflow logging and the evaluation report.

- :func:`jsonable`: a deep copy of a report made of plain JSON types: dict keys become strings,
  tuples and numpy arrays become lists, numpy scalars become Python numbers / bools, ``Path`` becomes
  its string, and NaN / +-inf become ``None`` (JSON has no NaN; a missing figure is null).
- :func:`atomic_write`: write bytes to a temporary file in the target directory, then
  ``os.replace`` it onto the target, so a reader never sees a half-written file (and a failed write
  leaves the old file in place).

No knobs.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["jsonable", "atomic_write"]


def jsonable(o: object) -> Any:
    """``o`` with every value a JSON type (see the module docstring)."""
    if isinstance(o, dict):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return [jsonable(v) for v in o.tolist()]
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (np.floating, float)):
        f = float(o)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(o, Path):
        return str(o)
    return o


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + ``os.replace``); creates the parent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
