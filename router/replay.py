"""Decision replay: walk logged runs step by step through one or more policies, without timing.

Algorithm: for every run of a run log (steps sorted by run and step) and every policy, each logged
step k goes through the step engine (:class:`router.core.engine.StepEngine`, the sidecar's and the
simulator's code): the logged step as a :class:`~router.core.record.StepRequest` (prompt tokens,
tool results, tools offered, JSON wanted, the logged tool pause, the run's ``needs_frontier``
label for the oracle; :func:`router.core.record.logged_request`), then ``engine.step`` (the one
call order, :mod:`router.core.driver`): plan (prefix, features, ``predictor.predict_features``,
snapshot, ``decide``), commit to the policy's own :class:`RunState`, and finish with the logged
output (:class:`_ReplayPort` serves it), so the next step's features see this policy's own history (its tiers, its
switches, the prefix it kept warm), as they would live. Time is the log's: a step arrives at its
``arrival_s`` and ends ``latency_s`` later (so the engine's tool pause is the logged one); a log
without timestamps gives no time features, as in training. No admission (no load in a replay).

Backends are synthetic and static (no load, never unhealthy): ``n_local`` local replicas serving
the weak model plus one frontier, priced with the router's config defaults
(:func:`default_backends`). The replay answers "which decisions would this policy make on these
runs", not "how fast": the what-if simulator adds load and time.

Prefix-cache accounting (per step, on the chosen backend)::

    reusable    = the step's prefix_reuse_tokens (prompt tokens repeating earlier context),
                  or the previous step's prompt + output when the log lacks it, at most the
                  prompt (router.core.accounting.reusable_tokens; 0 at step 0)
    warm        = min(reusable, what the chosen backend holds of the step's prompt)
    re-prefill  = reusable - warm   (avoidable work caused by the placement)
    new prefill = prompt - reusable

What a backend holds: for a local step whose log row carries ``hash_ids`` (Mooncake, synthetic
logs with block chains), the **prefix index** (:mod:`router.core.prefix_index`, the sidecar's and
the simulator's, approximate mode): each policy gets its own index over the local backends
(``index_tokens`` per replica, in blocks of ``block_tokens``), the engine fills every local
backend's ``warm_prefix_tokens`` from it (so ``prefix-aware`` places on it, as live) and records
the chosen replica; warm = the matched prefix (whole blocks, at most ``(prompt - 1) // block``),
reuse from *other* runs included, evicted leaf-LRU at the capacity. Replay has no clock: the
index sees the runs in the log's order (run by run, each run's steps in order), not interleaved
in time as they arrived; the what-if simulator replays them in time. Otherwise (no chain: most
agent logs, and the frontier's provider cache) the run's own model, no eviction, an upper bound:
the one warm-prefix rule (:class:`router.core.accounting.RunContext`): the context the run left
cached on that backend when it last ran there (prompt + completion of that step), as far as every
step since repeated it.

Report per policy (``replay(...)["policies"][name]``): ``runs``, ``steps``, ``escalation_rate``
(share of runs that ever ran on the frontier), ``frontier_step_share``, ``escalation_step`` (first
frontier step of each needs-frontier run, None if never) with its median, ``recall`` / ``precision``
of needs-frontier runs (labelled runs only; a run counts as flagged when it ever ran on the
frontier), ``switches_per_run`` (mean, incl. replica moves), ``tier_switches_per_run``,
``max_switches``, ``runs_with_flaps`` (two or more tier switches), token accounting (``warm_tokens``,
``reprefill_tokens``, ``new_prefill_tokens``, ``warm_share`` = warm / (warm + re-prefill), split by
tier), ``cache_hit_rate`` (the scorecard's cross-turn hit rate: warm / prompt tokens of local steps
after a run's first, :mod:`router.core.figures`), ``frontier_tokens`` and ``frontier_cost_usd`` (warm tokens at the cached price), and
``reasons`` (decision reason counts).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from features.logged import opt
from features.prefix import StepView
from features.runlog import RunLog
from models.predictor import Predictor
from router.core.accounting import RunContext, backend_step_usd, reusable_tokens
from router.core.driver import Served
from router.core.engine import StepEngine, StepPlan
from router.core.figures import cache_figures, escalation_quality, ratio, run_figures, switches
from router.core.prefix_index import PrefixIndex
from router.core.record import StepRequest, logged_end, logged_request, logged_result
from router.core.runs import RunTrack
from router.core.tiers import FRONTIER_DEFAULTS, LOCAL_DEFAULTS
from router.policy.types import BackendState, Decision, Policy, RunState

__all__ = ["default_backends", "replay", "PolicyTally"]


def default_backends(
    local_model: str = "local-model", frontier_model: str = "frontier-model", n_local: int = 2
) -> list[BackendState]:
    """``n_local`` local replicas + one frontier, with the tiers' defaults (:mod:`router.core.tiers`:
    what an unset field of the sidecar's settings means). The local GPU price is left 0 (the
    policy's ``local_gpu_usd_per_hour`` applies)."""
    if n_local < 0:
        raise ValueError("n_local must be >= 0")
    lf, ff = LOCAL_DEFAULTS, FRONTIER_DEFAULTS
    locals_ = [
        BackendState(
            name=f"local-{i}",
            tier="local",
            model=local_model,
            max_context=int(lf["max_context"]),
            prefill_s_per_token=float(lf["prefill_s_per_token"]),
            ttft_base_s=float(lf["ttft_base_s"]),
        )
        for i in range(n_local)
    ]
    frontier = BackendState(
        name=str(ff["name"]),
        tier="frontier",
        model=frontier_model,
        max_context=int(ff["max_context"]),
        price_in_per_m=float(ff["price_in_per_m"]),
        price_cached_in_per_m=float(ff["price_cached_in_per_m"]),
        price_out_per_m=float(ff["price_out_per_m"]),
        ttft_base_s=float(ff["ttft_base_s"]),
    )
    return [*locals_, frontier]


@dataclass
class PolicyTally:
    """Running totals of one policy over a replay (see the module docstring for each figure; the
    definitions are :mod:`router.core.figures`' and the step price :mod:`router.core.accounting`'s).

    :meth:`step` adds one replayed step, :meth:`run_done` closes a run, :meth:`report` gives the
    figures."""

    name: str
    runs: int = 0
    steps: int = 0
    frontier_steps: int = 0
    run_frontier_steps: list[int] = field(default_factory=list)
    quality: list[tuple[bool, bool | None]] = field(default_factory=list)  # (escalated, label) per run
    switches: list[int] = field(default_factory=list)
    tier_switches: list[int] = field(default_factory=list)
    escalation_step: dict[str, int | None] = field(default_factory=dict)
    warm: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    reprefill: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    new_prefill: dict[str, int] = field(default_factory=lambda: {"local": 0, "frontier": 0})
    frontier_tokens: int = 0
    frontier_cost_usd: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)
    _tiers: list[str] = field(default_factory=list)  # the open run's tier per step
    _cross_prompt: int = 0  # prompt tokens of local steps after a run's first
    _cross_warm: int = 0  # their warm tokens

    def step(
        self,
        tier: str,
        reason: str,
        prompt: int,
        reusable: int,
        warm: int,
        completion: int,
        frontier: BackendState | None,
    ) -> None:
        """One replayed step: served on ``tier`` with ``warm`` of its ``reusable`` prompt tokens
        cached; ``frontier``: the frontier backend that served it (its prices), else None."""
        self.steps += 1
        self.reasons[reason] += 1
        self.warm[tier] += warm
        self.reprefill[tier] += reusable - warm
        self.new_prefill[tier] += prompt - reusable
        if tier == "local" and self._tiers:  # cross-turn (router.core.figures.cache_figures)
            self._cross_prompt += prompt
            self._cross_warm += warm
        if tier == "frontier":
            self.frontier_steps += 1
            self.frontier_tokens += prompt + completion
            if frontier is not None:
                self.frontier_cost_usd += backend_step_usd(frontier, prompt, warm, completion)
        self._tiers.append(tier)

    def run_done(self, run_id: str, backend_switches: int, label: bool | None) -> None:
        """Close the open run: its switches (the engine's count: tier and replica moves) and label."""
        tiers, self._tiers = self._tiers, []
        esc = next((k for k, t in enumerate(tiers) if t == "frontier"), None)
        self.runs += 1
        self.switches.append(backend_switches)
        self.tier_switches.append(switches(tiers))
        self.run_frontier_steps.append(sum(1 for t in tiers if t == "frontier"))
        self.quality.append((esc is not None, label))
        if label is True:
            self.escalation_step[run_id] = esc

    def report(self) -> dict[str, Any]:
        warm, rep = sum(self.warm.values()), sum(self.reprefill.values())
        esc_steps = [s for s in self.escalation_step.values() if s is not None]
        tier_sw = self.tier_switches
        esc_rate, switches_per_run = run_figures(
            np.asarray(self.run_frontier_steps), np.asarray(self.switches)
        )
        eq = escalation_quality(self.quality)
        return {
            "runs": self.runs,
            "steps": self.steps,
            "escalation_rate": esc_rate,
            "frontier_step_share": ratio(self.frontier_steps, self.steps),
            "recall": eq.recall,
            "precision": eq.precision,
            "needs_frontier_runs": eq.needs_frontier_runs,
            "true_positive_runs": eq.true_positive_runs,
            "false_positive_runs": eq.false_positive_runs,
            "escalation_step": dict(self.escalation_step),
            "escalation_step_median": float(np.median(esc_steps)) if esc_steps else None,
            "switches_per_run": switches_per_run,
            "tier_switches_per_run": ratio(sum(tier_sw), self.runs),
            "max_switches": max(self.switches, default=0),
            "runs_with_flaps": sum(1 for s in tier_sw if s >= 2),
            "warm_tokens": warm,
            "reprefill_tokens": rep,
            "new_prefill_tokens": sum(self.new_prefill.values()),
            "warm_share": ratio(warm, warm + rep),
            "cache_hit_rate": cache_figures(
                np.ones(1, bool), np.ones(1), np.array([self._cross_prompt]), np.array([self._cross_warm])
            )[0],
            "by_tier": {
                t: {
                    "warm_tokens": self.warm[t],
                    "reprefill_tokens": self.reprefill[t],
                    "new_prefill_tokens": self.new_prefill[t],
                }
                for t in ("local", "frontier")
            },
            "frontier_tokens": self.frontier_tokens,
            "frontier_cost_usd": self.frontier_cost_usd,
            "reasons": dict(sorted(self.reasons.items())),
        }


def _labels(runlog: RunLog) -> tuple[dict[str, bool | None], dict[str, float], dict[str, str]]:
    """Per run id: the ``needs_frontier`` label (None if unknown), start time and model."""
    runs = runlog.runs
    labels: dict[str, bool | None] = {}
    started: dict[str, float] = {}
    models: dict[str, str] = {}
    n = len(runs)
    cols = {
        c: runs[c].tolist() if c in runs.columns else [None] * n
        for c in ("run_id", "needs_frontier", "started_at", "model")
    }
    for rid, lab, st, model in zip(
        cols["run_id"], cols["needs_frontier"], cols["started_at"], cols["model"], strict=True
    ):
        key = str(rid)
        labels[key] = None if opt(lab) is None else bool(lab)
        if opt(st) is not None:
            started[key] = float(st)
        if isinstance(model, str):
            models[key] = model
    return labels, started, models


def replay(
    runlog: RunLog,
    policies: Sequence[Policy],
    predictor: Predictor,
    *,
    backends: list[BackendState] | None = None,
    weak_model: str | None = None,
    index_tokens: int = 262_144,
    block_tokens: int = 512,
    trace: bool = False,
) -> dict[str, Any]:
    """Replay ``runlog`` through ``policies``; returns the report dict (module docstring).

    ``predictor``: a :class:`models.predictor.Predictor` (a ``ModelBundle``, a
    ``ConstantPredictor``). ``weak_model``: replay only runs whose ``model`` is this (the local
    model, e.g. ``gpt-oss-120b`` in the tau2 pairs); it also names the local backends' model.
    ``backends``: the synthetic backend list (default :func:`default_backends`).
    ``index_tokens`` / ``block_tokens``: each local backend's prefix-index capacity (the sidecar's
    ``local.prefix_index_tokens`` default) and the block size of the log's ``hash_ids`` (Mooncake's
    512); used only for rows with ``hash_ids``. ``trace``: the report also holds ``decisions``
    (policy name -> ``{(run_id, step): (tier, backend, reason, warm tokens)}``; parity tests compare
    them).
    """
    from features.extract import step_views, steps_columns
    from features.logged import run_context

    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(
            f"policy names must be unique in one replay (got {names}); set `name` in their configs"
        )
    labels, started, models = _labels(runlog)
    domains, embeddings = run_context(runlog.runs)
    steps = runlog.steps
    if weak_model is not None and len(steps):
        keep = [rid for rid, m in models.items() if m == weak_model]
        if not keep and "model" in steps.columns:
            keep = sorted(set(steps.loc[steps["model"] == weak_model, "run_id"].astype(str)))
        steps = steps[steps["run_id"].astype(str).isin(set(keep))].reset_index(drop=True)
    template = backends if backends is not None else default_backends(local_model=weak_model or "local-model")
    if not template:
        raise ValueError("replay needs at least one backend")
    n = len(steps)
    cols = steps_columns(steps) if n else {}
    reuse_col = (
        steps["prefix_reuse_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
        if n and "prefix_reuse_tokens" in steps.columns
        else np.full(n, np.nan)
    )
    engine = StepEngine(max_steps=1 << 30, keep_features=False)
    tallies = [PolicyTally(name=p.name) for p in policies]
    traces: list[dict[tuple[str, int], tuple[str, str, str, int]] | None] = [
        {} if trace else None for _ in policies
    ]
    hashes = steps["hash_ids"].tolist() if n and "hash_ids" in steps.columns else [None] * n
    indexes: list[PrefixIndex | None] = [None] * len(policies)
    if any(h is not None and not isinstance(h, float) and len(h) for h in hashes):
        cap = max(1, index_tokens // block_tokens)
        local_names = [b.name for b in template if b.tier == "local"]
        indexes = [PrefixIndex(block_tokens, [(b, cap) for b in local_names]) for _ in policies]
    frontier_prices = {b.name: b for b in template if b.tier == "frontier"}
    rid = cols.get("run_id", [])
    lo = 0
    while lo < n:
        hi = lo + 1
        while hi < n and rid[hi] == rid[lo]:
            hi += 1
        run_id = str(rid[lo])
        views = [step_views(cols, i) for i in range(lo, hi)]
        label = labels.get(run_id)
        reqs = [logged_request(cols, i, views[i - lo], label=label) for i in range(lo, hi)]
        chains = [_chain(hashes[i]) for i in range(lo, hi)]
        start = started.get(run_id, views[0].arrival_s)
        for i, policy in enumerate(policies):
            engine.prefix_index = indexes[i]  # each policy's own world
            _replay_run(
                engine, policy, predictor, tallies[i], template, frontier_prices, run_id, start,
                views, reqs, reuse_col[lo:hi], label,
                (domains.get(run_id), embeddings.get(run_id)), chains, traces[i],
            )  # fmt: skip
        lo = hi
    present = set(steps["run_id"].astype(str)) if n else set()
    labelled = [v for r, v in labels.items() if v is not None and r in present]
    out: dict[str, Any] = {
        "runs": tallies[0].runs if tallies else 0,
        "steps": n,
        "labelled_runs": len(labelled),
        "needs_frontier_runs": sum(1 for v in labelled if v),
        "weak_model": weak_model,
        "backends": [b.name for b in template],
        "policies": {t.name: t.report() for t in tallies},
    }
    if trace:
        out["decisions"] = {t.name: tr for t, tr in zip(tallies, traces, strict=True)}
    return out


def _chain(h: object) -> list[int] | None:
    """A logged ``hash_ids`` value as a chain (None when the row has none)."""
    if h is None or isinstance(h, float):
        return None
    vals = h.tolist() if isinstance(h, np.ndarray) else h
    if not isinstance(vals, Sequence) or isinstance(vals, str) or not vals:
        return None
    return [int(x) for x in vals]


class _ReplayPort:
    """The replay's I/O (:class:`router.core.driver.StepPort`) for one policy on one run: the
    synthetic backends, no admission, and the logged step served with the cache this policy's own
    world holds (module docstring: the prefix index's match with a chain, else the run's own model)."""

    __slots__ = ("template", "ctx", "view", "reusable", "indexed", "warm")

    def __init__(self, template: list[BackendState]):
        self.template = template
        self.ctx = RunContext()  # the run's own prefix model: per backend, its context cached there
        self.view: StepView | None = None  # the logged step being replayed
        self.reusable = 0
        self.indexed = False
        self.warm = 0  # what serve found warm on the chosen backend

    def backends(self) -> list[BackendState]:
        return [replace(b) for b in self.template]

    def claim(self, limit: int | None) -> bool:  # no admission in a replay: never asked
        return True

    def forced(self, plan: StepPlan) -> Decision | None:
        return None

    def serve(self, plan: StepPlan, backend: BackendState | None) -> Served:
        v = self.view
        assert v is not None
        d = plan.decision
        warm = self.ctx.warm(d.backend, plan.request.prompt_tokens, self.reusable)
        if self.indexed and d.tier == "local":
            warm = min(plan.warm_tokens, self.reusable)  # the index's match on the chosen replica
        self.warm = warm
        return Served(logged_result(v, warm if warm else (0 if d.tier == "local" else None)), logged_end(v))


def _replay_run(
    engine: StepEngine,
    policy: Policy,
    predictor: Predictor,
    t: PolicyTally,
    template: list[BackendState],
    frontier_prices: dict[str, BackendState],
    run_id: str,
    start: float | None,
    views: list[StepView],
    requests: list[StepRequest],
    reuse: np.ndarray,
    label: bool | None,
    context: tuple[str | None, np.ndarray | None] = (None, None),
    chains: Sequence[list[int] | None] = (),
    trace: dict[tuple[str, int], tuple[str, str, str, int]] | None = None,
) -> None:
    """Decide every step of one run with ``policy`` through the engine (``engine.step``); add its
    figures to ``t``. ``requests``: each logged step as engine input
    (:func:`router.core.record.logged_request`, shared by the policies: copied per step here);
    ``context``: the run's logged ``(domain, task_embedding)``; ``chains``: each step's block chain
    (None: no chain), read through the engine's prefix index when it has one; ``trace``: each step's
    decision is added to it."""
    st = RunState(run_id=run_id)
    track = RunTrack.new(run_id, start)
    track.domain, track.task_embedding = context
    port = _ReplayPort(template)
    prev_context = 0
    idx = engine.prefix_index
    for k, v in enumerate(views):
        req = replace(requests[k])
        prompt = req.prompt_tokens
        ru = reuse[k]
        reusable = reusable_tokens(k, prompt, None if math.isnan(ru) else int(ru), prev_context)
        chain = chains[k] if k < len(chains) else None
        port.indexed = chain is not None and idx is not None
        if chain is not None and idx is not None:
            req.chain, req.chain_lookup = chain, min(prompt // idx.block_tokens, len(chain))
        port.view, port.reusable = v, reusable
        turn = engine.step(st, track, req, port, now=v.arrival_s, policy=policy, predictor=predictor)
        d = turn.planned.decision
        tier, warm = d.tier, port.warm
        if trace is not None:
            trace[(run_id, turn.planned.step)] = (tier, d.backend, d.reason, warm)
        done = prompt + v.completion_tokens
        t.step(tier, d.reason, prompt, reusable, warm, done - prompt, frontier_prices.get(d.backend))
        port.ctx.served(d.backend, prompt, done - prompt)
        prev_context = done
    t.run_done(run_id, st.switches, label)
