"""`build_snapshot`: the one helper the sidecar and the simulator use to make a :class:`Snapshot`.

It derives, from the run's visible prefix:

- ``features``: the named feature values (``features.extract.extract_dict``); a caller that already
  extracted the vector (e.g. to feed the predictor) passes ``features=`` to skip a second pass;
- ``at_tool_boundary``: the new request carries tool results (``new_tool_results_n > 0``): the step
  after tool results arrive is where a run may switch with the least disruption;
- ``last_tool_repeated``: the newest tool call (the last key of the latest step that produced calls)
  repeats an identical earlier call (same ``tool_call_keys`` hash) in this run (a caller that keeps
  it incrementally, the step engine, passes it: O(1) instead of a scan of the run);
- ``last_tool_errored``: a tool result carried by the new request is an error;
- ``context_tokens``: the new request's prompt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

from features.prefix import RunPrefix
from models.types import Predictions
from router.policy.types import BackendState, RunState, Snapshot

__all__ = ["build_snapshot", "tool_repeated"]


def tool_repeated(prefix: RunPrefix) -> bool:
    """Does the newest tool call repeat an identical earlier call of the run?"""
    steps = prefix.steps
    for i in range(len(steps) - 1, -1, -1):
        keys = steps[i].tool_call_keys
        if not keys:
            continue
        newest = keys[-1]
        if newest in keys[:-1]:
            return True
        for j in range(i):
            if newest in steps[j].tool_call_keys:
                return True
        return False
    return False


def build_snapshot(
    run: RunState,
    prefix: RunPrefix,
    predictions: Predictions,
    backends: list[BackendState],
    *,
    label_needs_frontier: bool | None = None,
    requested_model: str | None = None,
    features: Mapping[str, float] | None = None,
    last_tool_repeated: bool | None = None,
) -> Snapshot:
    """Assemble the policy's input for step ``prefix.step_index`` of ``run``."""
    if features is None:
        from features.extract import extract_dict  # imported on first use; cached by Python after

        features = extract_dict(prefix)
    # positional, in Snapshot's field order: a class called with keywords builds (and unpacks) a
    # dict per call, about twice the cost; it runs at every step (tests/test_positional_order.py)
    return Snapshot(
        run,  # run
        len(prefix.steps),  # step_index
        features,  # features
        predictions,  # predictions
        backends,  # backends
        int(prefix.new_prompt_tokens),  # context_tokens
        prefix.new_tool_results_n > 0,  # at_tool_boundary
        tool_repeated(prefix) if last_tool_repeated is None else last_tool_repeated,  # last_tool_repeated
        any(prefix.new_tool_result_errors),  # last_tool_errored
        label_needs_frontier,  # label_needs_frontier
        requested_model,  # requested_model
    )
