"""``runroute bench``: every policy on given run logs with a given bundle (no training, no live part).

Algorithm of :func:`bench_runs`: read the run logs (validated; bad rows are counted in
``bad_rows``, not used), load the bundle (verified against its manifest), run
:func:`training.eval.compare.compare_policies` on the whole log as one set named after the files,
with the bundle's predictors scored on that log (``model_scores``:
:func:`training.eval.compare.model_scores`, or ``skipped`` with the reason), and return the typed
:class:`training.eval.scorecard.Scorecard` (``command: runroute bench``).

Knobs: ``prices``, ``sim`` (:class:`training.eval.config.SimSettings`), ``sweep_thresholds``
(default: 0 to 1 in steps of 0.05), ``variants`` (outcome-model variants, the first is the headline),
``map`` (each simulation through it: the builtin, or one Dask task each).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.eval.compare import Progress, compare_policies, model_scores
from training.eval.config import SimSettings
from training.eval.outcome import DEFAULT_VARIANTS, Prices
from training.eval.scorecard import PriceTable, Scorecard, Skipped, TrainingInfo

__all__ = ["bench_runs"]


def bench_runs(
    files: Sequence[Path],
    bundle_dir: Path,
    *,
    prices: Prices | None = None,
    sim: SimSettings | None = None,
    sweep_thresholds: Sequence[float] | None = None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    progress: Progress | None = None,
    map: Any = builtins.map,  # noqa: A002 - how the simulations are mapped (compare_policies)
) -> Scorecard:
    """Every policy on the run logs ``files`` with the bundle in ``bundle_dir`` (the module docstring)."""
    from features.runlog import read_runlog
    from models.bundle import ModelBundle

    log = read_runlog([str(f) for f in files])
    if len(log.steps) == 0:
        raise ValueError("the run logs hold no step records to compare policies on")
    bundle = ModelBundle.load(bundle_dir)
    pr = prices or Prices()
    sw = sweep_thresholds if sweep_thresholds is not None else [round(x, 2) for x in np.linspace(0, 1, 21)]
    t0 = time.perf_counter()
    res = compare_policies(
        log.runs,
        log.steps,
        bundle=bundle,
        prices=pr,
        sim=sim or SimSettings(),
        sweep_thresholds=sw,
        variants=variants,
        progress=progress,
        map=map,
    )
    res = res.model_copy(update={"model_scores": model_scores(bundle, log)})
    return Scorecard(
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command="runroute bench",
        prices=PriceTable(**pr.table()),
        outcome_variants=list(variants),
        training=TrainingInfo(
            bundle_dir=str(bundle_dir), bundle_version=bundle.version, thresholds=dict(bundle.thresholds)
        ),
        sets={", ".join(Path(f).name for f in files): res},
        live=Skipped(skipped="runroute bench runs the simulator only"),
        bad_rows=len(log.bad_rows),
        timings={"total_s": round(time.perf_counter() - t0, 2)},
    )
