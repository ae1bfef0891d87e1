"""The learned run-stable policy: pin a run to a tier and replica, move it only when it pays.

Algorithm (one call per step; pure, state only through ``snapshot.run``):

1. A client that named a concrete model (``requested_model``) goes to the backend serving it
   (``requested-model``); the policy is bypassed.
2. Economics from the predictions (``p = benefit`` = P(success | escalate now) - P(success | stay
   local) when the bundle's benefit model answered for the run's domain (issue 14: the benefit
   rule), else ``p = p_frontier``; ``reuse = cache_reuse_tokens``, remaining
   work ``R = remaining_tokens_p50``, or ``remaining_steps_p50 x context`` when the predictor gives
   no token estimate) and the backends' prices, all in USD::

       f_tok   = out_share*price_out + (1-out_share)*(hit*price_cached_in + (1-hit)*price_write)   (frontier, per token)
       l_pf    = prefill_s_per_token * gpu_usd_per_hour / 3600 + latency_usd_per_s * prefill_s_per_token
                 (local prefill, per token; also used as the local price of remaining work)
       extra   = R * (f_tok - l_pf)                       extra frontier cost of the remaining work
       benefit = p * value_of_success_usd - extra         expected gain of running the rest on the frontier
       cost_up   = reuse * l_pf                                            lost local cache
                 + (ctx - warm_F) * (price_write + latency_usd_per_s * prefill_s_per_token_F)
                 + latency_usd_per_s * ttft_base_s_F                      frontier cold prefill
       cost_down = min(warm_F or ctx, ctx) * (price_in - price_cached_in)  lost provider cache
                 + (ctx - warm_L) * l_pf + latency_usd_per_s * ttft_base_s_L  local cold prefill

   ``price_write`` is the frontier's prompt-cache write price (``price_cache_write_per_m``:
   Anthropic charges 1.25 x input to write its cache, then the cache-read price), the input price
   when the provider charges nothing extra (0). ``ctx`` is the new request's prompt tokens; ``warm_*`` the run's prefix tokens already cached
   on the target side. A local backend's price is its ``gpu_usd_per_hour`` (see ``BackendState``);
   0 means "use ``local_gpu_usd_per_hour``".
3. First step (no pin): frontier iff ``p >= up`` and ``benefit > 0`` (``first-frontier``), else
   local (``first-local``); the replica is picked by filter -> score -> pick
   (:mod:`router.policy.filters`).
4. Later steps: a local run wants to escalate iff ``p >= up``; a frontier run wants to come back iff
   ``p < down`` (with the benefit, ``up`` / ``down`` are ``benefit_up`` / ``benefit_down``: the
   uplift must be positive by this much before the economics are even asked) (hysteresis band between; ``down = 0`` never de-escalates; ``down = up`` is allowed).
   A wanted move happens only if, in this order,
   ``benefit - cost_up > 0`` (resp. ``-benefit - cost_down > 0``) else ``hold-cost``;
   ``switches < max_switches`` else ``hold-cap``; ``step - last_switch_step >= min_dwell_steps`` else
   ``hold-dwell``; and the step is at a tool boundary, or its gross gain is at least
   ``off_boundary_ratio x`` the switch cost, else ``hold-not-boundary``. Moves are ``escalate`` /
   ``de-escalate``; no wanted move is ``pinned``.
5. Placement fallbacks override the reason: ``failover`` (pinned replica unhealthy, another replica of
   the same tier), ``no-healthy-local``, ``no-healthy-frontier``, ``context-too-long``,
   ``no-healthy-backend`` (nothing healthy: the caller answers 503). Forced moves ignore dwell and cap.

``Decision.scores``: ``p_frontier``, ``benefit``, ``switch_cost`` (of the move considered from the
current tier), ``net`` (gain minus switch cost), ``remaining_tokens``, ``threshold_up``,
``threshold_down``; ``uplift`` when the benefit model answered (``p_frontier`` then holds it too).

Knobs (:class:`router.policy.config.LearnedConfig`): ``p_frontier_up`` / ``p_frontier_down``
(hysteresis thresholds; default from the bundle's calibrated thresholds), ``benefit_up`` /
``benefit_down`` (the same on the uplift), ``value_of_success_usd`` (the cost/quality knob),
``min_dwell_steps``, ``max_switches``, ``off_boundary_ratio``, ``frontier_cache_hit`` (share of
remaining frontier input tokens served from provider prompt caching), ``output_token_share``
(share of remaining tokens that are output), ``local_gpu_usd_per_hour``, ``latency_usd_per_s``
(price of a second of prefill latency; 0 = money only), ``scoring`` (replica weights),
``trouble_boost`` (:mod:`router.policy.trouble`: signals posted on the run raise ``p`` before the
economics; off by default), ``frontier_budget`` (:mod:`router.policy.budget`: with a budget the
engine passes ``Snapshot.budget_threshold``; ``up`` becomes that threshold (escalate iff
``p > threshold``), ``down`` is capped at it, and the economics no longer hold a move: no
``benefit > 0`` at the first step, no ``hold-cost``, no ``hold-not-boundary``; dwell and the switch
cap still apply. The model orders runs, the budget decides how many escalate).
"""

from __future__ import annotations

from router.policy.budget import FrontierBudget, tie_break
from router.policy.defaults import GPU_HOUR_USD
from router.policy.filters import DEFAULT_WEIGHTS, ScoreWeights, make_decision, place, place_requested
from router.policy.trouble import TroubleTerm
from router.policy.types import BackendState, Decision, Snapshot, Tier

__all__ = ["LearnedPolicy"]


class LearnedPolicy:
    """Run-stable tier choice from P(needs frontier), cache reuse and remaining work."""

    __slots__ = (
        "name",
        "up",
        "down",
        "value_of_success",
        "min_dwell",
        "max_switches",
        "off_boundary_ratio",
        "frontier_cache_hit",
        "out_share",
        "local_gpu_usd_per_hour",
        "latency_usd_per_s",
        "weights",
        "benefit_up",
        "benefit_down",
        "trouble",
        "frontier_budget",
    )

    def __init__(
        self,
        *,
        p_frontier_up: float,
        p_frontier_down: float,
        value_of_success_usd: float = 1.0,
        min_dwell_steps: int = 3,
        max_switches: int = 2,
        off_boundary_ratio: float = 4.0,
        frontier_cache_hit: float = 0.8,
        output_token_share: float = 0.05,
        local_gpu_usd_per_hour: float = GPU_HOUR_USD,
        latency_usd_per_s: float = 0.0,
        weights: ScoreWeights = DEFAULT_WEIGHTS,
        name: str = "learned",
        benefit_up: float = 0.0,
        benefit_down: float = 0.0,
        trouble: TroubleTerm | None = None,
        frontier_budget: FrontierBudget | None = None,
    ):
        if not 0.0 <= p_frontier_down <= p_frontier_up <= 1.0:
            raise ValueError(
                f"learned policy needs 0 <= p_frontier_down <= p_frontier_up <= 1 "
                f"(got down={p_frontier_down}, up={p_frontier_up})"
            )
        self.name = name
        self.up = float(p_frontier_up)
        self.down = float(p_frontier_down)
        self.value_of_success = float(value_of_success_usd)
        self.min_dwell = int(min_dwell_steps)
        self.max_switches = int(max_switches)
        self.off_boundary_ratio = float(off_boundary_ratio)
        self.frontier_cache_hit = float(frontier_cache_hit)
        self.out_share = float(output_token_share)
        self.local_gpu_usd_per_hour = float(local_gpu_usd_per_hour)
        self.latency_usd_per_s = float(latency_usd_per_s)
        self.weights = weights
        if not -1.0 <= benefit_down <= benefit_up <= 1.0:
            raise ValueError(
                f"learned policy needs -1 <= benefit_down <= benefit_up <= 1 (got {benefit_down}, {benefit_up})"
            )
        self.benefit_up = float(benefit_up)
        self.benefit_down = float(benefit_down)
        self.trouble = trouble if trouble is not None and trouble.terms else None  # router.policy.trouble
        self.frontier_budget = frontier_budget  # router.policy.budget; the engine sets the threshold

    def _sides(self, snap: Snapshot) -> tuple[BackendState | None, BackendState | None]:
        """The local and frontier backends the economics are priced on.

        Per tier: the pinned backend if the run is pinned there, else the healthy one holding the
        most of this run's prefix, else the first one listed.
        """
        pinned = snap.run.replica
        best: dict[str, BackendState] = {}
        for b in snap.backends:
            cur = best.get(b.tier)
            if cur is None or cur.name == pinned:
                if cur is None:
                    best[b.tier] = b
                continue
            if b.name == pinned or (b.healthy, b.warm_prefix_tokens) > (cur.healthy, cur.warm_prefix_tokens):
                best[b.tier] = b
        return best.get("local"), best.get("frontier")

    def economics(self, snap: Snapshot) -> tuple[float, float, float, float, float]:
        """``(p, benefit, cost_up, cost_down, remaining_tokens)``; USD, per the module docstring."""
        pred = snap.predictions
        if pred.benefit is not None:
            p = pred.benefit
            p = -1.0 if p < -1.0 else (1.0 if p > 1.0 else p)
            lo = -1.0
        else:
            p = pred.p_frontier
            p = 0.0 if p < 0.0 else (1.0 if p > 1.0 else p)
            lo = 0.0
        if self.trouble is not None:  # observed trouble (router.policy.trouble)
            p = self.trouble.adjust(p, snap.features, lo)
        ctx = snap.context_tokens if snap.context_tokens > 0 else 0
        rem = pred.remaining_tokens_p50
        if rem <= 0.0:
            rem = max(pred.remaining_steps_p50, 0.0) * ctx
        local, frontier = self._sides(snap)
        lat = self.latency_usd_per_s
        if local is not None:
            gpu = local.gpu_usd_per_hour if local.gpu_usd_per_hour > 0 else self.local_gpu_usd_per_hour
            l_pf = local.prefill_s_per_token * (gpu / 3600.0 + lat)
            warm_l = min(local.warm_prefix_tokens, ctx)
            l_ttft = local.ttft_base_s
        else:
            l_pf, warm_l, l_ttft = 0.0, 0, 0.0
        if frontier is not None:
            f_in = frontier.price_in_per_m * 1e-6
            f_c = frontier.price_cached_in_per_m * 1e-6
            f_out = frontier.price_out_per_m * 1e-6
            f_w = frontier.price_cache_write_per_m * 1e-6 or f_in
            hit = self.frontier_cache_hit
            f_tok = self.out_share * f_out + (1.0 - self.out_share) * (hit * f_c + (1.0 - hit) * f_w)
            warm_f = min(frontier.warm_prefix_tokens, ctx)
            cost_up = (
                pred.cache_reuse_tokens * l_pf
                + (ctx - warm_f) * (f_w + lat * frontier.prefill_s_per_token)
                + lat * frontier.ttft_base_s
            )
            lost_f = warm_f if warm_f > 0 else ctx
            cost_down = lost_f * (f_in - f_c) + (ctx - warm_l) * l_pf + lat * l_ttft
        else:
            f_tok, cost_up, cost_down = 0.0, 0.0, (ctx - warm_l) * l_pf + lat * l_ttft
        benefit = p * self.value_of_success - rem * (f_tok - l_pf)
        return p, benefit, cost_up, cost_down, rem

    def decide(self, snapshot: Snapshot) -> Decision:
        snap = snapshot
        w = self.weights
        if snap.requested_model is not None:
            b = place_requested(snap, w)
            if b is not None:
                return make_decision(snap, b, "requested-model")
        run = snap.run
        p, benefit, cost_up, cost_down, rem = self.economics(snap)
        uplift = snap.predictions.benefit is not None
        up, down = (self.benefit_up, self.benefit_down) if uplift else (self.up, self.down)
        thr = snap.budget_threshold if self.frontier_budget is not None else None
        pb = p
        if thr is not None:  # the budget decides how many escalate; the score only orders runs
            up, down = thr, min(down, thr)
            pb = tie_break(p, run.run_id)  # the window holds tie-broken scores (router.policy.budget)
        want: Tier
        if run.tier is None:
            if (pb > up) if thr is not None else (p >= up and benefit > 0.0):
                want, reason = "frontier", "first-frontier"
            else:
                want, reason = "local", "first-local"
            cost, net = cost_up, benefit - cost_up
        else:
            want, reason = run.tier, "pinned"
            if run.tier == "local":
                esc = pb > up if thr is not None else p >= up
                move, gain, cost, target, code = esc, benefit, cost_up, "frontier", "escalate"
            else:
                move, gain, cost, target, code = p < down, -benefit, cost_down, "local", "de-escalate"
            net = gain - cost
            if move:
                if net <= 0.0 and thr is None:  # under a budget the budget has priced the move
                    reason = "hold-cost"
                elif run.switches >= self.max_switches:
                    reason = "hold-cap"
                elif (
                    run.last_switch_step is not None
                    and snap.step_index - run.last_switch_step < self.min_dwell
                ):
                    reason = "hold-dwell"
                elif thr is None and not snap.at_tool_boundary and gain < self.off_boundary_ratio * cost:
                    reason = "hold-not-boundary"
                else:
                    want, reason = target, code  # type: ignore[assignment]
        backend, fallback = place(snap, want, w)
        scores = {
            "p_frontier": p,
            "benefit": benefit,
            "switch_cost": cost,
            "net": net,
            "remaining_tokens": rem,
            "threshold_up": up,
            "threshold_down": down,
        }
        if uplift:
            scores["uplift"] = p
        return make_decision(snap, backend, fallback or reason, scores, want)
