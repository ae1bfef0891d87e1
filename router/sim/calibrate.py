"""Calibration helpers: match the simulated node to a fake vLLM's latency constants, compare figures.

The fake vLLM (``router.fakes.vllm``) serves each request as: TTFT = ``base_ms + prefill_ms_per_token x
uncached tokens``, then ``decode_ms_per_token x (1 + batch_slowdown x (running - 1))`` per further
output token; prefix cache in blocks of ``block_size`` with ``capacity_blocks``, at most
``max_concurrency`` running requests. The simulated node prices an iteration as
``a + b*prefill + c*quad + d*ctx + e*batch``. They agree exactly for a request alone when

    a = base_ms / 1000 = decode_ms_per_token / 1000,  b = prefill_ms_per_token / 1000,  c = d = e = 0

(:func:`profile_from_fake`; :func:`fake_knobs_for_profile` goes the other way). With
``batch_slowdown = 0`` concurrent decodes also agree (each batch iteration costs ``a`` for everyone, as
each fake request sleeps ``a`` per token). They differ where iteration-level batching matters: in the
simulator a long prefill stalls the decodes sharing its iteration, the fake has no such coupling, so
calibration runs use light load. If ``base_ms != decode_ms_per_token`` the profile takes
``a = decode_ms_per_token`` and the TTFT is off by their difference (reported by
:func:`profile_from_fake` as ``ttft_offset_s``).

:func:`step_figures` computes p50/p95 step latency and the cross-turn cache hit rate from measured or
simulated steps; :func:`percent_errors` compares two such dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.figures import cache_figures, percentile
from router.sim.profiles import NodeProfile

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["profile_from_fake", "fake_knobs_for_profile", "sim_kv_for_fake", "step_figures", "percent_errors"]

_FAKE_DEFAULTS = {
    "base_ms": 10.0,
    "prefill_ms_per_token": 0.04,
    "decode_ms_per_token": 3.0,
    "batch_slowdown": 0.0,
    "block_size": 32,
    "capacity_blocks": 8192,
    "max_concurrency": 64,
    "max_model_len": 32768,
}


def _knobs(knobs: Mapping[str, object] | BaseModel) -> dict[str, Any]:
    d: dict[str, Any] = dict(_FAKE_DEFAULTS)
    src = knobs.model_dump() if hasattr(knobs, "model_dump") else dict(knobs)
    d.update({k: v for k, v in src.items() if k in _FAKE_DEFAULTS})
    return d


def profile_from_fake(knobs: Mapping[str, object] | BaseModel) -> tuple[NodeProfile, dict[str, float]]:
    """The node profile matching a fake vLLM's knobs, plus notes (``ttft_offset_s``, ``batch_slowdown``)."""
    k = _knobs(knobs)
    a = k["decode_ms_per_token"] / 1000.0
    prof = NodeProfile(
        name="fake-vllm",
        a=a,
        b=k["prefill_ms_per_token"] / 1000.0,
        c=0.0,
        d=0.0,
        e=0.0,
        kv_bytes_per_token=1,
        max_context=int(k["max_model_len"]),
        token_budget=int(k["max_model_len"]),
        max_num_seqs=max(1, int(k["max_concurrency"])),
        provenance={"method": "router.sim.calibrate.profile_from_fake", "knobs": k},
    )
    notes = {
        "ttft_offset_s": (k["base_ms"] - k["decode_ms_per_token"]) / 1000.0,
        "batch_slowdown": float(k["batch_slowdown"]),
    }
    return prof, notes


def sim_kv_for_fake(knobs: Mapping[str, object] | BaseModel) -> dict[str, float | int]:
    """``SimConfig`` fields giving the simulated node the fake's cache: block size and capacity."""
    k = _knobs(knobs)
    bs = int(k["block_size"])
    # profile_from_fake sets kv_bytes_per_token = 1, so GB = tokens / 1e9
    return {"block_tokens": bs, "kv_cache_gb": int(k["capacity_blocks"]) * bs / 1e9}


def fake_knobs_for_profile(
    profile: NodeProfile, block_size: int = 32, capacity_blocks: int = 8192
) -> dict[str, Any]:
    """Fake vLLM knobs reproducing ``profile`` (exact only for c = d = 0; e becomes batch_slowdown)."""
    if profile.c or profile.d:
        raise ValueError("the fake vLLM has no quadratic-prefill or decode-context term: use c = d = 0")
    per_tok = profile.a + profile.e
    return {
        "base_ms": 1000 * (profile.a + profile.e),
        "prefill_ms_per_token": 1000 * profile.b,
        "decode_ms_per_token": 1000 * per_tok,
        "batch_slowdown": profile.e / per_tok if per_tok else 0.0,
        "block_size": block_size,
        "capacity_blocks": capacity_blocks,
        "max_concurrency": profile.max_num_seqs,
    }


def step_figures(
    latency_s: Sequence[float],
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int],
    step_index: Sequence[int],
) -> dict[str, float]:
    """p50/p95 step latency and cache hit rate (cached / prompt tokens over steps with index >= 1),
    by :mod:`router.core.figures` (every step is local here); NaN where a figure is undefined."""
    lat = np.asarray(latency_s, float)
    hit, _ = cache_figures(
        np.ones(len(lat), bool),
        np.asarray(step_index),
        np.asarray(prompt_tokens, float),
        np.asarray(cached_tokens, float),
    )
    nan = float("nan")
    p50, p95 = percentile(lat, 50), percentile(lat, 95)
    return {
        "step_latency_s_p50": nan if p50 is None else p50,
        "step_latency_s_p95": nan if p95 is None else p95,
        "cache_hit_rate": nan if hit is None else hit,
    }


def percent_errors(measured: Mapping[str, float], simulated: Mapping[str, float]) -> dict[str, float]:
    """100 * (simulated - measured) / measured per shared key."""
    return {
        k: 100.0 * (simulated[k] - measured[k]) / measured[k] if measured[k] else float("nan")
        for k in measured
        if k in simulated
    }


def admission_config_for_profile(
    profile: NodeProfile,
    kv_cache_gb: float,
    slo_short_step_s: float,
    *,
    context_tokens: float = 8192.0,
    uncached_prompt_tokens: float = 512.0,
    short_output_tokens: float = 64.0,
    **overrides: Any,
) -> Any:
    """Admission knobs derived from a node profile, so the simulator's admission sheds where its node saturates.

    The same work-token accounting as the sidecar (:class:`router.policy.admission.AdmissionConfig`:
    a work token is one decode token amortised over a full batch; a prefill token weighs its GPU
    time relative to that):

    - the KV-limited batch ``N = min(max_num_seqs, kv_tokens / C)`` and its decode iteration
      ``t_d = a + d*N*C + e*N`` (``decode_s_per_token`` = t_d, ``replica_slots`` = N);
    - ``replica_tokens_per_s`` = ``N / t_d``; ``prefill_weight`` = ``b * N / t_d``;
    - ``base_short_step_s``: an idle replica's short step: one prefill iteration of
      ``uncached_prompt_tokens`` plus ``short_output_tokens`` decode iterations at batch 1 over
      ``context_tokens`` of context: ``a + b*u + c*u^2 + n_out * (a + d*C + e)``.

    ``overrides`` go straight into :class:`router.policy.admission.AdmissionConfig`.
    """
    from router.policy.admission import AdmissionConfig

    p, C, u = profile, float(context_tokens), float(uncached_prompt_tokens)
    base = p.a + p.b * u + p.c * u * u + short_output_tokens * (p.a + p.d * C + p.e)
    n = max(1.0, min(float(p.max_num_seqs), p.kv_capacity_tokens(kv_cache_gb) / C))
    t_decode = p.a + p.d * n * C + p.e * n
    return AdmissionConfig.model_validate(
        {
            "slo_short_step_s": slo_short_step_s,
            "decode_s_per_token": t_decode,
            "replica_slots": max(1, int(n)),
            "prefill_s_per_token": p.b,
            "ttft_base_s": p.a,
            "base_short_step_s": base,
            "replica_tokens_per_s": n / t_decode,
            "prefill_weight": p.b * n / t_decode,
            **overrides,
        }
    )
