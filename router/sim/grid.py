"""A what-if grid: every (policy x replicas x KV size) point on the same arrivals, and its answers.

:func:`run_grid` simulates each point (a fresh policy object and a fresh admission controller per
point, since both may keep state) and adds the built-in answers (:func:`answers`): the fewest
replicas holding the p95 short-step SLO, scale-to-zero vs always-on cost (with
``compare_always_on``), and what doubling the KV cache does to the hit rate. The points run through
:func:`router.sim.points.run_points` (one ``map`` over pure point functions). A grid only answers
within its own points; :mod:`router.sim.search` bisects for the answer instead.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from router.policy.types import Policy
from router.sim.points import MapFn, Point, PointResult, run_points
from router.sim.simconfig import SimConfig
from router.sim.slo import SLO
from router.sim.workload import Workload

if TYPE_CHECKING:
    from models.predictor import Predictor
    from router.policy.admission import AdmissionConfig, AdmissionController

__all__ = ["GridPoint", "run_grid", "answers"]


@dataclass
class GridPoint:
    scorecard: dict[str, Any]
    details: dict[str, Any]


def run_grid(
    workload: Workload,
    policies: dict[str, Callable[[], Policy]],
    replicas: Sequence[int],
    kv_cache_gb: Sequence[float],
    base: SimConfig,
    starts: np.ndarray,
    *,
    predictor: Predictor | None = None,
    admission_factory: Callable[[], AdmissionController | AdmissionConfig] | None = None,
    compare_always_on: bool = False,
    progress: Callable[[str], None] | None = None,
    map: MapFn = builtins.map,  # noqa: A002 - builtin map, a Dask client's map, a pool's map
    seed_starts: Sequence[np.ndarray] = (),
    n_boot: int = 0,
    level: float = 0.9,
    slo: SLO | None = None,
) -> dict[str, Any]:
    """Every (policy x replicas x KV) point on the same ``starts``; returns scorecards, details, answers.

    ``policies`` maps a label to a factory (a fresh policy object per point); ``admission_factory``
    likewise makes a fresh admission hook per simulation (controllers keep hysteresis state). With
    ``base.scale_to_zero`` and ``compare_always_on`` each point also runs always-on (``always_on``).
    Points run through :func:`router.sim.points.run_points` with ``map``. ``seed_starts`` / ``n_boot`` /
    ``level`` / ``slo``: intervals per point (:mod:`router.sim.points`, ``details["intervals"]``).
    """
    unc: dict[str, Any] = {"seed_starts": tuple(seed_starts), "n_boot": n_boot, "level": level, "slo": slo}
    points: list[Point] = []
    for label, factory in policies.items():
        for n in replicas:
            for kv in kv_cache_gb:
                cfg = replace(base, replicas=int(n), kv_cache_gb=float(kv))
                points.append(
                    Point(workload, cfg, factory, label, starts, predictor, admission_factory, **unc)
                )
                if compare_always_on and base.scale_to_zero:
                    cfg2 = replace(cfg, scale_to_zero=False)
                    points.append(
                        Point(
                            workload, cfg2, factory, label, starts, predictor, admission_factory, "always_on"
                        )
                    )

    def tick(r: PointResult) -> None:
        if progress and not r.tag:
            c = r.scorecard
            progress(
                f"{r.label} replicas={c['replicas']} kv={c['kv_cache_gb']}GB: {r.steps} steps in {r.wall_s:.2f}s"
            )

    cards: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    always_on: list[dict[str, Any]] = []
    for r in run_points(points, map=map, progress=tick):
        if r.tag == "always_on":
            keep = ("gpu_hours", "local_cost_usd", "scale_to_zero")
            always_on.append({**r.scorecard, **{k: v for k, v in r.details.items() if k in keep}})
        else:
            cards.append(r.scorecard)
            dets.append(r.details)
    out: dict[str, Any] = {"scorecards": cards, "details": dets}
    if always_on:
        out["always_on"] = always_on
    out["answers"] = answers(cards, dets, always_on, base.slo_short_s)
    return out


def answers(
    cards: list[dict[str, Any]],
    dets: list[dict[str, Any]],
    always_on: list[dict[str, Any]],
    slo_short_s: float,
) -> dict[str, Any]:
    """The built-in questions, answered from the grid's scorecards."""
    fewest: dict[str, dict[str, Any]] = {}
    for c in cards:
        key = f"{c['policy']}@{c['kv_cache_gb']:g}GB"
        p95 = c["short_step_latency_s_p95"]
        ent = fewest.setdefault(
            key,
            {
                "policy": c["policy"],
                "kv_cache_gb": c["kv_cache_gb"],
                "replicas": None,
                "short_step_latency_s_p95": None,
            },
        )
        if (
            p95 is not None
            and p95 <= slo_short_s
            and (ent["replicas"] is None or c["replicas"] < ent["replicas"])
        ):
            ent["replicas"], ent["short_step_latency_s_p95"] = c["replicas"], p95
    kv_pairs = []
    by = {(c["policy"], c["replicas"], c["kv_cache_gb"]): c for c in cards}
    for (pol, n, kv), c in sorted(by.items(), key=lambda x: (x[0][0], x[0][1], x[0][2])):
        d = by.get((pol, n, kv * 2))
        if d is not None and c["cache_hit_rate"] is not None and d["cache_hit_rate"] is not None:
            kv_pairs.append(
                {
                    "policy": pol,
                    "replicas": n,
                    "kv_cache_gb": kv,
                    "cache_hit_rate": c["cache_hit_rate"],
                    "kv_cache_gb_doubled": kv * 2,
                    "cache_hit_rate_doubled": d["cache_hit_rate"],
                    "short_step_latency_s_p95": c["short_step_latency_s_p95"],
                    "short_step_latency_s_p95_doubled": d["short_step_latency_s_p95"],
                    "cache_hit_upper_bound": c["cache_hit_upper_bound"],
                }
            )
    out: dict[str, Any] = {
        "slo_short_step_s": slo_short_s,
        "fewest_replicas_for_short_step_slo": list(fewest.values()),
        "kv_doubling": kv_pairs,
    }
    if always_on:
        s2z = []
        ao = {(c["policy"], c["replicas"], c["kv_cache_gb"]): c for c in always_on}
        for c, d in zip(cards, dets, strict=True):
            a = ao.get((c["policy"], c["replicas"], c["kv_cache_gb"]))
            if a is None:
                continue
            s2z.append(
                {
                    "policy": c["policy"],
                    "replicas": c["replicas"],
                    "kv_cache_gb": c["kv_cache_gb"],
                    "cost_usd_scale_to_zero": c["cost_usd"],
                    "cost_usd_always_on": a["cost_usd"],
                    "gpu_hours_scale_to_zero": d["gpu_hours"],
                    "gpu_hours_always_on": a["gpu_hours"],
                    "cold_starts": d["cold_starts"],
                    "cold_start_cost_usd": d["cold_start_cost_usd"],
                    "short_step_latency_s_p95_scale_to_zero": c["short_step_latency_s_p95"],
                    "short_step_latency_s_p95_always_on": a["short_step_latency_s_p95"],
                    "slo_attainment_scale_to_zero": c["slo_attainment"],
                    "slo_attainment_always_on": a["slo_attainment"],
                }
            )
        out["scale_to_zero_vs_always_on"] = s2z
    return out
