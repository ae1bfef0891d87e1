"""`RunPrefix`: what the router can see about a run when step k arrives, before generation starts.

Built three ways, always into this one type so that feature extraction has one code path:
- training: from logged Step rows of whole runs (:func:`features.extract.iter_prefixes` /
  :func:`features.extract.iter_frame_prefixes`),
- serving: by the sidecar from its run state plus the incoming request,
- simulation: by the what-if simulator from replayed steps.

Earlier steps are :class:`StepView` (facts known once that step finished). The new request is
described by the ``new_*`` fields (facts visible in the request body: its prompt size, the tool
results it carries, whether it asks for tools/JSON).

Incremental features: ``aggregate`` optionally holds running aggregates over ``steps``
(:class:`features.extract.StepAggregate`), which :func:`features.extract.extract` uses instead of
walking every step, so a growing run costs O(1) per step. Grow ``steps`` through
:meth:`RunPrefix.append`, which keeps the aggregate current. The aggregate is trusted only while it
covers exactly ``steps`` (same count, same last step object); any other change of ``steps`` makes
extraction fall back to the full scan (and rebuild the aggregate). Steps already in the list must
not be replaced or mutated in place while an aggregate is attached. ``aggregate`` takes no part in
equality or repr.

Run context (contract C2, the same in all three builders): ``domain`` (the run's domain: the
sidecar resolves it at the run's first step, see ``router.server.domain``; training and replay read
the run record's ``domain``), ``task_embedding`` (the ``features.embed`` vector of the run's first
user message, computed once per run; None until known; never part of the feature vector: a
predictor that wants it reads the prefix) and ``signals`` (the kinds of every signal posted on the
run so far, oldest first, ``POST /v1/runs/{id}/signal``; the last ``new_signals_n`` of them arrived
since the run's previous step, which is what the run log's ``Step.signals`` holds, so a logged run
replays into the same prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["StepView", "RunPrefix", "Aggregate", "SIGNAL_KINDS", "POSTHOC_KINDS", "signal_kind"]

#: the signal kinds a client or verifier may post on a run (``POST /v1/runs/{id}/signal``); each
#: has its own features (count so far, count since the previous step); ``other`` is anything else
#: worth telling (the endpoint refuses kinds outside this list)
SIGNAL_KINDS: tuple[str, ...] = ("verifier_failed", "user_rejected", "tests_failed", "other")
_KIND_INDEX = {k: i for i, k in enumerate(SIGNAL_KINDS)}

#: the signal kinds the sidecar itself records when a local step's answer comes back
#: (:mod:`router.server.hotpath.posthoc`); in the feature vector they count as ``other`` (``sig_other``,
#: ``new_sig_other``: the spec's columns are unchanged, so shipped bundles keep loading), and the
#: snapshot's named features expose each as ``sig_<kind>`` for the trouble term
POSTHOC_KINDS: tuple[str, ...] = (
    "tool_call_malformed",
    "tool_not_offered",
    "answer_empty",
    "answer_truncated",
    "tool_call_repeated",
    "low_confidence",
)


def signal_kind(kind: str) -> int:
    """Index of ``kind`` in :data:`SIGNAL_KINDS` (a kind outside it counts as ``other``)."""
    return _KIND_INDEX.get(kind, len(SIGNAL_KINDS) - 1)


@dataclass(slots=True)
class StepView:
    """A finished earlier step of the run."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    tool_calls: tuple[str, ...] = ()  # tool names the step produced
    tool_call_keys: tuple[str, ...] = ()  # hash of (name, args): repeated keys signal a loop
    tool_results_n: int = 0  # tool results this step consumed
    tool_result_errors: tuple[bool, ...] = ()
    tool_result_tokens: tuple[int, ...] = ()
    tool_pause_s: float | None = None  # gap before this step (since the previous step ended)
    arrival_s: float | None = None
    latency_s: float | None = None
    structured: bool | None = None  # produced a tool call / JSON
    tier: str | None = None  # "local" | "frontier"


class Aggregate(Protocol):
    """Running aggregates over a prefix's steps (implemented by features.extract.StepAggregate)."""

    n: int  # steps folded in
    last: StepView | None  # the last step folded in (identity check)

    def add(self, step: StepView) -> None: ...


@dataclass(slots=True)
class RunPrefix:
    """Everything visible when step ``len(steps)`` of run ``run_id`` arrives."""

    run_id: str
    steps: list[StepView] = field(default_factory=list)
    run_started_s: float | None = None
    now_s: float | None = None  # arrival time of the new step (same clock as run_started_s)
    # the new request
    new_prompt_tokens: int = 0
    new_tool_results_n: int = 0
    new_tool_result_errors: tuple[bool, ...] = ()
    new_tool_result_tokens: tuple[int, ...] = ()
    new_tool_pause_s: float | None = None
    new_n_tools_offered: int = 0
    new_wants_json: bool = False
    # context for the cache-reuse predictor: prefix-cache turnover on the run's local replica since
    # the run's previous step = tokens newly written into the cache / cache capacity in tokens,
    # clipped to [0, 1]; None (NaN feature) when unknown or at a run's first step
    local_cache_pressure: float | None = None
    # run context (contract C2; see the module docstring)
    domain: str | None = None
    task_embedding: np.ndarray | None = field(default=None, compare=False, repr=False)
    signals: tuple[str, ...] = ()  # client/verifier signals posted on the run so far
    new_signals_n: int = 0  # how many of the last ``signals`` arrived since the previous step
    # running feature aggregates over ``steps`` (see the module docstring); never compared or shown
    aggregate: Aggregate | None = field(default=None, compare=False, repr=False)

    @property
    def step_index(self) -> int:
        return len(self.steps)

    def aggregate_valid(self) -> bool:
        """True when ``aggregate`` covers exactly ``steps`` (same count, same last step object)."""
        agg = self.aggregate
        if agg is None:
            return False
        steps = self.steps
        n = len(steps)
        return agg.n == n and (n == 0 or agg.last is steps[n - 1])

    def append(self, step: StepView) -> None:
        """Append a finished step, folding it into ``aggregate`` when that is current (else it is
        dropped; the next extraction rebuilds it)."""
        if self.aggregate is not None:
            if self.aggregate_valid():
                self.aggregate.add(step)
            else:
                self.aggregate = None
        self.steps.append(step)
