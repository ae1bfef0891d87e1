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

Uncertainty (:mod:`router.sim.slo`): a point with ``seed_starts`` is simulated once more per extra
arrival seed (config seed + k, the k-th start times); with ``n_boot`` > 0 every simulation's metrics get
``n_boot`` run-bootstrap replicates, and ``details["intervals"]`` (short-step, TTFT, step and run p95,
the cache hit rates — overall, GPU and per lower KV tier, the global CPU pool's included — by
:func:`~router.sim.slo.measure_hit_rates`, and the ``slo`` targets in ``details["slo"]``) holds the median over seeds and the pooled ``level``
interval. The scorecard is the first seed's, so a point without extra seeds reports what it did before.

Comparisons (a speed-up, a goodput gain) pair two points of the same runs replicate by replicate: a
point with ``keep_replicates`` returns every seed's value and replicates (``PointResult.replicates``)
for :func:`~router.sim.slo.paired`; ``goodput`` names (TTFT, TPOT) SLO pairs whose goodput share
(:func:`~router.sim.slo.measure_goodput`) gets an interval in ``details["goodput"]``, several SLOs from
one simulation.

Knobs: ``map`` (how points are mapped), ``progress`` (a callback per finished point); per point
``seed_starts``, ``n_boot`` (0 = no intervals), ``level`` (0.9), ``slo``, ``goodput``,
``keep_replicates``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from router.policy.types import Policy
from router.sim.scorecard import details, scorecard
from router.sim.simconfig import SimConfig
from router.sim.simulator import Simulator
from router.sim.slo import SLO, Target, measure, measure_goodput, measure_hit_rates, pool
from router.sim.workload import Workload

if TYPE_CHECKING:
    from models.predictor import Predictor
    from router.policy.admission import AdmissionConfig, AdmissionController

__all__ = ["Point", "PointResult", "simulate_point", "run_points", "MapFn"]

MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Point:
    workload: Workload
    config: SimConfig
    policy_factory: Callable[[], Policy]
    label: str
    starts: np.ndarray
    predictor: Predictor | None = None
    admission_factory: Callable[[], AdmissionController | AdmissionConfig] | None = None
    tag: str = ""  # the caller's name for this point (e.g. "always_on", a sweep cell)
    slo: SLO | None = None  # targets measured with intervals into details["slo"]
    seed_starts: tuple[np.ndarray, ...] = ()  # start times of the extra arrival seeds (seed + 1, + 2, ...)
    n_boot: int = 0  # run-bootstrap replicates per simulation (0: no intervals)
    level: float = 0.9  # the intervals' coverage
    goodput: tuple[tuple[float, float], ...] = ()  # (TTFT s, TPOT s) goodput shares into details["goodput"]
    keep_replicates: bool = False  # every seed's replicates in PointResult.replicates (paired comparisons)


@dataclass
class PointResult:
    label: str
    tag: str
    scorecard: dict[str, Any]
    details: dict[str, Any]
    steps: int
    wall_s: float
    cpu_s: float
    # per arrival seed, figure -> {"value", "raw"} (Point.keep_replicates): for router.sim.slo.paired
    replicates: list[dict[str, dict[str, Any]]] = field(default_factory=list)


# the scorecard's figures that get an interval when a point asks for them (n_boot > 0)
INTERVAL_TARGETS: dict[str, Target] = {
    "short_step_latency_s_p95": Target("short", 95.0, 1.0),
    "ttft_s_p95": Target("ttft", 95.0, 1.0),
    "step_latency_s_p95": Target("step", 95.0, 1.0),
    "run_completion_s_p95": Target("run", 95.0, 1.0),
}


def simulate_point(p: Point) -> PointResult:
    """Simulate one point (module docstring); a pure function of the point."""
    from dataclasses import replace

    card: dict[str, Any] = {}
    det: dict[str, Any] = {}
    std = SLO(targets=tuple(INTERVAL_TARGETS.values()))
    per_std: list[dict[str, dict[str, Any]]] = []
    per_slo: list[dict[str, dict[str, Any]]] = []
    per_hit: list[dict[str, dict[str, Any]]] = []
    per_good: list[dict[str, dict[str, Any]]] = []
    reps: list[dict[str, dict[str, Any]]] = []
    wall = cpu = 0.0
    steps = 0
    for k, st in enumerate((p.starts, *p.seed_starts)):
        cfg = p.config if k == 0 else replace(p.config, seed=p.config.seed + k)
        res = Simulator(
            p.workload,
            p.policy_factory(),
            cfg,
            st,
            predictor=p.predictor,
            admission=p.admission_factory() if p.admission_factory else None,
        ).run()
        res.policy = p.label
        wall += res.wall_s
        cpu += res.cpu_s
        if k == 0:
            card, det, steps = scorecard(res), details(res), len(res.outcome)
        if p.goodput:  # a share needs no interval to be measured: without one, lo = hi = the value
            per_good.append(measure_goodput(res, p.goodput, p.n_boot, boot_seed=k))
        if p.n_boot > 0 or p.seed_starts:
            keep = p.keep_replicates
            per_std.append(measure(res, std, p.n_boot, boot_seed=k, keep_raw=keep))
            per_hit.append(measure_hit_rates(res, p.n_boot, boot_seed=k))
            if p.slo is not None:
                per_slo.append(measure(res, p.slo, p.n_boot, boot_seed=k, keep_raw=keep))
            if keep:
                ms = {
                    **per_std[-1],
                    **(per_slo[-1] if p.slo is not None else {}),
                    **(per_good[-1] if p.goodput else {}),
                }
                reps.append({key: {"value": m["value"], "raw": m.get("raw")} for key, m in ms.items()})
                for m in ms.values():
                    m.pop("raw", None)  # the pooled details carry no replicates
    if per_std:
        pooled = pool(per_std, p.level)
        det["intervals"] = {name: pooled[t.key] for name, t in INTERVAL_TARGETS.items()}
        # hit rates (overall, GPU, each lower tier incl. the global CPU pool): the same seeds and draws
        if all(set(h) == set(per_hit[0]) for h in per_hit):
            det["intervals"].update(pool(per_hit, p.level))
        det["seeds"] = len(per_std)
        det["interval_level"] = p.level
    if per_slo:
        det["slo"] = pool(per_slo, p.level)
    if per_good:
        det["goodput"] = pool(per_good, p.level)
    return PointResult(p.label, p.tag, card, det, steps, wall, cpu, reps)


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
