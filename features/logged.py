"""Logged step rows -> :class:`~features.prefix.RunPrefix`: the training and replay side of the one
feature code path (:func:`iter_prefixes` for one run, :func:`iter_frame_prefixes` for a whole
steps frame; :func:`step_views` / :func:`steps_columns` for callers that build their own).

Prefix k of a run holds steps < k as :class:`~features.prefix.StepView` and takes its ``new_*``
fields from step k's own row. Run context (C2): ``domain`` and ``task_embedding`` come from the
caller (the run record), ``signals`` accumulate the rows' ``signals`` (what the router logged new
at each step), so prefix k sees every signal of steps <= k and ``new_signals_n`` = step k's own.
pandas is never imported here (callers pass frames).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from features.aggregate import StepAggregate
from features.prefix import RunPrefix, StepView

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "STEP_COLUMNS",
    "iter_prefixes",
    "iter_frame_prefixes",
    "step_views",
    "steps_columns",
    "run_context",
    "signals_of",
    "opt",
    "opt_int",
    "opt_float",
]


def opt(v: Any) -> Any:
    """None for None / NaN / pd.NA / pd.NaT, else the value (pandas is not imported here): the one missing-
    value test of a logged cell (router.core.record.logged_request, router.replay, OPE replay)."""
    if v is None:
        return None
    if isinstance(v, float) and v != v:
        return None
    if type(v).__name__ in ("NAType", "NaTType"):
        return None
    return v


def opt_int(v: Any) -> int | None:
    v = opt(v)
    return None if v is None else int(v)


def opt_float(v: Any) -> float | None:
    v = opt(v)
    return None if v is None else float(v)


def _tup(v: Any, conv: type = str) -> tuple[Any, ...]:
    """A list cell (list, numpy array from Arrow, None) as a tuple of ``conv`` values."""
    if v is None:
        return ()
    if isinstance(v, np.ndarray):
        v = v.tolist()  # numpy scalars -> Python int/bool/str in one C loop
    elif isinstance(v, float):  # NaN from a missing cell
        return ()
    if not v:
        return ()
    if all(type(e) is conv for e in v):
        return tuple(v)
    return tuple(conv(e) for e in v)


STEP_COLUMNS = (
    "run_id",
    "step",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "tool_calls",
    "tool_call_keys",
    "tool_results_n",
    "tool_result_errors",
    "tool_result_tokens",
    "tool_pause_s",
    "arrival_s",
    "latency_s",
    "structured",
    "tier",
    "prompt_tokens_est",
    "n_tools_offered",
    "wants_json",
    "signals",
)


def steps_columns(steps: pd.DataFrame) -> dict[str, list[Any]]:
    """The step columns the prefix builders read, as Python lists (missing columns: None)."""
    n = len(steps)
    return {c: (steps[c].tolist() if c in steps.columns else [None] * n) for c in STEP_COLUMNS}


def step_views(cols: dict[str, list[Any]], i: int) -> StepView:
    """The :class:`StepView` of logged row ``i`` (column lists as built from a steps frame)."""
    st = opt(cols["structured"][i])
    return StepView(
        prompt_tokens=int(cols["prompt_tokens"][i]),
        completion_tokens=int(cols["completion_tokens"][i]),
        cached_tokens=opt_int(cols["cached_tokens"][i]),
        tool_calls=_tup(cols["tool_calls"][i]),
        tool_call_keys=_tup(cols["tool_call_keys"][i]),
        tool_results_n=opt_int(cols["tool_results_n"][i]) or 0,
        tool_result_errors=_tup(cols["tool_result_errors"][i], bool),
        tool_result_tokens=_tup(cols["tool_result_tokens"][i], int),
        tool_pause_s=opt_float(cols["tool_pause_s"][i]),
        arrival_s=opt_float(cols["arrival_s"][i]),
        latency_s=opt_float(cols["latency_s"][i]),
        structured=None if st is None else bool(st),
        tier=opt(cols["tier"][i]),
    )


def _run_prefixes(
    cols: dict[str, list[Any]],
    lo: int,
    hi: int,
    run_started_s: float | None,
    domain: str | None = None,
    task_embedding: Any = None,
) -> Iterator[RunPrefix]:
    run_id = str(cols["run_id"][lo])
    views = [step_views(cols, i) for i in range(lo, hi)]
    started = run_started_s if run_started_s is not None else views[0].arrival_s
    # one running aggregate for the run: prefix j gets it folded over views[:j], then it moves on
    # (an earlier prefix extracted later finds it stale and falls back to the full scan)
    agg = StepAggregate()
    est, tools, wants = cols["prompt_tokens_est"], cols["n_tools_offered"], cols["wants_json"]
    logged_signals = cols["signals"]
    signals: tuple[str, ...] = ()
    for j, v in enumerate(views):
        if j:
            agg.add(views[j - 1])
        i = lo + j
        # what the router saw before generation: its own estimate when it logged one (router logs),
        # else the logged count (imported traces: what a tokenizer gives)
        seen = opt_int(est[i])
        new_signals = _tup(logged_signals[i])
        if new_signals:
            signals = signals + new_signals
        yield RunPrefix(
            run_id=run_id,
            steps=views[:j],
            run_started_s=started,
            now_s=v.arrival_s,
            new_prompt_tokens=v.prompt_tokens if seen is None else seen,
            new_tool_results_n=v.tool_results_n,
            new_tool_result_errors=v.tool_result_errors,
            new_tool_result_tokens=v.tool_result_tokens,
            new_tool_pause_s=v.tool_pause_s,
            new_n_tools_offered=opt_int(tools[i]) or 0,  # null in imported traces (no bodies stored)
            new_wants_json=bool(opt(wants[i]) or False),
            local_cache_pressure=None,
            domain=domain,
            task_embedding=task_embedding,
            signals=signals,
            new_signals_n=len(new_signals),
            aggregate=agg,
        )


def iter_prefixes(
    run_steps: pd.DataFrame,
    run_started_s: float | None = None,
    *,
    domain: str | None = None,
    task_embedding: Any = None,
) -> Iterator[RunPrefix]:
    """One :class:`RunPrefix` per logged step k of ONE run (rows sorted by ``step`` here).

    Prefix k holds steps < k as :class:`StepView` and takes its ``new_*`` fields from step k's own
    row: ``new_prompt_tokens`` is the router's logged estimate (``prompt_tokens_est``) when present,
    else ``prompt_tokens``; ``new_n_tools_offered`` / ``new_wants_json`` are read from the row when
    logged (router logs), else 0 / False. ``run_started_s`` defaults to the first step's
    ``arrival_s`` (what the router sees: the run starts when its first request arrives).
    ``local_cache_pressure`` is not stored; callers that know it (the dataset builder's cache
    replay) set it on the yielded prefix. ``signals`` accumulate the rows' ``signals`` (module
    docstring); ``domain`` / ``task_embedding`` (the run record's) go on every prefix.
    """
    if len(run_steps) == 0:
        return
    ids = run_steps["run_id"].unique()
    if len(ids) != 1:
        raise ValueError(f"iter_prefixes expects the steps of one run, got {len(ids)} run_ids")
    ordered = run_steps.sort_values("step", kind="stable")
    yield from _run_prefixes(steps_columns(ordered), 0, len(ordered), run_started_s, domain, task_embedding)


def iter_frame_prefixes(
    steps: pd.DataFrame,
    run_started: Mapping[str, float] | None = None,
    *,
    domains: Mapping[str, str | None] | None = None,
    embeddings: Mapping[str, Any] | None = None,
) -> Iterator[tuple[int, RunPrefix]]:
    """``(row position, prefix)`` for every step of every run in a steps frame sorted by (run_id, step).

    The same code as :func:`iter_prefixes`, without a pandas group-by per run (fast on millions of
    rows). ``run_started``: optional run start time per run_id (else each run's first arrival);
    ``domains`` / ``embeddings``: optional run context per run_id (the run records' ``domain`` /
    ``task_embedding``).
    """
    n = len(steps)
    if n == 0:
        return
    cols = steps_columns(steps)
    rid = cols["run_id"]
    lo = 0
    while lo < n:
        hi = lo + 1
        r = rid[lo]
        while hi < n and rid[hi] == r:
            hi += 1
        key = str(r)
        start = run_started.get(key) if run_started else None
        dom = domains.get(key) if domains else None
        emb = embeddings.get(key) if embeddings else None
        for j, p in enumerate(_run_prefixes(cols, lo, hi, start, dom, emb)):
            yield lo + j, p
        lo = hi


def signals_of(v: Any) -> tuple[str, ...]:
    """A logged ``signals`` cell (list, Arrow array, None, NaN) as a tuple of kinds."""
    return _tup(v)


def run_context(runs: pd.DataFrame) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """``(domain per run_id, task embedding per run_id)`` from run records (the runs that have
    them; a run logged twice takes its last non-null value, as :func:`features.runmerge.merge_runs`)."""
    domains: dict[str, str] = {}
    embeddings: dict[str, np.ndarray] = {}
    if len(runs) == 0:
        return domains, embeddings
    ids = runs["run_id"].tolist()
    dom = runs["domain"].tolist() if "domain" in runs.columns else [None] * len(ids)
    emb = runs["task_embedding"].tolist() if "task_embedding" in runs.columns else [None] * len(ids)
    for rid, d, e in zip(ids, dom, emb, strict=True):
        key = str(rid)
        if isinstance(d, str) and d:
            domains[key] = d
        if e is not None and not isinstance(e, float) and len(e):
            embeddings[key] = np.asarray(e, dtype=np.float32)
    return domains, embeddings
