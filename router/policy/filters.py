"""Filter -> score -> pick: the backend-placement helpers every policy shares.

Algorithm (pure, allocation-light; runs on every step of every run):

1. **Filter** the snapshot's backends to the wanted tier, ``healthy`` and ``max_context >=
   context_tokens`` (:func:`candidates`).
2. **Keep the pin**: if the run is already pinned to a backend of that tier and it passed the filter,
   keep it (the run's prefix cache lives there). Policies without run affinity pass ``sticky=False``.
3. **Score** each candidate with normalised terms in [0, 1] (:func:`load_score`)::

       score = w_warm * warm - w_queue * queue - w_running * running - w_kv * kv

   - ``warm``    = min(1, warm_prefix_tokens / context_tokens)  (this run's prefix already cached)
   - ``queue``   = waiting / (waiting + queue_half)              (saturating, 0.5 at ``queue_half``)
   - ``running`` = running / (running + running_half)
   - ``kv``      = kv_usage clipped to [0, 1]
   **Prefix-cost mode** (``load_tokens > 0``; :func:`prefix_cost_pick`, the anchors' cost form:
   Dynamo's KV router, SGLang's cache-aware policy): instead of the score, each candidate costs
   ``(context_tokens - warm_prefix_tokens) + queue_tokens * prefill_queue_tokens + load_tokens *
   (running + waiting)``: the prefill tokens the replica would still compute for this step after the prefix it
   holds (``warm_prefix_tokens``, from the prefix index: this run's and every other run's chains),
   the prefill it still owes the requests already sent to it, and its request load in prefill-token
   equivalents; the cheapest wins. **Bounded imbalance**: when the candidates' loads drift apart
   (``max - min > balance_abs`` and ``max > balance_rel * min``) the least-loaded one wins
   instead (cost breaks ties), so a popular prefix cannot pile every run onto one replica.
   **Memory pressure** (``kv_tokens``, Dynamo's KV router weighs active blocks): each candidate also
   costs ``kv_tokens * kv_usage`` (the share of its KV held by running requests): a replica near
   capacity evicts the prefixes it holds to admit more, so a held prefix there is worth less.
   **Minimum gain** (``min_gain_tokens``): the *load-only pick* is the candidate cheapest without the
   held-prefix credit (owed prefill + load + pressure, the full cost breaking ties); when the
   cheapest candidate's cost is not at least ``min_gain_tokens`` below the load-only pick's, the
   load-only pick wins: a small saving does not move a step onto a busier replica.
   **Decode load** (``decode_tokens``): each candidate also costs ``decode_tokens *
   inflight_context_tokens`` (prompt + expected output of the requests in flight on it: the context
   every decode iteration there attends over, Dynamo's active blocks in tokens), so grouping runs
   on a replica for their shared prefix is weighed against the slower decode there; part of the
   load-only pick's cost too.
   **Bounded decode-load imbalance** (``balance_context_tokens``, in tokens rather than requests):
   before costing, a candidate whose ``inflight_context_tokens`` exceed the least one's by more
   than this is dropped (the least one always stays), so a prefix cannot pull a step onto a
   replica already attending over far more context than another.
4. **Pick** the highest score (the lowest cost); exact ties are broken by a rendezvous hash of (run id [+ salt],
   backend name), so different runs spread over equal replicas, the same run always lands on the
   same one, and removing a replica only moves the runs that were on it.
5. **Fall back** when the wanted tier has no candidate: the other tier (reason ``no-healthy-local`` /
   ``no-healthy-frontier``); then any healthy backend ignoring context fit, the largest context
   first (``context-too-long``: the upstream will answer with its own error); then, with nothing
   healthy, the pinned or first backend (``no-healthy-backend``: the caller answers 503). A pinned
   replica that dropped out of the filter while its tier is kept yields ``failover``.

Knobs (:class:`ScoreWeights`, built from the policy config's ``scoring`` block): ``warm``, ``queue``,
``running``, ``kv`` (term weights, >= 0), ``queue_half``, ``running_half`` (the counts at which the
saturating load terms reach 0.5); prefix-cost mode: ``load_tokens`` (prefill tokens one running or
waiting request on a replica is worth; 0 = off, the score above), ``queue_tokens`` (weight of the
prefill a replica still owes, per token), ``balance_abs`` (requests) and ``balance_rel`` (ratio),
the bounded-imbalance thresholds, ``kv_tokens`` (tokens a replica whose KV is all held by running
requests is worth; 0 = off), ``min_gain_tokens`` (0 = off), ``decode_tokens`` (prefill tokens one
in-flight context token is worth; 0 = off) and ``balance_context_tokens`` (0 = off; off in
``prefix-aware``: the runs of minutes 0-20 did not pick it, ``docs/prefix-index.md``). The ``prefix-aware`` policy's defaults (``load_tokens`` 512,
``queue_tokens`` 0.25, ``balance_abs`` 8, ``balance_rel`` 1.5) were chosen on the shipped first 20
minutes of the Mooncake conversation trace (16 a100 replicas x 50 GB KV); its ``kv_tokens`` 2000 and
``min_gain_tokens`` 1024 on the runs starting in those 20 minutes (4 deployments; ``decode_tokens``
is off: the value those runs picked did worse on the rest of the hour; the rule and the
figures, whole hour and minutes 20-60: ``docs/prefix-index.md``, ``bench/prefix_placement.py``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from router.policy.types import BackendState, Decision, Snapshot, Tier

__all__ = [
    "ScoreWeights",
    "DEFAULT_WEIGHTS",
    "stable_hash",
    "candidates",
    "load_score",
    "pick",
    "prefix_cost_pick",
    "place",
    "place_requested",
    "make_decision",
    "other_tier",
]


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Weights of the normalised replica-scoring terms (see the module docstring)."""

    warm: float = 1.0
    queue: float = 1.0
    running: float = 0.5
    kv: float = 0.5
    queue_half: float = 4.0
    running_half: float = 8.0
    load_tokens: float = 0.0  # > 0: prefix-cost mode (module docstring)
    queue_tokens: float = 0.25
    balance_abs: float = 8.0
    balance_rel: float = 1.5
    kv_tokens: float = 0.0  # prefix-cost mode: tokens a full KV (kv_usage 1) is worth; 0 = off
    min_gain_tokens: float = 0.0  # prefix-cost mode: smaller savings keep the load-only pick; 0 = off
    decode_tokens: float = 0.0  # prefix-cost mode: weight per in-flight context token (decode load); 0 = off
    balance_context_tokens: float = 0.0  # prefix-cost mode: in-flight context over the least; 0 = off


DEFAULT_WEIGHTS = ScoreWeights()


def stable_hash(key: str) -> int:
    """A process-independent 32-bit hash (``hash()`` of str is salted per process)."""
    return zlib.crc32(key.encode("utf-8"))


def other_tier(tier: Tier) -> Tier:
    return "frontier" if tier == "local" else "local"


def candidates(backends: list[BackendState], tier: Tier, context_tokens: int) -> list[BackendState]:
    """Backends of ``tier`` that are healthy and whose context fits ``context_tokens``."""
    return [b for b in backends if b.tier == tier and b.healthy and b.max_context >= context_tokens]


def load_score(b: BackendState, context_tokens: int, w: ScoreWeights) -> float:
    """Weighted sum of the normalised terms; higher is better."""
    if context_tokens > 0:
        warm = b.warm_prefix_tokens / context_tokens
        if warm > 1.0:
            warm = 1.0
    else:
        warm = 1.0 if b.warm_prefix_tokens > 0 else 0.0
    queue = b.waiting / (b.waiting + w.queue_half) if b.waiting > 0 else 0.0
    running = b.running / (b.running + w.running_half) if b.running > 0 else 0.0
    kv = min(max(b.kv_usage, 0.0), 1.0)
    return w.warm * warm - w.queue * queue - w.running * running - w.kv * kv


def pick(cands: list[BackendState], key: str, context_tokens: int, w: ScoreWeights) -> BackendState:
    """The best-scoring candidate; ties broken by rendezvous hash of (``key``, backend name)."""
    if len(cands) == 1:
        return cands[0]
    if w.load_tokens > 0:
        return prefix_cost_pick(cands, key, context_tokens, w)
    best = cands[0]
    best_score = load_score(best, context_tokens, w)
    best_h = stable_hash(f"{key}/{best.name}")
    for b in cands[1:]:
        s = load_score(b, context_tokens, w)
        if s > best_score:
            best, best_score, best_h = b, s, stable_hash(f"{key}/{b.name}")
        elif s == best_score:
            h = stable_hash(f"{key}/{b.name}")
            if h > best_h or (h == best_h and b.name < best.name):
                best, best_h = b, h
    return best


def prefix_cost_pick(
    cands: list[BackendState], key: str, context_tokens: int, w: ScoreWeights
) -> BackendState:
    """Prefix-cost mode (module docstring, 3): the cheapest candidate; the least-loaded one when
    loads drift beyond the bounded-imbalance thresholds; the load-only pick when the cheapest saves
    less than ``min_gain_tokens`` over it; ties by rendezvous hash."""
    bct = w.balance_context_tokens
    if bct > 0:  # bounded imbalance in decode load: drop candidates too far above the least
        limit = min(b.inflight_context_tokens for b in cands) + bct
        cands = [b for b in cands if b.inflight_context_tokens <= limit]
        if len(cands) == 1:
            return cands[0]
    loads = [b.running + b.waiting for b in cands]
    lo, hi = min(loads), max(loads)
    balance = hi - lo > w.balance_abs and hi > w.balance_rel * lo
    lt, qw, kt, mg, dw = w.load_tokens, w.queue_tokens, w.kv_tokens, w.min_gain_tokens, w.decode_tokens
    best = cands[0]
    best_key: tuple[float, float, int] | None = None
    plain = cands[0]  # the load-only pick (no held-prefix credit), for min_gain_tokens
    plain_key: tuple[float, float, int] | None = None
    plain_cost = 0.0
    for b, load in zip(cands, loads, strict=True):
        warm = b.warm_prefix_tokens if b.warm_prefix_tokens < context_tokens else context_tokens
        rest = qw * b.prefill_queue_tokens + lt * load
        if dw > 0:
            rest += dw * b.inflight_context_tokens
        if kt > 0:
            kv = b.kv_usage
            rest += kt * (0.0 if kv < 0.0 else 1.0 if kv > 1.0 else kv)
        cost = (context_tokens - warm) + rest
        h = -stable_hash(f"{key}/{b.name}")
        k = (float(load), cost, h) if balance else (cost, 0.0, h)
        if best_key is None or k < best_key:
            best, best_key = b, k
        if mg > 0 and (plain_key is None or (rest, cost, h) < plain_key):
            plain, plain_key, plain_cost = b, (rest, cost, h), cost
    if not balance and mg > 0 and best_key is not None and plain_cost - best_key[0] < mg:
        return plain
    return best


def place(
    snap: Snapshot, tier: Tier, w: ScoreWeights, *, sticky: bool = True, salt: str = ""
) -> tuple[BackendState | None, str | None]:
    """Choose a backend of ``tier`` for this step (filter, keep pin, score, pick, fall back).

    Returns ``(backend, fallback_reason)``; the reason is None when the wanted tier was served
    normally, else one of ``failover``, ``no-healthy-local``, ``no-healthy-frontier``,
    ``context-too-long``, ``no-healthy-backend``. The backend is None only for an empty list.
    """
    run = snap.run
    ctx = snap.context_tokens
    backends = snap.backends
    pinned = run.replica
    if sticky and pinned is not None and run.tier == tier:
        # the pin passes the filter: kept (step 2), the same answer as filtering every backend first
        for b in backends:
            if b.name == pinned and b.tier == tier and b.healthy and b.max_context >= ctx:
                return b, None
    cands = candidates(backends, tier, ctx)
    key = run.run_id + salt
    if cands:
        if run.tier == tier and run.replica is not None:
            for b in cands:
                if b.name == run.replica:
                    if sticky:
                        return b, None
                    break
            else:
                # the pinned replica is gone or unhealthy: the tier is kept, the replica moves
                return pick(cands, key, ctx, w), "failover"
        return pick(cands, key, ctx, w), None
    alt = other_tier(tier)
    alt_cands = candidates(backends, alt, ctx)
    if alt_cands:
        if run.tier == alt and run.replica is not None:
            for b in alt_cands:
                if b.name == run.replica:
                    return b, f"no-healthy-{tier}"
        return pick(alt_cands, key, ctx, w), f"no-healthy-{tier}"
    healthy = [b for b in backends if b.healthy]
    if healthy:
        return max(healthy, key=lambda b: (b.max_context, b.tier == tier)), "context-too-long"
    if not backends:
        return None, "no-healthy-backend"
    for b in backends:
        if b.name == run.replica:
            return b, "no-healthy-backend"
    return backends[0], "no-healthy-backend"


def place_requested(snap: Snapshot, w: ScoreWeights) -> BackendState | None:
    """A healthy backend serving ``snap.requested_model`` (the pin kept), or None.

    None (nobody healthy serves that model) lets the policy decide as if no model had been named;
    the caller sees ``Decision.model`` differ from the requested one.
    """
    model = snap.requested_model
    healthy = [b for b in snap.backends if b.model == model and b.healthy]
    if not healthy:
        return None
    for b in healthy:
        if b.name == snap.run.replica:
            return b
    return pick(healthy, snap.run.run_id, snap.context_tokens, w)


def make_decision(
    snap: Snapshot,
    backend: BackendState | None,
    reason: str,
    scores: dict[str, float] | None = None,
    tier: Tier = "local",
) -> Decision:
    """Wrap a placement into a :class:`Decision`; ``switched`` compares with the run's pin."""
    if backend is None:  # no backends at all: name nothing, the caller answers 503
        return Decision(tier=tier, backend="", model="", reason="no-healthy-backend", scores=scores or {})
    run = snap.run
    switched = run.tier is not None and (backend.tier != run.tier or backend.name != run.replica)
    # positional, in Decision's field order (a keyword call of a class builds a dict per call)
    return Decision(
        backend.tier,  # tier
        backend.name,  # backend
        backend.model,  # model
        reason,  # reason
        scores if scores is not None else {},  # scores
        switched,  # switched
    )
