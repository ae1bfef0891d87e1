"""Policy configuration: one discriminated union on ``kind`` is the registry of policies.

``build_policy(cfg, bundle)`` validates a dict (or takes an already-validated config) and builds the
policy object in one step: ``PolicyConfig`` picks the class from ``kind``, the class's ``build``
makes a plain (pydantic-free) policy object whose ``decide`` runs on the request path. Adding a
policy = one config class with a ``kind`` literal and ``build`` + one union member.

Kinds and their knobs (every field below is documented on its class):

- ``learned`` (:class:`LearnedConfig`): ``p_frontier_up`` / ``p_frontier_down`` (None = the bundle's
  calibrated ``thresholds``; without a bundle they are required), ``value_of_success_usd`` (the cost/quality knob), ``benefit_up`` / ``benefit_down`` (the hysteresis
  on the uplift when the bundle's benefit model answers for the run's domain),
  ``min_dwell_steps``, ``max_switches``, ``off_boundary_ratio``, ``frontier_cache_hit``,
  ``output_token_share``, ``local_gpu_usd_per_hour``, ``latency_usd_per_s``, ``frontier_budget``
  (:class:`router.policy.budget.FrontierBudget`: the share the user allows the frontier; None = off).
- ``always-local`` (``sticky``), ``always-frontier``, ``session-sticky``, ``stall-escalation``,
  ``oracle``: no knobs beyond ``scoring``.
- ``per-step-threshold``: ``threshold`` (None = the bundle's ``p_frontier_up``).

Every kind has ``scoring`` (:class:`Scoring`: the replica-scoring weights of
:mod:`router.policy.filters`), ``name`` (label in reports; default the kind) and ``explore``
(:class:`router.policy.explore.ExploreConfig`: exploration with logged propensities; absent = off,
the production default; ``build_policy`` then wraps the policy in
:class:`~router.policy.explore.ExplorePolicy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from features.prefix import POSTHOC_KINDS, SIGNAL_KINDS
from router.policy.baselines import (
    AlwaysFrontierPolicy,
    AlwaysLocalPolicy,
    OraclePolicy,
    PerStepThresholdPolicy,
    PrefixAwarePolicy,
    SessionStickyPolicy,
    StallEscalationPolicy,
)
from router.policy.budget import FrontierBudget
from router.policy.defaults import GPU_HOUR_USD
from router.policy.explore import ExploreConfig, ExplorePolicy
from router.policy.filters import ScoreWeights
from router.policy.learned import LearnedPolicy
from router.policy.trouble import TroubleTerm
from router.policy.types import Policy

if TYPE_CHECKING:  # the bundle module imports lightgbm; never needed at import time here
    from models.bundle import ModelBundle

__all__ = [
    "PolicyConfigError",
    "Scoring",
    "LearnedConfig",
    "AlwaysLocalConfig",
    "PrefixAwareConfig",
    "AlwaysFrontierConfig",
    "PerStepThresholdConfig",
    "SessionStickyConfig",
    "StallEscalationConfig",
    "OracleConfig",
    "PolicyConfig",
    "POLICY_KINDS",
    "parse_policy_config",
    "build_policy",
]


class PolicyConfigError(ValueError):
    """A policy config cannot be validated or built; the message is one line meant for a person."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scoring(_Strict):
    """Replica-scoring weights (normalised terms in [0, 1]; see router.policy.filters)."""

    warm: float = Field(default=1.0, ge=0, description="weight of the run's warm prefix on the replica")
    queue: float = Field(default=1.0, ge=0, description="weight of waiting requests (saturating)")
    running: float = Field(default=0.5, ge=0, description="weight of running requests (saturating)")
    kv: float = Field(default=0.5, ge=0, description="weight of KV-cache usage")
    queue_half: float = Field(
        default=4.0, gt=0, description="waiting requests at which the queue term is 0.5"
    )
    running_half: float = Field(
        default=8.0, gt=0, description="running requests at which the running term is 0.5"
    )
    load_tokens: float = Field(
        default=0.0,
        ge=0,
        description="prefix-cost placement: prefill tokens one running/waiting request is worth "
        "(0 = off: the weighted score)",
    )
    queue_tokens: float = Field(
        default=0.25,
        ge=0,
        description="prefix-cost placement: weight per prompt token a replica still has to prefill",
    )
    balance_abs: float = Field(
        default=8.0, ge=0, description="prefix-cost placement: load gap (requests) that forces least-loaded"
    )
    balance_rel: float = Field(
        default=1.5, ge=1, description="prefix-cost placement: load ratio that forces least-loaded"
    )
    kv_tokens: float = Field(
        default=0.0,
        ge=0,
        description="prefix-cost placement: tokens a replica's KV held by running requests is worth "
        "at kv_usage 1 (memory pressure; 0 = off)",
    )
    min_gain_tokens: float = Field(
        default=0.0,
        ge=0,
        description="prefix-cost placement: a held prefix saving fewer prefill tokens than this over "
        "the least-loaded replica does not move the step off it (0 = off)",
    )
    decode_tokens: float = Field(
        default=0.0,
        ge=0,
        description="prefix-cost placement: weight per context token (prompt + expected output) of "
        "the requests in flight on a replica (decode load; 0 = off)",
    )
    balance_context_tokens: float = Field(
        default=0.0,
        ge=0,
        description="prefix-cost placement: a replica whose in-flight context tokens exceed the least "
        "one's by more than this is not a candidate (bounded decode-load imbalance; 0 = off)",
    )

    def weights(self) -> ScoreWeights:
        return ScoreWeights(
            self.warm,
            self.queue,
            self.running,
            self.kv,
            self.queue_half,
            self.running_half,
            self.load_tokens,
            self.queue_tokens,
            self.balance_abs,
            self.balance_rel,
            self.kv_tokens,
            self.min_gain_tokens,
            self.decode_tokens,
            self.balance_context_tokens,
        )


class _Base(_Strict):
    name: str | None = Field(default=None, description="label in reports and logs (default: the kind)")
    scoring: Scoring = Field(default_factory=lambda: Scoring())
    explore: ExploreConfig | None = Field(
        default=None, description="exploration with logged propensities (None: off)"
    )

    def label(self) -> str:
        return self.name or str(getattr(self, "kind"))  # noqa: B009 - every subclass has `kind`


def _bundle_threshold(bundle: ModelBundle | None, key: str, kind: str) -> float:
    if bundle is None:
        raise PolicyConfigError(
            f"policy {kind!r} needs {key}: set it in the policy config or give a model bundle"
        )
    thresholds = getattr(bundle, "thresholds", None) or {}
    if key not in thresholds:
        raise PolicyConfigError(
            f"policy {kind!r} needs {key}: the bundle has no such threshold (has {sorted(thresholds)}); set it in config"
        )
    return float(thresholds[key])


class LearnedConfig(_Base):
    """The learned run-stable policy (router.policy.learned explains the algorithm)."""

    kind: Literal["learned"] = "learned"
    p_frontier_up: float | None = Field(
        default=None, ge=0, le=1, description="escalate at P(needs frontier) >= this"
    )
    p_frontier_down: float | None = Field(
        default=None, ge=0, le=1, description="de-escalate at P < this (0: never)"
    )
    value_of_success_usd: float = Field(
        default=1.0, ge=0, description="USD value of turning a failing run into a success"
    )
    min_dwell_steps: int = Field(default=3, ge=0, description="steps after a switch before the next one")
    max_switches: int = Field(default=2, ge=0, description="cap on switches per run (failovers count)")
    off_boundary_ratio: float = Field(
        default=4.0, ge=1, description="a switch off a tool boundary needs gain >= this x switch cost"
    )
    frontier_cache_hit: float = Field(
        default=0.8, ge=0, le=1, description="share of frontier input at cached price"
    )
    output_token_share: float = Field(
        default=0.05, ge=0, le=1, description="share of remaining tokens that are output"
    )
    local_gpu_usd_per_hour: float = Field(
        default=GPU_HOUR_USD, ge=0, description="local GPU price when a local backend carries none"
    )
    latency_usd_per_s: float = Field(
        default=0.0, ge=0, description="USD per second of prefill latency (0 = money only)"
    )
    benefit_up: float = Field(
        default=0.0,
        ge=-1,
        le=1,
        description="with the benefit model: escalate only at P(ok|frontier)-P(ok|local) >= this",
    )
    benefit_down: float = Field(
        default=0.0, ge=-1, le=1, description="with the benefit model: de-escalate at an uplift < this"
    )
    trouble_boost: dict[str, float] = Field(
        default_factory=dict,
        description="per signal kind posted on the run: added to P before the economics "
        "(router.policy.trouble; empty = off)",
    )
    frontier_budget: FrontierBudget | None = Field(
        default=None,
        description="the user's frontier budget (router.policy.budget): share of runs or steps, per "
        "domain or global; the threshold becomes an online conformal quantile of the policy's own "
        "scores (None = the fixed thresholds above)",
    )

    @model_validator(mode="after")
    def _order(self) -> LearnedConfig:
        bad = sorted(set(self.trouble_boost) - set(SIGNAL_KINDS) - set(POSTHOC_KINDS))
        if bad:
            raise ValueError(
                f"trouble_boost: unknown signal kind(s) {bad}; kinds are {list(SIGNAL_KINDS + POSTHOC_KINDS)}"
            )
        if self.p_frontier_up is not None and self.p_frontier_down is not None:
            if self.p_frontier_down > self.p_frontier_up:
                raise ValueError("p_frontier_down must be <= p_frontier_up (hysteresis band)")
        if self.benefit_down > self.benefit_up:
            raise ValueError("benefit_down must be <= benefit_up (hysteresis band)")
        return self

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        up = self.p_frontier_up
        down = self.p_frontier_down
        if up is None:
            up = _bundle_threshold(bundle, "p_frontier_up", self.kind)
        if down is None:
            down = _bundle_threshold(bundle, "p_frontier_down", self.kind)
        if down > up:
            raise PolicyConfigError(f"learned: p_frontier_down ({down}) > p_frontier_up ({up})")
        return LearnedPolicy(
            p_frontier_up=up,
            p_frontier_down=down,
            value_of_success_usd=self.value_of_success_usd,
            min_dwell_steps=self.min_dwell_steps,
            max_switches=self.max_switches,
            off_boundary_ratio=self.off_boundary_ratio,
            frontier_cache_hit=self.frontier_cache_hit,
            output_token_share=self.output_token_share,
            local_gpu_usd_per_hour=self.local_gpu_usd_per_hour,
            latency_usd_per_s=self.latency_usd_per_s,
            weights=self.scoring.weights(),
            name=self.label(),
            benefit_up=self.benefit_up,
            benefit_down=self.benefit_down,
            trouble=TroubleTerm(self.trouble_boost) if self.trouble_boost else None,
            frontier_budget=self.frontier_budget,
        )


class AlwaysLocalConfig(_Base):
    kind: Literal["always-local"] = "always-local"
    # a plain load balancer: load terms only, the run's warm prefix is not looked at
    scoring: Scoring = Field(default_factory=lambda: Scoring(warm=0.0))
    sticky: bool = Field(
        default=False, description="keep a run on its replica (default: fresh pick each step)"
    )

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        return AlwaysLocalPolicy(self.scoring.weights(), sticky=self.sticky, name=self.label())


class PrefixAwareConfig(_Base):
    """Local only; every step placed afresh by prefix cost (router.policy.filters, prefix-cost mode):
    prefill still to compute on the replica after the prefix the index says it holds + load."""

    kind: Literal["prefix-aware"] = "prefix-aware"
    # kv_tokens, min_gain_tokens: chosen on the runs starting in the first 20 minutes of the Mooncake
    # conversation hour (bench/prefix_placement.py --runs-window 0:20, docs/prefix-index.md);
    # decode_tokens off: the value those runs picked (0.05) did worse on the rest of the hour
    scoring: Scoring = Field(
        default_factory=lambda: Scoring(load_tokens=512.0, kv_tokens=2000.0, min_gain_tokens=1024.0)
    )

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        w = self.scoring.weights()
        if w.load_tokens <= 0:
            raise PolicyConfigError("prefix-aware: scoring.load_tokens must be > 0")
        return PrefixAwarePolicy(w, name=self.label())


class AlwaysFrontierConfig(_Base):
    kind: Literal["always-frontier"] = "always-frontier"

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        return AlwaysFrontierPolicy(self.scoring.weights(), name=self.label())


class PerStepThresholdConfig(_Base):
    kind: Literal["per-step-threshold"] = "per-step-threshold"
    threshold: float | None = Field(
        default=None, ge=0, le=1, description="frontier at p >= this (None: bundle's up)"
    )

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        t = (
            self.threshold
            if self.threshold is not None
            else _bundle_threshold(bundle, "p_frontier_up", self.kind)
        )
        return PerStepThresholdPolicy(t, self.scoring.weights(), name=self.label())


class SessionStickyConfig(_Base):
    kind: Literal["session-sticky"] = "session-sticky"
    # consistent hashing ignores load by default (production-stack session affinity)
    scoring: Scoring = Field(default_factory=lambda: Scoring(warm=0.0, queue=0.0, running=0.0, kv=0.0))

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        return SessionStickyPolicy(self.scoring.weights(), name=self.label())


class StallEscalationConfig(_Base):
    kind: Literal["stall-escalation"] = "stall-escalation"

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        return StallEscalationPolicy(self.scoring.weights(), name=self.label())


class OracleConfig(_Base):
    kind: Literal["oracle"] = "oracle"

    def build(self, bundle: ModelBundle | None = None) -> Policy:
        return OraclePolicy(self.scoring.weights(), name=self.label())


PolicyConfig = Annotated[
    LearnedConfig
    | AlwaysLocalConfig
    | AlwaysFrontierConfig
    | PerStepThresholdConfig
    | SessionStickyConfig
    | StallEscalationConfig
    | OracleConfig
    | PrefixAwareConfig,
    Field(discriminator="kind"),
]

POLICY_KINDS: tuple[str, ...] = (
    "learned",
    "always-local",
    "always-frontier",
    "per-step-threshold",
    "session-sticky",
    "stall-escalation",
    "oracle",
    "prefix-aware",
)

_ADAPTER: TypeAdapter[Any] = TypeAdapter(PolicyConfig)


def _one_line(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def parse_policy_config(cfg: object) -> Any:
    """Validate ``cfg`` (a config object, a dict with ``kind``, or a bare kind string)."""
    if isinstance(cfg, BaseModel):
        return cfg
    if isinstance(cfg, str):
        cfg = {"kind": cfg}
    if not isinstance(cfg, dict):
        raise PolicyConfigError(f"policy config must be a mapping with 'kind' (got {type(cfg).__name__})")
    if "kind" not in cfg:
        raise PolicyConfigError(f"policy config needs 'kind', one of {', '.join(POLICY_KINDS)}")
    if cfg["kind"] not in POLICY_KINDS:
        raise PolicyConfigError(
            f"unknown policy kind {cfg['kind']!r}; expected one of {', '.join(POLICY_KINDS)}"
        )
    try:
        return _ADAPTER.validate_python(cfg)
    except ValidationError as e:
        raise PolicyConfigError(f"policy {cfg['kind']!r}: {_one_line(e)}") from None


def build_policy(cfg: object, bundle: ModelBundle | None = None) -> Policy:
    """Validate ``cfg`` and build its policy; thresholds left unset come from ``bundle``."""
    parsed = parse_policy_config(cfg)
    try:
        policy: Policy = parsed.build(bundle)
    except PolicyConfigError:
        raise
    except ValueError as e:
        raise PolicyConfigError(str(e)) from None
    explore = getattr(parsed, "explore", None)
    if explore is not None and explore.rate > 0.0:
        policy = ExplorePolicy(policy, explore)
    return policy
