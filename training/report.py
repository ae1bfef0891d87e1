"""The scorecard report: ``report.md``, ``scorecard.json`` and PNG plots, plus the printed table.

:func:`write_report` takes the scorecard dict built by ``runroute demo`` / ``runroute bench``
(:mod:`runroute.demo`) and writes, atomically, into the report directory:

- ``scorecard.json``: the dict itself (keys documented in :data:`SCORECARD_DOC`);
- ``frontier_<set>.png``: the cost-quality plane: every policy's operating point (mean cost per
  run, USD, vs success rate under the base outcome model), the threshold sweeps of the learned and
  per-step-threshold policies as lines, and the learned policy's AIQ hull (dashed);
- ``bars_<set>.png``: per-policy success rate (with its standard error) and cost per run;
- ``latency_<set>.png``: per-policy p95 step latency of short vs long steps (simulator), with the
  live sidecar's measurement beside it where the live segment ran;
- ``report.md``: what was run, what was held out, the prices and the outcome model, the tables, the
  sensitivity of the ranking to the outcome model, and the learned policy against each baseline in
  sentences generated from the numbers (:func:`comparison_lines`), then the JSON key reference.

:func:`print_scorecard` prints one rich table per held-out set. Matplotlib runs on the Agg backend
(no display). Nothing here changes a number: every figure comes from the scorecard dict.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "SCORECARD_DOC",
    "write_report",
    "print_scorecard",
    "comparison_lines",
    "sensitivity",
    "ranking_text",
    "render_markdown",
    "plot_frontier",
    "plot_bars",
    "plot_latency",
]

SCORECARD_DOC = """\
`scorecard.json` (schema `runroute-scorecard/1`), written by `runroute demo` and `runroute bench --json`:

- `prices`: the price assumptions (USD per 1M tokens; `gpu_hour_usd` per GPU-hour; `local_in_per_m` /
  `local_out_per_m` derived from the GPU price and the sustained local throughput).
- `outcome_variants`: outcome-model variants evaluated; the first is the headline.
- `split` (demo): exactly what was held out (`tau2_heldout_tasks`, the synthetic seed) and what trained.
- `training`: bundle directory, version, calibrated `thresholds` (and `thresholds_report`: the target
  frontier share they were calibrated for), MLflow tracking URI and run, `sweep_thresholds` (the grid:
  fixed points plus quantiles of the training runs' max P(frontier), never held-out data).
- `sets.<name>`: one held-out workload: `n_runs`, `n_steps`, `n_quality_runs` (runs with both outcomes
  known), `n_needs_frontier`, `sim` (the simulated deployment), `policies` (one row per policy),
  `sweeps.<policy>` (threshold sweep points: `threshold`, `success_rate`, `cost_usd`,
  `escalation_rate`, `flaps_per_run`, `success_by_variant`), `model_scores` (the bundle's predictors
  scored on this set: `escalation` {`auc`, `pr_auc`, `brier`, `ece`, `n`, `pos_rate`},
  `cache_reuse.mae_tokens`, `remaining_steps` pinball losses).
- a policy row (`sets.<name>.policies[]`):
  - `policy`, `kind`, `thresholds` (learned / per-step-threshold);
  - quality: `success_rate` (base outcome model, over `quality_runs`), `success_se` (binomial standard
    error), `success_by_variant.<variant>`;
  - cost (outcome model, token-priced): `cost_usd` (total over the set), `local_cost_usd`,
    `frontier_cost_usd`, `cost_per_run_usd`, `cost_per_success_usd`;
  - `cost_at_95pct_frontier_success_usd`: cheapest cost among the policy's points (its sweep, if
    swept) reaching 95% of always-frontier's success; null if none does (`..._by_variant` per variant).
    It picks the sweep point with hindsight on the evaluated set: it describes the policy's curve, it is
    not the operating point the router runs (that is the row's own `success_rate` / `cost_usd`);
  - `aiq`: area under the policy's non-decreasing concave cost-quality hull over the normalised cost
    axis x = (cost - always-local cost) / (always-frontier cost - always-local cost) in [0, 1], hull
    anchored at always-local (`aiq_by_variant` per variant);
  - routing: `escalation_rate` (served runs with any frontier step chosen by the policy; runs that
    admission control spilled whole are left out here and counted in `spilled_runs`),
    `frontier_step_share`, `escalation_step_median`, `tier_switches_per_run`, `needs_frontier_recall` /
    `needs_frontier_precision` (a run is flagged when the policy sent any step to the frontier;
    labelled, non-spilled runs only), `needs_frontier_runs`;
  - simulator: `runs_completed`, `runs_rejected`, `runs_spilled` (admission control at run start),
    `run_completion_s_p50` / `_p95` (incl. tool pauses), `step_latency_s_p95`, `short_step_latency_s_p95`
    (<= 64 output tokens or a tool call), `long_step_latency_s_p95`, `ttft_s_p95`, `cache_hit_rate`
    (cached / prompt tokens, local steps from the 2nd on) beside `cache_hit_upper_bound` (prompt tokens
    repeating the run's earlier prefix / prompt tokens, same steps), `flaps_per_run` (switches of tier
    or replica per run), `slo_attainment`, `sim_cost_usd` (simulated frontier bill + always-on GPU-hours).
- `run_level_pairs` (demo): paired runs without step records (SWE-bench Pro), per pair: `runs`,
  `always_local_success`, `always_frontier_success`, `oracle_success`, `oracle_escalation_rate`.
- `live`: the live sidecar segment: `policies.<policy>` with measured `step_latency_s_p50/p95`,
  `short_step_latency_s_p95`, `long_step_latency_s_p95`, `cache_hit_rate`, `cache_hit_upper_bound`,
  `escalation_rate`, `flaps_per_run`, `reasons`, `steps`, `errors`; or `skipped` with the reason.
- `timings`: wall seconds per stage and `total_s`.
"""

_BASE_ORDER = (
    "always-local",
    "always-frontier",
    "per-step-threshold",
    "session-sticky",
    "stall-escalation",
    "learned",
    "oracle",
)
_COLORS = {
    "always-local": "#1f77b4",
    "always-frontier": "#d62728",
    "per-step-threshold": "#ff7f0e",
    "session-sticky": "#17becf",
    "stall-escalation": "#9467bd",
    "learned": "#2ca02c",
    "oracle": "#7f7f7f",
}


# ------------------------------------------------------------------------------------ formatting


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v))


def _f(v: Any, nd: int = 3) -> str:
    return f"{v:.{nd}f}" if _num(v) else "-"


def _pct(v: Any, nd: int = 1) -> str:
    return f"{100 * v:.{nd}f}%" if _num(v) else "-"


def _usd(v: Any) -> str:
    if not _num(v):
        return "-"
    return f"${v:.4f}" if abs(v) < 1 else f"${v:,.3f}"


def _jsonable(o: Any) -> Any:
    import numpy as np

    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return [_jsonable(v) for v in o.tolist()]
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (np.floating, float)):
        f = float(o)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, Path):
        return str(o)
    return o


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _rows(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in s.get("policies", [])}


# ------------------------------------------------------------------------------------ analysis

# (key, label, higher is better, formatter)
_CMP = (
    ("success_rate", "success", True, _f),
    ("cost_usd", "cost", False, _usd),
    ("aiq", "AIQ", True, _f),
    ("short_step_latency_s_p95", "short-step p95 (s)", False, lambda v: _f(v, 2)),
    ("run_completion_s_p95", "run completion p95 (s)", False, lambda v: _f(v, 1)),
    ("cache_hit_rate", "cache hit", True, _pct),
    ("flaps_per_run", "flaps/run", False, lambda v: _f(v, 2)),
)


def comparison_lines(s: dict[str, Any], ours: str = "learned") -> list[str]:
    """One sentence per baseline: where ``ours`` is better, where worse, from the numbers only.

    Success differences smaller than two combined standard errors are called "within noise".
    """
    rows = _rows(s)
    me = rows.get(ours)
    if me is None:
        return [f"no `{ours}` row in this set"]
    out = []
    for name in [p for p in _BASE_ORDER if p in rows and p != ours] + [
        p for p in rows if p not in _BASE_ORDER and p != ours
    ]:
        b = rows[name]
        better, worse, same = [], [], []
        for key, label, hib, fmt in _CMP:
            if not (_num(me.get(key)) and _num(b.get(key))):
                continue
            a, c = float(me[key]), float(b[key])
            txt = f"{label} {fmt(a)} vs {fmt(c)}"
            if key == "success_rate":
                se = math.hypot(me.get("success_se") or 0.0, b.get("success_se") or 0.0)
                if se > 0 and abs(a - c) < 2 * se:
                    txt += f" (within noise: 2 SE = {2 * se:.3f})"
            if fmt(a) == fmt(c):  # equal at the precision shown
                same.append(txt)
            elif (a > c) == hib:
                better.append(txt)
            else:
                worse.append(txt)
        verdict = ""
        if all(_num(r.get(k)) for r in (me, b) for k in ("success_rate", "cost_usd")):
            sa, sb = float(me["success_rate"]), float(b["success_rate"])
            ca, cb = float(me["cost_usd"]), float(b["cost_usd"])
            if sa >= sb and ca <= cb and (sa > sb or ca < cb):
                verdict = "dominates it (at least as good on success and cost, strictly better on one)"
            elif sa <= sb and ca >= cb and (sa < sb or ca > cb):
                verdict = "is dominated by it on success and cost"
            elif sa == sb and ca == cb:
                verdict = "ties it on success and cost"
            else:
                verdict = "trades success against cost with it"
        if not verdict:
            verdict = "has no success figure to compare (no run with both outcomes known)"
        elif cb > 0:
            rel = f"x{ca / cb:.1f}" if ca / cb >= 3 else f"{100 * (ca - cb) / cb:+.1f}%"
            verdict += f" (success {sa - sb:+.3f}, cost {rel})"
        line = f"**vs {name}**: {ours} {verdict}. Better: " + ("; ".join(better) or "nothing")
        line += ". Worse: " + ("; ".join(worse) or "nothing")
        if same:
            line += ". Equal: " + "; ".join(same)
        out.append(line + ".")
    return out


def _ranking(pairs: list[tuple[str, Any]], tol: float = 1e-9) -> list[list[str]]:
    """Tie groups, best first: [[a], [b, c], ...] (values within ``tol`` tie; missing values last)."""
    vals = sorted(pairs, key=lambda t: -(t[1] if _num(t[1]) else -math.inf))
    groups: list[list[str]] = []
    last: Any = None
    for name, v in vals:
        if groups and ((_num(v) and _num(last) and abs(v - last) <= tol) or (not _num(v) and not _num(last))):
            groups[-1].append(name)
        else:
            groups.append([name])
        last = v
    return [sorted(g) for g in groups]


def ranking_text(groups: list[list[str]]) -> str:
    return " > ".join(" = ".join(g) for g in groups)


def sensitivity(s: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """Rankings (tie groups) by success and by AIQ under each outcome variant, whether they differ from
    the first (base) variant's, and the learned policy's rank (1 + policies strictly better)."""
    rows = s.get("policies", [])
    out: dict[str, Any] = {"by_success": {}, "by_aiq": {}}
    for v in variants:
        out["by_success"][v] = _ranking(
            [(r["policy"], (r.get("success_by_variant") or {}).get(v)) for r in rows]
        )
        out["by_aiq"][v] = _ranking([(r["policy"], (r.get("aiq_by_variant") or {}).get(v)) for r in rows])
    if variants:
        b = variants[0]
        out["success_ranking_changes"] = {
            v: out["by_success"][v] != out["by_success"][b] for v in variants[1:]
        }
        out["aiq_ranking_changes"] = {v: out["by_aiq"][v] != out["by_aiq"][b] for v in variants[1:]}
        for key in ("success", "aiq"):
            lr: dict[str, int | None] = {}
            for v in variants:
                groups = out[f"by_{key}"][v]
                ahead = 0
                lr[v] = None
                for g in groups:
                    if "learned" in g:
                        lr[v] = ahead + 1
                        break
                    ahead += len(g)
            out[f"learned_{key}_rank"] = lr
    return out


# ------------------------------------------------------------------------------------ plots


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_frontier(s: dict[str, Any], title: str, path: Path) -> None:
    """Cost-quality plane of one set: points, sweeps and the learned policy's AIQ hull."""
    from training.outcome import hull_curve

    plt = _plt()
    rows = _rows(s)
    n = max(1, s.get("n_runs", 1))
    fig, ax = plt.subplots(figsize=(8.5, 6))
    for label, pts in (s.get("sweeps") or {}).items():
        xs = [p["cost_usd"] / n for p in pts if _num(p.get("success_rate"))]
        ys = [p["success_rate"] for p in pts if _num(p.get("success_rate"))]
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        ax.plot(
            [xs[i] for i in order],
            [ys[i] for i in order],
            "-",
            marker=".",
            color=_COLORS.get(label, "k"),
            alpha=0.55,
            label=f"{label}: threshold sweep",
        )
    al, af, le = rows.get("always-local"), rows.get("always-frontier"), rows.get("learned")
    if al and af and le and _num(al.get("success_rate")):
        pts = [(le["cost_usd"], le["success_rate"])] + [
            (p["cost_usd"], p["success_rate"]) for p in (s.get("sweeps") or {}).get("learned", [])
        ]
        h = hull_curve(pts, (al["cost_usd"], al["success_rate"]), al["cost_usd"], af["cost_usd"])
        if h is not None:
            hx, hr = h
            cost = (al["cost_usd"] + hx * (af["cost_usd"] - al["cost_usd"])) / n
            ax.plot(
                cost,
                hr,
                "--",
                color=_COLORS["learned"],
                lw=1.2,
                label=f"learned: AIQ hull ({_f(le.get('aiq'))})",
            )
        ax.plot(
            [al["cost_usd"] / n, af["cost_usd"] / n],
            [al["success_rate"], af["success_rate"]],
            ":",
            color="0.5",
            lw=1,
            label="random mix of local and frontier",
        )
    markers = "osD^vPX*"
    for i, (name, r) in enumerate(rows.items()):
        if not _num(r.get("success_rate")):
            continue
        ax.errorbar(
            r["cost_usd"] / n,
            r["success_rate"],
            yerr=r.get("success_se") or 0,
            fmt=markers[i % len(markers)],
            ms=10 - i % 3 * 2,
            mfc="none" if i % 2 else None,
            mew=2,
            color=_COLORS.get(name, "k"),
            capsize=3,
            label=name,
            zorder=5,
        )
    ax.set_xlabel("mean cost per run (USD, outcome model)")
    ax.set_xlim(left=0)
    ax.set_ylabel("success rate (base outcome model)")
    ax.set_title(f"{title}: cost vs quality ({s.get('n_quality_runs', 0)} runs with both outcomes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(s: dict[str, Any], title: str, path: Path) -> None:
    """Per-policy success rate (with SE) and mean cost per run."""
    plt = _plt()
    rows = [r for r in s.get("policies", [])]
    names = [r["policy"] for r in rows]
    n = max(1, s.get("n_runs", 1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    cols = [_COLORS.get(p, "k") for p in names]
    succ = [r.get("success_rate") or 0.0 for r in rows]
    a1.bar(names, succ, color=cols, yerr=[r.get("success_se") or 0 for r in rows], capsize=3)
    a1.set_ylabel("success rate (base outcome model)")
    a1.set_ylim(0, 1)
    a1.set_title(f"{title}: success")
    for i, (v, r) in enumerate(zip(succ, rows, strict=True)):
        a1.text(i + 0.08, v + (r.get("success_se") or 0) + 0.015, f"{v:.2f}", ha="left", fontsize=8)
    cost = [(r.get("cost_usd") or 0.0) / n for r in rows]
    a2.bar(names, cost, color=cols)
    a2.set_ylabel("mean cost per run (USD, outcome model)")
    a2.set_title(f"{title}: cost")
    for i, v in enumerate(cost):
        a2.text(i, v, f"${v:.4f}", ha="center", va="bottom", fontsize=8)
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=30)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(s: dict[str, Any], live: dict[str, Any] | None, title: str, path: Path) -> None:
    """p95 step latency, short vs long steps, per policy (simulator; live sidecar where measured)."""
    import numpy as np

    plt = _plt()
    rows = s.get("policies", [])
    names = [r["policy"] for r in rows]
    x = np.arange(len(names))
    lp = (live or {}).get("policies") or {}
    has_live = any(_num((lp.get(n) or {}).get("short_step_latency_s_p95")) for n in names)
    fig, axes = plt.subplots(1, 2 if has_live else 1, figsize=(13 if has_live else 8, 4.8), squeeze=False)
    w = 0.38
    ax = axes[0][0]
    short = [r.get("short_step_latency_s_p95") or 0 for r in rows]
    long_ = [r.get("long_step_latency_s_p95") or 0 for r in rows]
    ax.bar(x - w / 2, short, w, label="short steps (<= 64 output tokens or a tool call)", color="#4c72b0")
    ax.bar(x + w / 2, long_, w, label="long steps", color="#dd8452")
    ax.set_xticks(x, names, rotation=30)
    ax.set_ylabel("p95 step latency (s)")
    ax.set_title(f"{title}: simulator")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if has_live:
        ax2 = axes[0][1]
        ls = [(lp.get(n) or {}).get("short_step_latency_s_p95") or 0 for n in names]
        ll = [(lp.get(n) or {}).get("long_step_latency_s_p95") or 0 for n in names]
        ax2.bar(x - w / 2, ls, w, label="short steps", color="#4c72b0")
        ax2.bar(x + w / 2, ll, w, label="long steps", color="#dd8452")
        ax2.set_xticks(x, names, rotation=30)
        ax2.set_ylabel("p95 step latency (s)")
        ax2.set_title("live sidecar + fake backends (a few runs; oracle not run live)")
        ax2.legend(fontsize=8)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ markdown


def _table(rows: list[dict[str, Any]]) -> list[str]:
    hdr = (
        "| policy | success (± SE) | cost USD | cost/run | cost @95% AF | AIQ | escal. | recall | precision "
        "| cache hit (bound) | flaps/run | short p95 s | run p95 s | rej/spill |"
    )
    out = [hdr, "|" + "---|" * 14]
    for r in rows:
        out.append(
            f"| {r['policy']} | {_f(r.get('success_rate'))} (± {_f(r.get('success_se'))}) | {_usd(r.get('cost_usd'))} "
            f"| {_usd(r.get('cost_per_run_usd'))} | {_usd(r.get('cost_at_95pct_frontier_success_usd'))} "
            f"| {_f(r.get('aiq'))} | {_pct(r.get('escalation_rate'))} | {_pct(r.get('needs_frontier_recall'))} "
            f"| {_pct(r.get('needs_frontier_precision'))} | {_pct(r.get('cache_hit_rate'))} "
            f"({_pct(r.get('cache_hit_upper_bound'))}) | {_f(r.get('flaps_per_run'), 2)} "
            f"| {_f(r.get('short_step_latency_s_p95'), 2)} | {_f(r.get('run_completion_s_p95'), 1)} "
            f"| {r.get('runs_rejected', '-')}/{r.get('runs_spilled', '-')} |"
        )
    return out


def _outcome_model_md(card: dict[str, Any]) -> list[str]:
    from training.outcome import parse_variant

    lines = [
        "## Outcome model (how quality and cost are scored)",
        "",
        "Runs with a known weak-model outcome and a known strong-model outcome on the same task are "
        "scored from the per-step tiers each policy chose in the simulator:",
        "",
        "- a run kept local gets the **weak** model's logged outcome;",
        "- a run first sent to the frontier at step *k* gets the **strong** model's outcome (base "
        "variant `escalate-anytime`);",
        "- a run with a rejected step is a failure;",
        "- **cost** is priced per step from the logged token counts: a step on the same tier as the step "
        "before reuses the repeated prefix (free locally, cached-input price at the frontier); a step on a "
        "new tier prefills its whole context. So an escalation at *k* pays the local steps already spent, "
        "the frontier prefill of the whole context at *k*, and the frontier price of the remaining steps. "
        "The strong model's own trajectory after *k* is not observed: its steps are assumed to be the "
        "weak run's sizes.",
        "",
        "Variants (sensitivity):",
        "",
    ]
    for v in card.get("outcome_variants", []):
        lines.append(f"- `{v}`: {parse_variant(v).describe()}")
    return lines + [""]


def render_markdown(card: dict[str, Any], plots: dict[str, dict[str, str]]) -> str:
    L: list[str] = []
    t = card.get("timings", {})
    L += [
        f"# runroute scorecard ({card.get('command', '')})",
        "",
        f"Generated {card.get('generated_at', '')}; wall time {_f(t.get('total_s'), 0)} s.",
        "",
    ]
    sp = card.get("split")
    if sp:
        L += [
            "## What was run",
            "",
            "1. **Import**: the shipped samples `data/*.parquet` (tau-bench airline, tau2 airline, SWE-bench Pro, "
            "Mooncake, Azure, ServeGen) were read and summarised.",
            f"2. **Split by task** ({sp['method']}; seed {sp['seed']}). Held out: **{len(sp['tau2_heldout_tasks'])} "
            f"tau2 airline tasks** ({', '.join(sp['tau2_heldout_tasks'])}), evaluated on their "
            f"{sp['tau2_heldout_runs']} paired gpt-oss-120b runs (weak outcome logged, strong = claude-sonnet-4-5 "
            f"on the same task; {sp.get('tau2_heldout_runs_without_steps', 0)} of them logged no step and cannot be "
            f"replayed); and a **synthetic held-out workload** of {sp['synthetic_heldout']['runs']} runs "
            f"(generator seed {sp['synthetic_heldout']['seed']}). Kept out of training: every run of a held-out "
            f"task id of any source ({sp['excluded_from_training_runs']} runs: "
            + ", ".join(f"{k} {v}" for k, v in sp["excluded_from_training_by_source"].items())
            + f"). Training: {sp['training_runs']} runs / {sp['training_steps']} steps ("
            + ", ".join(f"{k} {v}" for k, v in sp["training_runs_by_source"].items())
            + f"; synthetic seed {sp['synthetic_train']['seed']}). No threshold or knob was tuned on a held-out set: "
            "the bundle's thresholds come from training's out-of-fold probabilities; the sweeps below are reported "
            "whole, never used to pick the learned policy's operating point.",
            "3. **Compared** every policy (the router's own `build_policy` objects) on each held-out set in the "
            "what-if simulator, and a few runs per policy through the live HTTP sidecar with fake backends.",
            "",
            "SWE-bench Pro pairs are run-level outcomes without steps, so they cannot be replayed step by step; "
            "they are not in the comparison.",
            "",
        ]
    tr = card.get("training", {})
    if tr:
        th = tr.get("thresholds", {})
        L += [
            "## Model bundle",
            "",
            f"Bundle `{tr.get('bundle_version')}` in `{tr.get('bundle_dir')}`; thresholds up "
            f"{_f(th.get('p_frontier_up'))} / down {_f(th.get('p_frontier_down'))}.",
        ]
        if tr.get("tracking_uri"):
            ml = tr.get("mlflow") or {}
            L.append(
                f"MLflow tracking: `{tr['tracking_uri']}` (artifacts under `mlruns/` beside it); run "
                f"`{ml.get('run_id', '-')}`, registered as `{ml.get('model_uri', '-')}` (alias champion: "
                f"version {ml.get('champion', '-')}). Browse with `mlflow ui --backend-store-uri {tr['tracking_uri']}`."
            )
        esc = tr.get("escalation") or {}
        if esc:
            L.append(
                "Escalation model (training report): "
                + ", ".join(f"{k} {_f(v)}" for k, v in esc.items() if _num(v))
                + "."
            )
        L.append("")
    pr = card.get("prices", {})
    L += [
        "## Prices (assumptions, one config object: `training.outcome.Prices`)",
        "",
        f"- frontier: input ${pr.get('frontier_in_per_m')}/1M, cached input ${pr.get('frontier_cached_in_per_m')}/1M, "
        f"output ${pr.get('frontier_out_per_m')}/1M tokens (list prices of a Claude-Sonnet-class API);",
        f"- local: ${pr.get('gpu_hour_usd')}/GPU-hour (on-demand A100-80GB class), at "
        f"{pr.get('local_prefill_tokens_per_s')} prefill and {pr.get('local_decode_tokens_per_s')} decode tokens/s "
        f"per GPU = ${_f(pr.get('local_in_per_m'), 4)} per 1M uncached input and ${_f(pr.get('local_out_per_m'), 4)} "
        "per 1M output tokens; cached local prefix free.",
        "- `cost_usd` in the tables is this token-priced outcome-model cost. The simulator's own bill "
        "(`sim_cost_usd`: frontier tokens + always-on GPU-hours of the simulated replicas) is in the JSON.",
        "",
    ]
    L += _outcome_model_md(card)
    variants = card.get("outcome_variants", [])
    for name, s in (card.get("sets") or {}).items():
        sim = s.get("sim", {})
        L += [
            f"## Held-out set `{name}`",
            "",
            f"{s.get('n_runs')} runs, {s.get('n_steps')} steps, {s.get('n_quality_runs')} with both outcomes, "
            f"{s.get('n_needs_frontier')} needs-frontier. Simulated: {sim.get('replicas')} local replicas "
            f"({sim.get('node_profile')}, {sim.get('kv_cache_gb')} GB KV each) + a frontier API; arrivals "
            f"{sim.get('arrivals')}; admission control {'on' if sim.get('admission') else 'off'}; "
            f"short-step SLO {sim.get('slo_short_s')} s.",
            "",
        ]
        L += _table(s.get("policies", []))
        L += [
            "",
            "`cost @95% AF`: the cheapest point of the policy (of its threshold sweep, for learned and "
            "per-step-threshold) whose success reaches 95% of always-frontier's, picked with hindsight on this "
            "set: it describes the curve, it is not the operating point. The rows themselves run the bundle's "
            "training-calibrated thresholds. Costs are totals over the set (USD, outcome model).",
            "",
        ]
        ms = s.get("model_scores") or {}
        esc = ms.get("escalation") if isinstance(ms, dict) else None
        if esc:
            L.append(
                f"Escalation model on this held-out set ({int(esc.get('n', 0))} labelled steps, positive rate "
                f"{_f(esc.get('pos_rate'))}): AUC {_f(esc.get('auc'))}, PR-AUC {_f(esc.get('pr_auc'))}, "
                f"Brier {_f(esc.get('brier'))}, ECE {_f(esc.get('ece'))}."
            )
        elif isinstance(ms, dict) and ms.get("skipped"):
            L.append(f"Escalation model scores: skipped: {ms['skipped']}.")
        pols = s.get("policies", [])
        if (
            pols
            and sim.get("admission")
            and all((r.get("runs_rejected") or 0) == 0 and (r.get("runs_spilled") or 0) == 0 for r in pols)
        ):
            L.append("Admission control was on and shed no run (no rejections, no spills) at this load.")
        le = _rows(s).get("learned")
        target = ((card.get("training") or {}).get("thresholds_report") or {}).get("target_frontier_share")
        if le and _num(target) and _num(le.get("escalation_rate")):
            L.append(
                f"The bundle's thresholds were calibrated in training for {_pct(target)} of runs escalated; "
                f"on this held-out set the learned policy escalated {_pct(le['escalation_rate'])} of runs."
            )
        L.append("")
        p = plots.get(name, {})
        for key in ("frontier", "bars", "latency"):
            if key in p:
                L += [f"![{key} {name}]({p[key]})", ""]
        sw = s.get("sweeps") or {}
        for label, pts in sw.items():
            L.append(
                f"Threshold sweep of `{label}` ({len(pts)} points): "
                + "; ".join(
                    f"{pt['threshold']:.2f}: {_f(pt['success_rate'])} @ {_usd(pt['cost_usd'])}"
                    for pt in pts
                    if _num(pt.get("success_rate"))
                )
                + "."
            )
            L.append("")
        sens = sensitivity(s, variants)
        L += ["### Sensitivity of the ranking to the outcome model", ""]
        L.append(
            "| policy | "
            + " | ".join(f"success `{v}`" for v in variants)
            + " | "
            + " | ".join(f"AIQ `{v}`" for v in variants)
            + " |"
        )
        L.append("|" + "---|" * (1 + 2 * len(variants)))
        for r in s.get("policies", []):
            sv = r.get("success_by_variant") or {}
            av = r.get("aiq_by_variant") or {}
            L.append(
                f"| {r['policy']} | "
                + " | ".join(_f(sv.get(v)) for v in variants)
                + " | "
                + " | ".join(_f(av.get(v)) for v in variants)
                + " |"
            )
        L.append("")
        if variants:
            base = variants[0]
            n_pol = len(s.get("policies", []))
            L.append(
                f"Under `{base}`: by success {ranking_text(sens['by_success'][base])}; by AIQ "
                f"{ranking_text(sens['by_aiq'][base])}. Learned ranks #{sens['learned_success_rank'].get(base)} "
                f"of {n_pol} by success and #{sens['learned_aiq_rank'].get(base)} by AIQ."
            )
            for v, ch in sens.get("success_ranking_changes", {}).items():
                ach = sens["aiq_ranking_changes"][v]
                L.append(
                    f"- `{v}`: success ranking {'changes: ' + ranking_text(sens['by_success'][v]) if ch else 'unchanged'}; "
                    f"AIQ ranking {'changes: ' + ranking_text(sens['by_aiq'][v]) if ach else 'unchanged'}; "
                    f"learned ranks #{sens['learned_success_rank'].get(v)} by success, "
                    f"#{sens['learned_aiq_rank'].get(v)} by AIQ."
                )
            L.append("")
        L += ["### Learned run-stable policy vs each baseline (generated from the numbers above)", ""]
        for line in comparison_lines(s):
            L.append(f"- {line}")
        L.append("")
    rl = card.get("run_level_pairs") or {}
    if rl:
        L += [
            "## Paired runs without steps (run-level bounds only)",
            "",
            "These pairs have outcomes but no step records, so no policy that predicts from a run's prefix can "
            "be replayed on them; the two ends and the oracle bound the room a router has (oracle: escalate "
            "exactly the runs the weak model fails and the strong one solves).",
            "",
            "| pair | runs | always-local success | always-frontier success | oracle success | oracle escalation |",
            "|---|---|---|---|---|---|",
        ]
        for k, v in rl.items():
            L.append(
                f"| {k} | {v['runs']} | {_f(v['always_local_success'])} | {_f(v['always_frontier_success'])} "
                f"| {_f(v['oracle_success'])} | {_pct(v['oracle_escalation_rate'])} |"
            )
        L.append("")
    live = card.get("live") or {}
    L += ["## Live sidecar segment", ""]
    if "skipped" in live:
        L += [f"skipped: {live['skipped']}", ""]
    else:
        L.append(
            f"{len(live.get('runs', []))} held-out synthetic runs per policy (at most "
            f"{live.get('settings', {}).get('max_steps')} steps each, prompts capped at "
            f"{live.get('settings', {}).get('max_prompt_tokens')} tokens) through `router.server.app.create_app` under "
            f"uvicorn on loopback, two fake vLLM replicas and a fake frontier; {live.get('wall_s')} s. The "
            "oracle is not run live (the request path has no labels). Fake backends have their own latency model "
            "(not the simulator's A100 profile), so compare orders of magnitude and cache behaviour, not seconds."
        )
        L.append("")
        syn = _rows((card.get("sets") or {}).get("synthetic-heldout", {}))
        L.append(
            "| policy | live steps | live p95 s | live short p95 s | sim short p95 s | live cache hit (bound) "
            "| sim cache hit (bound) | live escal. | sim escal. | live flaps/run | sim flaps/run |"
        )
        L.append("|" + "---|" * 11)
        for name, f in (live.get("policies") or {}).items():
            sr = syn.get(name, {})
            if "skipped" in f:
                L.append(f"| {name} | skipped: {f['skipped']} |" + " |" * 9)
                continue
            L.append(
                f"| {name} | {f.get('steps')} | {_f(f.get('step_latency_s_p95'))} | {_f(f.get('short_step_latency_s_p95'))} "
                f"| {_f(sr.get('short_step_latency_s_p95'), 2)} | {_pct(f.get('cache_hit_rate'))} "
                f"({_pct(f.get('cache_hit_upper_bound'))}) | {_pct(sr.get('cache_hit_rate'))} "
                f"({_pct(sr.get('cache_hit_upper_bound'))}) | {_pct(f.get('escalation_rate'))} "
                f"| {_pct(sr.get('escalation_rate'))} | {_f(f.get('flaps_per_run'), 2)} | {_f(sr.get('flaps_per_run'), 2)} |"
            )
        L.append("")
    if t:
        L += ["## Timings (s)", "", ", ".join(f"{k} {v}" for k, v in t.items()), ""]
    L += ["## scorecard.json keys", "", SCORECARD_DOC]
    return "\n".join(L)


def write_report(card: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write scorecard.json, the PNGs and report.md into ``out``; returns the written paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    card = _jsonable(card)
    written: dict[str, Path] = {}
    plots: dict[str, dict[str, str]] = {}
    for name, s in (card.get("sets") or {}).items():
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60]
        p: dict[str, str] = {}
        if s.get("policies"):
            plot_frontier(s, name, out / f"frontier_{safe}.png")
            plot_bars(s, name, out / f"bars_{safe}.png")
            plot_latency(
                s,
                card.get("live") if name == "synthetic-heldout" else None,
                name,
                out / f"latency_{safe}.png",
            )
            p = {
                "frontier": f"frontier_{safe}.png",
                "bars": f"bars_{safe}.png",
                "latency": f"latency_{safe}.png",
            }
            for k, v in p.items():
                written[f"{k}_{safe}"] = out / v
        plots[name] = p
    _atomic_write(out / "scorecard.json", (json.dumps(card, indent=2) + "\n").encode())
    written["scorecard"] = out / "scorecard.json"
    _atomic_write(out / "report.md", render_markdown(card, plots).encode())
    written["report"] = out / "report.md"
    return written


def print_scorecard(card: dict[str, Any], console: Any = None) -> None:
    """One rich table per set: the headline figures of every policy."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    for name, s in (card.get("sets") or {}).items():
        tab = Table(
            title=f"scorecard: {name} ({s.get('n_runs')} runs, {s.get('n_quality_runs')} with both outcomes)"
        )
        for col in (
            "policy",
            "success",
            "cost $",
            "cost@95%AF $",
            "AIQ",
            "escal.",
            "recall",
            "prec.",
            "cache hit (max)",
            "flaps/run",
            "short p95 s",
            "run p95 s",
            "rej/spill",
        ):
            tab.add_column(col, justify="left" if col == "policy" else "right")
        for r in s.get("policies", []):
            tab.add_row(
                r["policy"],
                f"{_f(r.get('success_rate'))}±{_f(r.get('success_se'), 2)}",
                _usd(r.get("cost_usd")),
                _usd(r.get("cost_at_95pct_frontier_success_usd")),
                _f(r.get("aiq")),
                _pct(r.get("escalation_rate")),
                _pct(r.get("needs_frontier_recall")),
                _pct(r.get("needs_frontier_precision")),
                f"{_pct(r.get('cache_hit_rate'))} ({_pct(r.get('cache_hit_upper_bound'))})",
                _f(r.get("flaps_per_run"), 2),
                _f(r.get("short_step_latency_s_p95"), 2),
                _f(r.get("run_completion_s_p95"), 1),
                f"{r.get('runs_rejected', '-')}/{r.get('runs_spilled', '-')}",
            )
        con.print(tab)
    live = card.get("live") or {}
    if "skipped" in live:
        con.print(f"live sidecar segment skipped: {live['skipped']}")
    elif live.get("policies"):
        tab = Table(
            title=f"live sidecar + fake backends ({len(live.get('runs', []))} runs per policy, {live.get('wall_s')} s)"
        )
        for col in (
            "policy",
            "steps",
            "p95 s",
            "short p95 s",
            "cache hit (max)",
            "escal.",
            "flaps/run",
            "errors",
        ):
            tab.add_column(col, justify="left" if col == "policy" else "right")
        for name, f in live["policies"].items():
            if "skipped" in f:
                tab.add_row(name, "skipped", "", "", "", "", "", "")
                continue
            tab.add_row(
                name,
                str(f.get("steps")),
                _f(f.get("step_latency_s_p95")),
                _f(f.get("short_step_latency_s_p95")),
                f"{_pct(f.get('cache_hit_rate'))} ({_pct(f.get('cache_hit_upper_bound'))})",
                _pct(f.get("escalation_rate")),
                _f(f.get("flaps_per_run"), 2),
                str(f.get("errors")),
            )
        con.print(tab)
    for name, s in (card.get("sets") or {}).items():
        con.print(f"[bold]{name}: learned vs baselines[/bold]")
        for line in comparison_lines(s):
            con.print("  " + line.replace("**", ""))
