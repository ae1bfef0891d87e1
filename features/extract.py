"""Feature extraction: one pure function from a :class:`~features.prefix.RunPrefix` to a float vector.

Algorithm: :func:`extract` reads running aggregates of the run's earlier steps
(:class:`features.aggregate.StepAggregate`: sums, counts, maxima, the tool-call-key counts, the
error streak, the last tier) plus the first and the last step, the new request and the run's
signals, and fills a float64 vector whose layout is :data:`FEATURE_NAMES`. The aggregate rides on
the prefix (``RunPrefix.aggregate``) and is updated in O(1) per appended step
(``RunPrefix.append``), so the router and the simulator pay O(1) per step and training's
:func:`iter_prefixes` / :func:`iter_frame_prefixes` (:mod:`features.logged`) O(1) per prefix; a
prefix without a current aggregate is scanned once (O(k) for step k) and gets one. The same
function serves training (prefixes rebuilt from logged Step rows), the router (prefixes built from
its run state and the incoming request) and the simulator, so the three never diverge. Unknown
values (no timestamps, no cache counters, no cache-pressure signal) are ``NaN``; LightGBM treats NaN
as "missing" and learns a direction for it.

Feature spec ``fs-2`` (bump :data:`FEATURE_SPEC_VERSION` whenever the layout or meaning changes, so
that bundles trained on another layout are refused at load time; ``fs-1`` had no first-prompt size,
no verb classes and no signals):

- size: ``step_index`` (k = number of earlier steps), ``ctx_tokens`` (the new prompt's tokens),
  ``first_prompt_tokens`` (the run's first prompt: the first earlier step's, or the new one at
  k = 0; system prompt + task, comparable across domains), ``ctx_growth_last`` (new prompt -
  previous prompt), ``ctx_growth_mean`` ((new - first) / k), ``tokens_so_far`` (prompt + completion
  tokens of the earlier steps).
- time: ``time_since_start_s`` (now - run start), ``tool_pause_s`` (the pause before this request),
  ``tool_pause_mean_s`` (mean of the earlier steps' pauses).
- tool mix: ``n_tool_calls``, ``tool_calls_last``; per verb class v of :mod:`features.verbs`
  (read / write / other, from the tool name, the same meaning in every domain)
  ``verb_<v>_calls`` / ``verb_<v>_share``, and ``verb_write_last`` (write-class calls of the last
  step). ``fs-1``'s 16 hash-bucket features (``crc32(name) % 8``) are gone: on tau2-bench
  (``bench/feature_ablation.py --tau2``, task-grouped CV) they added nothing in-domain beyond the
  SE and cost 0.05-0.10 AUC on a domain the model never saw (one domain's tools' meanings carried
  onto another's), see CHANGELOG ``fs-2``.
- trouble: ``tool_errors`` (errored tool results so far, the new request's included),
  ``tool_error_streak`` (consecutive errored results ending at the newest), ``new_tool_errors``
  (errored results the new request carries: the last step's calls), ``repeated_tool_calls`` (calls
  whose ``tool_call_key`` was already produced earlier in the run), ``max_key_repeats`` (most repeats
  of one key), ``last_call_repeated`` (0/1: the last step repeated an earlier call: a looping
  signal); per signal kind s of :data:`features.prefix.SIGNAL_KINDS` (verifier_failed,
  user_rejected, tests_failed, other) ``sig_<s>`` (signals of that kind posted on the run so far)
  and ``new_sig_<s>`` (of those, the ones since the previous step).
- output: ``out_tokens_last``, ``out_tokens_mean``, ``out_tokens_max``, ``structured_share``
  (share of earlier steps that produced a tool call / JSON; a step with unknown ``structured``
  counts as structured when it produced tool calls).
- serving history: ``cache_hit_ratio`` (cached / prompt tokens over earlier steps with a logged
  ``cached_tokens``; NaN if none), ``tier_switches`` (changes of tier between consecutive earlier
  steps with a known tier), ``frontier_step_share``.
- the new request: ``new_tool_results_n``, ``new_tool_result_tokens``, ``new_n_tools_offered``
  (tools the request offers), ``new_wants_json``, ``local_cache_pressure`` (share of the local
  prefix cache turned over since this run's previous step, 0-1; NaN when the caller does not know it).

Not in the vector: ``RunPrefix.domain`` and ``RunPrefix.task_embedding`` (a predictor that uses them
reads the prefix; see ``models.predictor``).
"""

from __future__ import annotations

import math

import numpy as np

from features.aggregate import StepAggregate
from features.logged import iter_frame_prefixes, iter_prefixes, step_views, steps_columns
from features.prefix import SIGNAL_KINDS, RunPrefix, signal_kind
from features.verbs import VERB_CLASSES

__all__ = [
    "FEATURE_SPEC_VERSION",
    "FEATURE_NAMES",
    "N_FEATURES",
    "StepAggregate",
    "extract",
    "extract_dict",
    "iter_prefixes",
    "iter_frame_prefixes",
    "step_views",
    "steps_columns",
]

FEATURE_SPEC_VERSION = "fs-2"

_HEAD: tuple[str, ...] = (
    "step_index",
    "ctx_tokens",
    "first_prompt_tokens",
    "ctx_growth_last",
    "ctx_growth_mean",
    "tokens_so_far",
    "time_since_start_s",
    "tool_pause_s",
    "tool_pause_mean_s",
    "n_tool_calls",
    "tool_calls_last",
)
_VERBS: tuple[str, ...] = (
    tuple(f"verb_{v}_calls" for v in VERB_CLASSES)
    + tuple(f"verb_{v}_share" for v in VERB_CLASSES)
    + ("verb_write_last",)
)
_TROUBLE: tuple[str, ...] = (
    "tool_errors",
    "tool_error_streak",
    "new_tool_errors",
    "repeated_tool_calls",
    "max_key_repeats",
    "last_call_repeated",
)
_SIGNALS: tuple[str, ...] = tuple(f"sig_{s}" for s in SIGNAL_KINDS) + tuple(
    f"new_sig_{s}" for s in SIGNAL_KINDS
)
_TAIL: tuple[str, ...] = (
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
FEATURE_NAMES: tuple[str, ...] = _HEAD + _VERBS + _TROUBLE + _SIGNALS + _TAIL
N_FEATURES = len(FEATURE_NAMES)
_V = len(_HEAD)  # first index of _VERBS
_TR = _V + len(_VERBS)  # first index of _TROUBLE
_SG = _TR + len(_TROUBLE)  # first index of _SIGNALS
_NK = len(SIGNAL_KINDS)
_T = _SG + len(_SIGNALS)  # first index of _TAIL
_NAN = math.nan


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
        first = steps[0].prompt_tokens
        x[3] = newp - last.prompt_tokens
        x[4] = (newp - first) / k
    else:
        last = None
        first = newp
        x[3] = 0.0
        x[4] = 0.0
    x[2] = first
    x[5] = a.tokens
    if prefix.now_s is not None and prefix.run_started_s is not None:
        x[6] = prefix.now_s - prefix.run_started_s
    else:
        x[6] = _NAN
    x[7] = _NAN if prefix.new_tool_pause_s is None else prefix.new_tool_pause_s
    x[8] = a.pause_sum / a.pause_n if a.pause_n else _NAN
    x[9] = n_calls
    x[10] = len(last.tool_calls) if last is not None else 0
    verbs = a.verbs
    for v in range(3):
        x[_V + v] = verbs[v]
        x[_V + 3 + v] = verbs[v] / n_calls if n_calls else 0.0
    x[_V + 6] = a.last_write
    i = _TR
    x[i] = a.errors + new_err
    x[i + 1] = streak
    x[i + 2] = new_err
    x[i + 3] = a.repeated
    x[i + 4] = a.max_rep
    x[i + 5] = a.last_repeated
    x[_SG:_T] = 0.0
    sig = prefix.signals
    if sig:
        n = len(sig)
        new0 = n - min(max(prefix.new_signals_n, 0), n)
        for j, kind in enumerate(sig):
            c = signal_kind(kind)
            x[_SG + c] += 1.0
            if j >= new0:
                x[_SG + _NK + c] += 1.0
    i = _T
    x[i] = last.completion_tokens if last is not None else 0
    x[i + 1] = a.out_sum / k if k else 0.0
    x[i + 2] = a.out_max
    x[i + 3] = a.structured / k if k else 0.0
    x[i + 4] = a.cached_sum / a.cached_prompt if a.has_cache and a.cached_prompt else _NAN
    x[i + 5] = a.switches
    x[i + 6] = a.frontier / k if k else 0.0
    x[i + 7] = prefix.new_tool_results_n
    x[i + 8] = sum(prefix.new_tool_result_tokens)
    x[i + 9] = prefix.new_n_tools_offered
    x[i + 10] = 1.0 if prefix.new_wants_json else 0.0
    x[i + 11] = _NAN if prefix.local_cache_pressure is None else prefix.local_cache_pressure
    return x


def extract_dict(prefix: RunPrefix) -> dict[str, float]:
    """:func:`extract` as ``{feature name: value}`` (for logs, snapshots and debugging)."""
    return dict(zip(FEATURE_NAMES, extract(prefix).tolist(), strict=True))
