"""tau-bench historical trajectories (JSON list of simulations) -> runs and steps.

Input (sierra-research/tau-bench ``historical_trajectories/*.json``): a list of
``{task_id, reward, info, traj, trial}``, ``traj`` = OpenAI-format chat messages (system, user,
assistant with optional ``tool_calls``, tool results with ``tool_call_id``/``name``/``content``).

Algorithm: one run per simulation (``run_id = taubench-<domain>-t<task>-r<trial>``), one step per
assistant message (each is one LLM call). Messages are first normalised to :class:`Msg`, and
:func:`steps_from_messages` (shared with the tau2 importer) builds the steps:

- ``prompt_tokens``: logged usage where present (never in tau-bench), else the estimate = sum over all
  messages before this one of (``ceil(chars/4)`` of the content + of the tool-call JSON, plus
  ``MESSAGE_OVERHEAD_TOKENS``), plus ``tool_schema_tokens`` (the tool definitions sent with every call;
  not stored in these files, default 0).
- ``completion_tokens``: usage, else ``ceil(chars/4)`` of the content plus each tool call's
  ``name`` + arguments JSON.
- ``tool_calls`` = call names, ``tool_call_keys`` = :func:`features.importers.tool_call_key`.
- tool results consumed = the agent's tool messages since the previous assistant message: count,
  estimated token size each, error flag (logged flag, else :func:`features.importers.looks_like_error`).
- ``structured`` = the step produced tool calls.
- ``prefix_reuse_tokens`` = min(prompt, previous step's prompt + completion): a chat prompt repeats the
  whole previous call's prompt and output (upper bound; 0 for the first step).
- ``arrival_s``/``tool_pause_s``/``latency_s``: from message timestamps where present (tau2); tau-bench
  has none, so they stay null.

Run: outcome = ``success`` iff reward == 1, else ``failure``; ``needs_frontier`` = reward < 1, because
tau-bench has only one model (no strong pair): a failed run is the best available proxy for "a
stronger model was needed". Model = ``gpt-4o`` parsed from the file name ``<model>-<domain>.json``.

Knobs: ``tool_schema_tokens`` (0), ``domain``/``model`` (parsed from the file name when None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from features.importers import (
    MESSAGE_OVERHEAD_TOKENS,
    check_path,
    estimate_tokens,
    load_json_file,
    looks_like_error,
    report_bad,
    to_frame,
    tool_call_key,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["Msg", "steps_from_messages", "import_taubench"]


@dataclass
class Msg:
    """A chat message reduced to what the importers need (no text is kept in the output)."""

    role: str  # system | user | assistant | tool
    text: str = ""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments)
    error: bool | None = None  # tool messages: logged error flag, None = unknown
    for_agent: bool = True  # tool messages: result goes to the agent (tau2: requestor == assistant)
    prompt_tokens: int | None = None  # logged usage (assistant)
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    time_s: float | None = None  # when the message was produced (epoch seconds)

    def size_tokens(self) -> int:
        calls = sum(estimate_tokens(n) + estimate_tokens(_args_text(a)) for n, a in self.tool_calls)
        return estimate_tokens(self.text) + calls + MESSAGE_OVERHEAD_TOKENS


def _args_text(args: Any) -> str:
    if isinstance(args, str):
        return args
    return orjson.dumps(args, default=str).decode()


def steps_from_messages(
    msgs: list[Msg], run_id: str, model: str | None, *, tool_schema_tokens: int = 0
) -> list[dict[str, Any]]:
    """One step dict per assistant message; see the module docstring for each field."""
    steps: list[dict[str, Any]] = []
    context = tool_schema_tokens  # estimated prompt so far
    pending_results: list[Msg] = []
    prev_end: float | None = None  # time the previous step's message was produced
    prev_total: int | None = None
    last_time: float | None = None  # timestamp of the latest message before the current one
    for m in msgs:
        if m.role == "assistant":
            prompt = m.prompt_tokens if m.prompt_tokens is not None else context
            completion = (
                m.completion_tokens
                if m.completion_tokens is not None
                else m.size_tokens() - MESSAGE_OVERHEAD_TOKENS
            )
            arrival = last_time if last_time is not None else m.time_s
            pause = None
            if arrival is not None and prev_end is not None:
                pause = max(0.0, arrival - prev_end)
            latency = None
            if arrival is not None and m.time_s is not None:
                latency = max(0.0, m.time_s - arrival)
            cached = m.cached_tokens if m.cached_tokens is not None and m.cached_tokens <= prompt else None
            steps.append(
                {
                    "record": "step",
                    "run_id": run_id,
                    "step": len(steps),
                    "arrival_s": arrival,
                    "tool_pause_s": pause,
                    "latency_s": latency,
                    "prompt_tokens": prompt,
                    "cached_tokens": cached,
                    "prefix_reuse_tokens": 0 if prev_total is None else min(prompt, prev_total),
                    "completion_tokens": completion,
                    "tool_calls": [n for n, _ in m.tool_calls],
                    "tool_call_keys": [tool_call_key(n, a) for n, a in m.tool_calls],
                    "tool_results_n": len(pending_results),
                    "tool_result_tokens": [r.size_tokens() for r in pending_results],
                    "tool_result_errors": [
                        r.error if r.error is not None else looks_like_error(r.text) for r in pending_results
                    ],
                    "structured": bool(m.tool_calls),
                    "model": model,
                }
            )
            pending_results = []
            prev_end = m.time_s if m.time_s is not None else arrival
            prev_total = prompt + completion
        elif m.role == "tool" and m.for_agent:
            pending_results.append(m)
        context += m.size_tokens()
        if m.time_s is not None:
            last_time = m.time_s
    return steps


def _openai_msg(m: dict[str, Any]) -> Msg:
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or c
        calls.append((str(fn.get("name", "")), fn.get("arguments", {})))
    content = m.get("content")
    return Msg(
        role=str(m.get("role", "")), text=content if isinstance(content, str) else "", tool_calls=calls
    )


def _parse_name(p: Path) -> tuple[str | None, str | None]:
    """``gpt-4o-airline.json`` -> (model ``gpt-4o``, domain ``airline``)."""
    stem = p.stem
    if "-" in stem:
        model, domain = stem.rsplit("-", 1)
        return model, domain
    return None, None


def import_taubench(
    path: str | Path,
    *,
    strict: bool = False,
    bad_rows: list[BadRow] | None = None,
    tool_schema_tokens: int = 0,
    domain: str | None = None,
    model: str | None = None,
) -> pd.DataFrame:
    """Import one tau-bench trajectories file (see module docstring)."""
    from features.runlog import RunLogError

    p = check_path(path)
    data = load_json_file(p)
    if not isinstance(data, list):
        raise RunLogError(f"{p}: expected a JSON list of simulations (tau-bench historical trajectories)")
    f_model, f_domain = _parse_name(p)
    model = model or f_model
    domain = domain or f_domain or "unknown"
    records: list[dict[str, Any]] = []
    for i, sim in enumerate(data, start=1):
        if not isinstance(sim, dict) or not isinstance(sim.get("traj"), list):
            report_bad(bad_rows, strict, p, i, "simulation without a 'traj' message list")
            continue
        reward = sim.get("reward")
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            report_bad(
                bad_rows,
                strict,
                p,
                i,
                "simulation without a numeric 'reward'",
                {"task_id": sim.get("task_id")},
            )
            continue
        task, trial = sim.get("task_id"), sim.get("trial", 0)
        run_id = f"taubench-{domain}-t{task}-r{trial}"
        msgs = [_openai_msg(m) for m in sim["traj"] if isinstance(m, dict)]
        steps = steps_from_messages(msgs, run_id, model, tool_schema_tokens=tool_schema_tokens)
        success = float(reward) == 1.0
        records.append(
            {
                "record": "run",
                "run_id": run_id,
                "source": "taubench",
                "task_id": f"{domain}/{task}",
                "model": model,
                "agent": "tool-calling",
                "outcome": "success" if success else "failure",
                "reward": float(reward),
                "needs_frontier": not success,
                "n_steps": len(steps),
            }
        )
        records.extend(steps)
    if not records and not bad_rows:
        raise RunLogError(f"{p}: no simulations")
    return to_frame(records)
