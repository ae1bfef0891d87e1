"""The what-if report on the shipped traces: replicas by search, KV tiers and formats, disaggregation
break-even, prompt-lookup speculative decoding. Writes a JSON and two PNGs and prints every figure.

Usage::

    .venv/bin/python bench/whatif_report.py [--out runroute-report/whatif] [--gpu a100] [--quick]

Sections (each a set of ordinary what-if points through ``router.sim.points.run_points``):

1. **Fewest replicas** (``router.sim.search.find``) holding ``--slo`` (``ttft_p95@<=8k=2s``: TTFT of the
   steps whose prompt fits 8k tokens) on the Mooncake conversation trace (the full hour from
   ``../shared/data/mooncake`` when present, else the shipped 20-minute sample), per policy, each probe
   with a ``--level`` interval (``--boot`` run-bootstrap replicates; trace arrivals are fixed, so one
   seed), the answer on the interval's upper bound, the range inside the noise, the SLO floors with
   their cause (``router.sim.slo.floors``), the capacity pre-check and its warnings; frontier-only
   policies answer 0 replicas.
2. **KV tiers and formats** on the same trace at the operating point the question is asked: each
   policy's answered replica count from section 1 (``--kv-replicas`` overrides), session-sticky and
   always-local: GPU-only fp16 vs a CPU tier of 4x the GPU KV, fp8, 2-bit (int2), fp8 + the CPU tier:
   hit rate (all tiers and per tier), short-step / TTFT / step p95 with intervals; then per variant
   the fewest replicas holding ``--slo2`` (default the same SLO) by bisection with intervals, and which
   variants' answers are indistinguishable; the KV-format accuracy note.
3. **Disaggregation break-even** (``router.sim.breakeven.sweep``): the synthetic table over context
   length x burstiness x link bandwidth x TPOT SLO, and the same comparison on the Mooncake trace.
4. **Speculative decoding**: the measured prompt-lookup acceptance per step kind
   (``router/sim/prompt_lookup_acceptance.json``), then the tau-bench and tau2-bench airline samples
   replayed on one replica (Poisson run starts at ``--spec-load`` of its capacity) with decoding
   plain, prompt lookup (measured) and EAGLE-style at assumed acceptance 0.6 and 0.8: short-step
   p95 and run completion p50/p95, and their speed-ups.

``--quick`` cuts every workload (for a smoke run); the figures in the report come from a full run.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MOONCAKE_FULL = Path("/work/shared/data/mooncake/conversation_trace.jsonl")

# the speculative-decoding figures: row key -> (measured key, speed-up key); run p50 is an extra target
SPEC_FIGURES = {
    "short_step_latency_s_p95": ("short_p95", "speedup_short_step_p95"),
    "run_completion_s_p50": ("run_p50", "speedup_run_completion_p50"),
    "run_completion_s_p95": ("run_p95", "speedup_run_completion_p95"),
}


def load_mooncake(quick: bool) -> tuple[Any, str]:
    from features.runlog import RunLog, read_runlog
    from features.samples import sample_path

    if MOONCAKE_FULL.exists() and not quick:
        from features.importers.mooncake import import_mooncake

        return RunLog.from_frame(import_mooncake(MOONCAKE_FULL)), str(MOONCAKE_FULL)
    p = sample_path("mooncake_20min.parquet")
    return read_runlog([p]), str(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runroute-report/whatif"))
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--slo", default="ttft_p95@<=8k=2s", help="the SLO of the searches (router.sim.slo)")
    ap.add_argument(
        "--kv-cache-gb", type=float, default=None, help="KV per replica (default: derived from the profile)"
    )
    ap.add_argument("--slo2", default=None, help="the SLO of the per-variant searches (default --slo)")
    ap.add_argument("--boot", type=int, default=200, help="run-bootstrap replicates per simulation")
    ap.add_argument("--level", type=float, default=0.9, help="the intervals' coverage")
    ap.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="arrival seeds of the sections with random arrivals (3: break-even cells, 4: spec decoding); "
        "sections 1-2 replay the trace's fixed start times (one seed)",
    )
    ap.add_argument("--kv-replicas", type=int, nargs="*", default=None)
    ap.add_argument("--spec-load", type=float, default=0.5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--sections", default="1,2,3,4", help="sections to (re)run; the others are kept from --out"
    )
    args = ap.parse_args()
    secs = {int(x) for x in args.sections.split(",") if x}

    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from features.samples import sample_path
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.breakeven import SweepConfig, plot_breakeven, sweep, trace_cells
    from router.sim.points import Point, run_points
    from router.sim.precheck import capacity_check, warning_lines
    from router.sim.profiles import load_profile
    from router.sim.search import find, indistinguishable
    from router.sim.search_report import precheck_lines, render_search
    from router.sim.simconfig import kv_quant_note
    from router.sim.slo import SLO, Target, floor_lines, floors, parse_slo
    from router.sim.specdec import eagle, load_acceptance, prompt_lookup
    from router.sim.whatif import SimConfig, Workload

    con = Console(width=160)
    t_all = time.perf_counter()
    prof = load_profile(None, args.gpu)
    kv_gb = args.kv_cache_gb or prof.default_kv_cache_gb() or 16.0
    slo = parse_slo(args.slo)
    slo2 = parse_slo(args.slo2) if args.slo2 else slo
    unc = {"n_boot": args.boot, "level": args.level}
    base = SimConfig(profile=prof, kv_cache_gb=kv_gb, slo_short_s=slo.short_p95_s or 5.0)
    report: dict[str, Any] = {"node_profile": prof.name, "kv_cache_gb": kv_gb, "quick": args.quick}
    old = args.out.with_suffix(".json")
    if secs != {1, 2, 3, 4} and old.exists():
        report = {**json.loads(old.read_text()), **report}
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=con, transient=True) as prog:
        task = prog.add_task("what-if points", total=None)

        def tick(r: Any) -> None:
            c = r.scorecard
            prog.update(task, advance=1, description=f"{r.label} x{c['replicas']}: {r.wall_s:.1f}s")

        # 1. fewest replicas by search --------------------------------------------------------------
        log, src = load_mooncake(args.quick)
        work = Workload.from_runlog(log, limit_runs=600 if args.quick else None)
        starts = run_starts("trace", len(work.runs), logged_starts=work.logged_starts())
        check = capacity_check(work, starts, base, [1, 2, 4, 8])
        pols = {
            k: functools.partial(build_policy, k)
            for k in ("always-local", "session-sticky", "always-frontier")
        }
        if 1 in secs:
            found = find(
                work, pols, base, starts, slo, start=check["suggested_start_replicas"], progress=tick, **unc
            )
            found["capacity_check"] = check
            found["slo_floors"] = floors(work, prof, slo)
            found["capacity_warnings"] = warning_lines(check, slo.short_p95_s) + floor_lines(
                found["slo_floors"]
            )
            found["trace"] = src
            report["fewest_replicas"] = found

        # 2. KV tiers and formats --------------------------------------------------------------------
        if 2 in secs:
            start = check["suggested_start_replicas"]
            answered = {
                e["policy"]: e["replicas"] for e in report["fewest_replicas"]["results"] if e["replicas"]
            }
            for e in report["fewest_replicas"]["results"]:  # no answer: the probe that came closest
                if not e["replicas"] and e["probes"] and e["policy"] not in answered:
                    best = min(e["probes"], key=lambda p: p.get("worst_value_s") or float("inf"))
                    answered[e["policy"]] = int(best["value"])
            # the operating point where the question is asked: each policy's answered count
            counts_of = {
                pol: args.kv_replicas or [answered.get(pol) or start]
                for pol in ("session-sticky", "always-local")
            }
            variants = {
                "gpu-fp16": {},
                "gpu-fp16+cpu4x": {"cpu_kv_x": 4.0},
                "gpu-fp8": {"kv_dtype": "fp8"},
                "gpu-int2": {"kv_dtype": "int2"},
                "gpu-fp8+cpu4x": {"kv_dtype": "fp8", "cpu_kv_x": 4.0},
            }
            pts = [
                Point(work, replace(base, replicas=n, **kw), pols[pol], pol, starts, tag=name, slo=slo, **unc)
                for pol in ("session-sticky", "always-local")
                for n in counts_of[pol]
                for name, kw in variants.items()
            ]
            kv_rows = []
            for p, r in zip(pts, run_points(pts, progress=tick), strict=True):
                c, d = r.scorecard, r.details
                kv_rows.append(
                    {
                        "variant": p.tag,
                        "policy": p.label,
                        "replicas": p.config.replicas,
                        "kv_blocks_per_replica": d["kv_blocks_per_replica"],
                        "cache_hit_rate": c["cache_hit_rate"],
                        "cache_hit_rate_gpu": d.get("cache_hit_rate_gpu", c["cache_hit_rate"]),
                        "cache_hit_rate_cpu": d.get("cache_hit_rate_cpu"),
                        "cache_hit_upper_bound": c["cache_hit_upper_bound"],
                        "short_step_latency_s_p95": c["short_step_latency_s_p95"],
                        "ttft_s_p95": c["ttft_s_p95"],
                        "step_latency_s_p95": c["step_latency_s_p95"],
                        "run_completion_s_p50": c["run_completion_s_p50"],
                        "accuracy_note": kv_quant_note(p.config.kv_dtype),
                        "intervals": d.get("intervals"),
                        "slo": d.get("slo"),
                    }
                )
            local = {k: pols[k] for k in ("always-local", "session-sticky")}
            by_variant = {}
            every = []
            for name, kw in variants.items():
                s0 = answered.get("always-local") or start
                res = find(work, local, replace(base, **kw), starts, slo2, start=s0, progress=tick, **unc)
                by_variant[name] = [
                    {
                        k: e.get(k)
                        for k in (
                            "policy",
                            "replicas",
                            "optimistic",
                            "interval_at_answer",
                            "simulations",
                            "floor_s",
                            "floor_metric",
                            "frontier_only",
                        )
                    }  # fmt: skip
                    for e in res["results"]
                ]
                every += [{**e, "policy": f"{e['policy']} {name}"} for e in res["results"]]
            report["kv_tiers_and_formats"] = {
                "trace": src,
                "cpu_kv_gbps": base.cpu_kv_gbps,
                "operating_points": counts_of,
                "rows": kv_rows,
                "fewest_replicas": {
                    "slo": slo2.describe(),
                    "by_variant": by_variant,
                    "indistinguishable": indistinguishable(every),
                },
            }

        # 3. disaggregation break-even ---------------------------------------------------------------
        if 3 in secs:
            be_unc = {"seeds": args.seeds, "n_boot": args.boot, "level": args.level}
            sc = (
                SweepConfig(requests=120, contexts=(2048, 32768), link_gbps=(1.0, 100.0), **be_unc)
                if args.quick
                else SweepConfig(**be_unc)
            )
            be = sweep(base, sc, progress=tick)
            gpus = 16 if not args.quick else 4
            be["trace"] = trace_cells(
                work, starts, replace(base, slo_ttft_s=5.0, slo_tpot_s=0.1), gpus, [gpus // 4, gpus // 2, 3 * gpus // 4],
                sc.link_gbps, "mooncake", n_boot=args.boot, level=args.level, progress=tick,
            )  # fmt: skip
            report["disaggregation"] = be

        # 4. speculative decoding --------------------------------------------------------------------
        if 4 in secs:
            acc = load_acceptance()
            spec_rows = []
            for sample in ("taubench_airline.parquet", "tau2bench_airline.parquet"):
                from features.runlog import read_runlog

                w = Workload.from_runlog(
                    read_runlog([sample_path(sample)]), limit_runs=60 if args.quick else None
                )
                probe = capacity_check(w, np.zeros(len(w.runs)), replace(base, replicas=1))
                gpu_s = (
                    probe["load_factor_1_replica"] * probe["horizon_s"]
                )  # GPU-seconds of the whole workload
                rate = args.spec_load * len(w.runs) / gpu_s
                st = run_starts(f"rate={rate}", len(w.runs), seed=0)
                more = tuple(run_starts(f"rate={rate}", len(w.runs), seed=k) for k in range(1, args.seeds))
                spec_slo = SLO(targets=(Target("run", 50.0, 1.0),))  # run p50 with an interval
                modes = {
                    "off": None,
                    "prompt-lookup": prompt_lookup(),
                    "eagle-0.6": eagle(0.6),
                    "eagle-0.8": eagle(0.8),
                }
                ps = [
                    Point(
                        w,
                        replace(base, replicas=1, spec=m),
                        pols["always-local"],
                        name,
                        st,
                        tag=sample,
                        slo=spec_slo,
                        seed_starts=more,
                        keep_replicates=True,
                        **unc,
                    )  # fmt: skip
                    for name, m in modes.items()
                ]
                res = run_points(ps, progress=tick)
                spec_rows += spec_table(sample, rate, ps, res, args.level)
            cfg0 = acc["configs"][acc["default"]]
            report["speculative_decoding"] = {
                "seeds": args.seeds,
                "interval_level": args.level,
                "boot": args.boot,
                "prompt_lookup_acceptance": {
                    "params": {
                        k: cfg0[k]
                        for k in ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens")
                    },
                    "kinds": cfg0["kinds"],
                    "other_configs": [
                        {k: c[k] for k in c if k != "per_file"} for c in acc["configs"] if c is not cfg0
                    ],
                    "provenance": acc["provenance"],
                },
                "eagle_note": "EAGLE acceptance 0.6 / 0.8 are parameters (assumed), not measurements",
                "rows": spec_rows,
            }
    report["wall_s"] = round(time.perf_counter() - t_all, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    js = args.out.with_suffix(".json")
    js.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    plot_report(report, args.out.with_suffix(".png"))
    plot_breakeven(report["disaggregation"], args.out.parent / (args.out.name + "_breakeven.png"))
    print_report(report, con, precheck_lines, render_search)
    con.print(
        f"wrote {js}, {args.out.with_suffix('.png')}, {args.out.parent / (args.out.name + '_breakeven.png')}"
    )


def spec_table(sample: str, rate: float, ps: list[Any], res: list[Any], level: float) -> list[dict[str, Any]]:
    """One row per decoding mode of one trace: each figure (short-step p95, run completion p50 / p95)
    with its interval (seeds + run bootstrap: the value is the median over seeds), its speed-up over
    plain decoding with a paired interval (the same runs, start times and draws:
    :func:`router.sim.slo.paired`), ``indistinguishable``: the figures whose speed-up interval holds
    1 (no change), and ``intervals_overlap``: those whose interval overlaps plain decoding's (the
    unpaired rule, :func:`router.sim.slo.overlap`; it ignores that both served the same runs)."""
    from router.sim.slo import overlap, paired

    def ivs(r: Any) -> dict[str, dict[str, Any]]:
        d = r.details
        slo_m = d.get("slo") or {}
        out = {}
        for fig, (key, _) in SPEC_FIGURES.items():
            m = slo_m.get(key) or (d.get("intervals") or {}).get(fig) or {}
            v = m.get("value") if m else r.scorecard[fig]
            out[fig] = {"value": v, "lo": m.get("lo", v), "hi": m.get("hi", v)}
        return out

    off_r = res[0]
    off = ivs(off_r)
    rows = []
    for p, r in zip(ps, res, strict=True):
        mine = ivs(r)
        row: dict[str, Any] = {"trace": sample, "mode": p.label, "run_starts_per_s": round(rate, 5)}
        row.update({fig: m["value"] for fig, m in mine.items()})
        row["intervals"] = mine
        for fig, (key, name) in SPEC_FIGURES.items():
            if off_r.replicates and r.replicates:
                sp = paired([s[key] for s in off_r.replicates], [s[key] for s in r.replicates], _div, level)
            else:  # no replicates: the point values, no interval
                v = _ratio(off[fig]["value"], mine[fig]["value"])
                sp = {"value": v, "lo": v, "hi": v}
            row[name] = sp["value"]
            row[name + "_interval"] = sp
        same = p.label == off_r.label
        # indistinguishable: the paired speed-up's interval holds 1 (no change); intervals_overlap: the
        # unpaired rule (the two figures' intervals overlap), which ignores that both served the same runs
        row["indistinguishable"] = (
            []
            if same
            else [
                f
                for f, (_, n) in SPEC_FIGURES.items()
                if (iv := row[n + "_interval"])["lo"] is not None and iv["lo"] <= 1.0 <= iv["hi"]
            ]
        )
        row["intervals_overlap"] = [] if same else [f for f in SPEC_FIGURES if overlap(off[f], mine[f])]
        rows.append(row)
    return rows


def _div(a: Any, b: Any) -> Any:
    return a / b


def _answer_text(e: dict[str, Any]) -> str:
    """One search answer in words: the count (frontier only: 0), its noise range and interval, or why none."""
    if e["replicas"] is None:
        why = (
            f"{e.get('floor_metric')} stopped improving at {e['floor_s']:.2f} s (a floor)"
            if e.get("floor_s") is not None
            else "not met up to the largest count searched"
        )
        return f"no replica count holds it ({why}; {e['simulations']} simulations)"
    if e.get("frontier_only"):
        return f"0 replicas (frontier only; {e['simulations']} simulations)"
    iv = "; ".join(
        f"{k} {m['value']:.2f} s [{m['lo']:.2f}, {m['hi']:.2f}]"
        for k, m in (e.get("interval_at_answer") or {}).items()
        if m["value"] is not None
    )
    rng = (
        f", {e['optimistic']:g}-{e['replicas']:g} inside the noise"
        if e.get("optimistic") is not None and e["optimistic"] < e["replicas"]
        else ""
    )
    return f"{e['replicas']} replicas on the upper bound ({iv}{rng}; {e['simulations']} simulations)"


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def _fig(row: dict[str, Any], key: str, nd: int = 2, pct: bool = False) -> str:
    """A row's figure with its interval: ``row["intervals"][key]`` or ``row[key + "_interval"]``."""
    v = row.get(key)
    m = (row.get("intervals") or {}).get(key) or row.get(key + "_interval") or {}
    if v is None:
        return "-"
    k = 100.0 if pct else 1.0
    out = f"{k * v:.{1 if pct else nd}f}{'%' if pct else ''}"
    if m.get("lo") is None:
        return out
    return out + f" [{k * m['lo']:.{1 if pct else nd}f}, {k * m['hi']:.{1 if pct else nd}f}]"


def _gain(r: dict[str, Any]) -> str:
    g = r.get("goodput_gain_interval") or {}
    out = f"{100 * r['goodput_gain']:+.1f}"
    return out if g.get("lo") is None else out + f" [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _pct_iv(r: dict[str, Any], key: str) -> str:
    """A row's hit rate with its seed + run-bootstrap interval when the point measured one."""
    iv = (r.get("intervals") or {}).get(key) or {}
    if r.get(key) is None or iv.get("lo") is None:
        return _pct(r.get(key))
    return f"{_pct(r[key])} [{100 * iv['lo']:.1f}, {100 * iv['hi']:.1f}]"


def print_report(rep: dict[str, Any], con: Any, precheck_lines: Any, render_search: Any) -> None:
    from rich.table import Table

    f = rep["fewest_replicas"]
    con.print(f"[bold]1. Fewest replicas[/bold] on {f['trace']}", highlight=False)
    for line in precheck_lines(f["capacity_check"]) + f["capacity_warnings"]:
        con.print(line, highlight=False)
    render_search(f, con)
    kv = rep["kv_tiers_and_formats"]
    t = Table(title=f"2. KV tiers and formats (CPU tier {kv['cpu_kv_gbps']:g} GB/s)")
    for c in (
        "repl",
        "policy",
        "variant",
        "blocks",
        "hit",
        "GPU hit",
        "CPU hit",
        "hit max",
        "short p95",
        "TTFT p95",
        "step p95",
    ):
        t.add_column(c, justify="left" if c in ("policy", "variant") else "right")
    for r in kv["rows"]:
        t.add_row(
            str(r["replicas"]), r["policy"], r["variant"], str(r["kv_blocks_per_replica"]), _pct_iv(r, "cache_hit_rate"),
            _pct_iv(r, "cache_hit_rate_gpu" if r["cache_hit_rate_cpu"] is not None else "cache_hit_rate"), _pct_iv(r, "cache_hit_rate_cpu"), _pct(r["cache_hit_upper_bound"]),
            f"{r['short_step_latency_s_p95']:.2f}", f"{r['ttft_s_p95']:.2f}", f"{r['step_latency_s_p95']:.2f}",
        )  # fmt: skip
    con.print(t)
    fr = kv["fewest_replicas"]
    for name, es in fr["by_variant"].items():
        for e in es:
            con.print(f"  {name}, {e['policy']}: {_answer_text(e)}", highlight=False)
    for pair in fr.get("indistinguishable", []):
        a, b = pair["a"], pair["b"]
        con.print(
            f"  indistinguishable: {a['policy']} ({pair['range_a'][0]:g}-{pair['range_a'][1]:g}) vs {b['policy']} "
            f"({pair['range_b'][0]:g}-{pair['range_b'][1]:g}): the ranges overlap",
            highlight=False,
        )
    for note in sorted({r["accuracy_note"] for r in kv["rows"] if r["accuracy_note"]}):
        con.print(f"NOTE: {note}", highlight=False)
    be = rep["disaggregation"]
    t = Table(
        title=f"3. Disaggregation break-even ({be['sweep']['gpus']} GPUs, {be['simulations']} simulations)"
    )
    for c in ("ctx", "CV", "link GB/s", "TPOT SLO", "co goodput", "co TTFT p95", "co TPOT p95", "best P:D",
              "dis goodput", "dis TTFT p95", "dis TPOT p95", "gain pp", "winner"):  # fmt: skip
        t.add_column(c, justify="right")
    for r in be["rows"]:
        c, d = r["colocated"], r["disagg_best"]
        t.add_row(
            str(r["context_tokens"]), f"{r['burstiness_cv']:g}", f"{r['link_gbps']:g}", f"{r['slo_tpot_s']:g}",
            _fig(c, "goodput_share", pct=True), _fig(c, "ttft_s_p95"), _fig(c, "tpot_s_p95", 3),
            f"{d['prefill_replicas']}:{d['decode_replicas']}", _fig(d, "goodput_share", pct=True), _fig(d, "ttft_s_p95"),
            _fig(d, "tpot_s_p95", 3), _gain(r), r["winner"],
        )  # fmt: skip
    con.print(t)
    for r in be["trace"]["rows"]:
        c, d = r["colocated"], r["disagg_best"]
        con.print(
            f"Mooncake trace on {r['gpus']} GPUs, link {r['link_gbps']:g} GB/s: co-located goodput {_fig(c, 'goodput_share', pct=True)} "
            f"(short p95 {_fig(c, 'short_step_latency_s_p95')} s) vs best split {d['prefill_replicas']}:{d['decode_replicas']} "
            f"{_fig(d, 'goodput_share', pct=True)} (short p95 {_fig(d, 'short_step_latency_s_p95')} s), gain {_gain(r)} pp: {r['winner']}",
            highlight=False,
        )
    sp = rep["speculative_decoding"]
    a = sp["prompt_lookup_acceptance"]
    con.print(
        f"[bold]4. Prompt-lookup acceptance[/bold] {a['params']} (measured, {a['provenance']['tokens']})",
        highlight=False,
    )
    for kd, k in a["kinds"].items():
        con.print(
            f"  {kd}: acceptance {k['acceptance_rate']:.3f}, {k['tokens_per_iteration']:.3f} tokens/iteration, "
            f"{k['proposed_per_iteration']:.2f} drafts verified/iteration over {k['steps']} steps ({k['output_tokens']} tokens)",
            highlight=False,
        )
    t = Table(title="Speculative decoding speed-up (1 replica)")
    for c in (
        "trace",
        "mode",
        "short p95 s",
        "run p50 s",
        "run p95 s",
        "x short p95",
        "x run p50",
        "x run p95",
        "indistinguishable from off",
    ):
        t.add_column(c, justify="left" if c in ("trace", "mode") else "right")
    for r in sp["rows"]:
        t.add_row(
            r["trace"], r["mode"], _fig(r, "short_step_latency_s_p95", 3), _fig(r, "run_completion_s_p50", 1),
            _fig(r, "run_completion_s_p95", 1), _fig(r, "speedup_short_step_p95"), _fig(r, "speedup_run_completion_p50"),
            _fig(r, "speedup_run_completion_p95"), ", ".join(r.get("indistinguishable") or []) or "-",
        )  # fmt: skip
    con.print(t)
    con.print(
        f"intervals: {100 * (sp.get('interval_level') or 0.9):.0f}%, {sp.get('seeds', 1)} arrival seeds x "
        f"{sp.get('boot', 0)} run-bootstrap replicates; speed-ups paired (same runs, starts and draws); "
        "indistinguishable: the figures whose speed-up interval holds 1.0",
        highlight=False,
    )
    con.print(f"report wall time {rep['wall_s']} s", highlight=False)


def plot_report(rep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(19, 11))
    (a1, a2), (a4, a3) = axes
    f = rep["fewest_replicas"]
    targets = f["slo_targets"]["targets"]
    for e in f["results"]:
        pts = []
        for p in sorted(e["probes"], key=lambda p: p["value"]):
            k = p.get("worst_target")
            m = (p.get("slo") or {}).get(k) if k else None
            if m is None or m["value"] is None:
                continue
            pts.append((p["value"], m["value"], m["lo"], m["hi"]))
        if not pts:
            continue
        lab = f"{e['policy']}: {'0 (frontier only)' if e.get('frontier_only') else e['replicas'] or 'none'}"
        ln = a1.errorbar(
            [x[0] for x in pts],
            [x[1] for x in pts],
            yerr=[[x[1] - x[2] for x in pts], [x[3] - x[1] for x in pts]],
            marker="o",
            capsize=3,
            label=f"{lab} ({e['simulations']} sims)",
        )
        ans = e["replicas"]
        if ans is not None:
            at = next((x for x in pts if x[0] == (ans or 1)), None)
            if at is not None:
                a1.scatter([ans], [at[1]], s=300, marker="*", color=ln[0].get_color(), zorder=5)
    for t, v in targets.items():
        a1.axhline(v, color="grey", ls="--", lw=1.2, label=f"SLO {t} = {v:g} s")
    for fl in f.get("slo_floors", []):
        if fl.get("floor_s_perfect_cache") is not None:
            a1.axhline(fl["floor_s_perfect_cache"], color="k", ls=":", lw=1.2,
                       label=f"floor {fl['target']} {fl['floor_s_perfect_cache']:.2f} s (no queueing)")  # fmt: skip
    lvl = f.get("interval_level") or 0.9
    a1.set(
        yscale="log",
        xlabel="local replicas",
        ylabel=f"SLO metric, s (log; bars {100 * lvl:.0f}% interval)",
        title=f"1. Replica search: {f['slo']} (answers starred)",
    )
    a1.legend(fontsize=7)
    kv = rep["kv_tiers_and_formats"]
    rows = [r for r in kv["rows"] if r["policy"] == "session-sticky"]
    x = range(len(rows))
    gpu = [100 * (r["cache_hit_rate_gpu"] or 0) for r in rows]
    cpu = [100 * (r["cache_hit_rate_cpu"] or 0) for r in rows]
    a2.bar(x, gpu, label="GPU hit %")
    a2.bar(x, cpu, bottom=gpu, label="CPU-tier hit %")
    a2.plot(x, [100 * (r["cache_hit_upper_bound"] or 0) for r in rows], "k--", label="upper bound %")
    # the total hit rate's seed + run-bootstrap interval on top of each stacked bar
    hit_iv = [(r.get("intervals") or {}).get("cache_hit_rate") or {} for r in rows]
    tops = [g + c for g, c in zip(gpu, cpu, strict=True)]
    a2.errorbar(
        list(x),
        tops,
        yerr=[
            [
                max(t - 100 * (iv.get("lo") if iv.get("lo") is not None else t / 100), 0)
                for t, iv in zip(tops, hit_iv, strict=True)
            ],
            [
                max(100 * (iv.get("hi") if iv.get("hi") is not None else t / 100) - t, 0)
                for t, iv in zip(tops, hit_iv, strict=True)
            ],
        ],
        fmt="none",
        ecolor="k",
        capsize=4,
        label=f"hit {100 * lvl:.0f}% interval",
    )
    a2.set_xticks(list(x), [r["variant"] for r in rows], rotation=20, fontsize=8)
    n_op = rows[0]["replicas"] if rows else 0
    a2.set(
        ylabel="cross-turn cache hit (%)",
        title=f"2. KV tiers and formats (session-sticky at its answer or closest probe, x{n_op})",
    )
    ax2 = a2.twinx()
    key = next(iter(targets))
    ys, lo, hi = [], [], []
    for r in rows:
        m = (r.get("slo") or {}).get(key) or {
            "value": r["ttft_s_p95"],
            "lo": r["ttft_s_p95"],
            "hi": r["ttft_s_p95"],
        }
        ys.append(m["value"] or 0)
        lo.append((m["value"] or 0) - (m["lo"] or 0))
        hi.append((m["hi"] or 0) - (m["value"] or 0))
    ax2.errorbar(
        list(x), ys, yerr=[lo, hi], fmt="ro-", capsize=4, label=f"{key} (s, {100 * lvl:.0f}% interval)"
    )
    ax2.axhline(targets[key], color="r", ls="--", lw=1, label=f"SLO {targets[key]:g} s")
    for fl in f.get("slo_floors", []):  # the target's no-queueing floor: no KV variant gets below it
        if fl.get("target") == key and fl.get("floor_s_perfect_cache") is not None:
            ax2.axhline(fl["floor_s_perfect_cache"], color="k", ls=":", lw=1.2,
                        label=f"floor {fl['floor_s_perfect_cache']:.2f} s (no queueing)")  # fmt: skip
    a2.set_ylim(0, 125)  # room above the bars for the two legends
    ax2.set_ylim(0, 1.6 * max([targets[key], *(y + h for y, h in zip(ys, hi, strict=True))]))
    ax2.set_ylabel(f"{key} (s)")
    a2.legend(loc="upper left", fontsize=8, ncol=2)
    ax2.legend(loc="upper right", fontsize=8, ncol=2)
    fr = kv["fewest_replicas"]
    names = list(fr["by_variant"])
    for j, pol in enumerate(("always-local", "session-sticky")):
        for i, name in enumerate(names):
            e = next((e for e in fr["by_variant"][name] if e["policy"] == pol), None)
            if e is None:
                continue
            y = i + (0.15 if j else -0.15)
            c = f"C{j}"
            if e["replicas"] is None:
                a4.scatter([0], [y], marker="x", color=c)
                a4.annotate("none (floor)", (0.5, y), fontsize=7, color=c, va="center")
                continue
            lo_v = e.get("optimistic") or e["replicas"]
            a4.plot([lo_v, e["replicas"]], [y, y], color=c, lw=6, alpha=0.4)
            a4.scatter([e["replicas"]], [y], color=c, marker="*", s=120, label=pol if i == 0 else None)
    a4.set_yticks(range(len(names)), names, fontsize=8)
    a4.set(
        xlabel="fewest replicas (star: upper bound meets the SLO; bar: range inside the noise)",
        title=f"2b. Per-variant answers: {fr['slo']}",
    )
    a4.legend(fontsize=8)
    a4.grid(True, axis="x", alpha=0.3)
    plot_spec(a3, rep["speculative_decoding"])
    fig.suptitle(f"runroute what-if report ({rep['node_profile']}, {rep['kv_cache_gb']:g} GB KV per replica)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _yerr(ms: list[dict[str, Any]]) -> list[list[float]]:
    """``errorbar``'s yerr of intervals ``{value, lo, hi}`` (none measured: zero length)."""
    lo = [max(m["value"] - (m["lo"] if m.get("lo") is not None else m["value"]), 0.0) for m in ms]
    hi = [max((m["hi"] if m.get("hi") is not None else m["value"]) - m["value"], 0.0) for m in ms]
    return [lo, hi]


def plot_spec(ax: Any, spec: dict[str, Any]) -> None:
    """Panel 4: per trace and mode the short-step p95 speed-up over plain decoding (bar) and the run
    completion p50 speed-up (x), each with its paired interval; a hatched bar is a mode whose short-step
    p95 speed-up interval holds 1 (indistinguishable from plain decoding), a hollow o the same for run p50."""
    sp = spec["rows"]
    traces = sorted({r["trace"] for r in sp})
    modes = [m for m in dict.fromkeys(r["mode"] for r in sp) if m != "off"]
    w = 0.8 / max(len(modes), 1)
    lvl = spec.get("interval_level") or 0.9
    for i, m in enumerate(modes):
        rs = [next(r for r in sp if r["trace"] == t and r["mode"] == m) for t in traces]
        xs = [j + i * w for j in range(len(traces))]
        bars = [
            r.get("speedup_short_step_p95_interval") or {"value": r["speedup_short_step_p95"]} for r in rs
        ]
        runs = [
            r.get("speedup_run_completion_p50_interval") or {"value": r["speedup_run_completion_p50"]}
            for r in rs
        ]
        same = ["short_step_latency_s_p95" in (r.get("indistinguishable") or []) for r in rs]
        b = ax.bar(xs, [m_["value"] for m_ in bars], w, label=f"{m}: short-step p95", alpha=0.85)
        for rect, eq in zip(b, same, strict=True):
            if eq:
                rect.set_hatch("//")
                rect.set_edgecolor("0.3")
        ax.errorbar(xs, [m_["value"] for m_ in bars], yerr=_yerr(bars), fmt="none", ecolor="k", capsize=3)
        xr = [x + w / 4 for x in xs]
        ax.errorbar(
            xr, [m_["value"] for m_ in runs], yerr=_yerr(runs), fmt="none", ecolor="0.35", capsize=2, lw=1
        )
        for x, m_, r in zip(xr, runs, rs, strict=True):
            eq = "run_completion_s_p50" in (r.get("indistinguishable") or [])
            ax.scatter([x], [m_["value"]], marker="x" if not eq else "o", s=30, zorder=4,
                       color="k", facecolors="none" if eq else "k")  # fmt: skip
        for x, m_ in zip(xs, bars, strict=True):
            if m_.get("hi") is not None:
                ax.text(x, m_["hi"] + 0.04, f"{m_['value']:.2f}\n[{m_['lo']:.2f},\n{m_['hi']:.2f}]",
                        ha="center", va="bottom", fontsize=6)  # fmt: skip
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="1.0: plain decoding")
    ax.scatter([], [], marker="x", color="k", label="x: run completion p50 speed-up")
    ax.scatter(
        [],
        [],
        marker="o",
        color="k",
        facecolors="none",
        label="o / hatched: interval holds 1.0 (indistinguishable)",
    )
    ax.set_xticks(
        [j + w * (len(modes) - 1) / 2 for j in range(len(traces))], [t.split(".")[0] for t in traces]
    )
    top = max(
        (r.get("speedup_short_step_p95_interval") or {}).get("hi") or r["speedup_short_step_p95"] or 1.0
        for r in sp
    )
    ax.set_ylim(0, top * 1.45)  # room for the legend above the labelled bars
    seeds = spec.get("seeds") or 1
    ax.set(
        ylabel=f"speed-up vs plain decoding (bars {100 * lvl:.0f}% paired interval)",
        title=f"4. Speculative decoding speed-up (1 replica; {seeds} arrival seed{'s' if seeds > 1 else ''} x run bootstrap)",
    )
    ax.legend(fontsize=7, loc="upper left", ncol=2)


if __name__ == "__main__":
    main()
