"""The synthetic generator's knobs: :class:`GeneratorParams` (defaults calibrated to real traces; the
algorithm that uses each knob and what the defaults match are in :mod:`features.generate`) and the
domain tool vocabularies :data:`DOMAIN_TOOLS`.

Knobs: every field of :class:`GeneratorParams`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["GeneratorParams", "DOMAIN_TOOLS", "BLOCK_TOKENS"]

BLOCK_TOKENS = 512

# Small tool vocabularies per domain (names only; Zipf-weighted in this order).
DOMAIN_TOOLS: dict[str, tuple[str, ...]] = {
    "airline": (
        "get_user_details",
        "get_reservation_details",
        "search_direct_flight",
        "search_onestop_flight",
        "update_reservation_flights",
        "book_reservation",
        "cancel_reservation",
        "calculate",
        "transfer_to_human_agents",
    ),
    "retail": (
        "find_user_id_by_email",
        "get_order_details",
        "get_product_details",
        "get_user_details",
        "modify_pending_order_items",
        "return_delivered_order_items",
        "exchange_delivered_order_items",
        "cancel_pending_order",
    ),
    "code": ("read_file", "grep", "run_tests", "edit_file", "list_dir", "bash"),
    "research": ("web_search", "fetch_url", "python", "summarize"),
}


@dataclass(frozen=True)
class GeneratorParams:
    """Every knob of the generator; defaults are calibrated (see the module docstring).

    Groups (the algorithm step that uses each is in the module docstring): latent outcome process
    (success rates, ``outcome_noise``, ``difficulty``, ``frontier_gap``, model names); run length
    (per-outcome medians, lognormal ``steps_sigma``, ``length_difficulty_coef``, clip bounds); step
    kinds and output sizes (lognormal medians/sigmas in tokens); context (``n_domains`` of
    :data:`DOMAIN_TOOLS`, system prompt, message and tool-result sizes, ``turn_overhead_tokens`` of
    framing per new message, ``growth_coef``, ``hash_ids`` on/off - off saves ~35% time at 1M steps);
    failure signals (marginal rates and their dependence on the latent ``u``); timing (run arrival
    process, pauses, nominal service time; ``start_time_s`` is the first run's start).
    """

    # latent outcome process
    weak_success_rate: float = 0.38  # tau2 gpt-oss-120b airline, 19/50
    strong_success_rate: float = 0.72  # tau2 claude-sonnet-4-5 airline, 36/50
    outcome_noise: float = 0.6  # model-specific noise sd relative to the task difficulty sd (1)
    difficulty: float = 0.0  # mean task difficulty shift (higher = harder tasks)
    frontier_gap: float = 0.0  # extra capability of the strong model (difficulty units)
    weak_model: str = "gpt-oss-120b"
    strong_model: str = "claude-sonnet-4-5"
    # run length
    median_steps_success: float = 8.5  # tau-bench gpt-4o airline
    median_steps_failure: float = 13.0
    steps_sigma: float = 0.35
    length_difficulty_coef: float = 0.25
    min_steps: int = 2
    max_steps: int = 200
    # step kinds and output sizes
    tool_step_share: float = 0.47
    tool_completion_median: float = 13.0
    tool_completion_sigma: float = 0.15
    tool_long_share: float = 0.2
    tool_long_completion_median: float = 90.0
    tool_long_completion_sigma: float = 0.5
    text_completion_median: float = 65.0
    text_completion_sigma: float = 0.56
    # context
    n_domains: int = 4
    system_prompt_tokens: int = 5650
    user_message_tokens_median: float = 23.0
    user_message_tokens_sigma: float = 0.56
    first_user_tokens_median: float = 60.0
    tool_result_tokens_median: float = 167.0
    tool_result_tokens_sigma: float = 0.9
    turn_overhead_tokens: int = 8
    growth_coef: float = 0.055  # tau-bench: tool results ~8% bigger in failed runs (log ratio 0.081)
    hash_ids: bool = True
    # observable failure signals
    tool_error_rate: float = 0.063
    # failure signals calibrated to tau-bench's own association (failed vs successful runs, log odds
    # ratios 0.68 for errors, 1.49 for repeats; bench/calibrate_generator.py), no stronger: a planted
    # signal the real data lacks would teach the escalation model a shortcut (issue 14)
    error_coef: float = 0.4
    repeat_rate: float = 0.023
    repeat_coef: float = 0.75
    repeat_after_error: float = 1.5
    # timing
    arrival_rate: float = 2.567  # runs/s (Azure code trace mean request rate)
    arrival_cluster_mean: float = 20.0
    arrival_cluster_sigma: float = 1.5
    arrival_spread_s: float = 0.5
    start_time_s: float = 0.0
    tool_pause_median_s: float = 0.5  # assumption (tau2 tools are in-memory: sub-ms)
    tool_pause_sigma: float = 1.2
    user_pause_median_s: float = 1.77  # tau2 user-simulator turns
    user_pause_sigma: float = 0.6
    service_base_s: float = 0.35
    decode_tokens_per_s: float = 55.0

    def __post_init__(self) -> None:
        for name in ("weak_success_rate", "strong_success_rate", "tool_error_rate", "repeat_rate"):
            v = getattr(self, name)
            if not 0.0 < v < 1.0:
                raise ValueError(f"generator: {name} must be strictly between 0 and 1, got {v}")
        for name in ("tool_step_share", "tool_long_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"generator: {name} must be in [0, 1], got {v}")
        sigmas = [f.name for f in dataclasses.fields(self) if f.name.endswith("sigma")]
        for name in [*sigmas, "arrival_spread_s", "service_base_s"]:
            if getattr(self, name) < 0:
                raise ValueError(f"generator: {name} must be >= 0, got {getattr(self, name)}")
        positive = (
            "outcome_noise", "median_steps_success", "median_steps_failure", "tool_completion_median",
            "tool_long_completion_median", "text_completion_median", "user_message_tokens_median",
            "first_user_tokens_median", "tool_result_tokens_median", "arrival_rate", "arrival_cluster_mean",
            "tool_pause_median_s", "user_pause_median_s", "decode_tokens_per_s",
        )  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"generator: {name} must be > 0, got {getattr(self, name)}")
        if self.n_domains < 1 or self.n_domains > len(DOMAIN_TOOLS):
            raise ValueError(f"generator: n_domains must be 1..{len(DOMAIN_TOOLS)}, got {self.n_domains}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError("generator: need 1 <= min_steps <= max_steps")
        if self.system_prompt_tokens < 0 or self.turn_overhead_tokens < 0:
            raise ValueError("generator: token counts must be >= 0")

    @classmethod
    def from_overrides(cls, **params: Any) -> GeneratorParams:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"generator: unknown parameter(s) {', '.join(unknown)}")
        return cls(**params)
