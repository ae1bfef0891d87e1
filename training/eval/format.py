"""Number formatting and the shared constants of the report, the plots and the printed tables.

- :func:`isnum`: a real, finite-or-infinite, non-NaN number (bools are not numbers here);
- :func:`fnum` (``nd`` decimals), :func:`fpct` (a share as a percentage), :func:`fusd` (USD, 4
  decimals below $1, else thousands separators and 3): each prints ``-`` for a missing figure;
- :data:`BASE_ORDER`: the order of the baseline policies in every comparison; :data:`COLORS`: one
  colour per policy in every plot.

No knobs.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

__all__ = ["BASE_ORDER", "COLORS", "isnum", "fnum", "fpct", "fusd", "rows_by_policy"]

BASE_ORDER = (
    "always-local",
    "always-frontier",
    "per-step-threshold",
    "session-sticky",
    "stall-escalation",
    "learned",
    "oracle",
)
COLORS = {
    "always-local": "#1f77b4",
    "always-frontier": "#d62728",
    "per-step-threshold": "#ff7f0e",
    "session-sticky": "#17becf",
    "stall-escalation": "#9467bd",
    "learned": "#2ca02c",
    "oracle": "#7f7f7f",
}


def isnum(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v))


def fnum(v: object, nd: int = 3) -> str:
    return f"{v:.{nd}f}" if isnum(v) else "-"


def fpct(v: object, nd: int = 1) -> str:
    return f"{100 * v:.{nd}f}%" if isnum(v) else "-"


def fusd(v: object) -> str:
    if not isnum(v):
        return "-"
    return f"${v:.4f}" if abs(v) < 1 else f"${v:,.3f}"


def rows_by_policy(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in s.get("policies", [])}
