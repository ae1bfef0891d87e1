"""What-if capacity forecasts: the public face of the simulator (workload, simulation, scorecard, grid).

The pieces live in :mod:`router.sim.workload` (logged runs -> :class:`Workload`),
:mod:`router.sim.simconfig` (:class:`SimConfig`), :mod:`router.sim.simulator` (:class:`Simulator`:
the closed-loop replay through the router's own step engine), :mod:`router.sim.scorecard`
(:class:`SimResult`, :func:`scorecard`, :func:`details`) and :mod:`router.sim.grid` (:func:`run_grid`,
:func:`answers`); this module re-exports them so ``from router.sim.whatif import ...`` keeps working.
"""

from __future__ import annotations

from router.sim.grid import GridPoint, answers, run_grid
from router.sim.scorecard import (
    REJECTED,
    SCORECARD_KEYS,
    SERVED_FRONTIER,
    SERVED_LOCAL,
    SPILLED,
    SimResult,
    details,
    scorecard,
)
from router.sim.simconfig import SimConfig
from router.sim.simulator import Simulator
from router.sim.workload import SHORT_STEP_TOKENS, RunSpec, SimError, StepSpec, Workload

__all__ = [
    "SimError",
    "StepSpec",
    "RunSpec",
    "Workload",
    "SimConfig",
    "SimResult",
    "Simulator",
    "scorecard",
    "details",
    "SCORECARD_KEYS",
    "SHORT_STEP_TOKENS",
    "GridPoint",
    "run_grid",
    "answers",
    "SERVED_LOCAL",
    "SERVED_FRONTIER",
    "SPILLED",
    "REJECTED",
]
