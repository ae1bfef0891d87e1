"""Shadow mode: decide with the live policy, record what a second policy would have done.

``ShadowPolicy(live, shadow).decide(snap)`` returns the live policy's :class:`Decision` with
``decision.shadow`` set to the shadow policy's decision for the *same* snapshot. The shadow sees the
run's real pin (the live policy's), so it answers "what would you do for this step, given where the
run actually is"; its decision is never applied. A shadow that raises never breaks the live path:
the live decision is returned with ``scores["shadow_error"] = 1.0`` and no shadow.
The wrapper has the live policy's ``name``; ``shadow_name`` labels the shadow.
"""

from __future__ import annotations

from router.policy.types import Decision, Policy, Snapshot

__all__ = ["ShadowPolicy"]


class ShadowPolicy:
    __slots__ = ("live", "shadow", "name", "shadow_name")

    def __init__(self, live: Policy, shadow: Policy):
        self.live = live
        self.shadow = shadow
        self.name = live.name
        self.shadow_name = shadow.name

    def decide(self, snapshot: Snapshot) -> Decision:
        decision = self.live.decide(snapshot)
        try:
            decision.shadow = self.shadow.decide(snapshot)
        except Exception:  # noqa: BLE001 - the shadow must never break the live decision
            decision.scores["shadow_error"] = 1.0
            decision.shadow = None
        return decision
