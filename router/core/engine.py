"""The step engine: the one per-step sequence of the sidecar, the what-if simulator and replay.

The adapters (``router.server`` over HTTP, ``router.sim`` on an event clock, ``router.replay`` and
``training.eval.ope_replay`` over a run log) only turn their input into a
:class:`~router.core.record.StepRequest` (a logged step through
:func:`router.core.record.logged_request`) and backend states, keep time and do I/O (run-state
store, upstream calls). Everything that decides, and everything logged about a decision, happens
here, synchronously, in this order.

**Where the call order lives**: :mod:`router.core.driver`. :meth:`StepEngine.begin` gives a
:class:`~router.core.driver.StepTurn` whose methods are the stages below and refuse a call out of
order (:class:`~router.core.driver.StepOrderError`); :meth:`StepEngine.step` runs the whole order
for an adapter whose serving is synchronous, through a :class:`~router.core.driver.StepPort`. The
stage methods of this class (``_plan`` ... ``_unserved_start``) are the turn's only.

1. **prefix** (``turn.plan``): the run's :class:`~router.core.runs.RunTrack` gives its
   finished steps and running aggregate; the new request adds prompt tokens, tool results (count,
   sizes, error flags), tools offered, JSON wanted, the tool pause (``now`` - the previous step's
   end) and ``local_cache_pressure`` (from the adapter's cache reading of the run's local replica).
2. **predict**: one feature extraction (``features.extract.extract``), then
   ``predictor.predict_features(x)`` (:class:`models.predictor.Predictor`), or, for a predictor
   that declares ``reads_run_context = True``, ``predictor.predict_context(x, prefix)``: the prefix
   carries the run context (``domain``, ``task_embedding``, ``signals``; contract C2) that the
   vector does not.
3. **snapshot**: the adapter's backend states with ``warm_prefix_tokens`` set from the router's
   belief (the run's last served context on the backend it is pinned to, capped at the new prompt;
   the same in all adapters, so a what-if decides on what the sidecar would know), then
   :func:`router.policy.snapshot.build_snapshot`. With a prefix index and a step that carries its
   block chain (:attr:`~router.core.record.StepRequest.chain`), every local backend's
   ``warm_prefix_tokens`` is instead the prefix of the chain the index says that replica holds
   (from this run and every other run; whole blocks, at most ``(prompt - 1) // block`` as vLLM
   reports), and the decision's replica is recorded in the index at commit (6); a local backend
   whose adapter gave no ``prefill_queue_tokens`` (``inflight_context_tokens``) gets the traffic
   model's in-flight prefill (context) estimate for it (the sidecar's view of the prefill a replica
   still owes and of the context its decode attends over).
4. **decide**: a spilled run goes to the frontier (``admission-spilled``); otherwise
   ``policy.decide(snapshot)``. An exploring policy (:class:`router.policy.explore.ExplorePolicy`)
   is told at a run's first step whether its exploration budget has room
   (``Snapshot.explore_allowed``; one :class:`~router.core.explore.ExploreBudget` per policy name,
   kept here across runs and reloads, on the adapter's clock).
5. **admission** (:mod:`router.core.admission`; only with a gate, and only when the chosen backend
   is healthy: a step nothing can serve is answered 503 by the adapter): at a run's first step whose
   decision is local, the controller's verdict; ``admit-local`` asks the adapter to claim a slot
   (:attr:`StepPlan.claim_limit`, then ``turn.claim``); spill re-places the step on the
   frontier; reject sets :attr:`StepPlan.rejected` (the adapter answers 429 / drops the run, and the
   step index is given back so the retry is again a first step).
6. **commit** (``turn.commit``): ``apply_decision`` to the run's pin, the traffic model
   charged with the step's prefill/decode work.
7. **fallback** (``turn.fallback``, once per step; the adapter saw the chosen backend fail before its
   first byte): the other tier through :func:`router.policy.filters.place` with the failed backend
   marked unhealthy (reason ``fallback-<kind>``; pinned there).
8. **finish** (``turn.finish``): the step becomes a :class:`~features.prefix.StepView` of
   the run (served steps only), the traffic model is credited, the cache mark is taken, a frontier
   step of an exploring run is charged to the exploration budget, the step's score and tier go to
   the frontier budget's state (:mod:`router.core.budget`; a policy with ``frontier_budget`` reads
   its threshold at step 3 as ``Snapshot.budget_threshold``, the run's final score enters the
   window when the run ends), and the run-log
   :class:`features.schema.Step` record (with the decision's propensity and explore flag) is
   returned (when asked for).
9. **races and unserved starts** (adapters with a shared store): ``turn.adopt`` when
   another router pinned a new run first (the step moves to that pin, reason ``pin-race``);
   ``turn.finish`` of a run's first step that was not served (the run gives its
   admission back, as if it never started: the client's retry is admitted afresh).

Knobs (constructor): ``admission`` (an :class:`~router.core.admission.AdmissionGate`, None = no
admission), ``traffic`` (a :class:`~router.core.traffic.TrafficModel`; the gate's when None),
``cache_reader`` (``replica name -> CacheReading | None``: the adapter's prefix-cache counters),
``prefix_index`` (a :class:`~router.core.prefix_index.PrefixIndex`, None = the run's own
belief only), ``text_chainer`` (a :class:`~router.core.prefix_index.TextChainer`: turns a step's
text ``segments`` into its chain, incrementally per run, when the adapter gives text instead of a
chain), ``max_steps`` (history kept per run, see :class:`~router.core.runs.RunTracker`),
``fallback_weights`` (placement weights of the fallback pick), ``keep_features`` (extract the
feature vector at every step for the record even when the predictor reads none — the sidecar
always logs it; a simulation without a step log skips it for a predictor with
``needs_features = False``), ``cache_lags`` (the cache reader's counter may lag a step that just
ended — a scraped counter — so the reading when the step is sent is kept to correct the mark; False
for an exact counter, the simulator's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from features.extract import FEATURE_SPEC_VERSION, extract
from features.prefix import RunPrefix, StepView
from features.schema import Step
from models.types import Predictions
from router.core.admission import SPILLED_REASON, AdmissionGate
from router.core.budget import BudgetTracker
from router.core.driver import FINISHED, DrivenTurn, StepPort, StepTurn, drive_step
from router.core.explore import ExploreBudget, step_price_usd
from router.core.prefix_index import PrefixIndex, RunChain, TextChainer
from router.core.record import LazyFeatures, StepRequest, StepResult, step_record
from router.core.runs import CacheReading, RunTrack
from router.core.traffic import StepToken, TrafficModel
from router.policy.admission import AdmissionDecision, LoadSnapshot
from router.policy.budget import FrontierBudget, budget_of
from router.policy.explore import ExplorePolicy
from router.policy.filters import DEFAULT_WEIGHTS, ScoreWeights, make_decision, other_tier, place
from router.policy.snapshot import build_snapshot
from router.policy.types import BackendState, Decision, Policy, RunState, Snapshot, apply_decision

if TYPE_CHECKING:  # pragma: no cover
    from models.predictor import Predictor

__all__ = ["StepEngine", "StepPlan", "StepTurn", "StepPort", "CacheReader"]

CacheReader = Callable[[str], CacheReading | None]


@dataclass(slots=True)
class StepPlan:
    """One step between :meth:`StepEngine.plan` and :meth:`StepEngine.finish`."""

    run_id: str
    step: int
    now: float | None
    request: StepRequest
    prefix: RunPrefix
    x: np.ndarray | None  # the feature vector (None: nobody needed it, see StepEngine.keep_features)
    predictions: Predictions
    snapshot: Snapshot
    decision: Decision
    admission: str | None = None  # first-step verdict: admit-local | spill | reject | frontier
    admission_decision: AdmissionDecision | None = None
    claim_limit: int | None = None  # the adapter must claim a slot (then StepEngine.claimed)
    late_local: bool = False  # a run first sent to the frontier moved local: claim, never refuse
    rejected: bool = False
    retry_after_s: float | None = None
    fallback_from: str | None = None
    flapped: bool = False  # the decision moved a pinned run (a switch)
    load: LoadSnapshot | None = None
    traffic_token: StepToken | None = None
    cache_start: CacheReading | None = None
    warm_tokens: int = 0  # the router's belief of this run's prefix on the chosen backend
    explore_budget: ExploreBudget | None = None  # the deciding policy's exploration budget
    frontier_budget: FrontierBudget | None = None  # the deciding policy's frontier budget
    policy_name: str = ""
    budget_realised: float | None = None  # realised share in the budget's window (metrics)
    budget_domain: str = "*"  # the window it was read from


class StepEngine:
    """See the module docstring. Adapters call :meth:`begin` (a :class:`StepTurn` per step) or
    :meth:`step` (the whole order for a synchronous adapter); the stage methods (``_plan``,
    ``_claimed``, ``_commit``, ``_fallback``, ``_adopt``, ``_finish``, ``_unserved_start``) are the
    turn's, called in its order only."""

    def __init__(
        self,
        *,
        admission: AdmissionGate | None = None,
        traffic: TrafficModel | None = None,
        cache_reader: CacheReader | None = None,
        max_steps: int = 1000,
        fallback_weights: ScoreWeights = DEFAULT_WEIGHTS,
        keep_features: bool = True,
        cache_lags: bool = True,
        prefix_index: PrefixIndex | None = None,
        text_chainer: TextChainer | None = None,
    ):
        self.prefix_index = prefix_index
        self.text_chainer = text_chainer
        self.admission = admission
        self.traffic = traffic if traffic is not None else (admission.traffic if admission else None)
        self.cache_reader = cache_reader
        self.max_steps = max_steps
        self.fallback_weights = fallback_weights
        self.keep_features = keep_features
        self.cache_lags = cache_lags
        self.spec_version = FEATURE_SPEC_VERSION
        self.explore_budgets: dict[str, ExploreBudget] = {}  # policy name -> its budget
        self.frontier_budgets = BudgetTracker()  # router.core.budget: the budget's online quantiles
        # the latest policy asked for its frontier budget and the answer (budget_of looks through
        # attributes a policy usually lacks: asked once per policy object, not at every step)
        self._fb_of: tuple[Policy | None, FrontierBudget | None] = (None, None)
        # the latest predictions given a cache-index reading and the copies made of them, by
        # reading (Predictions are frozen: a constant predictor's are the same object every step)
        self._ci_of: Predictions | None = None
        self._ci: dict[float, Predictions] = {}

    # ------------------------------------------------------------------ the call order
    def begin(self, run: RunState, track: RunTrack, reuse: StepTurn | None = None) -> StepTurn:
        """A new step of ``run``: the turn whose methods are the stages, in their order
        (:mod:`router.core.driver`). ``reuse``: the run's previous turn, once finished, is reset and
        returned instead of a new one (an adapter that holds one turn per run, the simulator: no
        object per step); any other turn is left alone."""
        if reuse is not None and reuse.stage is FINISHED and reuse.run is run and reuse.track is track:
            reuse.restart()
            return reuse
        return StepTurn(self, run, track)

    def step(
        self,
        run: RunState,
        track: RunTrack,
        req: StepRequest,
        port: StepPort,
        *,
        now: float | None,
        policy: Policy,
        predictor: Predictor,
        active_local_runs: int = 0,
        record: bool = False,
    ) -> DrivenTurn:
        """One whole step for an adapter whose serving is synchronous
        (:func:`router.core.driver.drive_step`: ``port`` does the I/O)."""
        return drive_step(
            self,
            run,
            track,
            req,
            port,
            now=now,
            policy=policy,
            predictor=predictor,
            active_local_runs=active_local_runs,
            record=record,
        )

    def explore_budget(self, policy: Policy) -> ExploreBudget | None:
        """The exploration budget of ``policy`` (None: it does not explore or has no cap)."""
        if not isinstance(policy, ExplorePolicy) or policy.cfg.budget_usd is None:
            return None
        usd, window = float(policy.cfg.budget_usd), float(policy.cfg.budget_window_s)
        b = self.explore_budgets.get(policy.name)
        if b is None:
            b = self.explore_budgets[policy.name] = ExploreBudget(usd, window)
        elif (b.budget_usd, b.window_s) != (usd, window):  # a reload changed it
            b.budget_usd, b.window_s = usd, window
        return b

    # ------------------------------------------------------------------ 1-5: plan
    def _reading(self, replica: str | None) -> CacheReading | None:
        if replica is None or self.cache_reader is None:
            return None
        return self.cache_reader(replica)

    def prefix(self, track: RunTrack, req: StepRequest, now: float | None) -> RunPrefix:
        """The run's visible prefix for this step (shares the track's steps and aggregate); the
        step's new signals (``req.signals``) are added to the track's."""
        base = track.base
        if req.signals:
            track.signals = track.signals + tuple(req.signals)
        # positional, in RunPrefix's field order: a class called with keywords builds (and unpacks)
        # a dict per call, twice the cost at this size (tests/test_positional_order.py checks the order)
        return RunPrefix(
            track.run_id,  # run_id
            base.steps,  # steps
            track.started_s,  # run_started_s
            now,  # now_s
            req.prompt_tokens,  # new_prompt_tokens
            req.tool_results_n,  # new_tool_results_n
            req.tool_result_errors,  # new_tool_result_errors
            req.tool_result_tokens,  # new_tool_result_tokens
            # new_tool_pause_s: an overlapping step (it arrived before the previous one ended) has none: 0
            max(0.0, now - track.last_end_s) if now is not None and track.last_end_s is not None else None,
            req.n_tools_offered,  # new_n_tools_offered
            req.wants_json,  # new_wants_json
            (  # local_cache_pressure
                track.cache_pressure(
                    self.cache_reader(track.cache_replica)
                    if self.cache_reader is not None and track.cache_replica is not None
                    else None
                )
                if track.cache_mark is not None
                else None
            ),
            track.domain,  # domain
            track.task_embedding,  # task_embedding
            track.signals,  # signals
            len(req.signals),  # new_signals_n
            base.aggregate,  # aggregate
        )

    def _plan(
        self,
        run: RunState,
        track: RunTrack,
        req: StepRequest,
        backends: list[BackendState],
        now: float | None,
        policy: Policy,
        predictor: Predictor,
        active_local_runs: int = 0,
    ) -> StepPlan:
        """Steps 1-5 of the module docstring. ``backends`` is a fresh list the engine may mutate.
        Positional (the turn's call, at every step: keyword arguments cost a name match each)."""
        step = run.steps_seen if run.steps_seen > track.next_step else track.next_step  # claim_step
        track.next_step = step + 1
        prefix = self.prefix(track, req, now)
        x: np.ndarray | None = None
        # a predictor that does not say is assumed to read the vector (correct, only slower)
        if getattr(predictor, "needs_features", True) or self.keep_features:
            x = extract(prefix)
            if prefix.aggregate is not track.base.aggregate:  # extract rebuilt it: keep it for next time
                track.base.aggregate = prefix.aggregate
            ctx = getattr(predictor, "reads_run_context", False)  # domain + task embedding (benefit)
            preds = (
                cast(Predictions, getattr(predictor, "predict_context")(x, prefix))  # noqa: B009
                if ctx
                else predictor.predict_features(x)
            )
        else:  # a predictor that reads no features (the constant one), and no record wants them
            preds = predictor.predict(prefix)
        pinned = run.replica
        idx = self.prefix_index
        chain = req.chain
        tc = self.text_chainer
        if idx is not None and chain is None and req.segments is not None and tc is not None:
            rc = track.prefix_chain
            if rc is None:
                rc = track.prefix_chain = RunChain()
            chain = req.chain = tc.extend(rc, req.segments)
            req.chain_lookup = len(chain)
            req.segments = None  # the request's text is not kept past this point
            exact = tc.exact  # a token chain stops where vLLM's hit must: no cap from the estimate
        else:
            exact = False
        if idx is not None and chain is not None:
            bt = idx.block_tokens
            n = req.chain_lookup if req.chain_lookup < len(chain) else len(chain)
            if not exact:
                pt = req.prompt_tokens  # max_hit_blocks(pt, bt), inline
                cap = (pt - 1) // bt if pt > 0 else 0
                if cap < n:
                    n = cap
            own = track.last_tokens if track.last_tokens < req.prompt_tokens else req.prompt_tokens
            loads = self.traffic.replicas if self.traffic is not None else None
            # every replica's match in one pass (PrefixIndex.lookup: one dictionary lookup for a
            # replica without the chain's first block, two more when the run's hint there is right)
            reps = idx.replicas
            if len(backends) <= len(reps):  # the adapter gave some of the replicas: only theirs
                names = []  # a loop, not a comprehension (its own frame in CPython 3.11)
                for b in backends:
                    if b.tier == "local":
                        names.append(b.name)
                hints = idx.lookup_some(chain, n, track.prefix_hints, names)
            else:
                hints = idx.lookup(chain, n, track.prefix_hints)
            for b in backends:
                if b.tier == "local":
                    b.warm_prefix_tokens = hints[b.name] * bt if b.name in reps else 0
                    if loads is not None and b.name in loads:
                        ld = loads[b.name]
                        if not b.prefill_queue_tokens:
                            b.prefill_queue_tokens = int(ld.prefill_tokens)
                        if not b.inflight_context_tokens:
                            b.inflight_context_tokens = int(ld.context_tokens)
                else:
                    b.warm_prefix_tokens = own if b.name == pinned else 0
        elif pinned is not None:
            warm = min(track.last_tokens, req.prompt_tokens)
            for b in backends:
                b.warm_prefix_tokens = warm if b.name == pinned else 0
        snap = build_snapshot(
            run,
            prefix,
            preds,
            backends,
            label_needs_frontier=req.label_needs_frontier,
            requested_model=req.requested_model,
            features=LazyFeatures(x, prefix),
            last_tool_repeated=track.newest_call_repeated,
        )
        budget = self.explore_budget(policy) if isinstance(policy, ExplorePolicy) else None
        if budget is not None and run.tier is None:
            snap.explore_allowed = budget.open(now)
        fb_of = self._fb_of
        if fb_of[0] is policy:
            fb = fb_of[1]
        else:
            fb = budget_of(policy)
            self._fb_of = (policy, fb)
        if fb is not None:
            snap.budget_threshold = self.frontier_budgets.threshold(policy.name, fb, track.domain)
        if run.admitted == "spill":
            decision = self._frontier(snap, SPILLED_REASON) or policy.decide(snap)
        else:
            decision = policy.decide(snap)
        plan = StepPlan(track.run_id, step, now, req, prefix, x, preds, snap, decision)
        plan.explore_budget = budget
        plan.frontier_budget, plan.policy_name = fb, policy.name
        if fb is not None:
            dom = track.domain if fb.scope == "domain" and track.domain is not None else "*"
            plan.budget_domain = dom
            plan.budget_realised = self.frontier_budgets.realised_share(policy.name, track.domain)
        gate = self.admission
        if gate is not None and any(b.name == decision.backend and b.healthy for b in backends):
            if run.admitted is None:
                run.priority, run.tenant = req.priority, req.tenant
                if decision.tier != "local":
                    run.admitted = plan.admission = "frontier"
                    gate.frontier_first()
                else:
                    plan.load = gate.load(backends, active_local_runs)
                    ad, limit = gate.first_step(plan.load, req.priority, req.tenant, req.spill_ok)
                    plan.admission_decision = ad
                    if limit is not None:
                        plan.claim_limit = limit
                    else:
                        self._shed(plan, run, track, ad)
            elif run.admitted == "frontier" and decision.tier == "local":
                plan.late_local = True
        return plan

    def _frontier(
        self, snap: Snapshot, reason: str, scores: dict[str, float] | None = None
    ) -> Decision | None:
        """The step placed on a healthy frontier backend (pin kept), or None when there is none."""
        b, fb = place(snap, "frontier", self.fallback_weights)
        if b is None or b.tier != "frontier" or fb not in (None, "failover"):
            return None
        return make_decision(snap, b, reason, dict(scores or {}), "frontier")

    def _shed(self, plan: StepPlan, run: RunState, track: RunTrack, ad: AdmissionDecision) -> None:
        gate = self.admission
        assert gate is not None
        plan.admission_decision = ad
        if ad.verdict == "spill":
            d = self._frontier(plan.snapshot, f"admission-{ad.reason}", {**plan.decision.scores, **ad.scores})
            if d is not None:
                plan.decision = d
                plan.admission = run.admitted = "spill"
                gate.spilled(run.run_id, run.tenant)
                return
        # reject (or a spill with no healthy frontier): nothing is applied; the index is given back
        plan.admission = "reject"
        plan.rejected = True
        plan.retry_after_s = ad.retry_after_s
        plan.decision = replace(plan.decision, reason=f"admission-{ad.reason.replace('spill-', 'reject-')}")
        track.next_step = plan.step
        gate.rejected()

    def _claimed(self, plan: StepPlan, run: RunState, track: RunTrack, ok: bool) -> None:
        """The adapter's slot claim (``plan.claim_limit``) succeeded or was refused."""
        gate = self.admission
        assert gate is not None
        plan.claim_limit = None
        if ok:
            run.admitted = plan.admission = "admit-local"
            gate.admitted(run.run_id, run.priority, run.tenant)
            return
        assert plan.load is not None
        self._shed(plan, run, track, gate.race_lost(plan.load, run.priority, run.tenant))

    def _late_local_claimed(self, plan: StepPlan, run: RunState) -> None:
        """The adapter counted a run that moved local after a frontier start (slot without limit)."""
        plan.late_local = False
        run.admitted = "admit-local"
        if self.admission is not None:
            self.admission.late_local(run.run_id, run.priority, run.tenant)

    # ------------------------------------------------------------------ 6: commit
    def _commit(self, plan: StepPlan, run: RunState, track: RunTrack, backend: BackendState | None) -> None:
        """Apply the decision to the run's pin and charge the traffic model (``backend``: the
        state of the chosen backend, None when nothing can serve the step)."""
        d = plan.decision
        plan.flapped = d.switched and run.tier is not None
        plan.warm_tokens = track.last_tokens if run.replica == d.backend and run.tier is not None else 0
        if not d.backend:  # nothing can serve it: count the step, keep the pin
            run.steps_seen = max(run.steps_seen, plan.step + 1)
            return
        apply_decision(run, d, plan.step)
        if backend is None:
            return
        local = backend.tier == "local"
        idx = self.prefix_index
        chain = plan.request.chain
        if local and idx is not None and chain is not None:
            plan.warm_tokens = backend.warm_prefix_tokens
            # the index's cache-reuse prediction on the chosen replica, logged beside the model's
            preds, tokens = plan.predictions, float(plan.warm_tokens)
            if preds is not self._ci_of or len(self._ci) > 4096:
                self._ci_of = preds
                self._ci = {}
            ci = self._ci.get(tokens)
            if ci is None:
                ci = self._ci[tokens] = preds.with_cache_index(tokens)
            plan.predictions = ci
            hold = plan.request.chain_hold
            idx.record(backend.name, chain, hold, track.prefix_hints.get(backend.name, 0))
            track.prefix_hints[backend.name] = len(chain) if hold is None else min(hold, len(chain))
        if local and self.cache_lags:
            plan.cache_start = self._reading(backend.name)
        if self.traffic is not None:
            reuse = max(
                plan.predictions.cache_reuse_tokens, float(min(plan.warm_tokens, plan.request.prompt_tokens))
            )
            plan.traffic_token = self.traffic.step_started(
                backend.name if local else None,
                run.run_id,
                plan.request.prompt_tokens,
                reuse,
                plan.predictions,
            )

    # ------------------------------------------------------------------ 8: finish
    def _finish(
        self,
        plan: StepPlan,
        track: RunTrack,
        res: StepResult,
        now: float | None,
        tier: str | None,
        replica: str | None,
        model: str | None,
        arrival_s: float | None = None,
        record: bool = True,
    ) -> Step | None:
        """Close the step (module docstring, 8); returns its :class:`features.schema.Step` record
        when ``record`` (else None). ``tier``/``replica``/``model``: what served it (None: nothing).
        Positional, as :meth:`_plan`."""
        ok = res.status == 200
        req = plan.request
        prompt = res.prompt_tokens if res.prompt_tokens else req.prompt_tokens
        cached = res.cached_tokens
        if cached is not None:
            cached = int(cached)
            if cached > prompt:
                cached = prompt
        structured = (
            res.structured if res.structured is not None else (bool(res.tool_calls) or req.wants_json)
        )
        pause = plan.prefix.new_tool_pause_s
        if ok:
            track.append(
                StepView(  # positional, in field order (as RunPrefix in prefix())
                    prompt,  # prompt_tokens
                    res.completion_tokens,  # completion_tokens
                    cached,  # cached_tokens
                    res.tool_calls,  # tool_calls
                    res.tool_call_keys,  # tool_call_keys
                    req.tool_results_n,  # tool_results_n
                    req.tool_result_errors,  # tool_result_errors
                    req.tool_result_tokens,  # tool_result_tokens
                    pause,  # tool_pause_s
                    plan.now,  # arrival_s
                    res.latency_s,  # latency_s
                    structured,  # structured
                    tier,  # tier
                ),
                self.max_steps,
            )
            track.last_tokens = prompt + res.completion_tokens
        track.last_end_s = now
        local = tier == "local"
        at = replica if local else track.cache_replica  # the replica whose counter is read
        track.mark_cache(
            replica,
            local,
            self.cache_reader(at) if self.cache_reader is not None and at is not None else None,
            plan.cache_start,
            prompt - (cached or 0) if ok else 0,
        )
        if self.traffic is not None and plan.traffic_token is not None:
            self.traffic.step_finished(
                plan.traffic_token, replica if local else None, prompt, cached or 0, res.completion_tokens, ok
            )
        d = plan.decision
        if plan.explore_budget is not None and d.explore and ok and tier == "frontier":
            for b in plan.snapshot.backends:
                if b.name == replica:
                    plan.explore_budget.charge(
                        step_price_usd(b, prompt, cached or 0, res.completion_tokens), now
                    )
                    break
        if plan.frontier_budget is not None:
            self.frontier_budgets.step(
                plan.policy_name,
                plan.frontier_budget,
                track.run_id,
                track.domain,
                d.scores.get("p_frontier"),
                tier if ok else None,
                d.reason,
            )
        if not record:
            return None
        return step_record(
            run_id=plan.run_id,
            step=plan.step,
            arrival_s=arrival_s if arrival_s is not None else plan.now,
            tool_pause_s=pause,
            req=req,
            prompt_tokens=prompt,
            cached_tokens=cached,
            res=res,
            structured=structured,
            tier=tier,
            replica=replica,
            model=model,
            spec_version=self.spec_version,
            features=plan.x.tolist() if plan.x is not None else None,
            predictions=plan.predictions.as_dict(),
            decision=f"{d.tier}:{d.backend}" if d.backend else None,
            reason=d.reason,
            admission=plan.admission,
            propensity=d.propensity,
            explore=d.explore,
        )

    # ------------------------------------------------------------------ 7: fallback
    def _fallback(
        self, plan: StepPlan, run: RunState, failed: str, kind: str, backends: list[BackendState]
    ) -> Decision | None:
        """Re-place a step whose backend ``failed`` before its first byte on the other tier.

        ``backends``: fresh states (the failed one is marked unhealthy here). Returns the applied
        decision (reason ``fallback-<kind>``), or None when the other tier has no candidate."""
        failed_tier = None
        for st in backends:
            if st.name == failed:
                st.healthy = False
                failed_tier = st.tier
        if failed_tier is None:
            return None
        target = other_tier(failed_tier)
        snap = replace(plan.snapshot, run=run, backends=backends)
        b, _ = place(snap, target, self.fallback_weights)
        if b is None or b.tier != target:
            return None
        d = Decision(tier=b.tier, backend=b.name, model=b.model, reason=f"fallback-{kind}", switched=True)
        plan.fallback_from = failed
        plan.decision = d
        plan.flapped = True
        apply_decision(run, d, plan.step)
        self._recharge(plan, run, b)
        plan.cache_start = self._reading(b.name) if b.tier == "local" and self.cache_lags else None
        return d

    def _recharge(self, plan: StepPlan, run: RunState, b: BackendState) -> None:
        """The step moved to ``b``: the first attempt's traffic charge is undone (it served nothing)
        and ``b`` is charged afresh."""
        if self.traffic is not None and plan.traffic_token is not None:
            self.traffic.step_finished(plan.traffic_token, None, 0, 0, 0, False)
            plan.traffic_token = self.traffic.step_started(
                b.name if b.tier == "local" else None,
                run.run_id,
                plan.request.prompt_tokens,
                plan.predictions.cache_reuse_tokens,
                plan.predictions,
            )

    # ------------------------------------------------------------------ 9: races, unserved starts
    def _adopt(self, plan: StepPlan, run: RunState, winner: RunState) -> bool:
        """Another router stored this new run's first pin before us (set-if-absent refused ours):
        take ``winner``'s pin for this step. Returns True when this router's own admission slot
        must be given back (the winner's router holds the run's slot)."""
        give_back = run.admitted == "admit-local" and self.admission is not None
        if give_back:
            assert self.admission is not None
            self.admission.released(run.run_id)
        same = (winner.tier, winner.replica) == (run.tier, run.replica)
        for f in (
            "tier",
            "replica",
            "pinned_at_step",
            "switches",
            "last_switch_step",
            "admitted",
            "owner",
            "explore_post",
        ):
            setattr(run, f, getattr(winner, f))
        run.steps_seen = max(run.steps_seen, winner.steps_seen, plan.step + 1)
        plan.admission = winner.admitted
        if same or winner.replica is None:
            return give_back
        b = next((x for x in plan.snapshot.backends if x.name == winner.replica), None)
        if b is None:
            return give_back
        plan.decision = Decision(tier=b.tier, backend=b.name, model=b.model, reason="pin-race")
        self._recharge(plan, run, b)
        plan.cache_start = self._reading(b.name) if b.tier == "local" else None
        return give_back

    def _unserved_start(self, plan: StepPlan, run: RunState) -> bool:
        """A run's first step ended without being served: give its admission back (the next step
        is a first step again). Returns True when the adapter must release a slot."""
        if plan.admission is None or run.admitted is None:
            return False
        holds = self.run_ended(run)
        run.admitted = None
        plan.admission = None
        return holds

    # ------------------------------------------------------------------ run end
    def run_ended(self, run: RunState) -> bool:
        """A run ended (client, idle expiry, simulator): give back admission bookkeeping.

        Returns True when the run holds a local slot the adapter must release in its counter."""
        self.frontier_budgets.ended(run.run_id)
        tracked = self.admission.released(run.run_id) if self.admission is not None else False
        return run.admitted == "admit-local" or tracked
