"""Plain data types of the decision layer: one `Snapshot` in, one `Decision` out.

The policy layer is pure: no I/O, no clock, no FastAPI. The sidecar and the what-if simulator build
a `Snapshot` for each step and call ``policy.decide(snapshot)``; the policy returns a `Decision`.
Run-stable policies keep per-run memory only through ``Snapshot.run`` (the pin and switch history
the caller stores in its run-state store) and say what to store via ``Decision``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from models.types import Predictions

__all__ = ["Tier", "BackendState", "RunState", "Snapshot", "Decision", "Policy", "apply_decision"]

Tier = Literal["local", "frontier"]


@dataclass(slots=True)
class BackendState:
    """One backend (a local vLLM replica or the frontier API) as the caller sees it now."""

    name: str  # replica id, e.g. "local-0", "frontier"
    tier: Tier
    model: str
    healthy: bool = True
    max_context: int = 131072
    running: int = 0  # requests running (vllm:num_requests_running + router in-flight)
    waiting: int = 0  # queued (vllm:num_requests_waiting)
    kv_usage: float = 0.0  # 0-1 (vllm:kv_cache_usage_perc)
    warm_prefix_tokens: int = 0  # tokens of this run's prefix believed cached on this backend
    # token prices in USD per 1M tokens (a frontier API; 0 for a local replica)
    price_in_per_m: float = 0.0
    price_cached_in_per_m: float = 0.0
    price_out_per_m: float = 0.0
    # the provider's prompt-cache write price (Anthropic: 1.25 x input); 0 = the input price
    price_cache_write_per_m: float = 0.0
    # latency model terms (seconds), used to price prefill/cold start
    prefill_s_per_token: float = 0.0
    ttft_base_s: float = 0.0
    # a local replica's price in USD per GPU-hour (0 = the policy's ``local_gpu_usd_per_hour``)
    gpu_usd_per_hour: float = 0.0
    # prompt tokens the replica still has to prefill for requests already sent to it (the router's
    # in-flight knowledge; 0 = unknown): the prefix-cost placement's queue term
    prefill_queue_tokens: int = 0
    # context (prompt + expected output) tokens of the requests in flight on the replica, which its
    # decode iterations attend over (Dynamo's active blocks, in tokens; 0 = unknown): the
    # prefix-cost placement's decode term
    inflight_context_tokens: int = 0


@dataclass(slots=True)
class RunState:
    """Per-run routing memory, owned by the caller's run-state store (in-process or Redis)."""

    run_id: str
    tier: Tier | None = None  # pinned tier (None before the first decision)
    replica: str | None = None  # pinned backend name
    pinned_at_step: int = 0
    switches: int = 0
    steps_seen: int = 0
    last_switch_step: int | None = None
    admitted: str | None = None  # admission decision at the first step ("admit-local", "spill", ...)
    priority: str = "interactive"
    tenant: str | None = None
    owner: str | None = None  # the client key (its id, never the key) that started the run
    # exploration (router.policy.explore): P(this run explores | its decisions so far); None: the
    # run started without an exploring policy
    explore_post: float | None = None
    # signals of the run (POST /v1/runs/{id}/signal) its latest step saw, so the next step on any
    # router knows which are new (router.server.runs.context)
    signals_seen: int = 0


@dataclass(slots=True)
class Snapshot:
    """Everything a policy may look at for one step of one run."""

    run: RunState
    step_index: int
    features: Mapping[str, float]  # named feature values (features.extract spec); may be lazy
    predictions: Predictions
    backends: list[BackendState]
    context_tokens: int = 0  # prompt tokens of the new request
    at_tool_boundary: bool = False  # the new request carries tool results (switch here if at all)
    last_tool_repeated: bool = False  # newest tool call repeats an earlier identical call
    last_tool_errored: bool = False  # newest tool result was an error
    label_needs_frontier: bool | None = None  # only the oracle reads this (evaluation only)
    requested_model: str | None = None  # a concrete model named by the client bypasses the policy
    explore_allowed: bool = True  # the step engine's exploration budget has room (router.core.explore)
    # the frontier budget's current threshold for this run's domain (router.core.budget; None: the
    # policy has no budget): a budgeted policy escalates iff its score > this
    budget_threshold: float | None = None


@dataclass(slots=True)
class Decision:
    """Where this step goes and why. ``scores`` keeps the numbers behind the choice."""

    tier: Tier
    backend: str  # BackendState.name
    model: str
    reason: str  # short reason code, e.g. "pinned", "escalate-benefit", "no-healthy-local"
    scores: dict[str, float] = field(default_factory=dict)
    switched: bool = False  # tier or replica changed from the run's pin
    shadow: Decision | None = None  # what a shadow policy would have done
    # the probability with which the deciding policy takes this decision (1.0: deterministic) and
    # whether it was a randomised (exploration) choice; logged with every step for off-policy evaluation
    propensity: float = 1.0
    explore: bool = False
    explore_post: float | None = None  # what to store as RunState.explore_post (None: unchanged)


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, snapshot: Snapshot) -> Decision: ...


def apply_decision(run: RunState, decision: Decision, step_index: int) -> RunState:
    """Update a run's pin after a decision; the one rule shared by the router and the simulator.

    A switch is a change of pinned tier or replica after the first decision; it increments
    ``switches`` and records ``last_switch_step``. ``explore_post`` is stored when the decision
    carries one. Returns the same (mutated) object.
    """
    if decision.explore_post is not None:
        run.explore_post = decision.explore_post
    if run.tier is None:
        run.tier, run.replica, run.pinned_at_step = decision.tier, decision.backend, step_index
    elif decision.tier != run.tier or decision.backend != run.replica:
        run.switches += 1
        run.last_switch_step = step_index
        run.tier, run.replica, run.pinned_at_step = decision.tier, decision.backend, step_index
    run.steps_seen = max(run.steps_seen, step_index + 1)
    return run
