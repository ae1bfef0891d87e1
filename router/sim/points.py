"""One what-if point as a pure function, and the point loop behind a ``map`` callable.

A :class:`Point` is everything one simulation depends on: the workload, the
:class:`~router.sim.simconfig.SimConfig` (its ``seed`` fixes every random draw), a policy factory
(a fresh policy object per point: policies may keep state), the run start times, the predictor
and an optional admission-controller factory. :func:`simulate_point` maps a point to its
:class:`PointResult` (scorecard + details) and reads nothing else, so points can run in any order
and in any process. :func:`run_points` is the one point loop: it applies ``map`` (the builtin by
default; a Dask client's ``map`` + ``gather``, a process pool's ``map``...) to
:func:`simulate_point` and reports each result to ``progress`` as it arrives. The grid
(:mod:`router.sim.grid`), the searches (:mod:`router.sim.search`) and the break-even sweep
(:mod:`router.sim.breakeven`) all go through it.

Knobs: ``map`` (how points are mapped), ``progress`` (a callback per finished point).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.policy.types import Policy
from router.sim.scorecard import details, scorecard
from router.sim.simconfig import SimConfig
from router.sim.simulator import Simulator
from router.sim.workload import Workload

__all__ = ["Point", "PointResult", "simulate_point", "run_points", "MapFn"]

MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Point:
    workload: Workload
    config: SimConfig
    policy_factory: Callable[[], Policy]
    label: str
    starts: np.ndarray
    predictor: Any = None
    admission_factory: Callable[[], Any] | None = None
    tag: str = ""  # the caller's name for this point (e.g. "always_on", a sweep cell)


@dataclass
class PointResult:
    label: str
    tag: str
    scorecard: dict[str, Any]
    details: dict[str, Any]
    steps: int
    wall_s: float
    cpu_s: float


def simulate_point(p: Point) -> PointResult:
    """Simulate one point (module docstring); a pure function of the point."""
    res = Simulator(
        p.workload,
        p.policy_factory(),
        p.config,
        p.starts,
        predictor=p.predictor,
        admission=p.admission_factory() if p.admission_factory else None,
    ).run()
    res.policy = p.label
    return PointResult(p.label, p.tag, scorecard(res), details(res), len(res.outcome), res.wall_s, res.cpu_s)


def run_points(
    points: Sequence[Point],
    *,
    map: MapFn = builtins.map,  # noqa: A002 - the name callers pass (builtin map, client.map, pool.map)
    progress: Callable[[PointResult], None] | None = None,
) -> list[PointResult]:
    """``map(simulate_point, points)`` in order, reporting each result to ``progress``."""
    out: list[PointResult] = []
    for r in map(simulate_point, points):
        if progress is not None:
            progress(r)
        out.append(r)
    return out
