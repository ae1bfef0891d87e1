"""Escalation on observed trouble: a term the learned policy adds to its escalation score.

A bundle trained on logs without signals has never seen a ``verifier_failed``; its prediction does
not move when one arrives. :class:`TroubleTerm` lets evidence posted on the run move the score the
learned policy compares with its thresholds, *before* the economics, so the move still has to pay
(benefit - switch cost > 0), obey the hysteresis band, the dwell and the switch cap:

    score' = clip(score + sum_k boost[k] * sig_k, lo, 1)

``sig_k`` is the feature ``sig_<k>`` (signals of kind k posted on the run so far,
:data:`features.prefix.SIGNAL_KINDS`, or recorded by the sidecar on a local step's answer,
:data:`features.prefix.POSTHOC_KINDS`), read from ``Snapshot.features``; ``score`` is P(needs
frontier), or the uplift when the bundle's benefit model answers (``lo`` = 0 resp. -1). The term
is persistent (counts so far, not "since the last step"), so a run escalated on trouble does not
drift back while the trouble stands. With no boosts (the default) nothing is read and nothing
changes.

Knob: ``policy.trouble_boost`` (``{kind: boost}``, e.g. ``{verifier_failed: 0.3, tests_failed:
0.3, user_rejected: 0.15, tool_call_malformed: 0.2}``).
"""

from __future__ import annotations

from collections.abc import Mapping

from features.prefix import POSTHOC_KINDS, SIGNAL_KINDS

__all__ = ["TroubleTerm"]


class TroubleTerm:
    """See the module docstring."""

    __slots__ = ("terms",)

    def __init__(self, boost: Mapping[str, float]):
        bad = sorted(set(boost) - set(SIGNAL_KINDS) - set(POSTHOC_KINDS))
        if bad:
            raise ValueError(
                f"trouble_boost: unknown signal kind(s) {bad}; kinds are {list(SIGNAL_KINDS + POSTHOC_KINDS)}"
            )
        self.terms = tuple((f"sig_{k}", float(v)) for k, v in boost.items() if v)

    def adjust(self, score: float, features: Mapping[str, float], lo: float) -> float:
        """``score`` plus the trouble term, clipped to ``[lo, 1]``."""
        if not self.terms:
            return score
        for name, w in self.terms:
            n = features.get(name, 0.0)
            if n:
                score += w * n
        return lo if score < lo else (1.0 if score > 1.0 else score)
