"""Where prefill/decode disaggregation beats chunked-prefill co-location on one node: a sweep.

Algorithm (:func:`sweep`):

1. **Cells** = context length x burstiness (x link bandwidth for disaggregation). Each (context,
   burstiness) cell gets a synthetic workload (:func:`synthetic`): ``requests`` single-step runs,
   prompts uniform in +-25% of the context length, outputs uniform in ``output_tokens``, no prefix
   reuse (DistServe's setting); run starts from a gamma renewal process with the given
   coefficient of variation (1 = Poisson; larger = burstier) at a rate that offers ``load`` times
   the co-located node's capacity (the pre-check's cost model, :mod:`router.sim.precheck`).
2. **Configurations** on ``gpus`` GPUs (one replica each): co-located (``disagg_prefill = 0``, the
   baseline) and every split P prefill : gpus - P decode (``splits``) at every link bandwidth.
3. **Scorecard.** Each point is a normal what-if point (:func:`router.sim.points.run_points`, the
   ``always-local`` policy: least-loaded local placement) with ``slo_ttft_s`` = ``ttft_slo_x`` x
   the context's prefill time alone on an idle replica and each ``slo_tpot_s``; the winner of a cell is
   the configuration with the higher goodput share (steps within both SLOs), ties to co-location;
   the best split is reported with its TTFT / TPOT p95 and the scorecard's step p95.
4. :func:`trace_cells` runs the same comparison on a logged workload (e.g. the Mooncake trace).

Knobs (:class:`SweepConfig`): ``gpus`` (4), ``contexts`` (2k, 8k, 32k tokens), ``burstiness``
(CV 1, 4), ``link_gbps`` (1, 10, 100 GB/s: roughly 10 GbE, 100 Gb/s RDMA, an NVLink-class link),
``splits`` (None = 1..gpus-1), ``requests`` (400), ``output_tokens`` (100-500), ``load`` (0.6),
``ttft_slo_x`` (3), ``tpot_slo_s`` (0.1 and 0.03 s: loose and tight streaming; each a row), ``seed``. :func:`plot_breakeven` draws the table.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from router.policy.config import build_policy
from router.sim.points import MapFn, Point, PointResult, run_points
from router.sim.precheck import capacity_check
from router.sim.simconfig import SimConfig
from router.sim.workload import RunSpec, StepSpec, Workload

__all__ = ["SweepConfig", "synthetic", "bursty_starts", "sweep", "trace_cells", "plot_breakeven"]


@dataclass(frozen=True)
class SweepConfig:
    gpus: int = 4
    contexts: tuple[int, ...] = (2048, 8192, 32768)
    burstiness: tuple[float, ...] = (1.0, 4.0)
    link_gbps: tuple[float, ...] = (1.0, 10.0, 100.0)
    splits: tuple[int, ...] | None = None
    requests: int = 400
    output_tokens: tuple[int, int] = (100, 500)
    load: float = 0.6
    ttft_slo_x: float = 3.0
    tpot_slo_s: tuple[float, ...] = (0.1, 0.03)
    seed: int = 0


def synthetic(context: int, n: int, out: tuple[int, int], seed: int, block_tokens: int = 512) -> Workload:
    """``n`` single-step runs, prompts ~U(0.75, 1.25) x ``context``, outputs ~U(out), no reuse."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(int(context * 0.75), int(context * 1.25) + 1, size=n)
    outs = rng.integers(out[0], out[1] + 1, size=n)
    runs = []
    fresh = -1
    for i, (p, c) in enumerate(zip(prompts.tolist(), outs.tolist(), strict=True)):
        nb = (p + c) // block_tokens
        chain = tuple(range(fresh, fresh - nb, -1))
        fresh -= nb
        runs.append(RunSpec(f"s{i}", [StepSpec(p, c, 0.0, chain, min(p // block_tokens, nb), nb, 0)], 0.0))
    return Workload(runs, block_tokens)


def bursty_starts(n: int, rate: float, cv: float, seed: int) -> np.ndarray:
    """Gamma renewal process: mean gap 1/rate, coefficient of variation ``cv``; first start at 0."""
    rng = np.random.default_rng(seed + 1)
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    t = np.cumsum(gaps)
    return t - t[0]


def _row(r: PointResult) -> dict[str, Any]:
    c, d = r.scorecard, r.details
    return {
        "goodput_share": d.get("goodput_share"),
        "ttft_s_p95": c["ttft_s_p95"],
        "tpot_s_p95": d.get("tpot_s_p95"),
        "step_latency_s_p95": c["step_latency_s_p95"],
        "short_step_latency_s_p95": c["short_step_latency_s_p95"],
        "slo_attainment": c["slo_attainment"],
    }


def _cells(
    work: Workload,
    starts: np.ndarray,
    base: SimConfig,
    gpus: int,
    splits: Sequence[int],
    bandwidths: Sequence[float],
    tag: str,
) -> list[Point]:
    pol = _policy
    pts = [Point(work, replace(base, replicas=gpus, disagg_prefill=0), pol, "co-located", starts, tag=tag)]
    for bw in bandwidths:
        for p in splits:
            cfg = replace(base, replicas=gpus, disagg_prefill=p, kv_link_gbps=bw)
            pts.append(Point(work, cfg, pol, f"disagg {p}:{gpus - p} @{bw:g}GB/s", starts, tag=tag))
    return pts


def _policy() -> Any:
    return build_policy("always-local")


def _table(
    points: list[Point], results: list[PointResult], keys: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    by_tag: dict[str, list[tuple[Point, PointResult]]] = {}
    for p, r in zip(points, results, strict=True):
        by_tag.setdefault(p.tag, []).append((p, r))
    rows = []
    for tag, prs in by_tag.items():
        co = next(r for p, r in prs if not p.config.disagg_prefill)
        bws = sorted({p.config.kv_link_gbps for p, _ in prs if p.config.disagg_prefill})
        for bw in bws:
            cand = [(p, r) for p, r in prs if p.config.disagg_prefill and p.config.kv_link_gbps == bw]
            bp, br = max(
                cand, key=lambda x: (x[1].details.get("goodput_share") or 0.0, -x[0].config.disagg_prefill)
            )
            g_co = co.details.get("goodput_share") or 0.0
            g_d = br.details.get("goodput_share") or 0.0
            rows.append(
                {
                    **keys[tag],
                    "link_gbps": bw,
                    "colocated": _row(co),
                    "disagg_best": {
                        "prefill_replicas": bp.config.disagg_prefill,
                        "decode_replicas": bp.config.replicas - bp.config.disagg_prefill,
                        **_row(br),
                        "kv_transfer_s_mean": round(
                            br.details["disagg"]["kv_transfer_s"]
                            / max(br.details["disagg"]["kv_transfers"], 1),
                            6,
                        ),
                    },
                    "winner": "disaggregated" if g_d > g_co else "co-located",
                    "goodput_gain": round(g_d - g_co, 6),
                }
            )
    return rows


def sweep(
    base: SimConfig,
    sc: SweepConfig = SweepConfig(),
    *,
    map: MapFn = builtins.map,  # noqa: A002 - builtin map, a Dask client's map, a pool's map
    progress: Callable[[PointResult], None] | None = None,
) -> dict[str, Any]:
    """The synthetic sweep of the module docstring; rows per (context, burstiness, link)."""
    splits = sc.splits or tuple(range(1, sc.gpus))
    points: list[Point] = []
    keys: dict[str, dict[str, Any]] = {}
    for L in sc.contexts:
        work = synthetic(L, sc.requests, sc.output_tokens, sc.seed, base.block_tokens)
        unit = capacity_check(work, np.zeros(len(work.runs)), replace(base, replicas=1))
        # capacity_check over a zero horizon (1 s): load_factor_1_replica = GPU-seconds of all requests
        rate = sc.load * sc.gpus * len(work.runs) / unit["load_factor_1_replica"]
        alone = capacity_check(synthetic(L, 1, (2, 2), sc.seed, base.block_tokens), np.zeros(1), base)
        ttft_slo = sc.ttft_slo_x * float(alone["short_step_alone_s_p95"] or 1.0)
        for cv in sc.burstiness:
            starts = bursty_starts(len(work.runs), rate, cv, sc.seed)
            for tpot in sc.tpot_slo_s:
                tag = f"L{L}-cv{cv:g}-tpot{tpot:g}"
                keys[tag] = {
                    "context_tokens": L,
                    "burstiness_cv": cv,
                    "requests_per_s": round(rate, 4),
                    "slo_ttft_s": round(ttft_slo, 4),
                    "slo_tpot_s": tpot,
                }
                cfg = replace(base, slo_ttft_s=ttft_slo, slo_tpot_s=tpot)
                points += _cells(work, starts, cfg, sc.gpus, splits, sc.link_gbps, tag)
    results = run_points(points, map=map, progress=progress)
    return {
        "sweep": {k: v for k, v in vars(sc).items()},
        "node_profile": base.profile.name,
        "kv_dtype": base.kv_dtype,
        "simulations": len(points),
        "rows": _table(points, results, keys),
    }


def trace_cells(
    work: Workload,
    starts: np.ndarray,
    base: SimConfig,
    gpus: int,
    splits: Sequence[int],
    bandwidths: Sequence[float],
    label: str,
    *,
    map: MapFn = builtins.map,  # noqa: A002
    progress: Callable[[PointResult], None] | None = None,
) -> dict[str, Any]:
    """Co-location vs the splits on a logged workload (one row per link bandwidth)."""
    pts = _cells(work, starts, base, gpus, splits, bandwidths, label)
    res = run_points(pts, map=map, progress=progress)
    return {"simulations": len(pts), "rows": _table(pts, res, {label: {"workload": label, "gpus": gpus}})}


def plot_breakeven(result: dict[str, Any], path: str | os.PathLike[str], title: str | None = None) -> Path:
    """One panel per link bandwidth: goodput gain of the best split over co-location per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    bws = sorted({r["link_gbps"] for r in rows})
    tpots = sorted({r.get("slo_tpot_s") for r in rows}, key=lambda x: -(x or 0))
    ctxs = sorted({r["context_tokens"] for r in rows})
    cvs = sorted({r["burstiness_cv"] for r in rows})
    fig, axes = plt.subplots(
        len(tpots), len(bws), figsize=(4.6 * len(bws), 3.8 * len(tpots)), squeeze=False, layout="constrained"
    )
    im: Any = None
    for ti, tp in enumerate(tpots):
        for ax, bw in zip(axes[ti], bws, strict=True):
            cell = [r for r in rows if r["link_gbps"] == bw and r.get("slo_tpot_s") == tp]
            grid = np.full((len(cvs), len(ctxs)), np.nan)
            for r in cell:
                grid[cvs.index(r["burstiness_cv"]), ctxs.index(r["context_tokens"])] = 100 * r["goodput_gain"]
            im = ax.imshow(grid, cmap="RdBu", vmin=-100, vmax=100, origin="lower", aspect="auto")
            for r in cell:
                i, j = cvs.index(r["burstiness_cv"]), ctxs.index(r["context_tokens"])
                d = r["disagg_best"]
                ax.text(j, i, f"{100 * r['goodput_gain']:+.0f} pp\n{d['prefill_replicas']}:{d['decode_replicas']}",
                        ha="center", va="center", fontsize=8)  # fmt: skip
            ax.set_xticks(range(len(ctxs)), [f"{c // 1024}k" for c in ctxs])
            ax.set_yticks(range(len(cvs)), [f"CV {c:g}" for c in cvs])
            if ti == len(tpots) - 1:
                ax.set_xlabel("context length (prompt tokens)")
            if bw == bws[0]:
                ax.set_ylabel("arrival burstiness (CV)")
            ax.set_title(f"link {bw:g} GB/s, TPOT SLO {tp:g} s", fontsize=10)
    fig.colorbar(
        im, ax=axes.ravel().tolist(), label="goodput share: best disaggregated split - co-located (pp)"
    )
    fig.suptitle(title or "Disaggregation break-even (blue: disaggregation wins; label: gain, P:D split)")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
