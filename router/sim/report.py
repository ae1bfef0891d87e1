"""Rendering a what-if result (:func:`router.sim.whatif.run_grid`): rich table, JSON, PNG plots.

- :func:`render_table`: one row per (policy x replicas x KV) with the scorecard figures, then the
  built-in answers as plain lines.
- :func:`write_json`: the whole result (scorecards with exactly the scorecard keys, details, answers,
  inputs), written atomically.
- :func:`plot`: a PNG with three panels, matplotlib's Agg backend (no display needed):
  p95 short-step latency (s, log scale, the SLO as a dashed line) vs local replicas, one line per
  policy; cost (USD) vs local replicas per policy; cross-turn cache hit rate vs KV cache size (GB) per
  policy at the largest replica count, with the run-prefix upper bound dashed. The latency and hit
  rate carry their interval as error bars when the points measured one (``details["intervals"]``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["render_table", "answer_lines", "write_json", "plot"]


def _f(v: Any, nd: int = 2, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _fi(v: Any, iv: dict[str, Any] | None, nd: int = 2, pct: bool = False) -> str:
    """``_f(v)`` followed by its interval ``[lo, hi]`` when the point measured one."""
    if v is None or not iv or iv.get("lo") is None:
        return _f(v, nd, pct)
    k = 100 if pct else 1
    return f"{_f(v, nd, pct)} [{k * iv['lo']:.{1 if pct else nd}f}, {k * iv['hi']:.{1 if pct else nd}f}]"


def tier_lines(result: dict[str, Any]) -> list[str]:
    """Per point with lower KV tiers: the hit rate of the GPU cache and of each tier (the global CPU
    pool's when shared), each with its interval when measured."""
    lines = []
    dets = result.get("details") or []
    shared = bool((result.get("inputs") or {}).get("cpu_kv_global"))
    for c, d in zip(result["scorecards"], dets, strict=False):
        tiers = [st["tier"] for st in d.get("kv_tiers") or []]
        if not tiers:
            continue
        ivs = d.get("intervals") or {}
        parts = [
            f"{name}{' (global pool)' if name == 'cpu' and shared else ''} "
            + _fi(d.get(f"cache_hit_rate_{name}"), ivs.get(f"cache_hit_rate_{name}"), pct=True)
            for name in ("gpu", *tiers)
        ]
        lines.append(
            f"{c['policy']} x{c['replicas']} @ {c['kv_cache_gb']:g} GB: hit by tier: " + ", ".join(parts)
        )
    return lines


def answer_lines(result: dict[str, Any]) -> list[str]:
    ans = result.get("answers", {})
    slo = ans.get("slo_short_step_s")
    lines = []
    for e in ans.get("fewest_replicas_for_short_step_slo", []):
        if e["replicas"] is None:
            lines.append(
                f"{e['policy']} @ {e['kv_cache_gb']:g} GB KV: no replica count in the grid holds "
                f"p95 short-step <= {slo:g} s"
            )
        else:
            lines.append(
                f"{e['policy']} @ {e['kv_cache_gb']:g} GB KV: fewest replicas holding p95 short-step "
                f"<= {slo:g} s: {e['replicas']} (p95 {e['short_step_latency_s_p95']:.2f} s)"
            )
    for e in ans.get("kv_doubling", []):
        lines.append(
            f"{e['policy']} x{e['replicas']}: KV {e['kv_cache_gb']:g} -> {e['kv_cache_gb_doubled']:g} GB: "
            f"cache hit {_f(e['cache_hit_rate'], pct=True)} -> {_f(e['cache_hit_rate_doubled'], pct=True)} "
            f"(upper bound {_f(e['cache_hit_upper_bound'], pct=True)})"
        )
    for e in ans.get("scale_to_zero_vs_always_on", []):
        lines.append(
            f"{e['policy']} x{e['replicas']} @ {e['kv_cache_gb']:g} GB: scale-to-zero ${e['cost_usd_scale_to_zero']:.2f} "
            f"({e['cold_starts']} cold starts, ${e['cold_start_cost_usd']:.2f} of wake time) vs always-on "
            f"${e['cost_usd_always_on']:.2f}; p95 short-step {_f(e['short_step_latency_s_p95_scale_to_zero'])} s "
            f"vs {_f(e['short_step_latency_s_p95_always_on'])} s"
        )
    return lines


def render_table(result: dict[str, Any], console: Console | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped / captured: do not squeeze the table into 80 columns
            console = Console(width=200)
    t = Table(title="what-if scorecard", show_lines=False)
    cols = [
        ("policy", "left"),
        ("repl", "right"),
        ("KV GB", "right"),
        ("done", "right"),
        ("rej", "right"),
        ("spill", "right"),
        ("run p50 s", "right"),
        ("step p50 s", "right"),
        ("step p95 s", "right"),
        ("step p99 s", "right"),
        ("short p95 s", "right"),
        ("TTFT p95 s", "right"),
        ("hit", "right"),
        ("hit max", "right"),
        ("cost $", "right"),
        ("escal", "right"),
        ("flaps", "right"),
        ("SLO ok", "right"),
    ]
    for name, just in cols:
        t.add_column(name, justify=just)  # type: ignore[arg-type]
    dets = result.get("details") or [{}] * len(result["scorecards"])
    for c, d in zip(result["scorecards"], dets, strict=True):
        ivs = d.get("intervals") or {}  # the point's intervals (seeds + run bootstrap), when measured
        t.add_row(
            c["policy"],
            str(c["replicas"]),
            f"{c['kv_cache_gb']:g}",
            str(c["runs_completed"]),
            str(c["runs_rejected"]),
            str(c["runs_spilled"]),
            _f(c["run_completion_s_p50"], 1),
            _f(c["step_latency_s_p50"]),
            _f(c["step_latency_s_p95"]),
            _f(c["step_latency_s_p99"]),
            _fi(c["short_step_latency_s_p95"], ivs.get("short_step_latency_s_p95")),
            _fi(c["ttft_s_p95"], ivs.get("ttft_s_p95")),
            _fi(c["cache_hit_rate"], ivs.get("cache_hit_rate"), pct=True),
            _f(c["cache_hit_upper_bound"], pct=True),
            _f(c["cost_usd"]),
            _f(c["escalation_rate"], pct=True),
            _f(c["flaps_per_run"]),
            _f(c["slo_attainment"], pct=True),
        )
    console.print(t)
    for line in tier_lines(result) + answer_lines(result):
        console.print(line, highlight=False)


def write_json(result: dict[str, object], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(result, indent=2, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(data + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def _yerr(vals: list[tuple[float, dict[str, Any] | None]], k: float = 1.0) -> list[list[float]]:
    """``errorbar``'s yerr for figures with their intervals (none measured: no bar)."""
    lo, hi = [], []
    for v, iv in vals:
        m = iv or {}
        ok = m.get("lo") is not None and m.get("hi") is not None
        lo.append(k * max(v - m["lo"], 0.0) if ok else 0.0)
        hi.append(k * max(m["hi"] - v, 0.0) if ok else 0.0)
    return [lo, hi]


def plot(result: dict[str, Any], path: str | os.PathLike[str], title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cards = result["scorecards"]
    dets = result.get("details") or [{}] * len(cards)
    ivs = {id(c): (d.get("intervals") or {}) for c, d in zip(cards, dets, strict=True)}
    slo = result.get("answers", {}).get("slo_short_step_s")
    policies = list(dict.fromkeys(c["policy"] for c in cards))
    kvs = sorted({c["kv_cache_gb"] for c in cards})
    kv0 = kvs[0]
    reps = sorted({c["replicas"] for c in cards})
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    ax1, ax2, ax3 = axes
    for pol in policies:
        pts = sorted((c["replicas"], c) for c in cards if c["policy"] == pol and c["kv_cache_gb"] == kv0)
        ok = [(x, c) for x, c in pts if c["short_step_latency_s_p95"] is not None]
        if ok:
            ax1.errorbar(
                [x for x, _ in ok],
                [c["short_step_latency_s_p95"] for _, c in ok],
                yerr=_yerr(
                    [
                        (c["short_step_latency_s_p95"], ivs[id(c)].get("short_step_latency_s_p95"))
                        for _, c in ok
                    ]
                ),
                marker="o",
                capsize=3,
                label=pol,
            )
        ax2.plot([x for x, _ in pts], [c["cost_usd"] for _, c in pts], marker="o", label=pol)
    if slo is not None:
        ax1.axhline(slo, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax1.set_yscale("log")
    ax1.set_xlabel("local replicas")
    lvl = next((d.get("interval_level") for d in dets if d.get("interval_level")), None)
    ax1.set_ylabel(
        "p95 short-step latency (s, log scale" + (f"; bars {100 * lvl:.0f}% interval)" if lvl else ")")
    )
    ax1.set_title(f"Short-step latency vs replicas (KV {kv0:g} GB/replica)")
    costs = [c["cost_usd"] for c in cards if c["cost_usd"] > 0]
    if costs and max(costs) / min(costs) > 50:
        ax2.set_yscale("log")
    ax2.set_xlabel("local replicas")
    ax2.set_ylabel(
        "cost (USD: frontier tokens + local GPU-hours)" + (", log scale" if ax2.get_yscale() == "log" else "")
    )
    ax2.set_title("Cost vs replicas")
    for ax in (ax1, ax2):
        ax.set_xticks(reps)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    rmax = reps[-1]
    any3 = False
    for pol in policies:
        pts = sorted(
            (c["kv_cache_gb"], c)
            for c in cards
            if c["policy"] == pol and c["replicas"] == rmax and c["cache_hit_rate"] is not None
        )
        if not pts:
            continue
        any3 = True
        line = ax3.errorbar(
            [x for x, _ in pts],
            [100 * c["cache_hit_rate"] for _, c in pts],
            yerr=_yerr([(c["cache_hit_rate"], ivs[id(c)].get("cache_hit_rate")) for _, c in pts], 100.0),
            marker="o",
            capsize=3,
            label=pol,
        )
        ax3.plot(
            [x for x, _ in pts],
            [100 * c["cache_hit_upper_bound"] for _, c in pts],
            linestyle="--",
            color=line[0].get_color(),
            alpha=0.6,
            label=f"{pol} upper bound",
        )
    ax3.set_xlabel("KV cache per replica (GB)")
    ax3.set_ylabel("cache hit rate (% of prompt tokens, local steps >= 2)")
    ax3.set_title(f"Cross-turn cache hits vs KV size ({rmax} replicas)")
    ax3.set_xticks(kvs)
    ax3.set_ylim(0, 100)
    ax3.grid(True, alpha=0.3)
    if any3:
        ax3.legend(fontsize=8)
    else:
        ax3.text(0.5, 0.5, "no local steps >= 2", ha="center", va="center", transform=ax3.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
