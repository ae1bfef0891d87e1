"""The what-if simulator: closed-loop replay of logged runs through the router's own step engine.

Algorithm (one capacity point = one :class:`Simulator` run):

1. **Closed loop**: run starts follow the arrival process (:mod:`router.sim.arrivals`); step k+1
   of a run arrives when step k finished plus step k+1's logged tool pause.
2. **Per step**, the sidecar's sequence, by the same code (:class:`router.core.engine.StepEngine`):
   the step as a :class:`~router.core.record.StepRequest` (logged prompt tokens, tool results,
   tools offered, JSON wanted, the run's ``needs_frontier`` label for the oracle), one
   :class:`~router.policy.types.BackendState` per simulated replica from its live state (running,
   waiting, KV usage, remaining wake time added to its TTFT) and one for the frontier, then
   a :class:`~router.core.driver.StepTurn` of the engine (``engine.begin``): ``turn.plan`` (prefix,
   predict, snapshot, decide, admission), the slot claim on this simulation's counter,
   ``turn.commit``. The step carries its block chain, so the engine's
   prefix index (:mod:`router.core.prefix_index`, approximate mode at each replica's KV capacity)
   tells the policy which replica holds how much of the prompt, as in the sidecar. ``local_cache_pressure`` comes from the node model's
   prefix-cache counter (hashed blocks newly written, exact, with wipes as epochs).
3. The chosen local replica (:mod:`router.sim.node`) or the frontier (:mod:`router.sim.frontier`)
   serves the step; its completion calls ``turn.finish`` and schedules the run's next step. A
   rejected run's steps are all rejected; a spilled run is served by the frontier.
4. Each step ends exactly once as served-local, served-frontier, spilled or rejected (checked);
   :mod:`router.sim.scorecard` turns the per-step arrays into the scorecard.

Optional model elements (all off by default, configured on :class:`~router.sim.simconfig.SimConfig`):
lower KV tiers and KV formats change what the replicas cache (per-tier hits are kept per step),
speculative decoding changes each local request's decode iterations by its step kind (tool call
or free text), disaggregation routes local requests through a prefill pool, a KV link and a decode
pool (:mod:`router.sim.disagg`); the policy sees the same backend states either way.

Admission: ``admission`` is an :class:`~router.policy.admission.AdmissionController` (or its
:class:`~router.policy.admission.AdmissionConfig`); the simulation then runs the step engine's
:class:`~router.core.admission.AdmissionGate` over a :class:`~router.core.traffic.TrafficModel` on
the event clock, exactly as the sidecar does: the controller is asked only at a run's first step
whose decision is local, a slot is held from admission until the run ends.

Speed: while the event loop runs, the garbage collector's gen-0 threshold is raised to ``GC_GEN0``
(never lowered; restored after): the loop's per-event allocations otherwise trigger a collection
every few steps, each older-generation pass re-walking the workload and the per-run tracks. It
changes when cyclic garbage is freed, not what is simulated. The objects that exist when the loop
starts (the workload, the runs' tracks) are frozen out of the collector's sight (``gc.freeze``, undone
after; skipped when the caller has frozen objects itself), so an older-generation pass walks only what
the loop made: a full collection during a simulation no longer re-walks the workload (one cost 0.18 s
of a 2.9 s, 32-replica simulation).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np

from features.schema import Step
from models.predictor import ConstantPredictor, Predictor
from router.core.accounting import gpu_usd
from router.core.admission import AdmissionGate
from router.core.driver import FINISHED, PLANNED, StepTurn
from router.core.engine import StepEngine, StepPlan
from router.core.prefix_index import PrefixIndex
from router.core.record import StepRequest, StepResult
from router.core.runs import CacheReading, RunTrack
from router.core.traffic import TrafficModel
from router.policy.admission import AdmissionConfig, AdmissionController
from router.policy.types import BackendState, Policy, RunState
from router.sim.disagg import build_replicas
from router.sim.engine import EventLoop
from router.sim.frontier import Frontier
from router.sim.node import Replica, Request
from router.sim.scorecard import REJECTED, SERVED_FRONTIER, SERVED_LOCAL, SPILLED, SimResult
from router.sim.simconfig import SimConfig
from router.sim.workload import RunSpec, SimError, StepSpec, Workload

__all__ = ["Simulator"]

DEFAULT_DECODE_TOKENS = 64  # a step's expected output before its run has history (TrafficModel's)
GC_GEN0 = 20_000  # the collector's gen-0 threshold while the event loop runs (Simulator.run)


def prefill_owed(rep: Replica) -> int:
    """Prompt tokens ``rep`` still has to prefill for the requests sent to it (running ones'
    remainders, waiting ones whole): what the router knows of what it sent and has not yet seen a
    first token for (BackendState.prefill_queue_tokens). The definition, O(queue): the simulator reads
    the replica's incremental count (``Replica.owed``), which the tests check against this."""
    n = 0
    for r in rep.running:
        if r.prefilled < r.prompt:
            n += r.prompt - r.prefilled
    for r in rep.waiting:
        n += r.prompt
    return n


class _Run:
    __slots__ = (
        "idx",
        "spec",
        "state",
        "track",
        "k",
        "start_t",
        "g0",
        "status",
        "frontier_steps",
        "turn",
        "plan",
        "out_sum",
        "out_n",
        "context_charged",
        "req",
    )

    def __init__(self, idx: int, spec: RunSpec, g0: int):
        self.idx = idx
        self.spec = spec
        self.state = RunState(run_id=spec.run_id)
        self.track: RunTrack = RunTrack.new(spec.run_id, 0.0)
        self.track.domain, self.track.task_embedding = spec.domain, spec.task_embedding
        self.k = 0
        self.start_t = 0.0
        self.g0 = g0
        self.status = 0
        self.frontier_steps = 0
        self.turn: StepTurn | None = None
        self.plan: StepPlan | None = None  # the plan of the step in flight (turn.planned)
        self.out_sum = 0  # output tokens of the run's steps served so far (the router saw them)
        self.out_n = 0
        self.context_charged = 0  # the context charged to its replica for the step in flight
        self.req: Request | None = None  # its local request, renewed per step (Request.renew)


class Simulator:
    """One closed-loop replay of ``workload`` under ``policy`` at one capacity point.

    ``predictor``: a :class:`models.predictor.Predictor` (a ``ModelBundle``); default a constant
    (p_frontier 0). ``admission``: an ``AdmissionController`` / ``AdmissionConfig`` (module
    docstring) or None. ``starts``: run start times (seconds), one per run.
    """

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        config: SimConfig,
        starts: np.ndarray,
        *,
        predictor: Predictor | None = None,
        admission: AdmissionController | AdmissionConfig | None = None,
    ):
        if len(starts) != len(workload.runs):
            raise SimError(f"{len(starts)} start times for {len(workload.runs)} runs")
        if workload.block_tokens != config.block_tokens:
            raise SimError("workload and config disagree on block_tokens")
        self.workload = workload
        self.policy = policy
        self.cfg = config
        self.starts = np.asarray(starts, dtype=float)
        self.predictor: Predictor = predictor if predictor is not None else ConstantPredictor()
        self.loop = EventLoop(start=0.0, seed=config.seed)
        blocks = config.kv_blocks()
        self.replicas, self.all_replicas, self.disagg = build_replicas(
            config, self.loop, self._local_done, workload.forest_chains()
        )
        self.spec = config.spec
        self.by_name = {r.name: r for r in self.replicas}
        self.frontier = Frontier(config.frontier, self.loop.rng, config.block_tokens)
        cap = self.replicas[0].capacity if self.replicas else blocks  # x tp (router.sim.disagg.tp_profile)
        self.local_max_context = min(config.profile.max_context, cap * config.block_tokens)
        self.engine = self._engine(admission)
        n = workload.n_steps
        # per-step results, kept as lists while the loop runs (a list item is written several times
        # faster than a numpy element) and turned into the SimResult's arrays by run()
        self.outcome: list[int] = [0] * n
        self.latency: list[float] = [np.nan] * n
        self.ttft: list[float] = [np.nan] * n
        self.cached: list[int] = [0] * n
        n_tiers = len(self.replicas[0].tiers.tiers) if self.replicas and self.replicas[0].tiers else 0
        self.tier_cached = np.zeros((n_tiers, n), dtype=np.int64) if n_tiers else None
        self.records: list[Step] | None = [] if config.log_steps else None
        self._runs: list[_Run] = []
        g = 0
        for i, spec in enumerate(workload.runs):
            self._runs.append(_Run(i, spec, g))
            g += len(spec.steps)
        self.run_completion = np.full(len(workload.runs), np.nan)
        self.slots = 0  # admitted local runs holding a slot (the sidecar's store counter)
        self.unfit = 0  # runs rejected because a prompt can never fit one replica's KV cache
        self._runs_left = len(workload.runs)
        self._last_end = 0.0
        # per replica-hour: a replica of tensor-parallel degree T holds T x the profile's GPUs
        self._gpu_price = gpu_usd(3600.0, config.gpu_hour_usd, config.profile.gpus_per_replica * config.tp)
        self._B = config.block_tokens
        # backend states of the router's replicas, rebuilt per step only for replicas that changed
        self._changed: list[Replica] = []
        self._local_pos = {r.name: i for i, r in enumerate(self.replicas)}
        # per replica, the context of the steps in flight there (each charged its prompt + its run's
        # mean output so far, DEFAULT_DECODE_TOKENS before any; credited when it ends):
        # BackendState.inflight_context_tokens, as the sidecar's traffic model (ReplicaLoad)
        self._inflight_ctx = {r.name: 0 for r in self.replicas}
        self._local_cache = [self._local_state(r, 0.0) for r in self.replicas]
        for r in self.all_replicas:
            r.watch = self._changed
        self._keeps_pin = bool(getattr(policy, "keeps_local_pin", False))
        self._scrape = config.scrape
        self._stz = config.scale_to_zero
        # the frontier's backend state, one object reused while the loop runs (only its running
        # count and the warm prefix the engine sets change between steps); None outside the loop
        self._front: BackendState | None = None
        self._looping = False
        self._arrive_h = self._arrive  # bound once: scheduled at every step
        self._res = StepResult(status=200)  # a served step's result (_step_done sets its fields)

    def _engine(self, admission: AdmissionController | AdmissionConfig | None) -> StepEngine:
        B = self.cfg.block_tokens

        # per replica name: its cache (a replica never rebinds ``kv``), the counters of the latest
        # reading and that reading (unchanged counters: the same reading)
        memo: dict[str, list[Any]] = {}

        def reading(name: str) -> CacheReading | None:
            m = memo.get(name)
            if m is None:
                rep = self.by_name.get(name)
                if rep is None:
                    return None
                m = memo[name] = [rep.kv, -1, -1, None, rep.capacity * B]
            kv = m[0]
            if m[1] == kv.inserted and m[2] == kv.wipes:
                return m[3]  # type: ignore[no-any-return]
            r = CacheReading(kv.inserted * B, m[4], kv.wipes, False)  # lags: positional
            m[1], m[2], m[3] = kv.inserted, kv.wipes, r
            return r

        if not self.cfg.scrape:
            reading = None  # type: ignore[assignment]
        gate = None
        if admission is not None:
            ctrl = admission if isinstance(admission, AdmissionController) else AdmissionController(admission)
            clock = self._now
            traffic = TrafficModel(
                [r.name for r in self.replicas],
                prefill_weight=ctrl.cfg.work_prefill_weight,
                clock=clock,
                wall=clock,
            )
            gate = AdmissionGate(ctrl.cfg, traffic, budget_hook=ctrl.budget_hook)
            gate.controller = ctrl  # the caller's controller object (its hysteresis state)
        index = PrefixIndex(B, [(r.name, r.capacity) for r in self.replicas])
        return StepEngine(
            admission=gate,
            cache_reader=reading,
            prefix_index=index,
            max_steps=1 << 30,
            keep_features=self.cfg.log_steps,
            cache_lags=False,  # the node's counter is exact: it already holds a finished step's blocks
        )

    def _now(self) -> float:
        return self.loop.now

    # ------------------------------------------------------------------ state the policy sees
    def _local_state(self, rep: Replica, t: float) -> BackendState:
        prof = self.cfg.profile
        scrape = self.cfg.scrape
        # by keyword: positional arguments shifted when BackendState gained price_cache_write_per_m
        # (prof.b had landed in the cache-write price, prof.a in prefill_s_per_token, the GPU price in
        # ttft_base_s)
        return BackendState(
            name=rep.name,
            tier="local",
            model=self.cfg.local_model,
            healthy=True,
            max_context=self.local_max_context,
            running=len(rep.running) if scrape else len(rep.running) + len(rep.waiting),
            waiting=len(rep.waiting) if scrape else 0,
            kv_usage=(rep.kv.occupied - len(rep.lru)) / rep.capacity if scrape else 0.0,
            prefill_s_per_token=prof.b,
            ttft_base_s=prof.a if rep.state == "on" else prof.a + rep.wake_remaining(t),
            gpu_usd_per_hour=self._gpu_price,
            prefill_queue_tokens=rep.owed,
            inflight_context_tokens=self._inflight_ctx.get(rep.name, 0),
        )

    def _refresh(self, st: BackendState, rep: Replica, t: float) -> None:
        """Bring the cached state ``st`` of ``rep`` up to date in place: every field
        :meth:`_local_state` sets that can change (the others never do, in the simulator)."""
        if self._scrape:
            st.running = len(rep.running)
            st.waiting = len(rep.waiting)
            st.kv_usage = (rep.kv.occupied - len(rep.lru)) / rep.capacity
        else:
            st.running = len(rep.running) + len(rep.waiting)
        st.warm_prefix_tokens = 0
        a = self.cfg.profile.a
        st.ttft_base_s = a if rep.state == "on" else a + rep.wake_remaining(t)
        st.prefill_queue_tokens = rep.owed
        st.inflight_context_tokens = self._inflight_ctx.get(rep.name, 0)

    def _backends(self, run: _Run | None, t: float, pin: int | None = None) -> list[BackendState]:
        """The replicas' states (rebuilt only for replicas on the change list; every one when a wake
        is in progress, since its remaining wake time moves with the clock) and the frontier's.
        ``pin`` (a pinned step, see :meth:`_arrive`): only that replica's state, then the frontier's; the other
        replicas stay on the change list until a step reads them."""
        changed = self._changed
        if pin is not None:
            rep = self.replicas[pin]
            if self.cfg.scale_to_zero:
                out = [self._local_state(rep, t)]
            else:
                if rep.marked:  # read now: it stays on the list, skipped there unless marked again
                    rep.marked = False
                    self._refresh(self._local_cache[pin], rep, t)
                    if len(changed) > 4 * len(self.replicas) + 16:  # re-marked often: drop stale
                        changed[:] = [r for r in dict.fromkeys(changed) if r.marked]
                out = [self._local_cache[pin]]
        elif self.cfg.scale_to_zero:
            out = [self._local_state(rep, t) for rep in self.replicas]
        else:
            if changed:
                cache, pos = self._local_cache, self._local_pos
                for rep in changed:
                    if rep.marked:
                        rep.marked = False
                        i = pos.get(rep.name)
                        if i is not None:
                            self._refresh(cache[i], rep, t)
                changed.clear()
            out = self._local_cache.copy()
        fs = self._front
        if fs is None:
            fc = self.cfg.frontier
            fs = BackendState(
                name=fc.name,
                tier="frontier",
                model=fc.model,
                healthy=True,
                max_context=fc.max_context,
                price_in_per_m=fc.price_in_per_m,
                price_cached_in_per_m=fc.price_cached_in_per_m,
                price_out_per_m=fc.price_out_per_m,
                prefill_s_per_token=fc.prefill_s_per_token,
                ttft_base_s=fc.ttft_p50_s,
            )
            if self._looping:  # one object for the whole loop (set afresh per step, below)
                self._front = fs
        # what the engine may have set at the previous step is set afresh (as in a new state)
        fs.running = self.frontier.running(t)
        fs.warm_prefix_tokens = 0
        out.append(fs)
        return out

    # ------------------------------------------------------------------ events
    def _start_run(self, run: _Run) -> None:
        run.start_t = self.loop.now
        run.track.started_s = run.start_t
        self._arrive(run)

    def _arrive(self, run: _Run) -> None:
        t = self.loop.now
        s = run.spec.steps[run.k]
        eng = self.engine
        req = s.request  # built once per step of the workload (the engine does not mutate it)
        if req is None:
            # positional, in StepRequest's field order (keywords build and unpack a dict per call;
            # tests/test_sim_speed_equiv.py checks it against the keyword construction)
            req = s.request = StepRequest(
                s.prompt,  # prompt_tokens
                s.tool_results_n,  # tool_results_n
                s.errors,  # tool_result_errors
                s.result_tokens,  # tool_result_tokens
                s.n_tools,  # n_tools_offered
                s.wants_json,  # wants_json
                None,  # requested_model
                "interactive",  # priority
                None,  # tenant
                run.spec.needs_frontier,  # label_needs_frontier
                "chat",  # protocol
                False,  # estimated
                s.signals,  # signals
                s.chain,  # chain
                s.n_lookup,  # chain_lookup
            )
        state = run.state
        pin = state.replica
        turn = run.turn
        if turn is not None and turn.stage is FINISHED:  # the run's finished turn, reset
            turn.restart()  # (eng.begin(state, run.track, turn), without its checks: same run)
        else:
            turn = run.turn = eng.begin(state, run.track)
        # a step that needs only its run's local replica's state (and the frontier's): the policy
        # keeps a local pin (``keeps_local_pin``: placed there or on the frontier whatever the other
        # replicas' states), the replica passes the filter (healthy, the prompt fits its context)
        # and admission has already seen the run
        pin_i = None
        if (
            self._keeps_pin
            and req.requested_model is None
            and pin is not None
            and state.tier == "local"
            and s.prompt <= self.local_max_context
            and (state.admitted is not None or eng.admission is None)
        ):
            pin_i = self._local_pos.get(pin)
        fs = self._front
        if pin_i is not None and fs is not None and not self._stz:
            # self._backends(run, t, pin_i), inline: the pinned replica's cached state, the frontier's
            rep = self.replicas[pin_i]
            st = self._local_cache[pin_i]
            if rep.marked:  # read now: it stays on the list, skipped there unless marked again
                rep.marked = False
                self._refresh(st, rep, t)
                changed = self._changed
                if len(changed) > 4 * len(self.replicas) + 16:  # re-marked often: drop stale
                    changed[:] = [r for r in dict.fromkeys(changed) if r.marked]
            fs.running = self.frontier.running(t)
            fs.warm_prefix_tokens = 0
            backends = [st, fs]
        else:
            backends = self._backends(run, t, pin_i)
        plan = run.plan = turn.plan(
            req,
            backends,
            now=t,
            policy=self.policy,
            predictor=self.predictor,
            active_local_runs=self.slots,
        )
        # the engine marked the pinned replica's state warm for this run; the state object is the
        # cached one the next step sees: clear it once the step is committed (the commit reads it:
        # the prefix index's reading on the chosen replica, StepPlan.warm_tokens)
        warm_i = self._local_pos.get(pin) if pin is not None and not self._stz else None
        if (
            turn.stage is not PLANNED and turn.needs_claim
        ):  # a limited claim (a first local step), or a late-local run counted
            limit = plan.claim_limit
            ok = limit is None or self.slots < limit
            if ok:
                self.slots += 1
            turn.claim(ok)
        if turn.stage is not PLANNED and turn.rejected:
            if warm_i is not None:
                self._local_cache[warm_i].warm_prefix_tokens = 0
            run.status = 2
            self._reject_rest(run)
            return
        if plan.admission == "spill":
            run.status = 1
        dec = plan.decision
        if turn.commit() is None:
            raise SimError(
                f"policy {getattr(self.policy, 'name', self.policy)!r} chose backend {dec.backend!r}, "
                "which does not exist"
            )
        if warm_i is not None:
            self._local_cache[warm_i].warm_prefix_tokens = 0
        if dec.tier == "local":
            rep = self.by_name[dec.backend]
            req_ = run.req
            if req_ is None:
                req_ = run.req = Request(run, s.prompt, s.completion, s.chain, s.n_lookup, t, self._B)
            else:  # the run's previous step is done: its request is in no replica's queues
                req_.renew(s.prompt, s.completion, s.chain, s.n_lookup, t, self._B)
            if self.spec is not None:
                self.spec.apply(req_, bool(s.tool_calls))
            # last: nothing after this submission touches a replica or schedules an event
            if not (rep.submit(req_, True) if self.disagg is None else self.disagg.submit(rep, req_)):
                run.status = 2  # its prompt can never fit a replica's KV cache
                self.unfit += 1
                self._reject_rest(run)
                return
            out = run.out_sum // run.out_n if run.out_n else DEFAULT_DECODE_TOKENS
            ctx = run.context_charged = s.prompt + out
            self._inflight_ctx[rep.name] = self._inflight_ctx.get(rep.name, 0) + ctx  # submit marked rep
        else:
            ttft, lat, cached, _cost = self.frontier.serve(
                run.idx, s.prompt, s.completion, s.chain, s.n_lookup, s.n_cacheable, t
            )
            run.frontier_steps += 1
            self.loop.schedule(t + lat, self._frontier_done, (run, t, ttft, lat, cached))

    def _reject_rest(self, run: _Run) -> None:
        g = run.g0 + run.k
        end = run.g0 + len(run.spec.steps)
        if any(self.outcome[g:end]):
            raise SimError(f"run {run.spec.run_id}: a step was accounted twice")
        self.outcome[g:end] = [REJECTED] * (end - g)
        self._run_ended(run)

    def _run_ended(self, run: _Run) -> None:
        if self.engine.run_ended(run.state) and self.slots > 0:
            self.slots -= 1
        self.frontier.forget(run.idx)
        self._last_end = self.loop.now
        self._runs_left -= 1
        if self._runs_left == 0:
            self.loop.stop()

    def _local_done(self, req: Request) -> None:
        run: _Run = req.key
        if req.tier_t is not None and self.tier_cached is not None:
            self.tier_cached[:, run.g0 + run.k] = req.tier_t
        plan = run.plan
        if plan is not None:
            name = plan.decision.backend
            if name in self._inflight_ctx:  # its replica is on the change list: the request ended
                self._inflight_ctx[name] -= run.context_charged
        run.context_charged = 0
        self._step_done(
            run, req.first_token_t - req.arrival, req.end_t - req.arrival, req.cached, SERVED_LOCAL, "local"
        )

    def _frontier_done(self, arg: tuple[_Run, float, float, float, int]) -> None:
        run, _t0, ttft, lat, cached = arg
        self._step_done(run, ttft, lat, cached, SPILLED if run.status == 1 else SERVED_FRONTIER, "frontier")

    def _step_done(self, run: _Run, ttft: float, lat: float, cached: int, code: int, tier: str) -> None:
        g = run.g0 + run.k
        if self.outcome[g] != 0:
            raise SimError(f"run {run.spec.run_id} step {run.k}: accounted twice")
        self.outcome[g] = code
        self.latency[g] = lat
        self.ttft[g] = ttft
        self.cached[g] = cached
        s: StepSpec = run.spec.steps[run.k]
        turn, plan = run.turn, run.plan
        assert turn is not None and plan is not None
        d = plan.decision
        t = self.loop.now
        # one result object for the whole simulation, its fields set afresh per step (the engine
        # copies what it keeps: the step's view, its record)
        res = self._res
        res.prompt_tokens = s.prompt
        res.cached_tokens = cached
        res.completion_tokens = s.completion
        res.tool_calls = s.tool_calls
        res.tool_call_keys = s.tool_call_keys
        res.ttft_s = ttft
        res.latency_s = lat
        res.structured = s.structured
        rec = turn.finish(
            res,
            now=t,
            tier=tier,
            replica=d.backend,
            model=d.model,
            record=self.records is not None,
        )
        if self.records is not None and rec is not None:
            self.records.append(rec)
        run.out_sum += s.completion
        run.out_n += 1
        run.k += 1
        if run.k < len(run.spec.steps):
            self.loop.schedule(t + run.spec.steps[run.k].pause, self._arrive_h, run)
        else:
            self.run_completion[run.idx] = t - run.start_t
            self._run_ended(run)

    # ------------------------------------------------------------------ driver
    def run(self) -> SimResult:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        # thousands of starts known up front: fed to the heap one at a time, in the same order
        self.loop.schedule_many(
            [(float(st), self._start_run, run) for run, st in zip(self._runs, self.starts, strict=True)]
        )
        # the loop allocates a few short-lived objects per event; at CPython's default gen-0 threshold
        # (700) the collector runs every few steps and its older generations re-walk the workload and
        # the engine's per-run tracks: collect less often while the loop runs (cyclic garbage is still
        # collected), and restore the caller's thresholds after
        thresholds = gc.get_threshold()
        if 0 < thresholds[0] < GC_GEN0:
            gc.set_threshold(GC_GEN0, *thresholds[1:])
        # and move what exists now (the workload, the runs' tracks, the caller's objects) out of the
        # collector's sight while the loop runs, so an older-generation pass walks only what the
        # loop made (unless the caller froze objects itself: its freeze is left alone)
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        self._looping = True
        try:
            self.loop.run()
        finally:
            if freeze:
                gc.unfreeze()
            gc.set_threshold(*thresholds)
            self._looping = False
            self._front = None
        makespan = max(self._last_end, float(self.starts.max()) if len(self.starts) else 0.0)
        if self.cfg.scale_to_zero:
            for r in self.replicas:
                r.finalize(makespan)
            gpu_s = sum(r.billed_s * self.cfg.pool_tp(r.role) for r in self.replicas)
        else:  # replicas x their tensor-parallel degree (each 1 by default)
            gpu_s = makespan * sum(self.cfg.pool_tp(r.role) for r in self.all_replicas)
        gpu_hours = gpu_s / 3600 * self.cfg.profile.gpus_per_replica
        outcome = np.array(self.outcome, dtype=np.int8)
        if np.any(outcome == 0):
            missing = int(np.sum(outcome == 0))
            raise SimError(f"{missing} step(s) were never served, spilled or rejected (simulator bug)")
        w = self.workload
        ns = w.n_steps
        prompt = np.empty(ns, dtype=np.int64)
        upper = np.empty(ns, dtype=np.int64)
        short = np.empty(ns, dtype=bool)
        sidx = np.empty(ns, dtype=np.int64)
        rofs = np.empty(ns, dtype=np.int64)
        comp = np.empty(ns, dtype=np.int64)
        # the workload's per-step columns: built as lists and converted once (a numpy element
        # assignment per field and step cost ~2.8k instructions per step, 1.3% of a simulation)
        steps = [s for spec in w.runs for s in spec.steps]
        prompt[:] = [s.prompt for s in steps]
        upper[:] = [s.upper for s in steps]
        short[:] = [s.short for s in steps]
        sidx[:] = [k for spec in w.runs for k in range(len(spec.steps))]
        rofs[:] = [i for i, spec in enumerate(w.runs) for _ in spec.steps]
        comp[:] = [s.completion for s in steps]
        return SimResult(
            policy=str(getattr(self.policy, "name", type(self.policy).__name__)),
            config=self.cfg,
            outcome=outcome,
            latency=np.array(self.latency, dtype=float),
            ttft=np.array(self.ttft, dtype=float),
            cached=np.array(self.cached, dtype=np.int64),
            prompt=prompt,
            upper=upper,
            short=short,
            step_index=sidx,
            run_of_step=rofs,
            run_completion_s=self.run_completion,
            run_status=np.array([r.status for r in self._runs], dtype=np.int8),
            run_switches=np.array([r.state.switches for r in self._runs], dtype=np.int64),
            run_frontier_steps=np.array([r.frontier_steps for r in self._runs], dtype=np.int64),
            frontier_cost_usd=self.frontier.cost_usd,
            gpu_hours=gpu_hours,
            cold_starts=sum(r.cold_starts for r in self.all_replicas),
            makespan_s=makespan,
            wall_s=time.perf_counter() - t_wall,
            cpu_s=time.process_time() - t_cpu,
            events=self.loop.events_run,
            rate_limited=self.frontier.rate_limited,
            iterations=sum(r.iterations for r in self.all_replicas),
            records=self.records,
            completion=comp,
            tier_cached=self.tier_cached,
            tier_stats=self._tier_stats(),
            gpu_evictions=sum(r.kv.evictions for r in self.all_replicas),
            runs_unfit=self.unfit,
            disagg_stats=self.disagg.stats() if self.disagg is not None else None,
        )

    def _tier_stats(self) -> list[dict[str, Any]] | None:
        if self.tier_cached is None:
            return None
        if self.cfg.cpu_kv_global:  # one shared tier: counted once
            return self.replicas[0].tiers.stats() if self.replicas[0].tiers is not None else None
        per = [r.tiers.stats() for r in self.replicas if r.tiers is not None]
        out = []
        for t in range(len(per[0])):
            row: dict[str, Any] = {"tier": per[0][t]["tier"]}
            for key in per[0][t]:
                if key != "tier":
                    row[key] = sum(p[t][key] for p in per)  # type: ignore[misc]
            out.append(row)
        return out
