"""A simulated local vLLM replica: continuous batching, chunked prefill, a block-hash prefix cache.

Algorithm (one replica):

- **Iterations.** An idle replica starts an iteration when a request arrives (after any other
  arrivals of the same instant, so they batch; at once, without an event, when the caller says the
  arrival is its handler's last act and no other event of that instant is pending: ``submit(last=True)``). Each iteration takes every decoding request (1 token
  each), then prefill chunks of the admitted requests still prefilling, then admits waiting requests
  first-come-first-served, while the chunked-prefill ``token_budget`` and ``max_num_seqs`` allow and
  the KV cache has room. Its time is the profile's ``a + b*sum(l) + c*sum(l*(s+l)) + d*sum(ctx) +
  e*batch`` (``l`` a prefill chunk, ``s`` the tokens of that request already in KV, ``ctx`` = prompt
  + generated tokens of a decoding request). The iteration that completes a request's prefill also
  emits its first token (TTFT).
- **Fast-forward.** While the batch is decode-only, its composition cannot change until a request
  finishes or a new one arrives, and iteration j takes ``A + d*n*j`` (``A = a + e*n + d*sum ctx``).
  The replica therefore schedules one event for the ``k`` iterations up to the next completion:
  ``T(k) = k*A + d*n*k*(k-1)/2``. An arrival in between shortens it to the iteration boundary at or
  after the arrival (a stale event is ignored through a generation counter). Results are identical
  to stepping every iteration; the event count per request is ~(prefill chunks + 2).
- **KV cache and prefix cache** (:mod:`router.core.prefix_cache`, the model the fake vLLM and
  training's replay use too). KV capacity is counted in blocks of ``block_tokens``. A request
  reserves blocks for prompt + output at admission (``n_blocks``, at most the capacity; no
  preemption; it waits while they do not fit). Its first ``n_blocks`` ``chain`` blocks (block-hash
  ids) are hashed: the leading ones already cached are hits (``cached`` tokens: whole blocks among
  its ``n_lookup`` prompt blocks, at most prompt - 1 tokens, as vLLM always computes the last prompt
  token) and are referenced, not re-allocated; the rest are private. When a request finishes, its
  hashed blocks stay cached unreferenced in an LRU list (tail blocks first, so a prefix outlives its
  suffix) and are evicted only when an admission needs room; private blocks are freed at once.
  ``inserted`` counts the hashed blocks ever newly written (``local_cache_pressure`` is its growth
  since a run's previous step / ``capacity``, ``router.core.prefix_cache.turnover``); ``wipes``
  counts cache losses (scale-to-zero). A request that failed admission is retried only after a
  release (nothing else makes room).
- **Scale-to-zero.** With ``scale_to_zero`` a replica starts off; a request for an off replica starts a
  wake (uniform ``wake_s``; a cold start) and waits for it; an idle reaper turns the replica off after
  ``idle_reap_s`` without work (its cache is lost). GPU time is billed while waking or on.

- **Lower KV tiers** (``tiers``, :mod:`router.sim.kvtier`): blocks the GPU cache evicts are demoted
  to a CPU (and SSD) tier; at admission the blocks after the GPU hit that a tier holds are loaded
  instead of prefilled (``cached`` counts them; ``tier_t`` splits them per tier) and the admitting
  iteration lasts the load time longer.
- **Speculative decoding** (``spec``, :mod:`router.sim.specdec`): a request may emit ``grow`` tokens
  per decode iteration (expected accepted drafts + 1) and verify ``vt`` draft tokens in it;
  ``it_target`` = 1 + ceil((output - 1) / grow) iterations finish it. A decode iteration then costs
  ``a + e*n + d*sum(ctx) + b*sum(vt) + draft_s + draft_tok_s*sum(vt)`` with ``ctx`` growing by ``grow`` per iteration
  (the fast-forward uses ``d*sum(grow)`` for ``d*n``). Off, ``grow = 1``, ``vt = 0``: the formulas
  above, bit for bit.
- **Roles** (``role``, for :mod:`router.sim.disagg`): ``both`` (the default, chunked-prefill
  co-location); ``prefill`` (requests come with ``it_target = 1``: prefill, first token, release);
  ``decode`` (requests arrive prefilled, their KV transferred: blocks are reserved unhashed and
  they decode from the next iteration on).

- **Decode bookkeeping.** Every decoding request emits one token per iteration, so the replica keeps
  one counter ``tick`` (decode iterations so far) and a request's ``decoded`` is ``tick - base``
  (``base`` set when it starts decoding), the decoding requests' summed context is
  ``sum(prompt - base) + n * tick`` (integers, exact; with speculative decoding the float sum is
  still taken request by request, in running order), and the requests that finish at a tick come off
  a heap keyed by ``base + it_target``, reordered by admission (the running order). An iteration
  touches only the requests still prefilling and those that finish: no pass over the whole batch.
  Results are bit-identical to incrementing every request (``bench/sim_digest.py``).
- **Change list** (``watch``): a replica whose router-visible state (running, waiting, KV usage, on/off)
  may have changed appends itself once to ``watch`` (a list the simulator owns and clears), so the
  simulator rebuilds only those replicas' backend states per step, not all of them.

Knobs (constructor): ``profile`` (coefficients and limits), ``kv_capacity_blocks``, ``block_tokens``,
``scale_to_zero``, ``wake_s`` (low, high seconds), ``idle_reap_s`` (None = never), ``fast_forward``
(False steps every decode iteration as its own event: the reference the fast path is tested against),
``tiers`` (a :class:`~router.sim.kvtier.TierStack` or None), ``spec`` (True when requests may carry
speculative-decoding rates), ``draft_s`` (draft cost per decode iteration, seconds),
``draft_s_per_token`` (a draft model's seconds per proposed token), ``role``, ``forest`` (every
request's chain is a path of one forest, :func:`router.core.prefix_cache.chains_form_forest`: the
cache is a :class:`~router.core.prefix_cache.ForestPrefixCache`, the same model by less work).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from router.core.prefix_cache import Chain, ForestPrefixCache, PrefixCache
from router.sim.engine import EventLoop
from router.sim.kvtier import TierStack
from router.sim.profiles import NodeProfile

__all__ = ["Request", "Replica"]


_SEQ = attrgetter("seq")  # a request's admission order (the sort key of the requests due at a tick)


class Request:
    """One step sent to a local replica. ``key`` is the caller's handle (returned in the callback)."""

    __slots__ = (
        "key",
        "prompt",
        "gen_target",
        "chain",
        "n_lookup",
        "n_blocks",
        "arrival",
        "cached",
        "prefilled",
        "decoded",
        "base",
        "seq",
        "first_token_t",
        "end_t",
        "n_private",
        "n_hashed",
        "chunk",
        "it_target",
        "grow",
        "c0",
        "vt",
        "tier_t",
        "load_s",
        "room_needed",
    )

    def __init__(
        self,
        key: Any,
        prompt: int,
        completion: int,
        chain: tuple[int, ...] | list[int],
        n_lookup: int,
        arrival: float,
        block_tokens: int,
    ):
        self.key = key
        self.renew(prompt, completion, chain, n_lookup, arrival, block_tokens)

    def renew(
        self,
        prompt: int,
        completion: int,
        chain: tuple[int, ...] | list[int],
        n_lookup: int,
        arrival: float,
        block_tokens: int,
    ) -> None:
        """Make this the request of a new step (same ``key``), every other field as constructed: the
        simulator reuses one request per run (its steps run one at a time; a finished request is in
        no replica's queues, and a method call costs less than a class call in CPython 3.11)."""
        self.prompt = prompt if prompt > 0 else 1
        self.gen_target = completion if completion > 0 else 1
        self.chain = chain  # hashed (cacheable) block ids, leading blocks first
        self.n_lookup = n_lookup  # leading chain blocks that lie inside the prompt
        self.n_blocks = -(-(prompt + self.gen_target) // block_tokens)
        self.arrival = arrival
        self.cached = 0
        self.prefilled = 0
        self.decoded = 0  # iterations emitted; while decoding on a replica: its tick - base
        self.base = 0
        self.seq = 0  # admission order on its replica (the order of its running requests)
        self.first_token_t = -1.0
        self.end_t = -1.0
        self.n_private = 0
        self.n_hashed = 0
        self.chunk = 0  # prefill tokens scheduled in the iteration in flight
        self.it_target = self.gen_target  # iterations to finish (speculative decoding: fewer)
        self.grow: float = 1.0  # tokens emitted per decode iteration
        self.c0: float = float(self.prompt)  # context after ``decoded`` iterations = c0 + decoded * grow
        self.vt: float = 0.0  # draft tokens verified per decode iteration
        self.tier_t: list[int] | None = None  # tokens loaded from each lower KV tier
        self.load_s = 0.0  # seconds of that load (added to the admitting iteration)
        self.room_needed = 0  # after a refusal: free + evictable blocks needed before a retry can fit


class Replica:
    """One simulated vLLM replica driven by an :class:`~router.sim.engine.EventLoop`."""

    def __init__(
        self,
        name: str,
        profile: NodeProfile,
        loop: EventLoop,
        kv_capacity_blocks: int,
        block_tokens: int,
        on_done: Callable[[Request], None],
        *,
        scale_to_zero: bool = False,
        wake_s: tuple[float, float] = (267.0, 282.0),
        idle_reap_s: float | None = 1800.0,
        fast_forward: bool = True,
        tiers: TierStack | None = None,
        spec: bool = False,
        draft_s: float = 0.0,
        draft_s_per_token: float = 0.0,
        role: str = "both",
        forest: bool = False,
    ):
        if kv_capacity_blocks < 2:
            raise ValueError(f"{name}: KV capacity of {kv_capacity_blocks} block(s) is too small")
        self.name = name
        self.p = profile
        self.loop = loop
        self.capacity = kv_capacity_blocks
        self.block_tokens = block_tokens
        self.on_done = on_done
        self.scale_to_zero = scale_to_zero
        self.wake_s = wake_s
        self.idle_reap_s = idle_reap_s if scale_to_zero else None
        self.fast_forward = fast_forward
        if role not in ("both", "prefill", "decode"):
            raise ValueError(f"{name}: role must be both, prefill or decode, got {role!r}")
        self.role = role
        self.spec = spec
        self.draft_s = draft_s if spec else 0.0
        self.draft_tok_s = draft_s_per_token if spec else 0.0
        self.tiers = tiers
        self.waiting: deque[Request] = deque()
        # admitted requests in admission order (a dict: O(1) removal), those still prefilling in the
        # same order, and the decoding ones by the tick they finish at (see "Decode bookkeeping")
        self.running: dict[Request, None] = {}
        self.prefilling: list[Request] = []
        self._fin: list[tuple[int, int, Request]] = []  # (base + it_target, seq, request), a heap
        self.tick = 0
        self._n_dec = 0
        self._dec_s = 0  # sum over decoding requests of prompt - base (their context = it + n x tick)
        self._adm = 0
        # prompt tokens still to prefill (waiting requests whole, running ones' remainders), kept
        # incrementally: the router-visible prefill queue (simulator.prefill_owed is its definition)
        self.owed = 0
        # KV blocks and the prefix cache; over forest chains the same model by delta work
        self.kv = (ForestPrefixCache if forest else PrefixCache)(kv_capacity_blocks, block_tokens)
        if tiers is not None:
            self.kv.spill = []  # GPU evictions, demoted to the tiers after each admission
        # views of ``kv`` that router.sim.whatif reads per step, bound once (kv never rebinds them):
        # lookup(chain, n_lookup) = leading blocks of chain[:n_lookup] cached (no side effects);
        # cache = cached block id -> reference count (a forest cache's: holders, zero exactly when the
        # count is); lru = unreferenced blocks, least recently freed first
        self.lookup: Callable[[Chain, int], int] = self.kv.lookup
        self.cache: dict[int, int] = self.kv.ref
        self.lru: OrderedDict[int, None] = self.kv.lru
        self.busy = False
        self.gen = 0
        # decode-only epoch in flight: start time, iterations, A, d*n
        self._ep: tuple[float, int, float, float] | None = None
        self.state = "off" if scale_to_zero else "on"
        self.on_since = 0.0
        self.billed_s = 0.0
        self.cold_starts = 0
        self.wake_until = 0.0
        self._reap_gen = 0
        self.iterations = 0
        self._releases = 0  # KV releases so far (a failed admission is retried only after one)
        self.watch: list[Replica] | None = None  # the simulator's change list (module docstring)
        self.marked = False  # already on ``watch`` since the simulator last read it
        self._end_chunk_h = self._end_chunk  # bound once: scheduled at every iteration
        # admissions take _try_admit's path without lower tiers or KV transfer inline (_start)
        self._plain_admit = tiers is None and role != "decode"
        self._end_epoch_h = self._end_epoch

    def _touch(self) -> None:
        if not self.marked and self.watch is not None:
            self.marked = True
            self.watch.append(self)

    # ------------------------------------------------------------------ observation (router's view)
    def kv_usage(self) -> float:
        return self.kv.kv_usage()

    @property
    def used(self) -> int:
        """Blocks occupied (cached, referenced or not, + private)."""
        return self.kv.occupied

    @property
    def inserted(self) -> int:
        """Hashed blocks newly written into the prefix cache so far."""
        return self.kv.inserted

    @property
    def wipes(self) -> int:
        """Times the whole cache was lost (scale-to-zero reaps)."""
        return self.kv.wipes

    def wake_remaining(self, t: float) -> float:
        if self.state == "on":
            return 0.0
        if self.state == "waking":
            return max(0.0, self.wake_until - t)
        return (self.wake_s[0] + self.wake_s[1]) / 2

    def fits(self, prompt: int) -> bool:
        return -(-prompt // self.block_tokens) + 1 <= self.capacity

    # ------------------------------------------------------------------ arrivals
    def submit(self, req: Request, last: bool = False) -> bool:
        """Queue a request; False if its prompt can never fit this replica's KV cache.

        ``last``: the caller's event handler submits nothing more and schedules nothing at this
        instant after this call. An idle replica then starts its iteration at once when no other
        event of this instant is pending, instead of by an event after them: the same iteration
        (nothing else can join its batch), one event fewer."""
        if -(-req.prompt // self.block_tokens) + 1 > self.capacity:  # not self.fits(req.prompt)
            return False
        t = self.loop.now
        self.waiting.append(req)
        self.owed += req.prompt
        if not self.marked and self.watch is not None:  # self._touch()
            self.marked = True
            self.watch.append(self)
        self._reap_gen += 1
        if self.state == "off":
            self.state = "waking"
            self.cold_starts += 1
            self.on_since = t
            lo, hi = self.wake_s
            self.wake_until = t + self.loop.rng.uniform(lo, hi)
            self.loop.schedule(self.wake_until, self._woken, None)
            return True
        if self.state == "waking":
            return True
        if not self.busy:
            if last and self.loop.quiet_after(t):  # nothing else happens at this instant: start now
                self._start(t)
                return True
            # start at this instant but after every other arrival of the same instant (they batch)
            self.busy = True
            self.gen += 1
            self.loop.schedule(t, self._kick, self.gen)
        elif self._ep is not None:
            self._shorten(t)
        return True

    def _kick(self, gen: int) -> None:
        if gen == self.gen:
            self._start(self.loop.now)

    def _woken(self, _: object) -> None:
        self.state = "on"
        self._touch()
        if not self.busy:
            self._start(self.loop.now)

    def _shorten(self, t: float) -> None:
        t0, k, a_term, dn = self._ep  # type: ignore[misc]
        x = t - t0
        if dn > 0:
            q = dn / 2
            bq = a_term - q
            k1 = math.ceil((-bq + math.sqrt(bq * bq + 4 * q * x)) / (2 * q))
        else:
            k1 = math.ceil(x / a_term)
        k1 = max(1, k1)
        # T(j) = j * a_term + dn * j * (j - 1) / 2, written out (no closure per call)
        while k1 > 1:
            j = k1 - 1
            if j * a_term + dn * j * (j - 1) / 2 < x:
                break
            k1 = j
        while k1 * a_term + dn * k1 * (k1 - 1) / 2 < x:
            k1 += 1
        if k1 < k:
            self.gen += 1
            self._ep = (t0, k1, a_term, dn)
            self.loop.schedule(t0 + (k1 * a_term + dn * k1 * (k1 - 1) / 2), self._end_epoch_h, self.gen)

    # ------------------------------------------------------------------ KV cache
    def _try_admit(self, req: Request) -> bool:
        # Only a release can make room, so a request that failed since the last release fails again.
        if req.n_private == -self._releases - 1:
            return False
        kv = self.kv
        room = kv.capacity - kv.occupied + len(kv.lru)
        if room < req.room_needed:  # only releases happened since it was refused: still short
            return False
        n_blocks = req.n_blocks if req.n_blocks < self.capacity else self.capacity
        if self.role == "decode":  # the KV arrives by transfer: reserve it unhashed, keep prefilled
            if kv.admit((), 0, req.prompt, n_blocks) < 0:
                req.n_private = -self._releases - 1
                req.room_needed = room + kv.shortfall
                return False
            req.n_private, req.n_hashed = n_blocks, 0
            return True
        chain = req.chain
        hit = kv.admit(chain, req.n_lookup, req.prompt, n_blocks)
        if hit < 0:
            req.n_private = -self._releases - 1  # remember the failure (reset on success below)
            req.room_needed = room + kv.shortfall
            return False
        n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
        req.n_private = n_blocks - n_hashed
        req.n_hashed = n_hashed
        B = self.block_tokens
        tiers = self.tiers
        if tiers is not None:
            spill = self.kv.spill
            if spill:
                tiers.demote(spill)
                spill.clear()
            lim = (req.prompt - 1) // B
            if req.n_lookup < lim:
                lim = req.n_lookup
            if hit < lim:
                got, secs = tiers.extend(chain, hit, lim)
                ext = sum(got)
                if ext:
                    req.tier_t = [g * B for g in got]
                    req.load_s = secs
                    hit += ext
        req.cached = req.prefilled = hit * B
        return True

    def _release(self, req: Request) -> None:
        self._releases += 1
        self.kv.release(req.chain, req.n_hashed, req.n_private)

    # ------------------------------------------------------------------ iterations
    def _start(self, t: float) -> None:
        if not self.marked and self.watch is not None:  # self._touch()
            self.marked = True
            self.watch.append(self)
        p = self.p
        spec = self.spec
        if not self.prefilling and not self.waiting:
            n_dec = self._n_dec
            if n_dec and not spec:
                # decode only (the common case between arrivals): every running request decodes,
                # nothing is admitted or prefilled; the epoch below, without the general pass's set-up
                tick = self.tick
                self.busy = True
                self.gen += 1
                k = self._fin[0][0] - tick if self.fast_forward else 1
                a_term = p.a + p.e * n_dec + p.d * (self._dec_s + n_dec * tick)
                self._open_epoch(t, k, a_term, p.d * n_dec)
                return
            if not n_dec:  # nothing running or waiting: idle, without the general pass's set-up
                self._idle(t)
                return
        budget = p.token_budget
        running = self.running
        tick = self.tick
        n_dec = self._n_dec
        grow: float = 0.0  # context growth per iteration of the decoding requests (spec only)
        vt: float = 0.0  # draft tokens verified per iteration (spec only)
        n_chunks = 0
        pt = 0
        quad = 0
        load = 0.0
        if spec:  # float sums: in running order, as they always were
            ctx: float = 0.0
            for r in running:
                if r.prefilled >= r.prompt:
                    ctx += r.c0 + (tick - r.base) * r.grow
                    grow += r.grow
                    vt += r.vt
            budget -= int(vt)
        else:  # integers: prompt + decoded summed over the decoding requests
            ctx = float(self._dec_s + n_dec * tick)
        budget -= n_dec
        for r in self.prefilling:
            if budget <= 0:
                break
            rem = r.prompt - r.prefilled
            ln = rem if rem < budget else budget
            r.chunk = ln
            n_chunks += 1
            pt += ln
            quad += ln * (r.prefilled + ln)
            budget -= ln
        waiting = self.waiting
        plain = self._plain_admit
        while waiting and budget > 0 and len(running) < p.max_num_seqs:
            r = waiting[0]
            if not plain:
                if not self._try_admit(r):
                    break
            else:  # self._try_admit(r), inline: its path without lower tiers on a "both"/"prefill" replica
                if r.n_private == -self._releases - 1:  # refused since the last release: again
                    break
                kv = self.kv
                room = kv.capacity - kv.occupied + len(kv.lru)
                if room < r.room_needed:
                    break
                n_blocks = r.n_blocks if r.n_blocks < self.capacity else self.capacity
                chain = r.chain
                hit = kv.admit(chain, r.n_lookup, r.prompt, n_blocks)
                if hit < 0:
                    r.n_private = -self._releases - 1
                    r.room_needed = room + kv.shortfall
                    break
                n_hashed = len(chain) if len(chain) < n_blocks else n_blocks
                r.n_private = n_blocks - n_hashed
                r.n_hashed = n_hashed
                r.cached = r.prefilled = hit * self.block_tokens
            waiting.popleft()
            running[r] = None
            self._adm += 1
            r.seq = self._adm
            rem = r.prompt - r.prefilled
            self.owed -= r.prompt if rem <= 0 else r.prompt - rem
            if rem <= 0:  # arrived prefilled (a decode-role replica): decodes in this iteration
                n_dec += 1
                ctx += r.c0 + r.decoded * r.grow
                grow += r.grow
                vt += r.vt
                budget -= 1
                self._decoding(r, tick - r.decoded)
                continue
            self.prefilling.append(r)
            if r.load_s:
                load += r.load_s
            ln = rem if rem < budget else budget
            r.chunk = ln
            n_chunks += 1
            pt += ln
            quad += ln * (r.prefilled + ln)
            budget -= ln
        if not n_chunks and not n_dec:
            self._idle(t)
            return
        self.busy = True
        self.gen += 1
        if n_chunks or n_dec < len(running):  # prefill work (or prefills starved of budget: step one)
            dt = p.a + p.b * pt + p.c * quad + p.d * ctx + p.e * (n_dec + n_chunks) + load
            if spec and n_dec:
                dt += p.b * vt + self.draft_s
                if self.draft_tok_s:
                    dt += self.draft_tok_s * vt
            self._ep = None
            loop = self.loop  # loop.schedule(t + dt, self._end_chunk, self.gen), inline (t is now)
            loop._seq += 1
            te = t + dt
            heapq.heappush(loop._heap, (te if te >= t else t, loop._seq, self._end_chunk_h, self.gen))
            return
        k = self._fin[0][0] - tick if self.fast_forward else 1
        a_term = p.a + p.e * n_dec + p.d * ctx
        if spec:
            a_term += p.b * vt + self.draft_s
            if self.draft_tok_s:
                a_term += self.draft_tok_s * vt
            dn = p.d * grow
        else:
            dn = p.d * n_dec
        self._open_epoch(t, k, a_term, dn)

    def _idle(self, t: float) -> None:
        """Nothing to run from ``t``: the replica waits for an arrival (or its idle reaper)."""
        self.busy = False
        self._ep = None
        if self.idle_reap_s is not None and self.state == "on":
            self.loop.schedule(t + self.idle_reap_s, self._reap, self._reap_gen)

    def _open_epoch(self, t: float, k: int, a_term: float, dn: float) -> None:
        """An epoch of ``k`` iterations from ``t`` (iteration i takes ``a_term + dn * i``), and its
        end event on the loop's heap (pushed directly: one heap entry, no schedule frame)."""
        self._ep = (t, k, a_term, dn)
        loop = self.loop
        loop._seq += 1
        te = t + k * a_term + dn * k * (k - 1) / 2
        heapq.heappush(loop._heap, (te if te >= t else t, loop._seq, self._end_epoch_h, self.gen))

    def _decoding(self, r: Request, base: int) -> None:
        """``r`` decodes from now on: ``decoded`` = tick - ``base`` (decode bookkeeping)."""
        r.base = base
        self._n_dec += 1
        self._dec_s += r.prompt - base
        heapq.heappush(self._fin, (base + r.it_target, r.seq, r))

    def _end_chunk(self, gen: int) -> None:
        if gen != self.gen:  # pragma: no cover - chunk iterations are never shortened
            return
        self.iterations += 1
        t = self.loop.now
        tick = self.tick = self.tick + 1  # every decoding request emitted one more token
        still: list[Request] = []
        owed = self.owed
        for r in self.prefilling:
            ln = r.chunk
            if ln:
                r.chunk = 0
                r.prefilled += ln
                owed -= ln
                if r.prefilled >= r.prompt:
                    r.decoded = 1
                    r.first_token_t = t
                    base = r.base = tick - 1  # self._decoding(r, tick - 1)
                    self._n_dec += 1
                    self._dec_s += r.prompt - base
                    heapq.heappush(self._fin, (base + r.it_target, r.seq, r))
                    continue
            still.append(r)
        self.owed = owed
        self.prefilling = still
        fin = self._fin
        if fin and fin[0][0] <= tick:
            self._finish(self._pop_due(fin, tick), t)
        else:
            self._start(t)

    def _pop_due(self, fin: list[tuple[int, int, Request]], tick: int) -> list[Request]:
        """The decoding requests whose ``decoded`` reached ``it_target`` at ``tick``, in running
        (admission) order, taken off the decode bookkeeping (``fin`` holds at least one)."""
        done: list[Request] = []
        n_dec, dec_s = self._n_dec, self._dec_s
        while fin and fin[0][0] <= tick:
            r = heapq.heappop(fin)[2]
            r.decoded = tick - r.base
            n_dec -= 1
            dec_s -= r.prompt - r.base
            done.append(r)
        self._n_dec, self._dec_s = n_dec, dec_s
        if len(done) > 1:
            done.sort(key=_SEQ)
        return done

    def _end_epoch(self, gen: int) -> None:
        if gen != self.gen:
            return
        t = self.loop.now
        _, k, _, _ = self._ep  # type: ignore[misc]
        self.iterations += k
        tick = self.tick = self.tick + k  # every running request is decoding in an epoch
        self._ep = None
        fin = self._fin
        if fin and fin[0][0] <= tick:
            self._finish(self._pop_due(fin, tick), t)
        else:  # a shortened epoch (an arrival came): it ends before any request finishes
            self._start(t)

    def _finish(self, done: list[Request], t: float) -> None:
        if done:
            running = self.running
            kv = self.kv
            for r in done:
                r.end_t = t
                self._releases += 1  # self._release(r)
                kv.release(r.chain, r.n_hashed, r.n_private)
                del running[r]
        self._start(t)
        for r in done:
            self.on_done(r)

    # ------------------------------------------------------------------ scale-to-zero
    def _reap(self, gen: int) -> None:
        if gen != self._reap_gen or self.busy or self.waiting or self.state != "on":
            return
        t = self.loop.now
        self._touch()
        self.billed_s += t - self.on_since
        self.state = "off"
        self._releases += 1
        self.kv.wipe()
        if self.tiers is not None:
            self.tiers.wipe()

    def finalize(self, t_end: float) -> None:
        """Close the billing period at ``t_end`` (call once at the end of a simulation)."""
        if self.state != "off":
            self.billed_s += max(0.0, t_end - self.on_since)
            self.on_since = t_end
