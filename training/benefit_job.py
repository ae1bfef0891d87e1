"""The training job's benefit stage: gated per-domain benefit model + its honest tables.

Algorithm (:func:`benefit_stage`, called by :func:`training.train.train_on_log`):

1. Paired rows of the *training* split (:func:`training.benefit.benefit_rows`); without any (no
   run has a strong outcome) the stage returns ``(None, {})`` and the bundle has no benefit model.
2. :func:`training.benefit.fit_benefit`: per-domain heads where ``>= min_runs`` labelled runs,
   each gated by its task-grouped CV evidence; the pooled prior.
3. With ``tables`` (the job's ``evaluate``): in-domain and leave-one-domain-out tables, the safety
   checks, the input ablation, the learning curve and permutation importance
   (:mod:`training.benefit_eval`), all on the training split.
4. **Held-out tasks**: the gated model scores the held-out split's paired runs at the decision step:
   per domain the AIQ of the gated policy (the model where active, else the prior's random-mixing
   line), of failure-threshold ranking (the domain's local head, else the prior: a tie) and the
   needs-frontier AUC, each with its task-bootstrap SE (:func:`held_out_scores`); the promotion gate
   reads these.

5. **Prior policies** (:func:`choose_priors`): a prior-mode domain runs the escalation classifier
   instead of the base rates where that measured better on the training runs by more than its SE.

Knobs: :class:`training.benefit.BenefitConfig` (``TrainConfig.benefit``) and ``tables``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models.benefit import BenefitModel
from router.core.figures import switches_by_run
from training import uplift
from training.benefit import BenefitConfig, BenefitRows, benefit_rows, fit_benefit

__all__ = ["benefit_stage", "held_out_scores", "choose_priors"]


def _flaps(run_id: np.ndarray, step: np.ndarray, frontier: np.ndarray) -> np.ndarray:
    """Tier changes per run of a per-step tier sequence (rows in any order)."""
    order = np.lexsort((step, run_id.astype(str)))
    return switches_by_run(run_id.astype(str)[order], frontier[order].astype(int))


def _sticky(run_id: np.ndarray, step: np.ndarray, uplift: np.ndarray, up: float, down: float) -> np.ndarray:
    """The learned policy's tier per step from the uplift alone: hysteresis (escalate at >= up,
    come back at < down), at most 2 switches, 3 steps' dwell (the policy's defaults)."""
    order = np.lexsort((step, run_id.astype(str)))
    r = run_id.astype(str)[order]
    out = np.zeros(len(r), dtype=bool)
    cur, tier, switches, last = None, False, 0, -10
    for j, i in enumerate(order):
        if r[j] != cur:
            cur, tier, switches, last = r[j], False, 0, -10
        k = int(step[i])
        want = (uplift[i] >= up) if not tier else not (uplift[i] < down)
        if want != tier and switches < 2 and k - last >= 3:
            tier, switches, last = want, switches + 1, k
        out[i] = tier
    return out


def held_out_scores(
    model: BenefitModel,
    rows: BenefitRows,
    cfg: BenefitConfig,
    escalation: Any = None,
    thresholds: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Per-domain figures of the gated model on held-out paired rows (module docstring, step 4).

    With the bundle's ``escalation`` classifier, per-step-threshold (P(needs frontier) >=
    ``p_frontier_up`` at each step, no stickiness) is a baseline too: a run counts as escalated when
    its largest P over its steps passes the threshold (its AIQ ranks runs by that maximum); flaps per
    run compare its per-step tiers with the learned policy's sticky tiers."""
    out: dict[str, Any] = {}
    at = rows.subset(rows.step == cfg.eval_step)
    pst_max: dict[str, float] = {}
    flaps: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if escalation is not None and len(rows):
        p_all = escalation.predict_proba(rows.X)[:, 1]
        up = (thresholds or {}).get("p_frontier_up", 0.5)
        for rid, p in zip(rows.run_id.astype(str), p_all, strict=True):
            pst_max[rid] = max(pst_max.get(rid, 0.0), float(p))
        upl = np.array(
            [
                (lambda t: t[1] - t[0])(model.predict(rows.X[i], _emb(rows, i), str(rows.domain[i])))
                for i in range(len(rows))
            ]
        )
        sticky = _sticky(rows.run_id, rows.step, upl, 0.0, 0.0)
        down = (thresholds or {}).get("p_frontier_down", up)
        sticky_p = _sticky(rows.run_id, rows.step, p_all, up, down)  # domains whose prior is the classifier
        for dom in sorted(set(rows.domain.tolist())):
            m = rows.domain == dom
            flaps[dom] = (
                _flaps(rows.run_id[m], rows.step[m], p_all[m] >= up),
                _flaps(rows.run_id[m], rows.step[m], (sticky if model.uses_uplift(dom) else sticky_p)[m]),
                np.zeros(0),
            )
    for dom in sorted(set(at.domain.tolist())):
        r = at.subset(at.domain == dom)
        pl = np.empty(len(r))
        pf = np.empty(len(r))
        fail = np.empty(len(r))
        d = model.domains.get(dom)
        for i in range(len(r)):
            e = _emb(r, i)
            pl[i], pf[i], _, _ = model.predict(r.X[i], e, dom)
            fail[i] = 1.0 - (
                float(d.local.predict(r.X[i : i + 1], None if e is None else e[None, :])[0])
                if d is not None and d.local is not None
                else pl[i]
            )
        pst = np.array([pst_max[x] for x in r.run_id.astype(str)]) if pst_max else None
        # the gated policy's ranking: the uplift, or per-step-threshold's where that is the prior policy
        gated = pf - pl if model.uses_uplift(dom) or pst is None else pst
        out[dom] = {"mode": model.mode(dom)[0], **_domain_scores(r, gated, fail, pst, cfg)}
        if dom in flaps:
            out[dom]["flaps_per_run"] = {
                "per_step_threshold": float(flaps[dom][0].mean()),
                "learned": float(flaps[dom][1].mean()),
            }
    return out


def _domain_scores(
    r: BenefitRows, score: np.ndarray, fail: np.ndarray, pst: np.ndarray | None, cfg: BenefitConfig
) -> dict[str, Any]:
    """AUC, AIQ of the learned ranking and of each baseline, and the differences, with SEs."""
    yl, yf, nf = r.y_local, r.y_frontier, r.needs_frontier

    def se(fn: Any) -> float:
        return uplift.bootstrap_se(fn, r.task, cfg.n_boot, cfg.seed)

    def aiq(s: np.ndarray) -> dict[str, float]:
        return {"aiq": uplift.aiq(s, yl, yf), "se": se(lambda i: uplift.aiq(s[i], yl[i], yf[i]))}

    def diff(b: np.ndarray) -> dict[str, float]:
        def d(i: Any) -> float:
            return uplift.aiq(score[i], yl[i], yf[i]) - uplift.aiq(b[i], yl[i], yf[i])

        return {"diff": d(np.arange(len(yl))), "se": se(d)}

    bases = {"random_mix": np.zeros(len(yl)), "failure_threshold": fail}
    if pst is not None:
        bases["per_step_threshold"] = pst
    return {
        "n_runs": int(len(r)),
        "auc": uplift.auc(nf, score),
        "auc_se": se(lambda i: uplift.auc(nf[i], score[i])),
        "aiq": {"learned": aiq(score), **{k: aiq(b) for k, b in bases.items()}},
        "learned_minus": {k: diff(b) for k, b in bases.items()},
    }


def _aiq_gain(r: BenefitRows, a: np.ndarray, b: np.ndarray, cfg: BenefitConfig) -> tuple[float, float]:
    """AIQ(ranking a) - AIQ(ranking b) on ``r`` and its task-bootstrap SE, *within* weak player
    (the run-weighted mean over players, when the rows pool several): a deployment has one local
    model, so a ranking that only tells players apart (their base rates differ) must not count."""
    players = r.player if r.player is not None else np.zeros(len(r), dtype=object)

    def one(i: Any) -> float:
        return uplift.aiq(a[i], r.y_local[i], r.y_frontier[i]) - uplift.aiq(
            b[i], r.y_local[i], r.y_frontier[i]
        )

    def gain(i: Any) -> float:
        i = np.asarray(i)
        tot = n = 0.0
        for pl in set(players[i].tolist()):
            j = i[players[i] == pl]
            tot += len(j) * one(j)
            n += len(j)
        return tot / n if n else float("nan")

    return gain(np.arange(len(r))), uplift.bootstrap_se(gain, r.task, cfg.n_boot, cfg.seed)


def choose_priors(model: BenefitModel, rows: BenefitRows, oof_esc: Any, cfg: BenefitConfig) -> dict[str, Any]:
    """Each domain's prior policy (:class:`models.benefit.DomainBenefit.prior`), and the last step
    of the gate: a domain model must also beat its prior policy.

    The escalation classifier's *out-of-fold* P(needs frontier) on the training rows (the job's
    grouped CV, ``oof_esc``: ``run_id`` and ``model`` per labelled step) ranks a run by its largest
    P over its steps (what per-step-threshold escalates on; AIQ differences are taken within weak
    player, :func:`_aiq_gain`; under the stated assumption that a late
    escalation earns the strong outcome, which favours it: its gain from the decision step's P alone
    is reported beside); its AIQ on the domain's paired runs is compared with random mixing (the base-rates prior, for any value of the cost knob). The
    classifier becomes the prior policy only when it wins by more than the SE of the difference
    (task bootstrap). A domain in ``model`` mode stays there only if its own CV ranking (the
    benefit score, out of fold) beats that prior policy's AIQ by more than the SE of the
    difference; else it is demoted to ``prior``. The reason gets the figures either way. Without
    OOF scores (no CV) every domain keeps the base rates and its gate."""
    from training.benefit import cross_validate

    out: dict[str, Any] = {}
    if oof_esc is None:
        return out
    best: dict[str, float] = {}
    first: dict[str, float] = {}
    steps = np.asarray(oof_esc.get("step", np.zeros(len(oof_esc["run_id"]))))
    for rid, p, k in zip(
        np.asarray(oof_esc["run_id"]).astype(str), np.asarray(oof_esc["model"]), steps, strict=True
    ):
        if np.isfinite(p):
            best[rid] = max(best.get(rid, 0.0), float(p))
            if k == cfg.eval_step:
                first[rid] = float(p)
    for dom, d in model.domains.items():
        d_rows = rows.subset((rows.domain == dom) & np.isin(rows.run_id.astype(str), list(best)))
        r = d_rows.subset(d_rows.step == cfg.eval_step)
        if len(r) < 2:
            continue
        s = np.array([best[x] for x in r.run_id.astype(str)])
        z = np.zeros(len(r))
        g, se = _aiq_gain(r, s, z, cfg)
        if np.isfinite(se) and g > se:
            d.prior = "escalation"
            d.reason += f"; prior policy: the escalation classifier (training AIQ {g:+.3f} over random mixing, SE {se:.3f})"
        else:
            d.reason += f"; prior policy: base rates (the escalation classifier's AIQ {g:+.3f}, SE {se:.3f}, is no better)"
        row: dict[str, Any] = {
            "prior": d.prior,
            "aiq_gain_over_random_mix": g,
            "se": se,
            "n_runs": int(len(r)),
        }
        # the same classifier ranking runs at the decision step only (no later-step information):
        # reported beside, since the max over steps leans on "escalating late = the strong outcome"
        if all(x in first for x in r.run_id.astype(str)):
            s0 = np.array([first[x] for x in r.run_id.astype(str)])
            row["aiq_gain_at_decision_step"], row["se_at_decision_step"] = _aiq_gain(r, s0, z, cfg)
        if d.mode == "model":
            pl, pf = cross_validate(d_rows, cfg)
            at = d_rows.step == cfg.eval_step
            mg, mse = _aiq_gain(r, (pf - pl)[at], s if d.prior == "escalation" else z, cfg)
            row.update(model_aiq_gain_over_prior=mg, model_se=mse)
            if not (np.isfinite(mse) and mg > mse):
                d.mode = "prior"
                d.reason += f"; demoted: the domain model's CV AIQ {mg:+.3f} (SE {mse:.3f}) does not beat its prior policy"
            else:
                d.reason += f"; the domain model's CV AIQ beats its prior policy by {mg:+.3f} (SE {mse:.3f})"
            row["mode"] = d.mode
        out[dom] = row
    return out


def _emb(r: BenefitRows, i: int) -> np.ndarray | None:
    return None if r.E is None or np.isnan(r.E[i]).any() else r.E[i]


def benefit_stage(
    runs: Any,
    train: Any,
    held: Any,
    cfg: BenefitConfig,
    *,
    tables: bool,
    escalation: Any = None,
    thresholds: dict[str, float] | None = None,
    oof_escalation: Any = None,
) -> tuple[BenefitModel | None, dict[str, Any]]:
    """``(model, report)`` for the bundle (module docstring). BLAS runs on one thread here: the
    matrices are small and on a busy 2-core machine two BLAS threads made a 384 x 384 eigh 40x
    slower (17 ms vs 670 ms, measured)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _stage(runs, train, held, cfg, tables, escalation, thresholds, oof_escalation)


def _stage(
    runs: Any,
    train: Any,
    held: Any,
    cfg: BenefitConfig,
    tables: bool,
    escalation: Any,
    thresholds: dict[str, float] | None,
    oof_escalation: Any,
) -> tuple[BenefitModel | None, dict[str, Any]]:
    rows = benefit_rows(runs, train.X, train.meta)
    if rows is None or len(rows) == 0:
        return None, {}
    model, gate_report = fit_benefit(rows, cfg)
    priors = choose_priors(model, rows, oof_escalation, cfg)
    for dom, d in model.domains.items():
        gate_report[dom].update(mode=d.mode, reason=d.reason, prior=d.prior)
    report: dict[str, Any] = {
        "config": cfg.model_dump(),
        "n_runs": int((rows.step == cfg.eval_step).sum()),
        "embedding_runs": int(
            0 if rows.E is None else (~np.isnan(rows.E[rows.step == cfg.eval_step]).any(axis=1)).sum()
        ),
        "prior": {"p_local": model.p_local, "p_frontier": model.p_frontier},
        "domains": gate_report,
        "priors": priors,
    }
    if tables:
        from training.benefit_eval import (
            ablation,
            learning_curve,
            lodo_table,
            permutation_importance,
            safety,
        )

        ind = {k: v for k, v in gate_report.items() if "aiq" in v}
        lodo = lodo_table(rows, cfg)
        report.update(
            in_domain=ind,
            leave_one_domain_out=lodo,
            safety=safety(ind, lodo, priors),
            ablation=ablation(rows, cfg),
            learning_curve=learning_curve(rows, cfg),
            permutation_importance=permutation_importance(rows, cfg),
        )
    h = benefit_rows(runs, held.X, held.meta) if len(held) else None
    if h is not None and len(h):
        report["holdout"] = held_out_scores(model, h, cfg, escalation, thresholds)
    return model, report
