"""Post-hoc signals: what the sidecar sees in a local step's own answer, kept as evidence for the
run's next step (issue 29; Cascade Routing: quality estimates of the cheap model's own output).

Algorithm: when a step served by the LOCAL tier answers 200, :func:`scan` reads the answer once,
from what the protocol's capture already assembled (chat, Responses and Messages; JSON and SSE
alike, translated or not: the capture parses the same events it relays), and returns the kinds of
:data:`features.prefix.POSTHOC_KINDS` it finds, at most one of each:

- ``tool_call_malformed``: a tool call whose arguments are not a JSON object (an empty arguments
  text counts as ``{}``);
- ``tool_not_offered``: a tool call naming a tool the request did not offer (only when the request
  offered function tools at all);
- ``answer_empty``: no tool call and zero completion tokens in the reported usage (an answer
  without usage is not judged);
- ``answer_truncated``: the completion used the request's whole token cap (``max_tokens``,
  ``max_completion_tokens`` or ``max_output_tokens``): the cap is read instead of
  ``finish_reason``, which the captures do not parse on the streaming fast path, so a cap hit
  exactly by a complete answer counts too, and an upstream default cap is not seen;
- ``tool_call_repeated``: a tool call whose ``(name, arguments)`` key equals one of the run's
  previous step's calls;
- ``low_confidence``: the answer's mean negative logprob per token is above
  ``local.low_confidence_nll`` (only with that knob and logprobs in the answer).

Token uncertainty: with ``local.request_logprobs`` the sidecar asks the local replica for
``logprobs`` on every chat request it sends there (a Responses or Messages client's request
translated to chat too; a replica spoken to natively in Responses or Messages is not asked) whose
client did not ask itself, and strips them from the answer again: each ``"logprobs":`` member's
value becomes ``null``, a byte splice, so the client gets the bytes a replica not asked would have
sent (JSON and every SSE chunk; :func:`router.server.protocols.chat.null_logprobs`). The chat
capture keeps each generated token's ``logprob`` (``choices[0].logprobs.content[]``); on a
tool-call answer those are the tool call's tokens (and its markup; on a streamed answer, the
tokens of the chunks vLLM sent). :func:`uncertainty` condenses them into the step record's
``answer_uncertainty``: ``tokens``, ``mean_nll`` (mean negative logprob, nats per token) and
``max_nll`` (the least likely token's). Logprobs cannot be measured on logged traces, so
``low_confidence`` has no default threshold and no default weight: a deployment sets
``low_confidence_nll`` and ``trouble_boost.low_confidence`` from its own traffic.

The proxy (:meth:`router.server.hotpath.stepio.StepIO._finish`, the one caller) appends them to the run's
signal list in the run-state store before the answer completes, exactly like ``POST
/v1/runs/{id}/signal``: the next step's ``Step.signals``, the run record's ``signals``, the
``sig_*`` features (in the vector as ``sig_other``; by name for the trouble term, which weighs them
through ``policy.trouble_boost``), and ``runroute_run_signals_total{kind}``.

Knobs: ``local.request_logprobs`` (off) and ``local.low_confidence_nll`` (None); a frontier step
or a non-200 answer is not scanned; weights live in ``trouble_boost``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

__all__ = ["scan", "offered_tools", "token_cap", "uncertainty"]


def offered_tools(body: Mapping[str, object]) -> frozenset[str] | None:
    """Names of the function tools the request offers (chat ``tools[].function.name``, Responses
    and Messages ``tools[].name``); None when it offers none (then no call is judged unoffered)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    names: set[str] = set()
    for t in tools:
        if not isinstance(t, dict):
            continue
        fn = t.get("function")
        name = fn.get("name") if isinstance(fn, dict) else t.get("name")
        if isinstance(name, str) and name:
            names.add(name)
    return frozenset(names) if names else None


def token_cap(body: Mapping[str, object]) -> int | None:
    """The request's completion-token cap, when it set one."""
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _malformed(args: str) -> bool:
    if not args.strip():
        return False
    try:
        obj = orjson.loads(args)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(obj, dict)


def uncertainty(logprobs: Sequence[float]) -> dict[str, float] | None:
    """``{tokens, mean_nll, max_nll}`` of an answer's token logprobs (None without any)."""
    if not logprobs:
        return None
    n = len(logprobs)
    return {"tokens": float(n), "mean_nll": -sum(logprobs) / n, "max_nll": -min(logprobs)}


def scan(
    *,
    names: Sequence[str],
    keys: Sequence[str],
    args: Sequence[str],
    prompt_tokens: int | None,
    completion_tokens: int,
    offered: frozenset[str] | None,
    cap: int | None,
    previous_keys: Sequence[str],
    mean_nll: float | None = None,
    low_confidence_nll: float | None = None,
) -> tuple[str, ...]:
    """The post-hoc kinds of one local answer (module docstring), in
    :data:`features.prefix.POSTHOC_KINDS` order."""
    out: list[str] = []
    if any(_malformed(a) for a in args):
        out.append("tool_call_malformed")
    if offered is not None and any(n not in offered for n in names):
        out.append("tool_not_offered")
    if not names and prompt_tokens is not None and completion_tokens == 0:
        out.append("answer_empty")
    if cap is not None and completion_tokens >= cap:
        out.append("answer_truncated")
    if previous_keys and any(k in previous_keys for k in keys):
        out.append("tool_call_repeated")
    if low_confidence_nll is not None and mean_nll is not None and mean_nll > low_confidence_nll:
        out.append("low_confidence")
    return tuple(out)
