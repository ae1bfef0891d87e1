"""Running aggregates of a run's finished steps (:class:`StepAggregate`): what
:func:`features.extract.extract` reads instead of walking every step.

Per step folded in (:meth:`StepAggregate.add`, O(its tool calls)): token sums and maxima, tool-call
counts per verb class (:mod:`features.verbs`; and the last step's write-class calls), the tool-call-key counts behind the
repeated-call features, the tool-error streak, structured outputs, cache counters, tier switches
and tool pauses.
"""

from __future__ import annotations

from features.prefix import StepView
from features.verbs import WRITE, verb_class

__all__ = ["StepAggregate"]


class StepAggregate:
    """Running aggregates over a run's earlier steps: everything :func:`extract` needs from them
    besides the first and the last step. :meth:`add` folds in one step in O(its tool calls), so a
    prefix that grows through :meth:`features.prefix.RunPrefix.append` is extracted in O(1) per
    step. The full scan builds the same object by adding every step in order, so both paths compute
    bit-identical vectors."""

    __slots__ = (
        "n",
        "last",
        "tokens",
        "out_sum",
        "out_max",
        "n_calls",
        "verbs",
        "last_write",
        "seen",
        "repeated",
        "max_rep",
        "last_repeated",
        "errors",
        "streak",
        "structured",
        "cached_sum",
        "cached_prompt",
        "has_cache",
        "switches",
        "frontier",
        "prev_tier",
        "pause_sum",
        "pause_n",
    )

    def __init__(self) -> None:
        self.n = 0
        self.last: StepView | None = None
        self.tokens = 0
        self.out_sum = 0
        self.out_max = 0
        self.n_calls = 0
        self.verbs = [0, 0, 0]  # read, write, other (features.verbs)
        self.last_write = 0  # write-class calls of the last step
        self.seen: dict[str, int] = {}
        self.repeated = 0
        self.max_rep = 0
        self.last_repeated = 0
        self.errors = 0
        self.streak = 0
        self.structured = 0
        self.cached_sum = 0
        self.cached_prompt = 0
        self.has_cache = False
        self.switches = 0
        self.frontier = 0
        self.prev_tier: str | None = None
        self.pause_sum = 0.0
        self.pause_n = 0

    @classmethod
    def of(cls, steps: list[StepView]) -> StepAggregate:
        """The aggregate of ``steps`` (the full scan)."""
        agg = cls()
        add = agg.add
        for s in steps:
            add(s)
        return agg

    def add(self, s: StepView) -> None:
        """Fold in the next step."""
        self.n += 1
        self.last = s
        c = s.completion_tokens
        self.tokens += s.prompt_tokens + c
        self.out_sum += c
        if c > self.out_max:
            self.out_max = c
        calls = s.tool_calls
        if calls:
            self.n_calls += len(calls)
            verbs = self.verbs
            w0 = verbs[WRITE]
            for name in calls:
                verbs[verb_class(name)] += 1
            self.last_write = verbs[WRITE] - w0
        else:
            self.last_write = 0
        step_rep = 0
        keys = s.tool_call_keys
        if keys:
            seen = self.seen
            for key in keys:
                n = seen.get(key, 0)
                if n:
                    self.repeated += 1
                    step_rep = 1
                    if n > self.max_rep:
                        self.max_rep = n
                seen[key] = n + 1
        self.last_repeated = step_rep
        errs = s.tool_result_errors
        if errs:
            streak = self.streak
            for e in errs:
                if e:
                    self.errors += 1
                    streak += 1
                else:
                    streak = 0
            self.streak = streak
        st = s.structured
        if st or (st is None and calls):
            self.structured += 1
        if s.cached_tokens is not None:
            self.has_cache = True
            self.cached_sum += s.cached_tokens
            self.cached_prompt += s.prompt_tokens
        t = s.tier
        if t is not None:
            if self.prev_tier is not None and t != self.prev_tier:
                self.switches += 1
            self.prev_tier = t
            if t == "frontier":
                self.frontier += 1
        if s.tool_pause_s is not None:
            self.pause_sum += s.tool_pause_s
            self.pause_n += 1
