"""Answers by search: the fewest replicas (or the smallest KV cache) that holds an SLO, per policy.

Algorithm (:func:`find`; one :class:`Ladder` per key, i.e. per policy x the other dimension):

- **SLO** (:class:`SLO`, :func:`parse_slo` of ``short_p95=2s[,ttft_p95=500ms]``): a point holds it
  when its scorecard's ``short_step_latency_s_p95`` (and ``ttft_s_p95`` when given) are at most
  the targets and admission rejected no run (a run whose prompt no replica's KV cache can hold is
  rejected at every count; it is reported in ``runs_rejected_kv_too_small``, not counted against
  the SLO); a point with no served short step does not hold it.
- **Ladder search** over sorted candidate values (replica counts ``1..max``, or KV sizes), assuming
  the SLO is monotone in the value: probe the start (the capacity pre-check's suggestion,
  :mod:`router.sim.precheck`); while every probe failed, gallop up (index ``2i + 1``); while every
  probe held, gallop down (``i // 2``); then bisect between the highest failing and the lowest
  holding index. The answer is the lowest holding value whose next lower candidate was simulated
  and failed (or the first candidate); None when even the last candidate fails. ``simulations``
  counts the points simulated; a probe that contradicts monotonicity (a hold below a failure) is
  reported in ``non_monotone``. A gallop that doubles the value without improving the short-step
  p95 by 1% has hit a floor (the steps' own service time, not queueing): the search stops there
  with no answer and reports ``floor_s``.
- **Rounds.** Each round takes the next probe of every unfinished key and simulates them together
  through :func:`router.sim.points.run_points` (one ``map``, so keys run in parallel on Dask).
- Dimensions: ``replicas`` (per policy x KV size) and ``kv`` (per policy x replica count, over KV
  sizes); ``replicas,kv`` first finds the replicas, then the smallest KV at that count.

Knobs (:func:`find`): ``dimension``, ``max_replicas`` (64), ``kv_values`` (the KV ladder, GB),
``start`` (the first probe's value), ``map``, ``progress``.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from router.policy.types import Policy
from router.sim.points import MapFn, Point, PointResult, run_points
from router.sim.simconfig import SimConfig
from router.sim.workload import SimError, Workload

__all__ = ["SLO", "parse_slo", "Ladder", "find", "KV_LADDER"]

KV_LADDER: tuple[float, ...] = tuple(float(v) for v in range(1, 81))  # GB per replica, 1..80
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


@dataclass(frozen=True)
class SLO:
    short_p95_s: float | None = None
    ttft_p95_s: float | None = None

    def holds(self, card: dict[str, Any], details: dict[str, Any] | None = None) -> bool:
        unfit = (details or {}).get("runs_rejected_kv_too_small", 0)
        if card["runs_rejected"] > unfit:  # admission rejections count; a prompt no KV holds does not
            return False
        if self.short_p95_s is not None:
            v = card["short_step_latency_s_p95"]
            if v is None or v > self.short_p95_s:
                return False
        if self.ttft_p95_s is not None:
            v = card["ttft_s_p95"]
            if v is None or v > self.ttft_p95_s:
                return False
        return True

    def describe(self) -> str:
        parts = []
        if self.short_p95_s is not None:
            parts.append(f"short-step p95 <= {self.short_p95_s:g} s")
        if self.ttft_p95_s is not None:
            parts.append(f"TTFT p95 <= {self.ttft_p95_s:g} s")
        return " and ".join(parts)


def parse_slo(text: str) -> SLO:
    """``short_p95=2s,ttft_p95=500ms`` (units s or ms; s when omitted)."""
    vals: dict[str, float] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, eq, val = part.partition("=")
        m = _DUR.match(val)
        if not eq or key not in ("short_p95", "ttft_p95") or m is None:
            raise SimError(f"--slo: expected short_p95=2s[,ttft_p95=500ms], got {part!r}")
        vals[key] = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        if vals[key] <= 0:
            raise SimError("--slo: targets must be > 0")
    if not vals:
        raise SimError("--slo: name at least one target (short_p95=..., ttft_p95=...)")
    return SLO(vals.get("short_p95"), vals.get("ttft_p95"))


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

    def record(self, idx: int, holds: bool, card: dict[str, Any]) -> None:
        self.probes.append(
            {
                "value": self.values[idx],
                "holds": holds,
                "short_step_latency_s_p95": card["short_step_latency_s_p95"],
                "ttft_s_p95": card["ttft_s_p95"],
                "runs_rejected": card["runs_rejected"],
            }
        )
        self.seen[idx] = holds
        self.fail = max((i for i, h in self.seen.items() if not h), default=-1)
        above = [i for i, h in self.seen.items() if h and i > self.fail]
        self.ok = min(above) if above else None
        self.non_monotone = sorted(self.values[i] for i, h in self.seen.items() if h and i < self.fail)
        fails = sorted((self.values[i], p) for i, p in self._p95.items() if not self.seen[i])
        self._p95[idx] = card["short_step_latency_s_p95"]
        if not holds and self.ok is None and fails:
            v0, p0 = fails[-1]
            v1, p1 = self.values[idx], card["short_step_latency_s_p95"]
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
    kv_cache_gb: Sequence[float] = (16.0,),
    replicas: Sequence[int] = (1,),
    max_replicas: int = 64,
    kv_values: Sequence[float] = KV_LADDER,
    start: float | None = None,
    predictor: Any = None,
    admission_factory: Callable[[], Any] | None = None,
    map: MapFn = builtins.map,  # noqa: A002 - builtin map, a Dask client's map, a pool's map
    progress: Callable[[PointResult], None] | None = None,
) -> dict[str, Any]:
    """The searches of the module docstring; returns one entry per key with its probes."""
    if dimension == "replicas,kv":
        first = find(
            workload, policies, base, starts, slo, dimension="replicas", kv_cache_gb=[max(kv_cache_gb)],
            max_replicas=max_replicas, start=start, predictor=predictor,
            admission_factory=admission_factory, map=map, progress=progress,
        )  # fmt: skip
        out = first
        out["kv_at_fewest_replicas"] = []
        for e in first["results"]:
            if e["replicas"] is None:
                continue
            sub = find(
                workload, {e["policy"]: policies[e["policy"]]}, base, starts, slo, dimension="kv",
                replicas=[e["replicas"]], kv_values=[v for v in kv_values if v <= e["kv_cache_gb"]] or kv_values,
                start=e["kv_cache_gb"], predictor=predictor, admission_factory=admission_factory,
                map=map, progress=progress,
            )  # fmt: skip
            out["kv_at_fewest_replicas"].extend(sub["results"])
            out["simulations"] += sub["simulations"]
        return out
    if dimension not in ("replicas", "kv"):
        raise SimError(f"--find: expected replicas, kv or replicas,kv, got {dimension!r}")
    keys: list[tuple[str, float]] = []
    ladders: dict[tuple[str, float], Ladder] = {}
    for label in policies:
        if dimension == "replicas":
            vals: Sequence[float] = list(range(1, max_replicas + 1))
            s0 = int(start) - 1 if start is not None else 0
            for kv in kv_cache_gb:
                keys.append((label, float(kv)))
                ladders[keys[-1]] = Ladder(vals, s0)
        else:
            vals = sorted(kv_values)
            s0 = _value_index(vals, start) if start is not None else len(vals) // 2
            for n in replicas:
                keys.append((label, float(n)))
                ladders[keys[-1]] = Ladder(vals, s0)
    sims = 0
    while True:
        todo: list[tuple[tuple[str, float], int]] = []
        for k in keys:
            i = ladders[k].next()
            if i is not None:
                todo.append((k, i))
        if not todo:
            break
        pts = []
        for (label, other), i in todo:
            v = ladders[(label, other)].values[i]
            cfg = (
                replace(base, replicas=int(v), kv_cache_gb=other)
                if dimension == "replicas"
                else replace(base, replicas=int(other), kv_cache_gb=float(v))
            )
            pts.append(Point(workload, cfg, policies[label], label, starts, predictor, admission_factory))
        for (key, i), r in zip(todo, run_points(pts, map=map, progress=progress), strict=True):
            ladders[key].record(i, slo.holds(r.scorecard, r.details), r.scorecard)
            ladders[key].probes[-1]["runs_rejected_kv_too_small"] = r.details["runs_rejected_kv_too_small"]
        sims += len(pts)
    results = []
    for label, other in keys:
        lad = ladders[(label, other)]
        best = next((p for p in lad.probes if p["value"] == lad.answer and p["holds"]), None)
        results.append(
            {
                "policy": label,
                "replicas": (int(lad.answer) if lad.answer is not None else None)
                if dimension == "replicas"
                else int(other),
                "kv_cache_gb": other if dimension == "replicas" else lad.answer,
                "found": dimension,
                "short_step_latency_s_p95": best["short_step_latency_s_p95"] if best else None,
                "ttft_s_p95": best["ttft_s_p95"] if best else None,
                "simulations": len(lad.probes),
                "probes": lad.probes,
                "non_monotone": lad.non_monotone,
                "floor_s": lad.floor,
                "searched": [lad.values[0], lad.values[-1]],
            }
        )
    return {
        "slo": slo.describe(),
        "slo_targets": {"short_p95_s": slo.short_p95_s, "ttft_p95_s": slo.ttft_p95_s},
        "dimension": dimension,
        "results": results,
        "simulations": sims,
    }
