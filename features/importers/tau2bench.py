"""tau2-bench leaderboard trajectory files -> runs and steps.

Input: one JSON document per submission in one of three shapes (the files are unchanged copies):

- the leaderboard shape ``{timestamp, info, tasks, simulations}`` (most files): ``info.agent_info``
  names the agent implementation and ``llm``; ``info.environment_info.domain_name`` the domain;
- a bare list of simulations (no ``info``): the domain is the file name's ``_<domain>_`` word
  (airline, retail, telecom, mock) and the model the name of the file's submission;
- ``{domain, agent, model, total_tasks, passed, pass_rate, simulations}`` (a community format).

A simulation without a numeric ``reward_info.reward`` is a bad row (reported, not imported). Each
simulation has ``id, task_id, trial, start_time, end_time, termination_reason, reward_info.reward`` and
``messages`` (role, content, tool_calls ``[{id, name, arguments, requestor}]``, ``turn_idx``, and for
most agents ``timestamp`` and assistant ``usage.prompt_tokens/completion_tokens``; tool messages carry
``requestor`` and an ``error`` flag).

Algorithm: load each file once; one run per simulation
(``run_id = tau2-<domain>-<model>-<submission>-t<task>-r<trial>``, submission = the file name before
``__``; a repeated run_id is a bad row),
one step per agent generation, built by :func:`features.importers.taubench.steps_from_messages`:

- The orchestrator's canned greeting (an assistant message at ``turn_idx`` 0 with no usage and no tool
  calls, before any user message) is context, not a generation: it is not a step.
- ``prompt_tokens``/``completion_tokens`` from ``usage`` where logged. Where the raw Anthropic usage
  shows cache reads, prompt = input + cache_read + cache_creation and ``cached_tokens`` = cache_read.
  Otherwise the tau-bench estimate (chars/4 + per-message overhead over the messages so far, with
  ``environment_info.policy`` as the system prompt; tool schemas are not in the files, so estimated
  prompts are a lower bound).
- Only tool results requested by the agent (``requestor == "assistant"``) count as consumed; the
  ``error`` flag is used where logged, else the text heuristic.
- Times: message ``timestamp`` (ISO, naive = UTC) -> epoch seconds. A step arrives at the timestamp of
  the last message before it; ``latency_s`` = its own timestamp - arrival; ``tool_pause_s`` = arrival -
  previous step's timestamp. Files without message timestamps (ToolOrchestra) get null times, and their
  placeholder start/end times are not copied to the run.

Run: outcome = success iff reward == 1, reward = ``reward_info.reward``; model = ``agent_info.llm``
without a provider prefix (``openai/gpt-oss-120b`` -> ``gpt-oss-120b``); agent = the submission (the
file name before ``__``: ``qwen2.5-7b-ollama``, ``gpt-4.1``; the pairing roles name submissions, since
one model appears in several submissions with different agents);
task_id = ``<domain>/<task_id>`` (pairing joins on it); ``domain`` = the benchmark's domain (C2).

Task embedding (``embed=True``): the first user message of each run (the task as the user states it)
is embedded once with :func:`features.embed.embed_texts` (C1, 384 floats, L2-normalised) and stored in
``Run.task_embedding``; the text itself is never stored. Off by default (it loads the sentence model).

``path`` may be one file or a directory of ``*.json`` files.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.importers import check_path, load_json_file, report_bad, to_frame
from features.importers.taubench import Msg, steps_from_messages

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["import_tau2bench"]


def _ts(v: Any) -> float | None:
    if not isinstance(v, str) or not v:
        return None
    try:
        d = datetime.fromisoformat(v)
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _to_msg(m: dict[str, Any], seen_user: bool) -> Msg:
    role = str(m.get("role", ""))
    content = m.get("content")
    text = content if isinstance(content, str) else ""
    calls = [
        (str(c.get("name", "")), c.get("arguments", {}))
        for c in (m.get("tool_calls") or [])
        if isinstance(c, dict)
    ]
    msg = Msg(role=role, text=text, tool_calls=calls, time_s=_ts(m.get("timestamp")))
    if role == "assistant":
        usage = m.get("usage") if isinstance(m.get("usage"), dict) else None
        if usage is None and not calls and not seen_user and m.get("turn_idx") == 0:
            msg.role = "greeting"
            return msg
        if usage is not None:
            msg.prompt_tokens = _int(usage.get("prompt_tokens"))
            msg.completion_tokens = _int(usage.get("completion_tokens"))
            raw = m.get("raw_data")
            ru = raw.get("usage") if isinstance(raw, dict) else None
            if isinstance(ru, dict) and _int(ru.get("cache_read_input_tokens")) is not None:
                read = _int(ru.get("cache_read_input_tokens")) or 0
                created = _int(ru.get("cache_creation_input_tokens")) or 0
                inp = _int(ru.get("input_tokens"))
                if inp is not None:
                    msg.prompt_tokens = inp + read + created
                    msg.cached_tokens = read
    elif role == "tool":
        msg.for_agent = m.get("requestor", "assistant") == "assistant"
        err = m.get("error")
        msg.error = err if isinstance(err, bool) else None
    return msg


def _files(p: Path) -> list[Path]:
    from features.runlog import RunLogError

    if p.is_dir():
        files = [check_path(x) for x in sorted(p.glob("*.json"))]
        if not files:
            raise RunLogError(f"{p}: directory holds no tau2-bench *.json files")
        return files
    return [p]


_DOMAINS = ("airline", "retail", "telecom", "mock")


def _domain_from_name(p: Path) -> str:
    words = p.stem.replace("-", "_").split("_")
    return next((d for d in _DOMAINS if d in words), "unknown")


def _shape(p: Path, data: Any) -> tuple[list[Any], str | None, str, str]:
    """(simulations, model, domain, system policy) of any of the three file shapes."""
    from features.runlog import RunLogError

    submission = p.stem.split("__", 1)[0]
    if isinstance(data, list):  # bare list of simulations
        return data, submission, _domain_from_name(p), ""
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise RunLogError(f"{p}: not a tau2-bench results file (no 'simulations' list)")
    info: dict[str, Any] = data["info"] if isinstance(data.get("info"), dict) else {}
    if not info:  # {domain, agent, model, ..., simulations}
        model = data.get("model") if isinstance(data.get("model"), str) else submission
        dom = data.get("domain")
        domain = dom if isinstance(dom, str) else _domain_from_name(p)
        return data["simulations"], str(model).rsplit("/", 1)[-1], domain, ""
    agent_info: dict[str, Any] = info["agent_info"] if isinstance(info.get("agent_info"), dict) else {}
    env_info: dict[str, Any] = (
        info["environment_info"] if isinstance(info.get("environment_info"), dict) else {}
    )
    llm = agent_info.get("llm")
    model = str(llm).rsplit("/", 1)[-1] if llm else None
    domain = env_info.get("domain_name") or _domain_from_name(p)
    pol = env_info.get("policy")
    policy = pol if isinstance(pol, str) else ""
    return data["simulations"], model, str(domain), policy


def _first_user_text(sim: dict[str, Any]) -> str:
    for m in sim.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])
    return ""


def _import_file(
    p: Path,
    strict: bool,
    bad_rows: list[BadRow] | None,
    records: list[dict[str, Any]],
    seen: set[str],
    texts: dict[str, str] | None,
) -> None:
    data = load_json_file(p)
    sims, model, domain, policy = _shape(p, data)
    submission = p.stem.split("__", 1)[0]
    agent = submission
    for i, sim in enumerate(sims, start=1):
        if not isinstance(sim, dict) or not isinstance(sim.get("messages"), list):
            report_bad(bad_rows, strict, p, i, "simulation without a 'messages' list")
            continue
        rinfo = sim.get("reward_info")
        reward = rinfo.get("reward") if isinstance(rinfo, dict) else None
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            report_bad(
                bad_rows,
                strict,
                p,
                i,
                "simulation without a numeric reward_info.reward",
                {"task_id": sim.get("task_id")},
            )
            continue
        task, trial = sim.get("task_id"), sim.get("trial", 0)
        run_id = f"tau2-{domain}-{model}-{submission}-t{task}-r{trial}"
        if run_id in seen:
            report_bad(bad_rows, strict, p, i, f"duplicate simulation (run_id {run_id})", {"task_id": task})
            continue
        seen.add(run_id)
        if texts is not None:
            texts[run_id] = _first_user_text(sim)
        # the policy is the agent's system prompt (not in the messages); it counts in estimated prompts
        msgs: list[Msg] = [Msg(role="system", text=policy)] if policy else []
        seen_user = False
        for m in sim["messages"]:
            if isinstance(m, dict):
                msgs.append(_to_msg(m, seen_user))
                seen_user = seen_user or m.get("role") == "user"
        steps = steps_from_messages(msgs, run_id, model)
        timed = any(m.time_s is not None for m in msgs)
        start, end = (_ts(sim.get("start_time")), _ts(sim.get("end_time"))) if timed else (None, None)
        if start is not None and end is not None and end < start:
            start = end = None
        success = float(reward) == 1.0
        records.append(
            {
                "record": "run",
                "run_id": run_id,
                "source": "tau2bench",
                "task_id": f"{domain}/{task}",
                "domain": domain,
                "model": model,
                "agent": agent,
                "started_at": start,
                "ended_at": end,
                "outcome": "success" if success else "failure",
                "reward": float(reward),
                "n_steps": len(steps),
            }
        )
        records.extend(steps)


def import_tau2bench(
    path: str | Path, *, strict: bool = False, bad_rows: list[BadRow] | None = None, embed: bool = False
) -> pd.DataFrame:
    """Import one tau2-bench results file or a directory of them (see module docstring)."""
    from features.runlog import RunLogError

    p = check_path(path, allow_dir=True)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    texts: dict[str, str] | None = {} if embed else None
    for f in _files(p):
        _import_file(f, strict, bad_rows, records, seen, texts)
    if not records and not bad_rows:
        raise RunLogError(f"{p}: no simulations")
    if texts:
        from features.embed import embed_texts

        ids = list(texts)
        vecs = embed_texts([texts[r] for r in ids])
        by_id = {r: [float(v) for v in vecs[i]] for i, r in enumerate(ids)}
        for rec in records:
            if rec["record"] == "run":
                rec["task_embedding"] = by_id.get(rec["run_id"])
    return to_frame(records)
