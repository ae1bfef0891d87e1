"""Seeded synthetic agent-run workloads in the run-log schema, calibrated to real traces.

Algorithm (everything is drawn with one ``numpy.random.Generator`` seeded by ``seed`` and built as
whole columns, no per-row Python objects beyond the list cells of the Arrow->pandas conversion):

1. **Latent difficulty and outcomes.** Each run ``i`` draws a task difficulty ``z_i ~ N(difficulty, 1)``
   and two model noises ``e_w, e_s ~ N(0, outcome_noise)``. The weak model (the run's own ``model``)
   succeeds iff ``z + e_w < t_w``, the strong one iff ``z + e_s < t_s + frontier_gap``, where
   ``t = sqrt(1 + outcome_noise^2) * Phi^-1(rate)`` so that at ``difficulty = 0`` the marginal success
   rates equal ``weak_success_rate`` and ``strong_success_rate``. ``needs_frontier`` = weak fails and
   strong succeeds; ``pair_label`` is ``needs_frontier`` / ``both_fail`` / ``weak_ok`` (weak succeeds,
   whatever the strong one did: the convention of ``features.importers.pairing``). ``outcome`` is the
   weak model's outcome, ``strong_outcome`` the strong one's, ``reward`` 1.0/0.0.
   ``needs_frontier`` rises with ``difficulty`` while the mean difficulty is below the middle of the
   two thresholds (about +0.16 at the defaults) and falls beyond it (tasks become too hard for both:
   ``both_fail`` grows monotonically); it rises monotonically with ``frontier_gap``.
2. **Observable signals of the latent process (with noise).** ``u = (z + e_w - t_w)/sqrt(1+noise^2)``
   is the weak model's standardised "distance to failure" (``u > 0`` <=> failure). It raises, each
   through a logistic link: the chance a tool result is an error (``error_coef``) and the chance a
   tool call repeats the previous call with identical arguments (``repeat_coef``, more so right after
   an error: ``repeat_after_error``). The intercepts are solved (bisection) on the drawn population
   with ``u`` shifted back to ``difficulty = 0``, so the *marginal* rates equal ``tool_error_rate`` /
   ``repeat_rate`` at the calibrated difficulty and rise with it. ``u`` also lengthens runs
   (``length_difficulty_coef`` on log length, within each outcome class, so the per-outcome medians
   stay calibrated) and makes tool results bigger (``growth_coef`` on log size, centred the same
   way). A learned escalation model therefore has a real but imperfect signal; ``needs_frontier`` vs
   ``both_fail`` are separated only through ``z``.
3. **Run length.** ``n_steps = round(median_steps_{success|failure} * exp(length_difficulty_coef *
   (u - median u in the class) + steps_sigma * eta))``, clipped to ``[min_steps, max_steps]``.
4. **Steps.** Every step but the last is a tool-call step with probability chosen so that
   ``tool_step_share`` of all steps are tool calls; the last step is a text answer. A tool-call step is
   ``structured`` and produces one call (tau-bench gpt-4o: 1.0 call per tool step) whose name comes
   from the run's domain vocabulary (Zipf weights); its output is short (lookups: lognormal around
   ``tool_completion_median``) or, with ``tool_long_share``, an argument-heavy write (around
   ``tool_long_completion_median``). Text steps (planning / answers) are lognormal around
   ``text_completion_median``. ``tool_call_keys`` are ``name#id``; a repeat copies the previous tool
   call's name and key.
5. **Growing context.** Step 0's prompt = the domain system prompt (``system_prompt_tokens``, the same
   for every run of a domain) + the first user message. Step ``k`` repeats the whole previous prompt
   and output (``prefix_reuse_tokens = prompt_{k-1} + completion_{k-1}``) and appends new input: the
   tool results the previous step asked for (``tool_results_n``, ``tool_result_tokens``,
   ``tool_result_errors``) or, after a text step, a user message (``user_message_tokens_median``),
   plus ``turn_overhead_tokens``. The share ``prefix_reuse/prompt`` is what tau-bench calls "a call's
   prompt repeats ~98% of the previous call's prompt+output".
6. **Prefix block hashes** (``hash_ids=True``): 512-token blocks as in Mooncake. Blocks inside the
   domain system prompt get domain-wide ids (shared across runs); every other *full* block of a run
   gets a run-stable id (it is reused by all later steps, since each prompt extends the previous
   one); the last partial block gets a fresh id per step.
7. **Timing.** Run starts follow a clustered (Neyman-Scott) process: cluster centres are Poisson;
   a cluster holds ``ceil(arrival_cluster_mean * LogNormal(-s^2/2, s))`` runs (``s =
   arrival_cluster_sigma``) spread after its centre by ``Exp(arrival_spread_s * sqrt(size))``; the
   centre rate makes the mean run rate ``arrival_rate``. Step 0 arrives at the run's start; step
   ``k`` arrives after step ``k-1``'s nominal service time (``latency_s = service_base_s +
   completion / decode_tokens_per_s``) plus a pause: after a tool step a tool execution pause
   (lognormal, ``tool_pause_median_s``, ``tool_pause_sigma``), after a text step a user turn
   (lognormal, ``user_pause_median_s``, ``user_pause_sigma``). ``tool_pause_s`` is null on step 0.

What the defaults match (targets, sources and tolerances: ``features/generator_calibration.json``,
recomputed by ``bench/calibrate_generator.py``, checked by ``tests/test_generate.py``):

- tau2 airline gpt-oss-120b vs claude-sonnet-4-5: needs-frontier 18/50, both-fail 13/50, weak
  success 19/50 (=run success rate 0.38), strong success 36/50; prompt-token p50 and first-step
  prompt from claude usage; user-turn pause median; step latency median (gpt-oss).
- tau-bench gpt-4o airline: median steps 8.5 (success) / 13 (failure); prompt repetition share
  (median 0.985); tool-step share 0.47; short-step (<= 64 output tokens) share 0.65; completion
  medians of tool / text steps; tool result size median; tool error share 0.063; repeated identical
  tool call share 0.023; user message size; and the *strength* of the failure signals, so the
  generator plants none the real data lacks: log odds ratio (failed vs successful runs) of a tool
  result being an error (0.68 +- 0.31) and of a call repeating an earlier one (1.49 +- 0.67), and the
  log ratio of tool-result sizes (0.08) - ``error_coef`` / ``repeat_coef`` / ``growth_coef`` were
  1.0 / 1.0 / 0.25 before (generated 1.83 / 2.04 / 0.35: 2.7x, 1.4x and 4x tau-bench's).
- Azure LLM code trace: per-second peak/mean of arrivals (~26) and per-minute CV (~1.0) when run
  starts are generated at its mean rate (2.57/s).

What they do not match: tau-bench's 42% success (we use tau2's weak 38%: the outcome is the weak
model's); claude's real completion tokens (median 340, extended thinking) - we use tau-bench's
message sizes; claude's prompt p95 (13.2k; we give ~10k: real prompts grow ~394 tokens a step,
tau-bench's chars/4 sizes ~165); tau2 tool pauses (sub-millisecond: in-memory tools) - ``tool_pause_median_s`` is an
assumption, not data; Azure's inter-arrival CV (13) and share of empty seconds (0.73); Mooncake's
inter-turn gap (median 123 s, human chat turns, not agent steps).

Knobs are the fields of :class:`GeneratorParams`; ``generate(n, seed, **params)`` overrides them.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import pyarrow as pa

from features.generate_params import BLOCK_TOKENS, DOMAIN_TOOLS, GeneratorParams
from features.generate_stats import log_odds_ratio, summary_stats

__all__ = [
    "GeneratorParams",
    "DOMAIN_TOOLS",
    "generate",
    "run_start_times",
    "summary_stats",
    "log_odds_ratio",
    "BLOCK_TOKENS",
]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _solve_intercept(target: float, lin: np.ndarray) -> float:
    """Intercept b with mean(sigmoid(b + lin)) == target over the drawn population (bisection)."""
    target = min(max(target, 1e-9), 1 - 1e-9)
    if len(lin) == 0:
        return math.log(target / (1 - target))
    lo, hi = -40.0, 40.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(_sigmoid(mid + lin).mean()) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _lognormal(rng: np.random.Generator, median: float | np.ndarray, sigma: float, n: int) -> np.ndarray:
    return np.asarray(median) * np.exp(sigma * rng.standard_normal(n))


def run_start_times(n_runs: int, rng: np.random.Generator, p: GeneratorParams) -> np.ndarray:
    """Sorted start times (s) of ``n_runs`` runs from the clustered arrival process (step 7)."""
    if n_runs == 0:
        return np.zeros(0)
    s = p.arrival_cluster_sigma
    k = max(8, int(n_runs / p.arrival_cluster_mean * 1.5) + 8)
    sizes = np.zeros(0, dtype=np.int64)
    while sizes.sum() < n_runs:
        more = np.ceil(p.arrival_cluster_mean * np.exp(rng.normal(-(s**2) / 2, s, k))).astype(np.int64)
        sizes = np.concatenate([sizes, np.maximum(more, 1)])
    k_used = int(np.searchsorted(np.cumsum(sizes), n_runs)) + 1
    sizes = sizes[:k_used]
    centre_rate = p.arrival_rate / float(sizes.mean())  # realised sizes: heavy tails converge slowly
    centres = np.cumsum(rng.exponential(1.0 / centre_rate, k_used))
    per = np.repeat(p.arrival_spread_s * np.sqrt(sizes), sizes)
    t = np.repeat(centres, sizes) + rng.exponential(1.0, int(sizes.sum())) * per
    t = np.sort(t)[:n_runs]
    return p.start_time_s + (t - t[0])


def _segment_positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments of the given lengths: (segment index per element, position within segment)."""
    total = int(lengths.sum())
    seg = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(total) - np.repeat(starts, lengths)
    return seg, pos


def _list_array(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def generate(n_runs: int, seed: int, **params: Any) -> pd.DataFrame:
    """``n_runs`` synthetic runs (run rows, then step rows) as a run-log frame; deterministic per seed."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    from features.schema import ARROW_SCHEMA, SCHEMA_VERSION

    if n_runs < 0:
        raise ValueError(f"generator: n_runs must be >= 0, got {n_runs}")
    p = GeneratorParams.from_overrides(**params)
    rng = np.random.default_rng(seed)
    n = int(n_runs)

    # 1. latent difficulty and outcomes
    nd = NormalDist()
    scale = math.sqrt(1.0 + p.outcome_noise**2)
    t_w = scale * nd.inv_cdf(p.weak_success_rate)
    t_s = scale * nd.inv_cdf(p.strong_success_rate) + p.frontier_gap
    z = rng.normal(p.difficulty, 1.0, n)
    e_w = rng.normal(0.0, p.outcome_noise, n)
    e_s = rng.normal(0.0, p.outcome_noise, n)
    weak_ok = z + e_w < t_w
    strong_ok = z + e_s < t_s
    u = (z + e_w - t_w) / scale  # > 0 <=> weak failure
    u_shift = p.difficulty / scale  # u - u_shift is distributed as at the calibrated difficulty 0
    domain = rng.integers(0, p.n_domains, n)

    # 3. run length
    m_o = np.where(weak_ok, p.median_steps_success, p.median_steps_failure)
    u_med = np.zeros(n)
    for cls in (True, False):
        mask = weak_ok == cls
        if mask.any():
            u_med[mask] = np.median(u[mask])
    log_len = np.log(m_o) + p.length_difficulty_coef * (u - u_med) + p.steps_sigma * rng.standard_normal(n)
    n_steps = np.clip(np.rint(np.exp(log_len)), p.min_steps, p.max_steps).astype(np.int64)

    # 4. steps
    total = int(n_steps.sum())
    run_of, k = _segment_positions(n_steps)
    last = k == n_steps[run_of] - 1
    first = k == 0
    mean_len = float(n_steps.mean()) if n else 1.0
    p_tool = min(1.0, p.tool_step_share * mean_len / max(mean_len - 1.0, 1e-9))
    is_tool = (rng.random(total) < p_tool) & ~last
    u_s = u[run_of]
    long_tool = rng.random(total) < p.tool_long_share
    comp = np.where(
        is_tool,
        np.where(
            long_tool,
            _lognormal(rng, p.tool_long_completion_median, p.tool_long_completion_sigma, total),
            _lognormal(rng, p.tool_completion_median, p.tool_completion_sigma, total),
        ),
        _lognormal(rng, p.text_completion_median, p.text_completion_sigma, total),
    )
    completion = np.maximum(1, np.rint(comp)).astype(np.int64)

    # tool calls: names, repeats, keys (one call per tool step)
    tool_idx = np.flatnonzero(is_tool)
    n_calls = len(tool_idx)
    dom_names = list(DOMAIN_TOOLS)[: p.n_domains]
    vocab = [name for d in dom_names for name in DOMAIN_TOOLS[d]]
    vocab_off = np.cumsum([0] + [len(DOMAIN_TOOLS[d]) for d in dom_names])
    call_run = run_of[tool_idx]
    call_dom = domain[call_run]
    sizes_v = vocab_off[call_dom + 1] - vocab_off[call_dom]
    # Zipf(1) weights within the domain vocabulary via inverse CDF on harmonic numbers
    r = rng.random(n_calls)
    max_v = int(sizes_v.max()) if n_calls else 1
    harm = np.cumsum(1.0 / np.arange(1, max_v + 1))
    target = r * harm[sizes_v - 1]
    rank = np.minimum(np.searchsorted(harm, target), sizes_v - 1)
    name_id = vocab_off[call_dom] + rank

    # tool results consumed by the step after a tool step; errors raise the chance of a repeat
    has_result = np.zeros(total, dtype=bool)
    has_result[tool_idx + 1] = True  # a tool step is never last, so tool_idx + 1 is in the same run
    res_idx = np.flatnonzero(has_result)
    lin_err = p.error_coef * u_s[res_idx]
    b_err = _solve_intercept(p.tool_error_rate, lin_err - p.error_coef * u_shift)
    res_err = rng.random(len(res_idx)) < _sigmoid(b_err + lin_err)
    err_step = np.zeros(total, dtype=bool)
    err_step[res_idx] = res_err
    res_tok = np.maximum(
        1,
        np.rint(
            _lognormal(rng, p.tool_result_tokens_median, p.tool_result_tokens_sigma, len(res_idx))
            * np.exp(
                p.growth_coef * (u_s[res_idx] - (np.median(u_s[res_idx]) - u_shift if len(res_idx) else 0.0))
            )
        ),
    ).astype(np.int64)
    res_tok = np.where(res_err, np.minimum(res_tok, 40), res_tok)  # error messages are short

    # repeats: a tool step repeats the previous tool call of its run (same name and arguments)
    prev_call_same_run = np.zeros(n_calls, dtype=bool)
    if n_calls > 1:
        prev_call_same_run[1:] = call_run[1:] == call_run[:-1]
    after_err = err_step[tool_idx]  # this step consumed an errored result
    lin_rep = p.repeat_coef * u_s[tool_idx] + p.repeat_after_error * after_err
    cand = prev_call_same_run  # the first call of a run has nothing to repeat
    b_rep = _solve_intercept(
        p.repeat_rate * n_calls / max(int(cand.sum()), 1), lin_rep[cand] - p.repeat_coef * u_shift
    )
    repeat = cand & (rng.random(n_calls) < _sigmoid(b_rep + lin_rep))
    src = np.where(repeat, -1, np.arange(n_calls))
    src = np.maximum.accumulate(src) if n_calls else src  # latest non-repeat call (same run: forced)
    name_id = name_id[src]
    call_uid = src.astype(np.int64)

    # 5. growing context
    n_new = np.zeros(total, dtype=np.int64)
    n_new[res_idx] = res_tok + p.turn_overhead_tokens
    after_text = np.zeros(total, dtype=bool)
    after_text[1:] = ~is_tool[:-1] & ~first[1:]
    user_tok = np.maximum(
        1, np.rint(_lognormal(rng, p.user_message_tokens_median, p.user_message_tokens_sigma, total))
    ).astype(np.int64)
    n_new = np.where(after_text, user_tok + p.turn_overhead_tokens, n_new)
    first_user = np.maximum(
        1, np.rint(_lognormal(rng, p.first_user_tokens_median, p.user_message_tokens_sigma, total))
    ).astype(np.int64)
    n_new = np.where(first, p.system_prompt_tokens + first_user, n_new)
    # prompt_k = prompt_{k-1} + completion_{k-1} + new_k  => cumulative sums within each run
    inc = n_new + np.where(first, 0, np.concatenate([[0], completion[:-1]]))
    csum = np.cumsum(inc)
    run_start_idx = np.cumsum(n_steps) - n_steps
    base = np.repeat(csum[run_start_idx] - inc[run_start_idx], n_steps)
    prompt = csum - base
    prev_prompt = np.concatenate([[0], prompt[:-1]])
    prev_comp = np.concatenate([[0], completion[:-1]])
    reuse = np.where(first, 0, prev_prompt + prev_comp)

    # 7. timing
    starts = run_start_times(n, rng, p)
    latency = p.service_base_s + completion / p.decode_tokens_per_s
    pause = np.where(
        is_tool,
        _lognormal(rng, p.tool_pause_median_s, p.tool_pause_sigma, total),
        _lognormal(rng, p.user_pause_median_s, p.user_pause_sigma, total),
    )  # pause *after* this step; shifted to the next step below
    pause_in = np.concatenate([[0.0], pause[:-1]])
    pause_in[first] = 0.0
    gap = np.where(first, 0.0, np.concatenate([[0.0], latency[:-1]]) + pause_in)
    g = np.cumsum(gap)
    arrival = starts[run_of] + g - np.repeat(g[run_start_idx], n_steps)
    ended = (arrival + latency)[np.cumsum(n_steps) - 1] if n else np.zeros(0)

    # ---- Arrow columns (steps)
    run_ids = pc.binary_join_element_wise(
        pa.array(np.full(n, f"gen{seed}-")), pc.cast(pa.array(np.arange(n)), pa.string()), ""
    )
    step_run_ids = run_ids.take(pa.array(run_of))
    call_off = np.zeros(total + 1, dtype=np.int64)
    call_off[1:] = np.cumsum(is_tool)
    names_arr = pa.array(vocab).take(pa.array(name_id))
    keys_arr = pc.binary_join_element_wise(names_arr, pc.cast(pa.array(call_uid), pa.string()), "#")
    res_off = np.zeros(total + 1, dtype=np.int64)
    res_off[1:] = np.cumsum(has_result)
    n_models = pa.array(np.full(total, p.weak_model))

    cols: dict[str, pa.Array] = {
        "schema_version": pa.array(np.full(total, SCHEMA_VERSION, dtype=np.int32)),
        "record": pa.array(np.full(total, "step")),
        "run_id": step_run_ids,
        "model": n_models,
        "step": pa.array(k),
        "arrival_s": pa.array(arrival),
        "tool_pause_s": pa.array(np.where(first, np.nan, pause_in), from_pandas=True),
        "prompt_tokens": pa.array(prompt),
        "prefix_reuse_tokens": pa.array(reuse),
        "completion_tokens": pa.array(completion),
        "tool_calls": _list_array(call_off, names_arr),
        "tool_call_keys": _list_array(call_off, keys_arr),
        "tool_results_n": pa.array(has_result.astype(np.int64)),
        "tool_result_tokens": _list_array(res_off, pa.array(res_tok)),
        "tool_result_errors": _list_array(res_off, pa.array(res_err)),
        "structured": pa.array(is_tool),
        "latency_s": pa.array(latency),
    }
    if p.hash_ids:
        cols["hash_ids"] = _hash_ids(prompt, run_of, domain, n, p)
    steps_tbl = _table(cols, total, ARROW_SCHEMA)

    # ---- Arrow columns (runs)
    pair = np.where(weak_ok, "weak_ok", np.where(strong_ok, "needs_frontier", "both_fail"))
    run_cols: dict[str, pa.Array] = {
        "schema_version": pa.array(np.full(n, SCHEMA_VERSION, dtype=np.int32)),
        "record": pa.array(np.full(n, "run")),
        "run_id": run_ids,
        "source": pa.array(np.full(n, "synthetic")),
        "task_id": pc.binary_join_element_wise(
            pa.array(np.array(dom_names)[domain] if n else np.zeros(0, dtype=str)),
            pc.cast(pa.array(np.arange(n)), pa.string()),
            "/",
        ),
        "model": pa.array(np.full(n, p.weak_model)),
        "agent": pa.array(np.full(n, "synthetic-agent")),
        "started_at": pa.array(starts),
        "ended_at": pa.array(ended),
        "outcome": pa.array(np.where(weak_ok, "success", "failure")),
        "reward": pa.array(weak_ok.astype(np.float64)),
        "needs_frontier": pa.array(~weak_ok & strong_ok),
        "pair_label": pa.array(pair),
        "strong_model": pa.array(np.full(n, p.strong_model)),
        "strong_outcome": pa.array(np.where(strong_ok, "success", "failure")),
        "n_steps": pa.array(n_steps),
    }
    runs_tbl = _table(run_cols, n, ARROW_SCHEMA)
    table = pa.concat_tables([runs_tbl, steps_tbl])
    df = table.to_pandas()
    if not isinstance(df, pd.DataFrame):  # pragma: no cover - pyarrow always returns a frame here
        raise TypeError("unexpected pyarrow result")
    return df


def _hash_ids(
    prompt: np.ndarray, run_of: np.ndarray, domain: np.ndarray, n_runs: int, p: GeneratorParams
) -> pa.Array:
    """Mooncake-style 512-token block ids of each step's prompt (algorithm step 6)."""
    import pyarrow as pa

    nb = (prompt + BLOCK_TOKENS - 1) // BLOCK_TOKENS  # blocks incl. a partial last one
    full = prompt // BLOCK_TOKENS
    sys_blocks = p.system_prompt_tokens // BLOCK_TOKENS
    dom_ids = p.n_domains * sys_blocks
    max_blocks = np.zeros(n_runs, dtype=np.int64)
    np.maximum.at(max_blocks, run_of, nb)
    run_base = dom_ids + np.cumsum(max_blocks) - max_blocks
    fresh_base = dom_ids + int(max_blocks.sum())
    seg, j = _segment_positions(nb)
    r = run_of[seg]
    ids = np.where(
        j < sys_blocks,
        domain[r] * sys_blocks + j,
        np.where(j < full[seg], run_base[r] + j, fresh_base + seg),
    )
    off = np.zeros(len(prompt) + 1, dtype=np.int64)
    off[1:] = np.cumsum(nb)
    return _list_array(off, pa.array(ids.astype(np.int64)))


def _table(cols: dict[str, pa.Array], n: int, schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)
