"""The price of a step and its warm prefix, written once for the sidecar, the simulator, replay, the
fakes and evaluation.

Algorithm: a step on a token-priced backend (a frontier API) costs
``(fresh x price_in + cached x price_cached_in + written x price_cache_write + out x price_out) / 1e6``
USD, where ``cached`` prompt tokens are read from the provider's prompt cache, ``written`` prompt
tokens are written to it (Anthropic-style explicit caching; 0 where the provider does not bill
writes), and ``fresh = max(prompt - cached - written, 0)`` are the rest. A step on a local replica costs
the GPU time it holds: ``gpu_s / 3600 x gpus x gpu_hour_usd``. Both functions work on scalars and
on numpy arrays of steps (evaluation prices whole runs at once), with the same arithmetic.

Warm prefix (:class:`RunContext`, the prefix model of one run): how many of a step's prompt tokens
are already cached on the backend that serves it is the prefix this prompt shares with the context
the run left on *that* backend at its last step there (prompt + output), not "the previous step ran
on the same tier". Two kinds of evidence, one rule:

- **Token counts** (:meth:`RunContext.warm`): a step's ``reusable`` tokens are the prefix its prompt
  repeats from earlier context (:func:`reusable_tokens`: the logged ``prefix_reuse_tokens``, else
  the previous prompt + output, capped at the prompt; 0 at step 0). Arriving, the step caps
  what every backend holds of the run's context at ``reusable`` (past that point the conversation
  changed, so the cached context is no longer a prefix of this prompt); the serving backend's warm
  prefix is what it then holds. Served, the backend holds the step's prompt + output. So a run that
  went local -> frontier -> local finds on the local backend what step 0 left there, still a
  prefix of step 2's prompt: ``min(p0 + c0, reusable_1, reusable_2)``.
- **Block chains** (:meth:`RunContext.warm_chain`, a provider's prompt cache in the simulator): the
  leading blocks of the step's chain equal to the chain the run left on that backend (while it has
  not expired), in tokens, at most the prompt.

Either way a warm prefix shorter than the backend's ``min_tokens`` (a provider's minimum cacheable
prompt) is 0. A local replica's *shared* prefix cache (other runs' blocks included) is the prefix
index's (:mod:`router.core.prefix_index`); this is the run's own model, used where no index reads
the backend (the frontier, logs without block chains, evaluation by tier).

Knobs: none; the prices are the caller's (a backend's ``price_*_per_m`` fields, a simulator's
``gpu_hour_usd``, evaluation's ``Prices``), and so are ``min_tokens`` and an expiry (a provider's
cache TTL). Every consumer calls these functions; a second copy of the formula anywhere in the
tree is a bug (``tests/test_accounting.py`` greps for one).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np

from router.policy.types import BackendState

__all__ = ["token_usd", "backend_step_usd", "gpu_usd", "reusable_tokens", "RunContext", "warm_by_backend"]

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


# ------------------------------------------------------------------------------------ warm prefix


def reusable_tokens(step: int, prompt: int, logged_reuse: int | None, prev_context: int) -> int:
    """Prompt tokens of step ``step`` repeating earlier context (module docstring): the logged
    ``prefix_reuse_tokens`` when known (at step 0 that is a prefix shared with other runs, which
    only a shared cache such as the prefix index can hold), else ``prev_context`` (the previous
    step's prompt + output; 0 at step 0); at most ``prompt``."""
    if logged_reuse is not None:
        return max(0, min(logged_reuse, prompt))
    return 0 if step <= 0 else max(0, min(prev_context, prompt))


class RunContext:
    """The prefix model of one run: per backend, what of the run's context is cached there.

    See the module docstring for the rule. ``held`` (backend -> tokens of the run's current context
    cached there) is read-only for callers."""

    __slots__ = ("held", "_chains")

    def __init__(self) -> None:
        self.held: dict[Hashable, int] = {}
        self._chains: dict[Hashable, tuple[Sequence[int], int, float]] = {}

    def warm(self, backend: Hashable, prompt: int, reusable: int, min_tokens: int = 0) -> int:
        """A step arrives repeating ``reusable`` tokens of the previous context: cap what every
        backend holds at that, and return the prefix ``backend`` holds of the ``prompt``."""
        held = self.held
        for b, n in held.items():
            if n > reusable:
                held[b] = reusable
        w = min(held.get(backend, 0), prompt)
        return w if w >= min_tokens else 0

    def served(self, backend: Hashable, prompt: int, completion: int) -> None:
        """``backend`` served the step: it holds the step's prompt + output."""
        self.held[backend] = prompt + completion

    def warm_chain(
        self,
        backend: Hashable,
        chain: Sequence[int],
        n_lookup: int,
        prompt: int,
        block_tokens: int,
        now: float = 0.0,
        min_tokens: int = 0,
    ) -> int:
        """Leading blocks of ``chain[:n_lookup]`` equal to the chain the run left on ``backend``
        (0 once expired at ``now``), in tokens, at most ``prompt``; 0 under ``min_tokens``."""
        left = self._chains.get(backend)
        if left is None or now > left[2]:
            return 0
        prev, n_prev, _ = left
        n = 0
        lim = n_lookup if n_lookup < n_prev else n_prev
        while n < lim and chain[n] == prev[n]:
            n += 1
        tok = min(n * block_tokens, prompt)
        return tok if tok >= min_tokens else 0

    def served_chain(
        self, backend: Hashable, chain: Sequence[int], n_cacheable: int, until: float = math.inf
    ) -> None:
        """``backend`` served the step: it holds the first ``n_cacheable`` blocks of ``chain`` until
        ``until`` (a provider's cache TTL after the call; inf: no expiry)."""
        self._chains[backend] = (chain, n_cacheable, until)


def warm_by_backend(
    backends: Sequence[Hashable], prompt: Sequence[int], completion: Sequence[int], reusable: Sequence[int]
) -> list[int]:
    """Warm prefix of every step of one run served on ``backends`` (one per step; None: not served,
    which caches nothing), by the token-count rule of :class:`RunContext`."""
    ctx = RunContext()
    out = []
    for b, p, c, r in zip(backends, prompt, completion, reusable, strict=True):
        if b is None:
            ctx.warm(None, p, r)  # the step still arrived: its reuse still caps the held context
            out.append(0)
            continue
        out.append(ctx.warm(b, p, r))
        ctx.served(b, p, c)
    return out
