"""The benefit model's honest tables: in-domain, leave-one-domain-out, ablation, learning curve,
permutation importance and the safety checks (issue 14, items 2 and 7).

Every figure comes from out-of-fold predictions of task-grouped CV (:func:`training.benefit.cross_validate`)
or from whole held-out domains; SEs are task-bootstrap SEs (:func:`training.uplift.bootstrap_se`).

- :func:`in_domain_table`: per domain, the gate's evidence (needs-frontier AUC of the benefit score
  with SE, heads' Brier / ECE, Qini, AIQ of the learned ranking and of the baselines) and the mode.
- :func:`lodo_table`: per domain, heads fit on every *other* domain, scored on this one (transfer);
  the gated bundle would run its prior there (the domain is unseen).
- :func:`safety`: per domain, in-domain and held out: the AIQ of the *gated* policy (the learned
  ranking where the domain's mode is ``model``, else the prior, whose routing is the random-mixing
  line of always-local/always-frontier for the cost knob) against the best baseline's AIQ minus one
  SE; and, where a domain model is active, its AIQ difference to failure-threshold ranking with SE.
- :func:`ablation`: AUC with SE for inputs ``struct`` / ``embed`` / ``both``.
- :func:`learning_curve`: in-domain AUC vs labelled runs (25 / 50 / 100 / all; tasks subsampled,
  seeded, so a run count is reached by whole tasks).
- :func:`permutation_importance`: AUC drop when one input (a structural feature, or the embedding as
  one block) is permuted across the held-out fold's runs, averaged over folds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from training import uplift
from training.benefit import (
    BenefitConfig,
    BenefitRows,
    cross_validate,
    evidence,
    fit_heads,
    gate,
    has_inputs,
    task_folds,
)

__all__ = ["in_domain_table", "lodo_table", "safety", "ablation", "learning_curve", "permutation_importance"]

CURVE_RUNS = (25, 50, 100)


def _domains(rows: BenefitRows, inputs: str = "struct") -> list[str]:
    """Domains of the rows whose runs carry the head inputs."""
    return sorted(d for d in set(rows.domain.tolist()) if has_inputs(rows.subset(rows.domain == d), inputs))


def in_domain_table(rows: BenefitRows, cfg: BenefitConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dom in _domains(rows, cfg.inputs):
        d = rows.subset(rows.domain == dom)
        n = int((d.step == cfg.eval_step).sum())
        if n < 4:
            out[dom] = {"n_runs": n, "mode": "prior", "reason": "too few runs to cross-validate"}
            continue
        pl, pf = cross_validate(d, cfg)
        ev = evidence(d, pl, pf, cfg)
        mode, reason = gate(ev, n, cfg)
        out[dom] = {"mode": mode, "reason": reason, **ev}
    return out


def lodo_table(rows: BenefitRows, cfg: BenefitConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dom in _domains(rows, cfg.inputs):
        te = rows.domain == dom
        if len(set(rows.domain[~te].tolist())) == 0:
            continue
        hl, hf = fit_heads(rows.subset(~te), cfg)
        d = rows.subset(te)
        pl, pf = hl.predict(d.X, d.E), hf.predict(d.X, d.E)
        out[dom] = {"trained_on": sorted(set(rows.domain[~te].tolist())), **evidence(d, pl, pf, cfg)}
    return out


def _safety_row(ev: dict[str, Any], active: bool, prior: dict[str, Any] | None = None) -> dict[str, Any]:
    """``prior``: :func:`training.benefit_job.choose_priors`' row of the domain (the escalation
    classifier's out-of-fold AIQ gain over random mixing): per-step-threshold joins the baselines
    and, where it is the domain's prior policy, is what the gated policy runs."""
    a = dict(ev["aiq"])
    if prior is not None and "aiq_gain_over_random_mix" in prior:
        a["per_step_threshold"] = {
            "aiq": a["random_mix"]["aiq"] + prior["aiq_gain_over_random_mix"],
            "se": a["random_mix"]["se"],
        }
    if active:
        gated = a["learned"]
    elif prior is not None and prior.get("prior") == "escalation":
        gated = a["per_step_threshold"]
    else:
        gated = a["random_mix"]
    base = {k: a[k] for k in ("random_mix", "failure_threshold", "per_step_threshold") if k in a}
    best_name = max(base, key=lambda k: base[k]["aiq"])
    best = base[best_name]
    ok = gated["aiq"] >= best["aiq"] - (best["se"] if np.isfinite(best["se"]) else 0.0)
    row: dict[str, Any] = {
        "gated_mode": "model" if active else "prior",
        "gated_aiq": gated["aiq"],
        "best_baseline": best_name,
        "best_baseline_aiq": best["aiq"],
        "best_baseline_se": best["se"],
        "safe": bool(ok),
    }
    if active:
        dv = ev["aiq_diff_vs_failure_threshold"]
        row["learned_minus_failure_threshold"] = dv["diff"]
        row["learned_minus_failure_threshold_se"] = dv["se"]
        row["beats_failure_threshold_by_se"] = bool(dv["diff"] > dv["se"])
    return row


def safety(
    in_domain: dict[str, Any], lodo: dict[str, Any], priors: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The Done-when safety figures from the two tables (module docstring); ``priors``: the
    in-domain prior policies (:func:`training.benefit_job.choose_priors`)."""
    out: dict[str, Any] = {"in_domain": {}, "held_out_domain": {}}
    for dom, ev in in_domain.items():
        if "aiq" in ev:
            out["in_domain"][dom] = _safety_row(ev, ev["mode"] == "model", (priors or {}).get(dom))
    for dom, ev in lodo.items():
        out["held_out_domain"][dom] = _safety_row(ev, False)  # unseen domain: the prior
    rows = list(out["in_domain"].values()) + list(out["held_out_domain"].values())
    out["all_safe"] = bool(all(r["safe"] for r in rows)) if rows else False
    return out


def ablation(rows: BenefitRows, cfg: BenefitConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dom in _domains(rows):
        d = rows.subset(rows.domain == dom)
        if int((d.step == cfg.eval_step).sum()) < 4:
            continue
        out[dom] = {}
        for inp in ("struct", "embed", "both"):
            if inp != "struct" and not has_inputs(d, "embed"):
                continue
            pl, pf = cross_validate(d, cfg, inp)
            ev = evidence(d, pl, pf, cfg.model_copy(update={"n_boot": min(cfg.n_boot, 50)}))
            out[dom][inp] = {"auc": ev["auc"], "auc_se": ev["auc_se"], "qini": ev["qini"]}
    return out


def learning_curve(rows: BenefitRows, cfg: BenefitConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    quick = cfg.model_copy(update={"n_boot": min(cfg.n_boot, 50)})
    for dom in _domains(rows, cfg.inputs):
        d = rows.subset(rows.domain == dom)
        first = d.subset(d.step == cfg.eval_step)
        n_all = len(first)
        pts = []
        for target in [*[t for t in CURVE_RUNS if t < n_all], n_all]:
            tasks, counts = np.unique(first.task.astype(str), return_counts=True)
            order = np.random.default_rng(cfg.seed).permutation(len(tasks))
            keep, tot = [], 0
            for i in order:
                if tot >= target:
                    break
                keep.append(tasks[i])
                tot += counts[i]
            sub = d.subset(np.isin(d.task.astype(str), keep))
            if len(set(sub.task.tolist())) < 2:
                continue
            pl, pf = cross_validate(sub, quick)
            ev = evidence(sub, pl, pf, quick)
            pts.append({"runs": int(ev["n_runs"]), "auc": ev["auc"], "auc_se": ev["auc_se"]})
        out[dom] = pts
    return out


def permutation_importance(rows: BenefitRows, cfg: BenefitConfig, repeats: int = 3) -> dict[str, Any]:
    """Per domain: ``{input: mean AUC drop}`` over folds and ``repeats`` shuffles."""
    from features.extract import FEATURE_NAMES
    from training.benefit import STRUCT_FEATURES

    out: dict[str, Any] = {}
    rng = np.random.default_rng(cfg.seed)
    for dom in _domains(rows, cfg.inputs):
        d = rows.subset(rows.domain == dom)
        if int((d.step == cfg.eval_step).sum()) < 10:
            continue
        fold = task_folds(d.task, cfg.n_folds, cfg.seed)
        drops: dict[str, list[float]] = {}
        inputs: list[str] = []
        if cfg.inputs in ("struct", "both"):
            inputs += [n for n in STRUCT_FEATURES if n in FEATURE_NAMES]
        if cfg.inputs in ("embed", "both") and d.E is not None:
            inputs.append("task_embedding")
        for f in np.unique(fold):
            te = (fold == f) & (d.step == cfg.eval_step)
            hl, hf = fit_heads(d.subset(fold != f), cfg)
            t = d.subset(te)
            nf = t.needs_frontier
            base = uplift.auc(nf, hf.predict(t.X, t.E) - hl.predict(t.X, t.E))
            if not np.isfinite(base):
                continue
            for name in inputs:
                for _ in range(repeats):
                    X, E = t.X.copy(), None if t.E is None else t.E.copy()
                    p = rng.permutation(len(t))
                    if name == "task_embedding" and E is not None:
                        E = E[p]
                    else:
                        j = FEATURE_NAMES.index(name)
                        X[:, j] = X[p, j]
                    s = hf.predict(X, E) - hl.predict(X, E)
                    drops.setdefault(name, []).append(base - uplift.auc(nf, s))
        out[dom] = {
            k: float(np.nanmean(v)) for k, v in sorted(drops.items(), key=lambda kv: -np.nanmean(kv[1]))
        }
    return out
