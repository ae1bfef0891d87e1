"""The price of a step, written once for the sidecar, the simulator, replay, the fakes and evaluation.

Algorithm: a step on a token-priced backend (a frontier API) costs
``(fresh x price_in + cached x price_cached_in + written x price_cache_write + out x price_out) / 1e6``
USD, where ``cached`` prompt tokens are read from the provider's prompt cache, ``written`` prompt
tokens are written to it (Anthropic-style explicit caching; 0 where the provider does not bill
writes), and ``fresh = max(prompt - cached - written, 0)`` are the rest. A step on a local replica costs
the GPU time it holds: ``gpu_s / 3600 x gpus x gpu_hour_usd``. Both functions work on scalars and
on numpy arrays of steps (evaluation prices whole runs at once), with the same arithmetic.

Knobs: none; the prices are the caller's (a backend's ``price_*_per_m`` fields, a simulator's
``gpu_hour_usd``, evaluation's ``Prices``). Every consumer calls these functions; a second copy of
the formula anywhere in the tree is a bug (``tests/test_accounting.py`` greps for one).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from router.policy.types import BackendState

__all__ = ["token_usd", "backend_step_usd", "gpu_usd"]

_N = TypeVar("_N", float, np.ndarray)


def token_usd(
    prompt: _N,
    cached: _N,
    completion: _N,
    *,
    price_in_per_m: float,
    price_cached_in_per_m: float,
    price_out_per_m: float,
    cache_write: _N | int = 0,
    price_cache_write_per_m: float = 0.0,
) -> _N:
    """USD of ``prompt`` tokens (``cached`` of them read from the prompt cache, ``cache_write``
    written to it) and ``completion`` output tokens at per-1M-token prices (module docstring)."""
    rest = prompt - cached - cache_write
    fresh = np.maximum(rest, 0) if isinstance(rest, np.ndarray) else max(rest, 0.0)
    return (
        fresh * price_in_per_m
        + cache_write * price_cache_write_per_m
        + cached * price_cached_in_per_m
        + completion * price_out_per_m
    ) / 1e6


def backend_step_usd(b: BackendState, prompt: int, cached: int, completion: int) -> float:
    """USD of one step on backend ``b`` at its token prices (0 for a local backend, which carries none)."""
    return token_usd(
        float(prompt),
        float(cached),
        float(completion),
        price_in_per_m=b.price_in_per_m,
        price_cached_in_per_m=b.price_cached_in_per_m,
        price_out_per_m=b.price_out_per_m,
    )


def gpu_usd(gpu_s: _N, gpu_hour_usd: float, gpus: int = 1) -> _N:
    """USD of holding ``gpus`` GPUs for ``gpu_s`` seconds at ``gpu_hour_usd`` per GPU-hour."""
    return gpu_s / 3600.0 * gpus * gpu_hour_usd
