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

Knobs: :class:`training.benefit.BenefitConfig` (``TrainConfig.benefit``) and ``tables``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models.benefit import BenefitModel
from training import uplift
from training.benefit import BenefitConfig, BenefitRows, benefit_rows, fit_benefit

__all__ = ["benefit_stage", "held_out_scores"]


def held_out_scores(model: BenefitModel, rows: BenefitRows, cfg: BenefitConfig) -> dict[str, Any]:
    """Per-domain figures of the gated model on held-out paired rows (module docstring, step 4)."""
    out: dict[str, Any] = {}
    at = rows.subset(rows.step == cfg.eval_step)
    for dom in sorted(set(at.domain.tolist())):
        r = at.subset(at.domain == dom)
        pl = np.empty(len(r))
        pf = np.empty(len(r))
        fail = np.empty(len(r))
        d = model.domains.get(dom)
        for i in range(len(r)):
            e = None if r.E is None or np.isnan(r.E[i]).any() else r.E[i]
            pl[i], pf[i], mode, _ = model.predict(r.X[i], e, dom)
            fail[i] = 1.0 - (
                float(d.local.predict(r.X[i : i + 1], None if e is None else e[None, :])[0])
                if d is not None and d.local is not None
                else pl[i]
            )
        score = pf - pl
        const = np.zeros(len(r))

        def se(fn: Any, r: BenefitRows = r) -> float:
            return uplift.bootstrap_se(fn, r.task, cfg.n_boot, cfg.seed)

        def aiq(s: np.ndarray, r: BenefitRows = r) -> dict[str, float]:
            return {
                "aiq": uplift.aiq(s, r.y_local, r.y_frontier),
                "se": se(lambda i: uplift.aiq(s[i], r.y_local[i], r.y_frontier[i])),
            }

        nf = r.needs_frontier
        diffs = {
            name: {
                "diff": uplift.aiq(score, r.y_local, r.y_frontier) - uplift.aiq(b, r.y_local, r.y_frontier),
                "se": se(
                    lambda i, b=b: uplift.aiq(score[i], r.y_local[i], r.y_frontier[i])
                    - uplift.aiq(b[i], r.y_local[i], r.y_frontier[i])
                ),
            }
            for name, b in (("random_mix", const), ("failure_threshold", fail))
        }
        out[dom] = {
            "mode": model.mode(dom)[0],
            "n_runs": int(len(r)),
            "auc": uplift.auc(nf, score),
            "auc_se": se(lambda i: uplift.auc(nf[i], score[i])),
            "aiq": {"learned": aiq(score), "random_mix": aiq(const), "failure_threshold": aiq(fail)},
            "learned_minus": diffs,
        }
    return out


def benefit_stage(
    runs: Any, train: Any, held: Any, cfg: BenefitConfig, *, tables: bool
) -> tuple[BenefitModel | None, dict[str, Any]]:
    """``(model, report)`` for the bundle (module docstring)."""
    rows = benefit_rows(runs, train.X, train.meta)
    if rows is None or len(rows) == 0:
        return None, {}
    model, gate_report = fit_benefit(rows, cfg)
    report: dict[str, Any] = {
        "config": cfg.model_dump(),
        "n_runs": int((rows.step == cfg.eval_step).sum()),
        "embedding_runs": int(0 if rows.E is None else (~np.isnan(rows.E).any(axis=1)).sum()),
        "prior": {"p_local": model.p_local, "p_frontier": model.p_frontier},
        "domains": gate_report,
    }
    if tables:
        from training.benefit_eval import (
            ablation,
            in_domain_table,
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
            safety=safety(ind, lodo),
            ablation=ablation(rows, cfg),
            learning_curve=learning_curve(rows, cfg),
            permutation_importance=permutation_importance(rows, cfg),
        )
    h = benefit_rows(runs, held.X, held.meta) if len(held) else None
    if h is not None and len(h):
        report["holdout"] = held_out_scores(model, h, cfg)
    return model, report
