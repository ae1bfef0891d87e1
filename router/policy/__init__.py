"""The decision layer: pure policies over plain data (``decide(snapshot) -> Decision``).

Public names: the types (:mod:`router.policy.types`), ``build_snapshot``, the policy config union
and ``build_policy`` (:mod:`router.policy.config`), the policy classes, and ``ShadowPolicy``.
"""

from router.policy.baselines import (
    AlwaysFrontierPolicy,
    AlwaysLocalPolicy,
    OraclePolicy,
    PerStepThresholdPolicy,
    SessionStickyPolicy,
    StallEscalationPolicy,
)
from router.policy.config import (
    POLICY_KINDS,
    PolicyConfig,
    PolicyConfigError,
    build_policy,
    parse_policy_config,
)
from router.policy.filters import ScoreWeights
from router.policy.learned import LearnedPolicy
from router.policy.shadow import ShadowPolicy
from router.policy.snapshot import build_snapshot
from router.policy.types import BackendState, Decision, Policy, RunState, Snapshot, Tier, apply_decision

__all__ = [
    "AlwaysFrontierPolicy",
    "AlwaysLocalPolicy",
    "BackendState",
    "Decision",
    "LearnedPolicy",
    "OraclePolicy",
    "POLICY_KINDS",
    "PerStepThresholdPolicy",
    "Policy",
    "PolicyConfig",
    "PolicyConfigError",
    "RunState",
    "ScoreWeights",
    "SessionStickyPolicy",
    "ShadowPolicy",
    "Snapshot",
    "StallEscalationPolicy",
    "Tier",
    "apply_decision",
    "build_policy",
    "build_snapshot",
    "parse_policy_config",
]
