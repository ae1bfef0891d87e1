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
   the context's prefill time alone on an idle replica, simulated once per arrival seed (``seeds``:
   the gamma process at seed, seed + 1, ...) and scored at every ``slo_tpot_s`` (an SLO does not
   change what the node does, so the TPOT rows share the simulations). Every figure carries an
   interval (:mod:`router.sim.slo`: ``n_boot`` run-bootstrap replicates per seed, pooled at
   ``level``; the value is the median over seeds): the goodput share (steps within both SLOs,
   :func:`~router.sim.slo.measure_goodput`), TTFT / TPOT / step p95. The best split of a cell is the
   one with the highest goodput; its **gain** over co-location is paired replicate by replicate (the
   same runs, start times and draws: :func:`~router.sim.slo.paired`). The **winner** is the
   configuration with the higher goodput when the gain's interval excludes 0, else
   ``indistinguishable``. ``intervals_overlap`` records the unpaired rule the search answers use
   (the two goodput intervals overlap): it ignores that both configurations served the same runs at
   the same arrivals, so it calls more cells indistinguishable.
4. :func:`trace_cells` runs the same comparison on a logged workload (e.g. the Mooncake trace: its
   start times are fixed, so one seed and the run bootstrap).

Knobs (:class:`SweepConfig`): ``gpus`` (4), ``contexts`` (2k, 8k, 32k tokens), ``burstiness``
(CV 1, 4), ``link_gbps`` (1, 10, 100 GB/s: roughly 10 GbE, 100 Gb/s RDMA, an NVLink-class link),
``splits`` (None = 1..gpus-1), ``requests`` (400), ``output_tokens`` (100-500), ``load`` (0.6),
``ttft_slo_x`` (3), ``tpot_slo_s`` (0.1 and 0.03 s: loose and tight streaming; each a row), ``seed``,
``seeds`` (1), ``n_boot`` (0: no interval), ``level`` (0.9). :func:`plot_breakeven` draws the table
(:func:`breakeven_figure`: a heatmap per TPOT SLO and link, each cell's gain with its interval,
hatched where indistinguishable, and the logged trace's goodput with error bars).
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
from router.sim.slo import SLO, Target, goodput_key, overlap, paired
from router.sim.workload import RunSpec, StepSpec, Workload

__all__ = [
    "SweepConfig",
    "synthetic",
    "bursty_starts",
    "sweep",
    "trace_cells",
    "plot_breakeven",
    "breakeven_figure",
]


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
    seeds: int = 1  # arrival seeds per cell (seed, seed + 1, ...)
    n_boot: int = 0  # run-bootstrap replicates per simulation (0: no interval)
    level: float = 0.9  # the intervals' coverage


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


def _iv(m: dict[str, Any] | None) -> dict[str, Any]:
    """A pooled measurement as ``{value, lo, hi}`` (None figures when nothing was measured)."""
    m = m or {}
    return {"value": m.get("value"), "lo": m.get("lo"), "hi": m.get("hi")}


def _row(r: PointResult, gkey: str) -> dict[str, Any]:
    """One configuration's figures at one (TTFT, TPOT) SLO pair, each with its interval: the values
    are the medians over arrival seeds (:func:`router.sim.slo.pool`), the intervals pooled seeds + run
    bootstrap; without a measured interval the first seed's figures, ``lo = hi = value``."""
    c, d = r.scorecard, r.details
    ivs = d.get("intervals") or {}
    tp = next(iter((d.get("slo") or {}).values()), None)  # the TPOT p95 (itl_p95 target)
    iv = {
        "goodput_share": _iv((d.get("goodput") or {}).get(gkey)),
        "ttft_s_p95": _iv(ivs.get("ttft_s_p95")) if ivs else _iv(None),
        "tpot_s_p95": _iv(tp),
        "step_latency_s_p95": _iv(ivs.get("step_latency_s_p95")) if ivs else _iv(None),
        "short_step_latency_s_p95": _iv(ivs.get("short_step_latency_s_p95")) if ivs else _iv(None),
    }
    first = {
        "ttft_s_p95": c["ttft_s_p95"],
        "tpot_s_p95": d.get("tpot_s_p95"),
        "step_latency_s_p95": c["step_latency_s_p95"],
        "short_step_latency_s_p95": c["short_step_latency_s_p95"],
    }
    for k, v in first.items():  # no interval measured: the first seed's figure, a degenerate interval
        if iv[k]["value"] is None and v is not None:
            iv[k] = {"value": v, "lo": v, "hi": v}
    return {
        **{k: m["value"] for k, m in iv.items()},
        "slo_attainment": c["slo_attainment"],
        "intervals": iv,
    }


def _cells(
    work: Workload,
    starts: np.ndarray,
    base: SimConfig,
    gpus: int,
    splits: Sequence[int],
    bandwidths: Sequence[float],
    tag: str,
    unc: dict[str, Any],
) -> list[Point]:
    """Co-location and every split at every link on one workload; ``unc``: the points' uncertainty
    fields (``seed_starts``, ``n_boot``, ``level``, ``goodput``, ``slo``)."""
    pol = _policy
    kw = {**unc, "keep_replicates": True}
    pts = [
        Point(work, replace(base, replicas=gpus, disagg_prefill=0), pol, "co-located", starts, tag=tag, **kw)
    ]
    for bw in bandwidths:
        for p in splits:
            cfg = replace(base, replicas=gpus, disagg_prefill=p, kv_link_gbps=bw)
            pts.append(Point(work, cfg, pol, f"disagg {p}:{gpus - p} @{bw:g}GB/s", starts, tag=tag, **kw))
    return pts


def _policy() -> Any:
    return build_policy("always-local")


def _table(
    points: list[Point], results: list[PointResult], keys: dict[str, list[dict[str, Any]]], level: float
) -> list[dict[str, Any]]:
    """Rows per (cell, SLO pair, link): co-located vs the best split with paired intervals.

    ``keys[tag]``: per SLO pair measured on the tag's points, the row's keys (``slo_ttft_s`` and
    ``slo_tpot_s`` among them). The best split has the highest goodput share (median over seeds;
    ties: fewer prefill replicas); its gain over co-location is paired replicate by replicate
    (:func:`router.sim.slo.paired`: same runs, seeds and draws); the winner is the configuration with
    the higher goodput when the gain's interval excludes 0, else ``indistinguishable``;
    ``intervals_overlap`` says whether the two goodput intervals overlap (the unpaired rule).
    """
    by_tag: dict[str, list[tuple[Point, PointResult]]] = {}
    for p, r in zip(points, results, strict=True):
        by_tag.setdefault(p.tag, []).append((p, r))
    rows = []
    for tag, prs in by_tag.items():
        co = next(r for p, r in prs if not p.config.disagg_prefill)
        bws = sorted({p.config.kv_link_gbps for p, _ in prs if p.config.disagg_prefill})
        for k in keys[tag]:
            gkey = goodput_key(k["slo_ttft_s_exact"], k["slo_tpot_s"])
            co_row = _row(co, gkey)
            for bw in bws:
                cand = [(p, r) for p, r in prs if p.config.disagg_prefill and p.config.kv_link_gbps == bw]
                bp, br = max(
                    cand,
                    key=lambda x: (
                        ((x[1].details.get("goodput") or {}).get(gkey) or {}).get("value") or 0.0,
                        -x[0].config.disagg_prefill,
                    ),
                )
                d_row = _row(br, gkey)
                gain = paired(
                    [s[gkey] for s in co.replicates], [s[gkey] for s in br.replicates], _minus, level
                ) if co.replicates and br.replicates else None  # fmt: skip
                g_co, g_d = co_row["goodput_share"] or 0.0, d_row["goodput_share"] or 0.0
                if gain is None or gain["value"] is None:  # no replicates: the point values, no interval
                    gain = {
                        "value": round(g_d - g_co, 6),
                        "lo": round(g_d - g_co, 6),
                        "hi": round(g_d - g_co, 6),
                    }
                winner = (
                    "indistinguishable"
                    if gain["lo"] <= 0.0 <= gain["hi"]
                    else ("disaggregated" if gain["value"] > 0 else "co-located")
                )
                rows.append(
                    {
                        **{kk: v for kk, v in k.items() if kk != "slo_ttft_s_exact"},
                        "link_gbps": bw,
                        "colocated": co_row,
                        "disagg_best": {
                            "prefill_replicas": bp.config.disagg_prefill,
                            "decode_replicas": bp.config.replicas - bp.config.disagg_prefill,
                            **d_row,
                            "kv_transfer_s_mean": round(
                                br.details["disagg"]["kv_transfer_s"]
                                / max(br.details["disagg"]["kv_transfers"], 1),
                                6,
                            ),
                        },
                        "goodput_gain": gain["value"],
                        "goodput_gain_interval": gain,
                        "winner": winner,
                        # the unpaired rule: the two goodput intervals overlap (conservative: ignores
                        # that both configurations served the same runs at the same arrivals)
                        "intervals_overlap": overlap(
                            co_row["intervals"]["goodput_share"], d_row["intervals"]["goodput_share"]
                        ),
                        "seeds": co.details.get("seeds", 1),
                        "interval_level": level,
                    }
                )
    return rows


def _minus(a: Any, b: Any) -> Any:
    return b - a


def _unc(sc: SweepConfig, tpots: Sequence[float], ttft_s: float) -> dict[str, Any]:
    return {
        "n_boot": sc.n_boot,
        "level": sc.level,
        "goodput": tuple((ttft_s, t) for t in tpots),
        "slo": SLO(targets=(Target("itl", 95.0, max(tpots)),)),
    }


def sweep(
    base: SimConfig,
    sc: SweepConfig = SweepConfig(),
    *,
    map: MapFn = builtins.map,  # noqa: A002 - builtin map, a Dask client's map, a pool's map
    progress: Callable[[PointResult], None] | None = None,
) -> dict[str, Any]:
    """The synthetic sweep of the module docstring; rows per (context, burstiness, TPOT SLO, link).

    One simulation per (context, burstiness, configuration) and arrival seed: the TPOT SLOs are
    scored on the same simulation (an SLO does not change what the node does)."""
    splits = sc.splits or tuple(range(1, sc.gpus))
    points: list[Point] = []
    keys: dict[str, list[dict[str, Any]]] = {}
    for L in sc.contexts:
        work = synthetic(L, sc.requests, sc.output_tokens, sc.seed, base.block_tokens)
        unit = capacity_check(work, np.zeros(len(work.runs)), replace(base, replicas=1))
        # capacity_check over a zero horizon (1 s): load_factor_1_replica = GPU-seconds of all requests
        rate = sc.load * sc.gpus * len(work.runs) / unit["load_factor_1_replica"]
        alone = capacity_check(synthetic(L, 1, (2, 2), sc.seed, base.block_tokens), np.zeros(1), base)
        ttft_slo = sc.ttft_slo_x * float(alone["short_step_alone_s_p95"] or 1.0)
        for cv in sc.burstiness:
            starts = bursty_starts(len(work.runs), rate, cv, sc.seed)
            more = tuple(bursty_starts(len(work.runs), rate, cv, sc.seed + k) for k in range(1, sc.seeds))
            tag = f"L{L}-cv{cv:g}"
            keys[tag] = [
                {
                    "context_tokens": L,
                    "burstiness_cv": cv,
                    "requests_per_s": round(rate, 4),
                    "slo_ttft_s": round(ttft_slo, 4),
                    "slo_ttft_s_exact": ttft_slo,
                    "slo_tpot_s": tpot,
                }
                for tpot in sc.tpot_slo_s
            ]
            cfg = replace(base, slo_ttft_s=ttft_slo, slo_tpot_s=max(sc.tpot_slo_s))
            unc = {**_unc(sc, sc.tpot_slo_s, ttft_slo), "seed_starts": more}
            points += _cells(work, starts, cfg, sc.gpus, splits, sc.link_gbps, tag, unc)
    results = run_points(points, map=map, progress=progress)
    return {
        "sweep": {k: v for k, v in vars(sc).items()},
        "node_profile": base.profile.name,
        "kv_dtype": base.kv_dtype,
        "simulations": len(points) * sc.seeds,
        "rows": _table(points, results, keys, sc.level),
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
    n_boot: int = 0,
    level: float = 0.9,
    seed_starts: tuple[np.ndarray, ...] = (),
    map: MapFn = builtins.map,  # noqa: A002
    progress: Callable[[PointResult], None] | None = None,
) -> dict[str, Any]:
    """Co-location vs the splits on a logged workload (one row per link bandwidth) at the base
    config's TTFT and TPOT SLOs, with intervals (run bootstrap; ``seed_starts`` for extra arrival
    seeds: none for a trace's fixed start times)."""
    tpot = base.slo_tpot_s if base.slo_tpot_s is not None else 0.1
    sc = SweepConfig(n_boot=n_boot, level=level, seeds=1 + len(seed_starts))
    unc = {**_unc(sc, (tpot,), base.slo_ttft_s), "seed_starts": seed_starts}
    pts = _cells(work, starts, replace(base, slo_tpot_s=tpot), gpus, splits, bandwidths, label, unc)
    res = run_points(pts, map=map, progress=progress)
    keys = {label: [{"workload": label, "gpus": gpus, "slo_ttft_s": base.slo_ttft_s, "slo_ttft_s_exact": base.slo_ttft_s, "slo_tpot_s": tpot}]}  # fmt: skip
    return {"simulations": len(pts) * sc.seeds, "rows": _table(pts, res, keys, level)}


def _err(m: dict[str, Any], k: float = 100.0) -> tuple[float, list[float], list[float]]:
    """(value, [below], [above]) of an interval for ``errorbar``, scaled by ``k``."""
    v = float(m.get("value") or 0.0)
    lo = float(m["lo"]) if m.get("lo") is not None else v
    hi = float(m["hi"]) if m.get("hi") is not None else v
    return k * v, [k * max(v - lo, 0.0)], [k * max(hi - v, 0.0)]


def _pp(x: float) -> str:
    """A share difference in percentage points, signed: whole points, tenths under 1 point, 0 unsigned."""
    v = 100 * x
    if abs(v) < 0.05:
        return "0"
    return f"{v:+.1f}" if abs(v) < 1 else f"{round(v):+d}"


def _pct_iv(m: dict[str, Any]) -> str:
    if m.get("value") is None:
        return "-"
    if m.get("lo") is None:
        return f"{100 * m['value']:.1f}%"
    return f"{100 * m['value']:.1f}% [{100 * m['lo']:.1f}, {100 * m['hi']:.1f}]"


def plot_breakeven(result: dict[str, Any], path: str | os.PathLike[str], title: str | None = None) -> Path:
    """:func:`breakeven_figure` written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = breakeven_figure(result, title)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def breakeven_figure(result: dict[str, Any], title: str | None = None) -> Any:
    """One heatmap per (TPOT SLO, link bandwidth): the goodput gain of the best split over co-location
    per cell, annotated with its paired interval and the split; a hatched cell is one whose gain
    interval holds 0 (indistinguishable). With ``result["trace"]``, a last column: the logged
    trace's goodput share, co-located vs the best split per link, with error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = result["rows"]
    trace = (result.get("trace") or {}).get("rows") or []
    bws = sorted({r["link_gbps"] for r in rows})
    tpots = sorted({r.get("slo_tpot_s") for r in rows}, key=lambda x: -(x or 0))
    ctxs = sorted({r["context_tokens"] for r in rows})
    cvs = sorted({r["burstiness_cv"] for r in rows})
    ncol = len(bws) + (1 if trace else 0)
    fig = plt.figure(figsize=(4.8 * ncol, 4.0 * len(tpots) + 0.6), layout="constrained")
    gs = fig.add_gridspec(len(tpots), ncol)
    axes = [[fig.add_subplot(gs[ti, bi]) for bi in range(len(bws))] for ti in range(len(tpots))]
    lvl = next((r.get("interval_level") for r in rows if r.get("interval_level")), 0.9)
    seeds = next((r.get("seeds") for r in rows if r.get("seeds")), 1)
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
                d, g = r["disagg_best"], r.get("goodput_gain_interval") or {}
                same = r["winner"] == "indistinguishable"
                if same:
                    ax.add_patch(
                        Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", ec="0.45", lw=0)
                    )
                iv = f"[{_pp(g['lo'])}, {_pp(g['hi'])}]" if g.get("lo") is not None else "[no interval]"
                ax.text(j, i, f"{'= ' if same else ''}{_pp(r['goodput_gain'])} pp\n{iv}\nsplit {d['prefill_replicas']}:{d['decode_replicas']}",
                        ha="center", va="center", fontsize=8,
                        bbox={"boxstyle": "round", "fc": "white", "alpha": 0.75, "lw": 0})  # fmt: skip
            ax.set_xticks(range(len(ctxs)), [f"{c // 1024}k" for c in ctxs])
            ax.set_yticks(range(len(cvs)), [f"CV {c:g}" for c in cvs])
            if ti == len(tpots) - 1:
                ax.set_xlabel("context length (prompt tokens)")
            if bw == bws[0]:
                ax.set_ylabel("arrival burstiness (CV)")
            ax.set_title(f"link {bw:g} GB/s, TPOT SLO {tp:g} s", fontsize=10)
    fig.colorbar(
        im,
        ax=[a for row in axes for a in row],
        label="goodput share: best disaggregated split - co-located (pp)",
        location="bottom" if trace else "right",
        shrink=0.5 if trace else 1.0,
    )
    if trace:
        ax = fig.add_subplot(gs[:, -1])
        w = 0.38
        for k, r in enumerate(trace):
            c, d = r["colocated"], r["disagg_best"]
            for off, m, col, lab in ((-w / 2, c, "C0", "co-located"), (w / 2, d, "C3", "best split")):
                v, lo, hi = _err(m["intervals"]["goodput_share"])
                ax.bar([k + off], [v], w, color=col, alpha=0.7, label=lab if k == 0 else None)
                ax.errorbar([k + off], [v], yerr=[lo, hi], fmt="none", ecolor="k", capsize=4)
                ax.text(k + off, v / 2, _pct_iv(m["intervals"]["goodput_share"]), rotation=90, ha="center",
                        va="center", fontsize=8)  # fmt: skip
            top = 100 * max((m["intervals"]["goodput_share"].get("hi") or 0.0) for m in (c, d))
            g = r.get("goodput_gain_interval") or {}
            gain = f"{_pp(g['value'])} pp [{_pp(g['lo'])}, {_pp(g['hi'])}]" if g.get("lo") is not None else ""
            ax.text(k, min(top + 2, 100), f"{r['winner']}\nsplit {d['prefill_replicas']}:{d['decode_replicas']}\n{gain}",
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_xticks(range(len(trace)), [f"{r['link_gbps']:g} GB/s" for r in trace])
        ax.set_ylim(0, 118)
        r0 = trace[0]
        ax.set(
            xlabel="KV link",
            ylabel=f"goodput share (%, bars {100 * lvl:.0f}% interval)",
            title=f"{r0.get('workload', 'trace')} on {r0.get('gpus', '?')} GPUs\n"
            f"(TTFT <= {r0['slo_ttft_s']:g} s, TPOT <= {r0['slo_tpot_s']:g} s)",
        )
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(
        title
        or "Disaggregation break-even (blue: disaggregation wins)\ncell: goodput gain of the best split, its "
        f"{100 * lvl:.0f}% interval ({seeds} arrival seed{'s' if seeds > 1 else ''} x run bootstrap), the P:D split; "
        "hatched '=': the gain's interval holds 0 (indistinguishable)",
        fontsize=10,
    )
    return fig
