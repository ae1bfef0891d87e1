"""``report.md``: what was run, what was held out, prices, the outcome model, one section per set
(table, model scores, plots, sweeps, the sensitivity of the ranking to the outcome model, the
learned policy against each baseline in generated sentences), run-level pairs, the live segment, the
timings and the scorecard key reference (generated from :mod:`training.eval.scorecard`).

Every figure comes from the scorecard dict (:meth:`training.eval.scorecard.Scorecard.to_json_dict`);
nothing here computes a new number but rankings (:mod:`training.eval.analysis`). No knobs.
"""

from __future__ import annotations

from typing import Any

from training.eval.analysis import comparison_lines, ranking_text, sensitivity
from training.eval.format import fnum, fpct, fusd, isnum, rows_by_policy

__all__ = ["render_markdown", "policy_table"]


def policy_table(rows: list[dict[str, Any]]) -> list[str]:
    hdr = (
        "| policy | success (± SE) | cost USD | cost/run | cost @95% AF | AIQ [95% CI] | escal. | recall | precision "
        "| cache hit (bound) | flaps/run | short p95 s | run p95 s | rej/spill |"
    )
    out = [hdr, "|" + "---|" * 14]
    for r in rows:
        out.append(
            f"| {r['policy']} | {fnum(r.get('success_rate'))} (± {fnum(r.get('success_se'))}) | {fusd(r.get('cost_usd'))} "
            f"| {fusd(r.get('cost_per_run_usd'))} | {fusd(r.get('cost_at_95pct_frontier_success_usd'))} "
            f"| {fnum(r.get('aiq'))} {_ci(r, 'aiq')} | {fpct(r.get('escalation_rate'))} | {fpct(r.get('needs_frontier_recall'))} "
            f"| {fpct(r.get('needs_frontier_precision'))} | {fpct(r.get('cache_hit_rate'))} "
            f"({fpct(r.get('cache_hit_upper_bound'))}) | {fnum(r.get('flaps_per_run'), 2)} "
            f"| {fnum(r.get('short_step_latency_s_p95'), 2)} | {fnum(r.get('run_completion_s_p95'), 1)} "
            f"| {r.get('runs_rejected', '-')}/{r.get('runs_spilled', '-')} |"
        )
    if any(r.get("success_diff_vs_ref") is not None for r in rows):
        out += [
            "",
            "Paired against per-step-threshold (same runs, task-bootstrap 95% CI):",
            "",
            "| policy | success - per-step-threshold [95% CI] | AIQ - per-step-threshold [95% CI] |",
            "|---|---|---|",
        ]
        for r in rows:
            if r.get("policy") == "per-step-threshold" or r.get("success_diff_vs_ref") is None:
                continue
            out.append(
                f"| {r['policy']} | {_signed(r.get('success_diff_vs_ref'))} {_ci(r, 'success_diff_vs_ref')} "
                f"| {_signed(r.get('aiq_diff_vs_ref'))} {_ci(r, 'aiq_diff_vs_ref')} |"
            )
    return out


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def _ci(r: dict[str, Any], key: str) -> str:
    lo, hi = r.get(f"{key}_ci_low"), r.get(f"{key}_ci_high")
    return (
        ""
        if lo is None or hi is None
        else f"[{lo:+.3f}, {hi:+.3f}]"
        if "diff" in key
        else f"[{lo:.3f}, {hi:.3f}]"
    )


def _outcome_model_md(card: dict[str, Any]) -> list[str]:
    from training.eval.outcome import parse_variant

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
        "- **cost** is priced per step from the logged token counts: a step finds cached on its tier the "
        "context the run left there at its last step on it, as far as every step since repeated it (free "
        "locally, cached-input price at the frontier); a step on a tier the run never used prefills its "
        "whole context. So an escalation at *k* pays the local steps already spent, "
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
        f"Generated {card.get('generated_at', '')}; wall time {fnum(t.get('total_s'), 0)} s.",
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
            f"{fnum(th.get('p_frontier_up'))} / down {fnum(th.get('p_frontier_down'))}.",
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
                + ", ".join(f"{k} {fnum(v)}" for k, v in esc.items() if isnum(v))
                + "."
            )
        L.append("")
    pr = card.get("prices", {})
    L += [
        "## Prices (assumptions, one config object: `training.eval.outcome.Prices`)",
        "",
        f"- frontier: input ${pr.get('frontier_in_per_m')}/1M, cached input ${pr.get('frontier_cached_in_per_m')}/1M, "
        f"output ${pr.get('frontier_out_per_m')}/1M tokens (list prices of a Claude-Sonnet-class API);",
        f"- local: ${pr.get('gpu_hour_usd')}/GPU-hour (on-demand A100-80GB class), at "
        f"{pr.get('local_prefill_tokens_per_s')} prefill and {pr.get('local_decode_tokens_per_s')} decode tokens/s "
        f"per GPU = ${fnum(pr.get('local_in_per_m'), 4)} per 1M uncached input and ${fnum(pr.get('local_out_per_m'), 4)} "
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
        L += policy_table(s.get("policies", []))
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
                f"{fnum(esc.get('pos_rate'))}): AUC {fnum(esc.get('auc'))}, PR-AUC {fnum(esc.get('pr_auc'))}, "
                f"Brier {fnum(esc.get('brier'))}, ECE {fnum(esc.get('ece'))}."
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
        le = rows_by_policy(s).get("learned")
        target = ((card.get("training") or {}).get("thresholds_report") or {}).get("target_frontier_share")
        if le and isnum(target) and isnum(le.get("escalation_rate")):
            L.append(
                f"The bundle's thresholds were calibrated in training for {fpct(target)} of runs escalated; "
                f"on this held-out set the learned policy escalated {fpct(le['escalation_rate'])} of runs."
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
                    f"{pt['threshold']:.2f}: {fnum(pt['success_rate'])} @ {fusd(pt['cost_usd'])}"
                    for pt in pts
                    if isnum(pt.get("success_rate"))
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
                + " | ".join(fnum(sv.get(v)) for v in variants)
                + " | "
                + " | ".join(fnum(av.get(v)) for v in variants)
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
                f"| {k} | {v['runs']} | {fnum(v['always_local_success'])} | {fnum(v['always_frontier_success'])} "
                f"| {fnum(v['oracle_success'])} | {fpct(v['oracle_escalation_rate'])} |"
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
        syn = rows_by_policy((card.get("sets") or {}).get("synthetic-heldout", {}))
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
                f"| {name} | {f.get('steps')} | {fnum(f.get('step_latency_s_p95'))} | {fnum(f.get('short_step_latency_s_p95'))} "
                f"| {fnum(sr.get('short_step_latency_s_p95'), 2)} | {fpct(f.get('cache_hit_rate'))} "
                f"({fpct(f.get('cache_hit_upper_bound'))}) | {fpct(sr.get('cache_hit_rate'))} "
                f"({fpct(sr.get('cache_hit_upper_bound'))}) | {fpct(f.get('escalation_rate'))} "
                f"| {fpct(sr.get('escalation_rate'))} | {fnum(f.get('flaps_per_run'), 2)} | {fnum(sr.get('flaps_per_run'), 2)} |"
            )
        L.append("")
    if t:
        L += ["## Timings (s)", "", ", ".join(f"{k} {v}" for k, v in t.items()), ""]
    from training.eval.readme_keys import scorecard_keys

    L += ["## scorecard.json keys", "", scorecard_keys()]
    return "\n".join(L)
