"""What the hot path tells the client about a step besides the upstream's answer.

- :func:`step_headers`: ``x-runroute-run-id`` (the header-safe run id as the client sent it, without
  its tenant scope: :func:`router.server.runs.identity.client_id`), ``-tier``, ``-replica``,
  ``-reason``, ``-step``, ``-fallback-from`` (after a fallback), ``-admission`` (``admit-local`` /
  ``spill`` at a run's first step).
- :func:`reject_error`: the 429 ``run_rejected_overload`` of a new run admission refused, with
  ``Retry-After`` = the plan's estimate of when a slot frees (at least ``retry_after_min_s``, whole
  seconds, >= 1), ``retry-after-ms``, and ``x-should-retry``: ``true`` up to
  ``client_retry_max_s``, else ``false`` (the openai/anthropic SDKs retry silently on their own,
  the anthropic one waiting any Retry-After; past the bound the caller sees the 429 at once).
"""

from __future__ import annotations

import math
from typing import Protocol

from router.core.engine import StepPlan
from router.server.errors import ProxyError
from router.server.runs.identity import client_id

__all__ = ["step_headers", "reject_error", "RetryKnobs"]


class RetryKnobs(Protocol):
    """The admission knobs a 429 reads (:class:`router.server.settings.AdmissionSettings`)."""

    @property
    def retry_after_min_s(self) -> float: ...
    @property
    def slo_short_step_s(self) -> float: ...
    @property
    def client_retry_max_s(self) -> float: ...


def step_headers(plan: StepPlan, run_id: str, tier: str, replica: str) -> dict[str, str]:
    h = {
        "x-runroute-run-id": client_id(run_id),
        "x-runroute-tier": tier,
        "x-runroute-replica": replica,
        "x-runroute-reason": plan.decision.reason,
        "x-runroute-step": str(plan.step),
    }
    if plan.fallback_from:
        h["x-runroute-fallback-from"] = plan.fallback_from
    if plan.admission in ("admit-local", "spill"):
        h["x-runroute-admission"] = plan.admission
    return h


def reject_error(plan: StepPlan, run_id: str, adm: RetryKnobs) -> ProxyError:
    """``adm``: the admission settings (``retry_after_min_s``, ``slo_short_step_s``)."""
    ad = plan.admission_decision
    assert ad is not None
    wait = plan.retry_after_s if plan.retry_after_s is not None else adm.retry_after_min_s
    retry = max(1, math.ceil(wait))
    return ProxyError(
        429,
        "run_rejected_overload",
        f"new run refused: the local tier is at capacity ({ad.reason}, predicted short step "
        f"{ad.predicted_short_step_s:.2f}s vs SLO {adm.slo_short_step_s:g}s); retry after {retry}s",
        {
            "retry-after": str(retry),
            "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
            "x-should-retry": "true" if retry <= adm.client_retry_max_s else "false",
            "x-runroute-run-id": client_id(run_id),
            "x-runroute-reason": plan.decision.reason,
            "x-runroute-admission": "reject",
        },
    )
