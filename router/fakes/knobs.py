"""The knobs every fake shares (:class:`CommonKnobs`, validated as one line on error), and the
per-request :class:`Ticket` and per-server :class:`Stats` (see :mod:`router.fakes.server` for what
each knob does)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["KnobError", "CommonKnobs", "validate_knobs", "Ticket", "Stats"]


class KnobError(ValueError):
    """Bad knob name or value, as one line."""


class CommonKnobs(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "fake-model"
    name: str | None = None
    zero_latency: bool = False
    delay_ms: float = Field(0.0, ge=0)
    error_rate: float = Field(0.0, ge=0, le=1)
    error_status: int = Field(500, ge=500, le=599)
    abort_rate: float = Field(0.0, ge=0, le=1)
    seed: int = 0
    default_tokens: int = Field(16, ge=1)
    max_tokens_cap: int = Field(256, ge=1)
    tool_call_rate: float = Field(1.0, ge=0, le=1)
    malformed_tool_call_rate: float = Field(0.0, ge=0, le=1)  # chance a call's arguments lose their last byte
    strict_model: bool = True
    max_concurrency: int = Field(0, ge=0)
    max_tool_turns: int = Field(0, ge=0)  # answer with text once a request carries this many tool results


def validate_knobs(cls: type[BaseModel], values: Mapping[str, object]) -> Any:
    try:
        return cls.model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "knobs"
        known = ", ".join(sorted(cls.model_fields))
        hint = f" (known knobs: {known})" if err["type"] == "extra_forbidden" else ""
        raise KnobError(f"bad knob {loc!r}: {err['msg']}{hint}") from None


@dataclass(slots=True)
class Ticket:
    """One admitted request: what the engine decided and when it happened."""

    arrived: float
    admitted: float = 0.0
    cached_tokens: int = 0
    created_tokens: int = 0
    prompt_tokens: int = 0
    slot: Any = None  # engine-specific (e.g. a prefix-cache allocation)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Stats:
    requests: int = 0
    completed: int = 0
    streamed: int = 0
    bad_requests: int = 0
    errors_injected: int = 0
    aborts_injected: int = 0
    rate_limited: int = 0
    unauthorized: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    models_seen: dict[str, int] = field(default_factory=dict)
    protocols: dict[str, int] = field(default_factory=dict)
