"""Answers by search: the fewest replicas (or the smallest KV cache) that holds an SLO, per policy.

Algorithm (:func:`find`; one :class:`Ladder` per key, i.e. per policy x the other dimension):

- **SLO** (:class:`~router.sim.slo.SLO`, :func:`~router.sim.slo.parse_slo`: targets by step class,
  ``short_p95=2s,ttft_p95@<=8k=2s,itl_p95=80ms,run_p95=10min``): a point holds it when every target's
  value — with ``seeds`` / ``n_boot`` the **upper bound** of its interval — is at most the target and
  admission rejected no run (a run whose prompt no replica's KV cache can hold is rejected at every
  count; it is reported in ``runs_rejected_kv_too_small``, not counted against the SLO).
- **Uncertainty**: with ``seed_starts`` (start times of extra arrival seeds) and ``n_boot`` every probe
  is simulated once per seed and bootstrapped over runs (:mod:`router.sim.points`); the answer is the
  fewest replicas whose upper bound holds. ``optimistic`` is the lowest probed value whose *lower*
  bound already held: answers in ``[optimistic, answer]`` are inside the model's noise, and
  :func:`indistinguishable` pairs keys whose ranges overlap.
- **Ladder search** over sorted candidate values (replica counts ``1..max``, or KV sizes), assuming
  the SLO is monotone in the value: probe the start (the capacity pre-check's suggestion,
  :mod:`router.sim.precheck`); while every probe failed, gallop up (index ``2i + 1``); while every
  probe held, gallop down (``i // 2``); then bisect between the highest failing and the lowest
  holding index. The answer is the lowest holding value whose next lower candidate was simulated
  and failed (or the first candidate); None when even the last candidate fails. ``simulations``
  counts the points simulated; a policy that served no step locally at its answer is answered with
  0 replicas (``frontier_only``); a probe that contradicts monotonicity (a hold below a failure) is
  reported in ``non_monotone``. A gallop that doubles the value without improving the short-step
  p95 by 1% has hit a floor (the steps' own service time, not queueing): the search stops there
  with no answer and reports ``floor_s`` and ``floor_metric`` (the target furthest from holding; the
  analytic floors and their causes are :func:`router.sim.slo.floors`).
- **Rounds.** Each round takes the next probe of every unfinished key and simulates them together
  through :func:`router.sim.points.run_points` (one ``map``, so keys run in parallel on Dask).
- Dimensions: ``replicas`` (per policy x KV size) and ``kv`` (per policy x replica count, over KV
  sizes); ``replicas,kv`` first finds the replicas, then the smallest KV at that count.
- **Disaggregated** (``base.disagg_prefill`` = P > 0): P prefill replicas stay fixed and the count
  searched is the total, ``P + 1 .. max_replicas`` (so the answer's decode pool is ``replicas - P``);
  each result carries ``disagg_prefill``, the same intervals and ``indistinguishable`` pairs, so an
  ITL (TPOT) target can be searched with and without disaggregation and the answers compared.
  ``disagg_variants`` (e.g. ``(0, 2, 4)``; 0 = co-located) makes each P a **variant of one search**:
  every policy x KV key is searched once per P in the same rounds, each result names its ``variant``,
  and :func:`indistinguishable` pairs co-located and disaggregated answers (all counted in total
  replicas, i.e. GPUs at TP 1) whose noise ranges overlap.

Knobs (:func:`find`): ``dimension``, ``max_replicas`` (64), ``kv_values`` (the KV ladder, GB),
``start`` (the first probe's value), ``seed_starts`` (() = one seed), ``n_boot`` (0 = no interval),
``level`` (0.9), ``map``, ``progress``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from router.policy.types import Policy
from router.sim.points import MapFn, Point, PointResult, run_points
from router.sim.simconfig import SimConfig
from router.sim.slo import SLO, parse_slo
from router.sim.workload import SimError, Workload

if TYPE_CHECKING:
    from models.predictor import Predictor
    from router.policy.admission import AdmissionConfig, AdmissionController

__all__ = ["SLO", "parse_slo", "Ladder", "find", "KV_LADDER", "indistinguishable", "variant_name"]

KV_LADDER: tuple[float, ...] = tuple(float(v) for v in range(1, 81))  # GB per replica, 1..80


@dataclass
class Ladder:
    """The search state of one key over ``values`` (module docstring)."""

    values: Sequence[float]
    start: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    fail: int = -1  # highest failing index
    ok: int | None = None  # lowest holding index
    non_monotone: list[float] = field(default_factory=list)
    seen: dict[int, bool] = field(default_factory=dict)
    floor: float | None = None  # the p95 stopped improving while the value doubled (a plateau)
    _p95: dict[int, float | None] = field(default_factory=dict)

    def next(self) -> int | None:
        if not self.probes:
            return min(max(self.start, 0), len(self.values) - 1)
        if self.ok is None:
            if self.fail >= len(self.values) - 1 or self.floor is not None:
                return None
            return min(2 * self.fail + 1, len(self.values) - 1)
        if self.ok - self.fail <= 1:
            return None
        if self.fail < 0:
            return self.ok // 2 if self.ok > 0 else None
        return (self.fail + self.ok) // 2

    def record(self, idx: int, holds: bool, card: dict[str, Any], score: float | None = None) -> None:
        """Record a probe; ``score`` (the SLO's worst value / target) watches the plateau (default: the
        short-step p95)."""
        self.probes.append(
            {
                "value": self.values[idx],
                "holds": holds,
                "short_step_latency_s_p95": card["short_step_latency_s_p95"],
                "ttft_s_p95": card["ttft_s_p95"],
                "runs_rejected": card["runs_rejected"],
            }
        )
        if score is None:
            score = card["short_step_latency_s_p95"]
        self.seen[idx] = holds
        self.fail = max((i for i, h in self.seen.items() if not h), default=-1)
        above = [i for i, h in self.seen.items() if h and i > self.fail]
        self.ok = min(above) if above else None
        self.non_monotone = sorted(self.values[i] for i, h in self.seen.items() if h and i < self.fail)
        fails = sorted((self.values[i], p) for i, p in self._p95.items() if not self.seen[i])
        self._p95[idx] = score
        if not holds and self.ok is None and fails:
            v0, p0 = fails[-1]
            v1, p1 = self.values[idx], score
            if v1 >= 2 * v0 and p0 is not None and p1 is not None and p1 >= 0.99 * p0:
                self.floor = p1

    @property
    def answer(self) -> float | None:
        return None if self.ok is None else self.values[self.ok]


def _value_index(values: Sequence[float], v: float) -> int:
    return int(np.searchsorted(np.asarray(values, dtype=float), float(v)))


def find(
    workload: Workload,
    policies: dict[str, Callable[[], Policy]],
    base: SimConfig,
    starts: np.ndarray,
    slo: SLO,
    *,
    dimension: str = "replicas",
    kv_cache_gb: Sequence[float] | None = None,
    replicas: Sequence[int] = (1,),
    max_replicas: int = 64,
    kv_values: Sequence[float] = KV_LADDER,
    start: float | None = None,
    predictor: Predictor | None = None,
    admission_factory: Callable[[], AdmissionController | AdmissionConfig] | None = None,
    map: MapFn = builtins.map,  # noqa: A002 - builtin map, a Dask client's map, a pool's map
    progress: Callable[[PointResult], None] | None = None,
    seed_starts: Sequence[np.ndarray] = (),
    n_boot: int = 0,
    level: float = 0.9,
    disagg_variants: Sequence[int] = (),
) -> dict[str, Any]:
    """The searches of the module docstring; returns one entry per key with its probes."""
    unc: dict[str, Any] = {"seed_starts": tuple(seed_starts), "n_boot": n_boot, "level": level}
    kv_cache_gb = list(kv_cache_gb) if kv_cache_gb else [base.kv_cache_gb]
    variants = sorted({int(v) for v in disagg_variants}) or [base.disagg_prefill]
    if any(v < 0 for v in variants):
        raise SimError("--disagg-prefill: prefill replica counts must be >= 0")
    if dimension == "replicas,kv":
        first = find(
            workload, policies, base, starts, slo, dimension="replicas", kv_cache_gb=[max(kv_cache_gb)],
            max_replicas=max_replicas, start=start, predictor=predictor,
            admission_factory=admission_factory, map=map, progress=progress, disagg_variants=variants, **unc,
        )  # fmt: skip
        out = first
        out["kv_at_fewest_replicas"] = []
        for e in first["results"]:
            if e["replicas"] is None or e.get("frontier_only"):
                continue
            sub = find(
                workload, {e["policy"]: policies[e["policy"]]}, replace(base, disagg_prefill=e["disagg_prefill"]),
                starts, slo, dimension="kv",
                replicas=[e["replicas"]], kv_values=[v for v in kv_values if v <= e["kv_cache_gb"]] or kv_values,
                start=e["kv_cache_gb"], predictor=predictor, admission_factory=admission_factory,
                map=map, progress=progress, **unc,
            )  # fmt: skip
            out["kv_at_fewest_replicas"].extend(sub["results"])
            out["simulations"] += sub["simulations"]
        return out
    if dimension not in ("replicas", "kv"):
        raise SimError(f"--find: expected replicas, kv or replicas,kv, got {dimension!r}")
    # disaggregated: P prefill replicas stay fixed, the count searched is the total (P + decode >= 1);
    # each P of ``disagg_variants`` (0 = co-located) is a variant of every key, searched side by side
    n_min_all = max(variants) + 1
    if dimension == "replicas" and max_replicas < n_min_all:
        raise SimError(
            f"--find replicas: --max-replicas {max_replicas} leaves no decode replica beside "
            f"{max(variants)} prefill replicas"
        )
    if dimension == "kv" and any(n < n_min_all for n in replicas):
        raise SimError(f"--find kv: every replica count must exceed the {max(variants)} prefill replicas")
    keys: list[tuple[str, float, int]] = []
    ladders: dict[tuple[str, float, int], Ladder] = {}
    for label in policies:
        for dp in variants:
            n_min = dp + 1
            if dimension == "replicas":
                vals: Sequence[float] = list(range(n_min, max_replicas + 1))
                s0 = min(max(int(start) - n_min, 0), len(vals) - 1) if start is not None else 0
                for kv in kv_cache_gb:
                    keys.append((label, float(kv), dp))
                    ladders[keys[-1]] = Ladder(vals, s0)
            else:
                vals = sorted(kv_values)
                s0 = _value_index(vals, start) if start is not None else len(vals) // 2
                for n in replicas:
                    keys.append((label, float(n), dp))
                    ladders[keys[-1]] = Ladder(vals, s0)
    sims = 0
    while True:
        todo: list[tuple[tuple[str, float, int], int]] = []
        for k in keys:
            i = ladders[k].next()
            if i is not None:
                todo.append((k, i))
        if not todo:
            break
        pts = []
        for (label, other, dp), i in todo:
            v = ladders[(label, other, dp)].values[i]
            cfg = (
                replace(base, replicas=int(v), kv_cache_gb=other, disagg_prefill=dp)
                if dimension == "replicas"
                else replace(base, replicas=int(other), kv_cache_gb=float(v), disagg_prefill=dp)
            )
            pts.append(
                Point(workload, cfg, policies[label], label, starts, predictor, admission_factory,
                      slo=slo, **unc)
            )  # fmt: skip
        for (key, i), r in zip(todo, run_points(pts, map=map, progress=progress), strict=True):
            lad = ladders[key]
            # the plateau watch reads the values (medians), not the upper bounds: a bound's noise is no floor
            mid = {**r.details, "slo": _bound(r.details, "value")} if "slo" in r.details else r.details
            lad.record(i, slo.holds(r.scorecard, r.details), r.scorecard, slo.score(r.scorecard, mid))
            pr = lad.probes[-1]
            pr["runs_rejected_kv_too_small"] = r.details["runs_rejected_kv_too_small"]
            pr["steps_local"] = r.details["steps_local"]
            worst = slo.worst(r.scorecard, r.details)
            pr["worst_target"], pr["worst_value_s"] = (worst[0].key, worst[1]) if worst else (None, None)
            if "slo" in r.details:
                pr["slo"] = {
                    k: {x: m[x] for x in ("value", "lo", "hi", "n")} for k, m in r.details["slo"].items()
                }
                pr["holds_optimistic"] = _holds_at(slo, r.scorecard, r.details, "lo")
                pr["holds_median"] = _holds_at(slo, r.scorecard, r.details, "value")
        sims += len(pts)
    results = []
    for label, other, dp in keys:
        lad = ladders[(label, other, dp)]
        best = next((p for p in lad.probes if p["value"] == lad.answer and p["holds"]), None)
        floor_probe = None
        if lad.floor is not None:
            floor_probe = max((p for p in lad.probes if not p["holds"]), key=lambda p: p["value"])
        opt = [p["value"] for p in lad.probes if p.get("holds_optimistic")]
        # a policy that served no step locally at its answer needs no replica at all (frontier only)
        frontier_only = dimension == "replicas" and best is not None and best.get("steps_local") == 0
        results.append(
            {
                "interval_at_answer": best.get("slo") if best else None,
                "optimistic": min(opt) if opt else None,
                "floor_metric": floor_probe["worst_target"] if floor_probe else None,
                "floor_value_s": floor_probe["worst_value_s"] if floor_probe else None,
                "policy": label,
                "replicas": (0 if frontier_only else int(lad.answer) if lad.answer is not None else None)
                if dimension == "replicas"
                else int(other),
                "frontier_only": frontier_only,
                "disagg_prefill": dp,
                "variant": variant_name(dp),
                "kv_cache_gb": other if dimension == "replicas" else lad.answer,
                "found": dimension,
                "short_step_latency_s_p95": best["short_step_latency_s_p95"] if best else None,
                "ttft_s_p95": best["ttft_s_p95"] if best else None,
                "simulations": len(lad.probes),
                "probes": lad.probes,
                "non_monotone": lad.non_monotone,
                "floor_s": floor_probe["worst_value_s"] if floor_probe else None,
                "searched": [lad.values[0], lad.values[-1]],
            }
        )
    return {
        "slo": slo.describe(),
        "slo_targets": slo.as_dict(),
        "dimension": dimension,
        "results": results,
        "simulations": sims,
        "seeds": 1 + len(seed_starts),
        "n_boot": n_boot,
        "interval_level": level if (n_boot or seed_starts) else None,
        "disagg_variants": variants,
        "indistinguishable": indistinguishable(results),
    }


def variant_name(disagg_prefill: int) -> str:
    """A search key's serving variant: ``co-located`` or ``disaggregated P=<prefill replicas>``."""
    return "co-located" if disagg_prefill <= 0 else f"disaggregated P={disagg_prefill}"


def _bound(det: dict[str, Any], bound: str) -> dict[str, Any]:
    """``details["slo"]`` with each target judged on ``bound`` (lo: optimistic, value: the median)."""
    return {k: {**m, "hi": m[bound]} for k, m in (det.get("slo") or {}).items()}


def _holds_at(slo: SLO, card: dict[str, Any], det: dict[str, Any], bound: str) -> bool:
    """Whether the SLO holds judged on the intervals' ``bound``."""
    return slo.holds(card, {**det, "slo": _bound(det, bound)})


def indistinguishable(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of keys (same search dimension) whose answer ranges ``[optimistic, answer]`` overlap: the
    model cannot tell which needs fewer at this seed count and interval level. Two keys with the same
    answer are a pair too (``same_answer``) when they are different serving variants (co-located vs
    disaggregated): the question was which to deploy, and the answer is that it does not matter."""
    out = []
    rs = [r for r in results if r.get("optimistic") is not None or r.get("interval_at_answer")]
    dim = "replicas"
    for i, a in enumerate(rs):
        for b in rs[i + 1 :]:
            dim = a["found"]
            va = a["replicas"] if dim == "replicas" else a["kv_cache_gb"]
            vb = b["replicas"] if dim == "replicas" else b["kv_cache_gb"]
            same = va == vb
            if (
                va is None
                or vb is None
                or (same and a.get("disagg_prefill", 0) == b.get("disagg_prefill", 0))
            ):
                continue
            lo_a = a["optimistic"] if a["optimistic"] is not None else va
            lo_b = b["optimistic"] if b["optimistic"] is not None else vb
            if max(lo_a, lo_b) <= min(va, vb):
                out.append(
                    {
                        "a": {
                            "policy": a["policy"],
                            "kv_cache_gb": a["kv_cache_gb"],
                            "replicas": a["replicas"],
                            "disagg_prefill": a.get("disagg_prefill", 0),
                        },
                        "b": {
                            "policy": b["policy"],
                            "kv_cache_gb": b["kv_cache_gb"],
                            "replicas": b["replicas"],
                            "disagg_prefill": b.get("disagg_prefill", 0),
                        },
                        "range_a": [lo_a, va],
                        "range_b": [lo_b, vb],
                        "same_answer": same,
                    }
                )
    return out
