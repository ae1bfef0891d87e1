"""SWE-bench Pro evaluation results -> run-level records (no steps).

Input: ``eval_results__<model>.json`` files (scaleapi/SWE-bench_Pro-os ``traj/*/eval_results.json``),
each a JSON object ``{instance_id: resolved (bool)}``. ``path`` is one such file or a directory of them.

Algorithm: one Run per (model, instance): ``run_id = swebench-pro-<model>-<instance>``, source
``swebench-pro``, task_id = the instance id, model = the file name after ``eval_results__`` (e.g.
``gpt-4o-paper``, ``claude-45sonnet-10132025``), outcome success iff resolved, reward 1.0/0.0.
A value that is not a boolean is a bad row (row = its 1-based position in the file's object).
Weak/strong labels come from :func:`features.importers.pairing.pair_outcomes` on these runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.importers import check_path, load_json_file, report_bad, to_frame

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["import_swebench_pro", "model_from_filename"]

_PREFIX = "eval_results__"


def model_from_filename(p: Path) -> str:
    """``eval_results__gpt-4o-paper.json`` -> ``gpt-4o-paper``; a plain ``eval_results.json`` in a
    model folder -> the folder name."""
    stem = p.stem
    if stem.startswith(_PREFIX):
        return stem[len(_PREFIX) :]
    if stem == "eval_results":
        return p.parent.name
    return stem


def import_swebench_pro(
    path: str | Path, *, strict: bool = False, bad_rows: list[BadRow] | None = None
) -> pd.DataFrame:
    """Import one eval_results file or a directory of them (see module docstring)."""
    from features.runlog import RunLogError

    p = check_path(path, allow_dir=True)
    if p.is_dir():
        files = [check_path(x) for x in sorted(p.glob("*.json")) + sorted(p.glob("*/eval_results.json"))]
        if not files:
            raise RunLogError(f"{p}: directory holds no SWE-bench Pro eval_results*.json files")
    else:
        files = [p]
    records: list[dict[str, Any]] = []
    for f in files:
        data = load_json_file(f)
        if not isinstance(data, dict):
            raise RunLogError(f"{f}: expected a JSON object {{instance_id: resolved}}")
        model = model_from_filename(f)
        for i, (inst, resolved) in enumerate(data.items(), start=1):
            if not isinstance(resolved, bool):
                report_bad(bad_rows, strict, f, i, f"resolved value for '{inst}' is not true/false", resolved)
                continue
            records.append(
                {
                    "record": "run",
                    "run_id": f"swebench-pro-{model}-{inst}",
                    "source": "swebench-pro",
                    "task_id": inst,
                    "model": model,
                    "outcome": "success" if resolved else "failure",
                    "reward": 1.0 if resolved else 0.0,
                    "n_steps": None,
                }
            )
    if not records and not bad_rows:
        raise RunLogError(f"{p}: no instances")
    return to_frame(records)
