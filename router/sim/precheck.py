"""A fast capacity pre-check before simulating: offered prefill + decode work vs the node profile.

Algorithm (:func:`capacity_check`; no event loop, one pass over the steps):

1. **Horizon.** Each run's steps arrive, open loop, at its start time plus its logged tool pauses
   (service time ignored); the horizon is the span from the first start to the last such arrival
   (at least 1 s). The offered rates are totals over it.
2. **Offered tokens.** Prefill: every step's prompt tokens, and a lower bound with a perfect
   (infinite, shared) prefix cache: in open-loop arrival order, a step's leading chain blocks that
   any earlier step held are hits (at most its prompt - 1 tokens). Decode: output tokens after the
   first (the first comes with the prefill).
3. **Work per token** from the profile (``a + b*sum(l) + c*sum(l*(s+l)) + d*sum(ctx) + e*batch``):
   a step's prefill of ``u`` uncached tokens after ``s`` cached ones costs ``b*u + c*sum l*(s+l)``
   over its chunks of at most ``token_budget``; a decode token costs ``d*ctx + (a + e*n)/n`` with
   ``ctx`` = prompt + half the output and ``n`` the fullest decode batch the KV cache holds
   (``min(max_num_seqs, KV tokens / mean decode context)``), divided by the tokens per iteration
   of speculative decoding when it is on. Capacity in tokens/s per replica = tokens / GPU-seconds.
4. **Load factor** of ``r`` replicas = (prefill GPU-seconds + decode GPU-seconds) / horizon / r
   (perfectly balanced, perfectly batched: a lower bound on the real load). It is given without a
   cache and with the perfect cache. A factor above 1 *with the perfect cache* means the replicas
   cannot keep up whatever the policy does: a warning names the factor. The suggested starting
   point of a replica search is the fewest replicas whose no-cache factor is <= 1; the perfect-
   cache one is a lower bound. ``peak_10min_factor``: the busiest 10-minute window's offered work
   over the mean (burstiness the mean hides).
5. **Service floor.** ``short_step_alone_s_p95``: the p95 over short steps of each one served
   alone on an idle replica (its prefill chunks, one ``a`` each, then its decode), without and with
   the perfect cache. No replica count brings the simulated p95 below the perfect-cache floor, so
   a short-step SLO under it is out of reach locally (a warning says so).

Knobs: the :class:`~router.sim.simconfig.SimConfig` (profile, KV size and format, spec decode),
``replicas`` (the counts to warn about).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from router.sim.simconfig import SimConfig
from router.sim.workload import StepSpec, Workload

__all__ = ["capacity_check", "warning_lines"]


def _prefill_s(b: float, c: float, u: int, s: int, budget: int) -> float:
    """``b*u + c*sum(l*(s+l))`` over chunks of at most ``budget`` tokens (cumulative ``s``)."""
    t = b * u
    while u > 0:
        ln = u if u < budget else budget
        s += ln
        t += c * ln * s
        u -= ln
    return t


def capacity_check(
    workload: Workload, starts: np.ndarray, cfg: SimConfig, replicas: Sequence[int] = ()
) -> dict[str, Any]:
    """The offered load and the profile's capacity (module docstring); JSON-ready."""
    p = cfg.node_profile()
    B = p.token_budget
    arrivals: list[float] = []
    works: list[float] = []
    pre_tok = pre_tok_pc = dec_tok = 0
    pre_s = pre_s_pc = 0.0
    ctx_w = 0.0
    alone: list[float] = []  # short steps served alone: no cache
    alone_pc: list[float] = []  # ... with a perfect (infinite) prefix cache
    timed: list[tuple[float, int, StepSpec]] = []
    for run, st in zip(workload.runs, starts, strict=True):
        t = float(st)
        for s in run.steps:
            t += s.pause
            timed.append((t, len(timed), s))
    timed.sort(key=lambda x: (x[0], x[1]))
    seen: set[int] = set()
    BT = cfg.block_tokens
    for t, _, s in timed:
        lim = min(s.n_lookup, max(s.prompt - 1, 0) // BT)
        h = 0
        while h < lim and s.chain[h] in seen:
            h += 1
        seen.update(s.chain[: s.n_cacheable])
        u_pc = max(s.prompt - h * BT, 1)
        w = _prefill_s(p.b, p.c, s.prompt, 0, B)
        w_pc = _prefill_s(p.b, p.c, u_pc, s.prompt - u_pc, B)
        pre_s += w
        pre_s_pc += w_pc
        n_dec = max(s.completion - 1, 0)
        dec_ctx = n_dec * (s.prompt + s.completion / 2)
        if s.short:
            dec = n_dec * (p.a + p.e) + p.d * dec_ctx
            alone.append(w + p.a * math.ceil(s.prompt / B) + p.e + dec)
            alone_pc.append(w_pc + p.a * math.ceil(u_pc / B) + p.e + dec)
        pre_tok += s.prompt
        pre_tok_pc += u_pc
        dec_tok += n_dec
        ctx_w += dec_ctx
        arrivals.append(t)
        works.append(w + dec_ctx * p.d)
    t0 = float(np.min(starts)) if len(starts) else 0.0
    horizon = max(1.0, (max(arrivals) if arrivals else 0.0) - t0)
    ctx_mean = ctx_w / dec_tok if dec_tok else 1.0
    kv_tokens = cfg.kv_blocks() * cfg.block_tokens
    n_batch = max(1, min(p.max_num_seqs, int(kv_tokens // max(ctx_mean, 1.0))))
    per_tok = p.d * ctx_mean + (p.a + p.e * n_batch) / n_batch
    spec = cfg.spec
    if spec is not None:
        e, v = spec.free_text.tokens_per_iteration, spec.free_text.proposed_per_iteration
        per_tok = (per_tok + p.b * v + spec.draft_s(p) / n_batch + spec.draft_s_per_token * v) / e
    dec_s = dec_tok * per_tok
    load1 = (pre_s + dec_s) / horizon
    load1_pc = (pre_s_pc + dec_s) / horizon
    peak = 1.0
    if arrivals:
        a = np.asarray(arrivals) - t0
        win = np.floor(a / 600.0).astype(int)
        per_win = np.bincount(win, weights=np.asarray(works))
        full = per_win[: max(1, int(horizon // 600))]  # whole windows only (the last may be partial)
        mean = float(np.sum(works)) / (horizon / 600.0)
        peak = float(full.max()) / mean if mean > 0 else 1.0
    out: dict[str, Any] = {
        "horizon_s": round(horizon, 3),
        "offered_prefill_tokens_per_s": round(pre_tok / horizon, 3),
        "offered_prefill_tokens_per_s_perfect_cache": round(pre_tok_pc / horizon, 3),
        "offered_decode_tokens_per_s": round(dec_tok / horizon, 3),
        "capacity_prefill_tokens_per_s": round(pre_tok / pre_s, 3) if pre_s else None,
        "capacity_decode_tokens_per_s": round(1.0 / per_tok, 3),
        "decode_batch_at_full_kv": n_batch,
        "mean_decode_context_tokens": round(ctx_mean, 1),
        "load_factor_1_replica": round(load1, 4),
        "load_factor_1_replica_perfect_cache": round(load1_pc, 4),
        "replicas_lower_bound": max(1, math.ceil(load1_pc)),
        "suggested_start_replicas": max(1, math.ceil(load1)),
        "peak_10min_factor": round(peak, 3),
        "short_step_alone_s_p95": round(float(np.percentile(alone, 95)), 4) if alone else None,
        "short_step_alone_s_p95_perfect_cache": round(float(np.percentile(alone_pc, 95)), 4)
        if alone_pc
        else None,
        "per_replicas": [
            {
                "replicas": int(r),
                "load_factor": round(load1 / r, 4) if r else None,
                "load_factor_perfect_cache": round(load1_pc / r, 4) if r else None,
                "overloaded": bool(r) and load1_pc / r > 1.0,
            }
            for r in replicas
        ],
    }
    return out


def warning_lines(check: dict[str, Any], slo_short_s: float | None = None) -> list[str]:
    """One warning per replica count the offered load overloads even with a perfect prefix cache,
    and one when the short-step SLO is out of reach of any replica count (the steps' own service)."""
    lines = []
    floor = check.get("short_step_alone_s_p95_perfect_cache")
    if slo_short_s is not None and floor is not None and floor > slo_short_s:
        lines.append(
            f"WARNING: short-step p95 <= {slo_short_s:g} s is out of reach of local replicas: served alone on "
            f"an idle replica the p95 short step takes {floor:.2f} s even with a perfect prefix cache "
            f"({check['short_step_alone_s_p95']:.2f} s without; long prompts' own prefill)"
        )
    for e in check["per_replicas"]:
        if e["replicas"] and e["overloaded"]:
            lines.append(
                f"WARNING: offered load is {e['load_factor']:.1f}x the capacity of {e['replicas']} "
                f"replica(s) ({e['load_factor_perfect_cache']:.1f}x even with a perfect prefix cache): "
                f"queues grow without bound; start the search at {check['suggested_start_replicas']} "
                f"(lower bound {check['replicas_lower_bound']})"
            )
        elif e["replicas"] and e["load_factor"] > 1.0:
            lines.append(
                f"note: offered load is {e['load_factor']:.1f}x the capacity of {e['replicas']} replica(s) "
                f"without prefix-cache hits ({e['load_factor_perfect_cache']:.2f}x with a perfect cache)"
            )
    return lines
