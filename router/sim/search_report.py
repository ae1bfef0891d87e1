"""Rendering a search result (:func:`router.sim.search.find`) and its capacity pre-check.

- :func:`render_search`: the pre-check figures, then one row per key (policy x the fixed dimension):
  the answer, its p95s, the number of simulations it took and every probe (value: p95, holds).
- :func:`plot_search`: a PNG (matplotlib Agg): short-step p95 (log scale) of every probe against
  the searched value, one line per key, the SLO dashed, the answer circled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["render_search", "precheck_lines", "plot_search"]


def precheck_lines(check: dict[str, Any]) -> list[str]:
    return [
        f"capacity pre-check over {check['horizon_s']:.0f} s: offered prefill "
        f"{check['offered_prefill_tokens_per_s']:,.0f} tok/s "
        f"({check['offered_prefill_tokens_per_s_perfect_cache']:,.0f} with a perfect prefix cache), decode "
        f"{check['offered_decode_tokens_per_s']:,.0f} tok/s; one replica does "
        f"{check['capacity_prefill_tokens_per_s']:,.0f} prefill or {check['capacity_decode_tokens_per_s']:,.0f} "
        f"decode tok/s (decode batch {check['decode_batch_at_full_kv']} at full KV); load factor of one replica "
        f"{check['load_factor_1_replica']:.2f} ({check['load_factor_1_replica_perfect_cache']:.2f} with a "
        f"perfect cache); busiest 10 min x{check['peak_10min_factor']:.2f}; suggested start "
        f"{check['suggested_start_replicas']} replicas (lower bound {check['replicas_lower_bound']})"
    ]


def render_search(result: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
    dim = result["dimension"]
    t = Table(
        title=f"fewest {'replicas' if dim.startswith('replicas') else 'GB of KV'} holding {result['slo']}"
    )
    for name in (
        "policy",
        "KV GB",
        "replicas",
        "short p95 s",
        "TTFT p95 s",
        "sims",
        "probes (value: short p95)",
    ):
        t.add_column(name, justify="left" if name in ("policy", "probes (value: short p95)") else "right")
    rows = result["results"] + result.get("kv_at_fewest_replicas", [])
    for e in rows:
        probes = ", ".join(
            f"{p['value']:g}: {p['short_step_latency_s_p95'] if p['short_step_latency_s_p95'] is not None else '-'}"
            f"{'' if p['holds'] else ' x'}"
            for p in sorted(e["probes"], key=lambda p: p["value"])
        )
        t.add_row(
            e["policy"],
            "-" if e["kv_cache_gb"] is None else f"{e['kv_cache_gb']:g}",
            "-" if e["replicas"] is None else str(e["replicas"]),
            "-" if e["short_step_latency_s_p95"] is None else f"{e['short_step_latency_s_p95']:.3f}",
            "-" if e["ttft_s_p95"] is None else f"{e['ttft_s_p95']:.3f}",
            str(e["simulations"]),
            probes,
        )
    console.print(t)
    for e in rows:
        what = "replicas" if e["found"] == "replicas" else "GB of KV per replica"
        if e["found"] == "replicas":
            at = f"@ {e['kv_cache_gb']:g} GB KV"
            ans = e["replicas"]
        else:
            at = f"x{e['replicas']} replicas"
            ans = e["kv_cache_gb"]
        if ans is None:
            floor = (
                f"; the p95 stopped improving at {e['floor_s']:.3f} s (a floor: the steps' own service, not queueing)"
                if e.get("floor_s") is not None
                else ""
            )
            console.print(
                f"{e['policy']} {at}: no value in {e['searched'][0]:g}..{e['searched'][1]:g} {what} holds "
                f"{result['slo']} ({e['simulations']} simulations{floor})",
                highlight=False,
            )
        else:
            console.print(
                f"{e['policy']} {at}: fewest {what} holding {result['slo']}: {ans:g} (short-step p95 "
                f"{e['short_step_latency_s_p95']:.3f} s; bisection, {e['simulations']} simulations)"
                + (f"; NOT monotone at {e['non_monotone']}" if e["non_monotone"] else "")
                + (
                    f"; {unfit} run(s) rejected at every count: a prompt larger than one replica's KV cache"
                    if (
                        unfit := max((p.get("runs_rejected_kv_too_small", 0) for p in e["probes"]), default=0)
                    )
                    else ""
                ),
                highlight=False,
            )
    console.print(f"{result['simulations']} simulations in all", highlight=False)


def plot_search(result: dict[str, Any], path: str | os.PathLike[str], title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for e in result["results"] + result.get("kv_at_fewest_replicas", []):
        pts = sorted(
            (p["value"], p["short_step_latency_s_p95"])
            for p in e["probes"]
            if p["short_step_latency_s_p95"] is not None
        )
        if not pts:
            continue
        lab = e["policy"] + (
            f" @{e['kv_cache_gb']:g} GB" if e["found"] == "replicas" else f" x{e['replicas']}"
        )
        line = ax.plot([x for x, _ in pts], [max(y, 1e-3) for _, y in pts], marker="o", label=lab)
        ans = e["replicas"] if e["found"] == "replicas" else e["kv_cache_gb"]
        if ans is not None and e["short_step_latency_s_p95"] is not None:
            ax.scatter([ans], [max(e["short_step_latency_s_p95"], 1e-3)], s=160, facecolors="none",
                       edgecolors=line[0].get_color(), linewidths=2)  # fmt: skip
    slo_s = (result.get("slo_targets") or {}).get("short_p95_s")
    if slo_s is not None:
        ax.axhline(slo_s, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo_s:g} s")
    ax.set_yscale("log")
    dim = result["dimension"]
    ax.set_xlabel("local replicas" if dim.startswith("replicas") else "KV cache per replica (GB)")
    ax.set_ylabel("p95 short-step latency (s, log scale)")
    ax.set_title(title or f"Search: {result['slo']} ({result['simulations']} simulations; answers circled)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
