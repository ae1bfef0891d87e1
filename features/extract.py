"""Feature extraction: one pure function from a :class:`~features.prefix.RunPrefix` to a float vector.

Algorithm: :func:`extract` reads running aggregates of the run's earlier steps
(:class:`StepAggregate`: sums, counts, maxima, the tool-call-key counts, the error streak, the last
tier) plus the first and the last step, and fills a float64 vector whose layout is
:data:`FEATURE_NAMES`. The aggregate rides on the prefix (``RunPrefix.aggregate``) and is updated in
O(1) per appended step (``RunPrefix.append``), so the router and the simulator pay O(1) per step and
training's :func:`iter_prefixes` / :func:`iter_frame_prefixes` O(1) per prefix; a prefix without a
current aggregate is scanned once (O(k) for step k) and gets one. The same function serves training (prefixes rebuilt
from logged Step rows by :func:`iter_prefixes` / :func:`iter_frame_prefixes`), the router (prefixes
built from its run state and the incoming request) and the simulator, so the three never diverge.
Unknown values (no timestamps, no cache counters, no cache-pressure signal) are ``NaN``; LightGBM
treats NaN as "missing" and learns a direction for it.

Feature spec ``fs-1`` (bump :data:`FEATURE_SPEC_VERSION` whenever the layout or meaning changes, so
that bundles trained on another layout are refused at load time):

- size: ``step_index`` (k = number of earlier steps), ``ctx_tokens`` (the new prompt's tokens),
  ``ctx_growth_last`` (new prompt - previous prompt), ``ctx_growth_mean`` ((new - first) / k),
  ``tokens_so_far`` (prompt + completion tokens of the earlier steps).
- time: ``time_since_start_s`` (now - run start), ``tool_pause_s`` (the pause before this request),
  ``tool_pause_mean_s`` (mean of the earlier steps' pauses).
- tool mix: ``n_tool_calls``, ``tool_calls_last`` and, per bucket b of :data:`N_TOOL_BUCKETS`,
  ``tool_bucket_count_b`` / ``tool_bucket_share_b``; a tool name goes to bucket
  ``crc32(name) % N_TOOL_BUCKETS`` (a stable hash: Python's ``hash()`` is salted per process), so
  unseen tool names still land somewhere.
- trouble: ``tool_errors`` (errored tool results so far, the new request's included),
  ``tool_error_streak`` (consecutive errored results ending at the newest), ``new_tool_errors``,
  ``repeated_tool_calls`` (calls whose ``tool_call_key`` was already produced earlier in the run),
  ``max_key_repeats`` (most repeats of one key), ``last_call_repeated`` (0/1: the last step repeated
  an earlier call: a looping signal).
- output: ``out_tokens_last``, ``out_tokens_mean``, ``out_tokens_max``, ``structured_share``
  (share of earlier steps that produced a tool call / JSON; a step with unknown ``structured``
  counts as structured when it produced tool calls).
- serving history: ``cache_hit_ratio`` (cached / prompt tokens over earlier steps with a logged
  ``cached_tokens``; NaN if none), ``tier_switches`` (changes of tier between consecutive earlier
  steps with a known tier), ``frontier_step_share``.
- the new request: ``new_tool_results_n``, ``new_tool_result_tokens``, ``new_n_tools_offered``,
  ``new_wants_json``, ``local_cache_pressure`` (share of the local prefix cache turned over since
  this run's previous step, 0-1; NaN when the caller does not know it).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from features.prefix import RunPrefix, StepView

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "FEATURE_SPEC_VERSION",
    "FEATURE_NAMES",
    "N_FEATURES",
    "N_TOOL_BUCKETS",
    "tool_bucket",
    "StepAggregate",
    "extract",
    "extract_dict",
    "iter_prefixes",
    "iter_frame_prefixes",
    "step_views",
    "steps_columns",
]

FEATURE_SPEC_VERSION = "fs-1"
N_TOOL_BUCKETS = 8

_HEAD: tuple[str, ...] = (
    "step_index",
    "ctx_tokens",
    "ctx_growth_last",
    "ctx_growth_mean",
    "tokens_so_far",
    "time_since_start_s",
    "tool_pause_s",
    "tool_pause_mean_s",
    "n_tool_calls",
    "tool_calls_last",
)
_TAIL: tuple[str, ...] = (
    "tool_errors",
    "tool_error_streak",
    "new_tool_errors",
    "repeated_tool_calls",
    "max_key_repeats",
    "last_call_repeated",
    "out_tokens_last",
    "out_tokens_mean",
    "out_tokens_max",
    "structured_share",
    "cache_hit_ratio",
    "tier_switches",
    "frontier_step_share",
    "new_tool_results_n",
    "new_tool_result_tokens",
    "new_n_tools_offered",
    "new_wants_json",
    "local_cache_pressure",
)
FEATURE_NAMES: tuple[str, ...] = (
    _HEAD
    + tuple(f"tool_bucket_count_{b}" for b in range(N_TOOL_BUCKETS))
    + tuple(f"tool_bucket_share_{b}" for b in range(N_TOOL_BUCKETS))
    + _TAIL
)
N_FEATURES = len(FEATURE_NAMES)
_BUCKET0 = len(_HEAD)
_SHARE0 = _BUCKET0 + N_TOOL_BUCKETS
_T = _SHARE0 + N_TOOL_BUCKETS  # first index of _TAIL
_NAN = math.nan


def tool_bucket(name: str) -> int:
    """Stable bucket of a tool name: ``crc32(utf-8 name) % N_TOOL_BUCKETS``."""
    return zlib.crc32(name.encode("utf-8")) % N_TOOL_BUCKETS


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
        "buckets",
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
        self.buckets = [0] * N_TOOL_BUCKETS
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
            buckets = self.buckets
            for name in calls:
                buckets[zlib.crc32(name.encode("utf-8")) % N_TOOL_BUCKETS] += 1
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


def extract(prefix: RunPrefix, out: np.ndarray | None = None) -> np.ndarray:
    """Feature vector (float64, layout :data:`FEATURE_NAMES`) of ``prefix``.

    Uses ``prefix.aggregate`` when it covers exactly ``prefix.steps`` (O(1) in the run's length);
    otherwise scans the steps once and attaches the aggregate it built, so that steps appended later
    through :meth:`~features.prefix.RunPrefix.append` are folded in incrementally.

    ``out``: an optional pre-allocated float64 array of length :data:`N_FEATURES` to fill (the
    serving fast path reuses one buffer); it is returned.
    """
    x = np.empty(N_FEATURES, dtype=np.float64) if out is None else out
    steps = prefix.steps
    k = len(steps)
    newp = prefix.new_prompt_tokens
    a = prefix.aggregate
    if type(a) is not StepAggregate or a.n != k or (k and a.last is not steps[k - 1]):
        a = StepAggregate.of(steps)
        prefix.aggregate = a
    n_calls = a.n_calls
    buckets = a.buckets
    streak = a.streak

    new_err = 0
    for e in prefix.new_tool_result_errors:
        if e:
            new_err += 1
            streak += 1
        else:
            streak = 0

    x[0] = k
    x[1] = newp
    if k:
        last = steps[-1]
        x[2] = newp - last.prompt_tokens
        x[3] = (newp - steps[0].prompt_tokens) / k
    else:
        last = None
        x[2] = 0.0
        x[3] = 0.0
    x[4] = a.tokens
    if prefix.now_s is not None and prefix.run_started_s is not None:
        x[5] = prefix.now_s - prefix.run_started_s
    else:
        x[5] = _NAN
    x[6] = _NAN if prefix.new_tool_pause_s is None else prefix.new_tool_pause_s
    x[7] = a.pause_sum / a.pause_n if a.pause_n else _NAN
    x[8] = n_calls
    x[9] = len(last.tool_calls) if last is not None else 0
    for b in range(N_TOOL_BUCKETS):
        x[_BUCKET0 + b] = buckets[b]
        x[_SHARE0 + b] = buckets[b] / n_calls if n_calls else 0.0
    i = _T
    x[i] = a.errors + new_err
    x[i + 1] = streak
    x[i + 2] = new_err
    x[i + 3] = a.repeated
    x[i + 4] = a.max_rep
    x[i + 5] = a.last_repeated
    x[i + 6] = last.completion_tokens if last is not None else 0
    x[i + 7] = a.out_sum / k if k else 0.0
    x[i + 8] = a.out_max
    x[i + 9] = a.structured / k if k else 0.0
    x[i + 10] = a.cached_sum / a.cached_prompt if a.has_cache and a.cached_prompt else _NAN
    x[i + 11] = a.switches
    x[i + 12] = a.frontier / k if k else 0.0
    x[i + 13] = prefix.new_tool_results_n
    x[i + 14] = sum(prefix.new_tool_result_tokens)
    x[i + 15] = prefix.new_n_tools_offered
    x[i + 16] = 1.0 if prefix.new_wants_json else 0.0
    x[i + 17] = _NAN if prefix.local_cache_pressure is None else prefix.local_cache_pressure
    return x


def extract_dict(prefix: RunPrefix) -> dict[str, float]:
    """:func:`extract` as ``{feature name: value}`` (for logs, snapshots and debugging)."""
    return dict(zip(FEATURE_NAMES, extract(prefix).tolist(), strict=True))


# ----------------------------------------------------------------------------- logged rows -> prefixes


def _opt(v: Any) -> Any:
    """None for None / NaN / pd.NA, else the value (pandas is not imported here)."""
    if v is None:
        return None
    if isinstance(v, float) and v != v:
        return None
    if type(v).__name__ == "NAType":
        return None
    return v


def _opt_int(v: Any) -> int | None:
    v = _opt(v)
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    v = _opt(v)
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


_STEP_COLUMNS = (
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
)


def steps_columns(steps: pd.DataFrame) -> dict[str, list[Any]]:
    """The step columns the prefix builders read, as Python lists (missing columns: None)."""
    n = len(steps)
    return {c: (steps[c].tolist() if c in steps.columns else [None] * n) for c in _STEP_COLUMNS}


def step_views(cols: dict[str, list[Any]], i: int) -> StepView:
    """The :class:`StepView` of logged row ``i`` (column lists as built from a steps frame)."""
    st = _opt(cols["structured"][i])
    return StepView(
        prompt_tokens=int(cols["prompt_tokens"][i]),
        completion_tokens=int(cols["completion_tokens"][i]),
        cached_tokens=_opt_int(cols["cached_tokens"][i]),
        tool_calls=_tup(cols["tool_calls"][i]),
        tool_call_keys=_tup(cols["tool_call_keys"][i]),
        tool_results_n=_opt_int(cols["tool_results_n"][i]) or 0,
        tool_result_errors=_tup(cols["tool_result_errors"][i], bool),
        tool_result_tokens=_tup(cols["tool_result_tokens"][i], int),
        tool_pause_s=_opt_float(cols["tool_pause_s"][i]),
        arrival_s=_opt_float(cols["arrival_s"][i]),
        latency_s=_opt_float(cols["latency_s"][i]),
        structured=None if st is None else bool(st),
        tier=_opt(cols["tier"][i]),
    )


def _run_prefixes(
    cols: dict[str, list[Any]], lo: int, hi: int, run_started_s: float | None
) -> Iterator[RunPrefix]:
    run_id = str(cols["run_id"][lo])
    views = [step_views(cols, i) for i in range(lo, hi)]
    started = run_started_s if run_started_s is not None else views[0].arrival_s
    # one running aggregate for the run: prefix j gets it folded over views[:j], then it moves on
    # (an earlier prefix extracted later finds it stale and falls back to the full scan)
    agg = StepAggregate()
    est, tools, wants = cols["prompt_tokens_est"], cols["n_tools_offered"], cols["wants_json"]
    for j, v in enumerate(views):
        if j:
            agg.add(views[j - 1])
        i = lo + j
        # what the router saw before generation: its own estimate when it logged one (router logs),
        # else the logged count (imported traces: what a tokenizer gives)
        seen = _opt_int(est[i])
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
            new_n_tools_offered=_opt_int(tools[i]) or 0,  # null in imported traces (no bodies stored)
            new_wants_json=bool(_opt(wants[i]) or False),
            local_cache_pressure=None,
            aggregate=agg,
        )


def iter_prefixes(run_steps: pd.DataFrame, run_started_s: float | None = None) -> Iterator[RunPrefix]:
    """One :class:`RunPrefix` per logged step k of ONE run (rows sorted by ``step`` here).

    Prefix k holds steps < k as :class:`StepView` and takes its ``new_*`` fields from step k's own
    row: ``new_prompt_tokens`` is the router's logged estimate (``prompt_tokens_est``) when present,
    else ``prompt_tokens``; ``new_n_tools_offered`` / ``new_wants_json`` are read from the row when
    logged (router logs), else 0 / False. ``run_started_s`` defaults to the first step's
    ``arrival_s`` (what the router sees: the run starts when its first request arrives).
    ``local_cache_pressure`` is not stored; callers that know it (the dataset builder's cache
    replay) set it on the yielded prefix.
    """
    if len(run_steps) == 0:
        return
    ids = run_steps["run_id"].unique()
    if len(ids) != 1:
        raise ValueError(f"iter_prefixes expects the steps of one run, got {len(ids)} run_ids")
    ordered = run_steps.sort_values("step", kind="stable")
    yield from _run_prefixes(steps_columns(ordered), 0, len(ordered), run_started_s)


def iter_frame_prefixes(
    steps: pd.DataFrame, run_started: dict[str, float] | None = None
) -> Iterator[tuple[int, RunPrefix]]:
    """``(row position, prefix)`` for every step of every run in a steps frame sorted by (run_id, step).

    The same code as :func:`iter_prefixes`, without a pandas group-by per run (fast on millions of
    rows). ``run_started``: optional run start time per run_id (else each run's first arrival).
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
        start = run_started.get(str(r)) if run_started else None
        for j, p in enumerate(_run_prefixes(cols, lo, hi, start)):
            yield lo + j, p
        lo = hi
