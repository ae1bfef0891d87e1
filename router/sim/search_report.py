"""Rendering a search result (:func:`router.sim.search.find`) and its capacity pre-check.

- :func:`render_search`: the pre-check figures, then one row per key (policy x the fixed dimension):
  the answer, its p95s, the number of simulations it took and every probe (value: p95, holds).
- :func:`plot_search`: a PNG (matplotlib Agg): the SLO's worst target (value / target, log scale) of
  every probe against the searched value, one line per key, with its interval as an error bar when the
  search measured one; the SLO line (1.0) dashed, each answer marked with a star and a vertical line,
  a plateau (floor) drawn as a dotted horizontal line at its level.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

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


def _probe_value(p: dict[str, Any]) -> str:
    """A probe's worst target value (its interval's upper bound when measured), else its short-step p95."""
    v = p.get("worst_value_s", p.get("short_step_latency_s_p95"))
    return "-" if v is None else f"{v:.3f}" + (f" ({p['worst_target']})" if p.get("worst_target") else "")


def _name(e: dict[str, Any], result: dict[str, Any]) -> str:
    """A result's policy, with its serving variant when the search had a disaggregated one."""
    if not any(v > 0 for v in result.get("disagg_variants") or [e.get("disagg_prefill", 0)]):
        return str(e["policy"])
    p = e.get("disagg_prefill", 0)
    return f"{e['policy']} ({'co-located' if not p else f'disaggregated P={p}'})"


def render_search(result: dict[str, Any], console: Console | None = None) -> None:
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
        "probes (value: worst target, s; x = fails)",
    ):
        t.add_column(name, justify="left" if name.startswith(("policy", "probes")) else "right")
    rows = result["results"] + result.get("kv_at_fewest_replicas", [])
    for e in rows:
        probes = ", ".join(
            f"{p['value']:g}: {_probe_value(p)}{'' if p['holds'] else ' x'}"
            for p in sorted(e["probes"], key=lambda p: p["value"])
        )
        t.add_row(
            _name(e, result),
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
        ivs = e.get("interval_at_answer") or {}
        if e["found"] == "replicas":
            at = f"@ {e['kv_cache_gb']:g} GB KV"
            ans = e["replicas"]
        else:
            at = f"x{e['replicas']} replicas"
            ans = e["kv_cache_gb"]
        if ans is None:
            floor = (
                f"; {e.get('floor_metric') or 'short_p95'} stopped improving at {e['floor_s']:.3f} s (a floor: "
                "the steps' own service, not queueing)"
                if e.get("floor_s") is not None
                else ""
            )
            console.print(
                f"{_name(e, result)} {at}: no value in {e['searched'][0]:g}..{e['searched'][1]:g} {what} holds "
                f"{result['slo']} ({e['simulations']} simulations{floor})",
                highlight=False,
            )
        else:
            iv = "; ".join(
                f"{k} {m['value']:.3f} s [{m['lo']:.3f}, {m['hi']:.3f}]"
                for k, m in ivs.items()
                if m["value"] is not None
            )
            noise = (
                f"; {e['optimistic']:g} already holds on the interval's lower bound (inside the noise)"
                if e.get("optimistic") is not None and e["optimistic"] < ans
                else ""
            )
            short = e["short_step_latency_s_p95"]
            console.print(
                f"{_name(e, result)} {at}: fewest {what} holding {result['slo']}"
                f"{' on the upper bound' if ivs else ''}: {ans:g} ("
                + (
                    f"{iv}, {100 * (result.get('interval_level') or 0.9):.0f}% intervals"
                    if iv
                    else f"short-step p95 {'-' if short is None else f'{short:.3f}'} s"
                )
                + f"; bisection, {e['simulations']} simulations){noise}"
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
    for pair in result.get("indistinguishable", []):
        a, b = pair["a"], pair["b"]
        console.print(
            f"indistinguishable: {_name(a, result)} @{a['kv_cache_gb']:g} GB needs "
            f"{pair['range_a'][0]:g}-{pair['range_a'][1]:g} and {_name(b, result)} @{b['kv_cache_gb']:g} GB "
            f"{pair['range_b'][0]:g}-{pair['range_b'][1]:g}: "
            + (
                "the same answer: either serves this SLO with as many replicas"
                if pair.get("same_answer")
                else "the ranges overlap, the model cannot say which needs fewer"
            ),
            highlight=False,
        )
    seeds = result.get("seeds", 1)
    console.print(
        f"{result['simulations']} simulations in all"
        + (
            f" ({seeds} arrival seed(s) each, {result.get('n_boot', 0)} run-bootstrap replicates)"
            if result.get("interval_level")
            else ""
        ),
        highlight=False,
    )


def _ratio(p: dict[str, Any], targets: dict[str, float]) -> tuple[float, float, float] | None:
    """(worst value / target, its lower, its upper) of one probe; None without a measured target."""
    meas = p.get("slo")
    if meas:
        r = [
            (
                m["value"] / targets[k],
                (m["lo"] or m["value"]) / targets[k],
                (m["hi"] or m["value"]) / targets[k],
            )
            for k, m in meas.items()
            if m["value"] is not None and k in targets
        ]
        return max(r, key=lambda x: x[2]) if r else None
    v = p.get("worst_value_s")
    k = p.get("worst_target")
    if v is None or k not in targets:
        v, k = p.get("short_step_latency_s_p95"), "short_p95"
        if v is None or k not in targets:
            return None
    return v / targets[k], v / targets[k], v / targets[k]


def plot_search(result: dict[str, Any], path: str | os.PathLike[str], title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = dict((result.get("slo_targets") or {}).get("targets") or {})
    st = result.get("slo_targets") or {}
    if not targets and st.get("short_p95_s"):
        targets = {"short_p95": st["short_p95_s"]}
    fig, ax = plt.subplots(figsize=(9.5, 5.8))
    for e in result["results"] + result.get("kv_at_fewest_replicas", []):
        pts = sorted((p["value"], r) for p in e["probes"] if (r := _ratio(p, targets)) is not None)
        lab = _name(e, result) + (
            f" @{e['kv_cache_gb']:g} GB" if e["found"] == "replicas" else f" x{e['replicas']}"
        )
        if not pts:
            ax.plot([], [], label=f"{lab}: no local step measured")
            continue
        xs = [x for x, _ in pts]
        ys = [max(r[0], 1e-3) for _, r in pts]
        err = [[max(r[0] - r[1], 0) for _, r in pts], [max(r[2] - r[0], 0) for _, r in pts]]
        ans = e["replicas"] if e["found"] == "replicas" else e["kv_cache_gb"]
        line = ax.errorbar(
            xs,
            ys,
            yerr=err,
            marker="o",
            capsize=3,
            label=f"{lab}: answer {ans if ans is not None else 'none'}",
        )
        color = line[0].get_color()
        if ans is not None:
            r = next((r for x, r in pts if x == ans), None)
            if r is not None:
                ax.scatter([ans], [max(r[0], 1e-3)], s=260, marker="*", color=color, zorder=5)
            ax.axvline(ans, color=color, linestyle=":", linewidth=1)
        if e.get("floor_s") is not None and e.get("floor_metric") in targets:
            f = e["floor_s"] / targets[e["floor_metric"]]
            ax.axhline(
                f,
                color=color,
                linestyle="-.",
                linewidth=1.2,
                label=f"{lab}: floor {e['floor_s']:.2f} s ({e['floor_metric']})",
            )
    for fl in result.get("slo_floors", []):
        if fl["target"] in targets and fl.get("floor_s_perfect_cache") is not None:
            v = fl["floor_s_perfect_cache"] / targets[fl["target"]]
            ax.axhline(v, color="black", linestyle=(0, (1, 3)), linewidth=1.2,
                       label=f"no-queueing floor {fl['target']}: {fl['floor_s_perfect_cache']:.2f} s (perfect cache)")  # fmt: skip
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1.2, label="SLO (value = target)")
    ax.set_yscale("log")
    dim = result["dimension"]
    ax.set_xlabel("local replicas" if dim.startswith("replicas") else "KV cache per replica (GB)")
    lvl = result.get("interval_level")
    ax.set_ylabel(
        "worst SLO target: value / target (log)" + (f"; bars: {100 * lvl:.0f}% interval" if lvl else "")
    )
    ax.set_title(
        title or f"Search: {result['slo']} ({result['simulations']} simulations; answers starred)", fontsize=9
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
