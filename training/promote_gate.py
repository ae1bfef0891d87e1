"""The promotion gate of ``runroute train --promote-if-better``: beat every baseline on held-out tasks.

Algorithm (:func:`baseline_gate`): read the training report's held-out figures of the gated benefit
policy (``report["benefit"]["holdout"]``, :func:`training.benefit_job.held_out_scores`: per domain
the AIQ difference between the learned policy and each baseline, with the task-bootstrap SE of the
difference). Pool the domains by their held-out run counts (``diff = sum w_d diff_d``,
``SE = sqrt(sum w_d^2 SE_d^2)``, ``w_d = n_d / N``). The candidate passes only if, for **every**
baseline present (random mixing of always-local / always-frontier, failure-threshold, and
per-step-threshold when the bundle's escalation classifier was scored), ``diff > SE``. No held-out
paired tasks: the escalation classifier's held-out Brier score against the training job's
escalation baselines (``constant`` prevalence, ``logreg_steps``, ``stall``: fit on the training
split, :mod:`training.evaluate`), the Brier difference's SE from a bootstrap over held-out groups
(:func:`escalation_gate`); no held-out labelled rows at all means no evidence: the gate refuses.
The verdict's reason names every baseline with its figures.

The champion comparison (:func:`training.mlflow_log._compare`) runs only after this gate passes;
with no champion yet, a candidate that fails the gate is registered but does not become champion.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from models.bundle import ModelBundle
    from training.dataset import Dataset

__all__ = ["baseline_gate", "escalation_gate", "pooled_differences"]


def pooled_differences(holdout: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``{baseline: (pooled AIQ difference, its SE)}`` over the held-out domains."""
    total = sum(int(d.get("n_runs", 0)) for d in holdout.values())
    out: dict[str, tuple[float, float]] = {}
    if total == 0:
        return out
    names = sorted({b for d in holdout.values() for b in d.get("learned_minus", {})})
    for b in names:
        diff = var = 0.0
        for d in holdout.values():
            lm = d.get("learned_minus", {}).get(b)
            if lm is None:
                continue
            w = int(d["n_runs"]) / total
            se = lm["se"] if math.isfinite(lm["se"]) else 0.0
            diff += w * lm["diff"]
            var += (w * se) ** 2
        out[b] = (diff, math.sqrt(var))
    return out


def escalation_gate(
    bundle: ModelBundle, train: Dataset, held: Dataset, n_boot: int = 200, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """``{baseline: (Brier(baseline) - Brier(model), SE)}`` on the held-out labelled rows."""
    import numpy as np

    from training.evaluate import _logreg, stall_score
    from training.uplift import bootstrap_se

    lt = train.meta["y_frontier"].notna().to_numpy()
    lh = held.meta["y_frontier"].notna().to_numpy()
    if lh.sum() == 0 or lt.sum() == 0 or bundle.escalation is None:
        return {}
    ytr = train.meta["y_frontier"].to_numpy()[lt].astype(float)
    y = held.meta["y_frontier"].to_numpy()[lh].astype(float)
    Xtr, X = train.X[lt], held.X[lh]
    g = held.meta["group"].astype(str).to_numpy()[lh]
    p = bundle.escalation.predict_proba(X)[:, 1]
    steps_tr, steps = (
        train.meta["step"].to_numpy()[lt].astype(float),
        held.meta["step"].to_numpy()[lh].astype(float),
    )
    base = {
        "constant": np.full(len(y), ytr.mean()),
        "logreg_steps": _logreg(steps_tr, ytr, steps),
        "stall": _logreg(stall_score(Xtr), ytr, stall_score(X)),
    }
    out: dict[str, tuple[float, float]] = {}
    for name, b in base.items():

        def gain(i: np.ndarray, b: np.ndarray = b) -> float:
            return float(np.mean((b[i] - y[i]) ** 2) - np.mean((p[i] - y[i]) ** 2))

        out[name] = (gain(np.arange(len(y))), bootstrap_se(gain, g, n_boot, seed))
    return out


def baseline_gate(
    report: dict[str, Any], escalation: dict[str, tuple[float, float]] | None = None
) -> tuple[bool, str]:
    """``(passes, reason)`` (module docstring); ``escalation``: :func:`escalation_gate`'s figures,
    read when the report has no held-out paired tasks."""
    hold = (report.get("benefit") or {}).get("holdout") or {}
    pooled = pooled_differences(hold)
    what = "AIQ"
    if not pooled and escalation:
        pooled, what = escalation, "Brier gain"
    if not pooled:
        return False, "no held-out labelled tasks: nothing shows the candidate beats the baselines"
    parts, ok = [], True
    for b, (diff, se) in pooled.items():
        beat = diff > se
        ok &= beat
        parts.append(f"{b}: {what} {diff:+.4f} (SE {se:.4f}){'' if beat else ' not > SE'}")
    verdict = "beats every baseline on held-out tasks" if ok else "does not beat every baseline"
    return ok, f"{verdict} ({'; '.join(parts)})"
