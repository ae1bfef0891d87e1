"""Logged runs for off-policy evaluation, and a candidate policy replayed on their prefixes.

:func:`load_logged` turns a run log into the arrays the estimators (:mod:`training.eval.ope`) need
and refuses what cannot be evaluated, with a one-line :class:`OPEError`:

- a log without step records, or with steps that carry no ``propensity`` (written without
  exploration logging: the estimators have nothing to weight by);
- runs are *left out* (and counted by reason) when their outcome is unknown, a step has no tier
  (nothing served it) or step indices have gaps.

Per run it keeps the logged tier per step (``a``: 1 = frontier), the logging propensity ``mu``,
the explore flag, success (outcome == success), the per-step cost of the logged tiers (the outcome
model's prices and warm prefixes, :func:`training.eval.outcome.step_costs`, re-exported here as
:func:`step_costs`; they sum to :func:`training.eval.outcome.run_costs`) and the logged feature
vectors (for the doubly robust model); :meth:`LoggedRuns.figures` gives the logged tiers' cost and
cross-turn cache hit rate (the figures the simulator and replay report for the same log).

:func:`replay_candidate` walks each logged run through the step engine (the sidecar's code path,
:class:`router.core.engine.StepEngine`, its one call order ``engine.step`` with this module's port;
the logged step as engine input by :func:`router.core.record.logged_request`; no admission) with
the candidate policy and predictor: each logged step is planned (prefix, features, predictions, snapshot, decision), the candidate's
decision is committed to its own run state, and the step is finished with the *logged* result
(tokens, cached tokens, tool calls, latency, the logged tier), so while the candidate agrees with
the log its state and features are those the logging router had. At the first step where the
candidate's tier differs the walk of that run stops (the log says nothing about what follows).
Returned per step: ``pi`` (the candidate's probability of the logged action: 1 while it agrees, 0
at its deviation and after) and ``pf`` (its probability of the frontier, known up to and including
the deviation). A deviation where the logged decision had propensity 1 (the logging policy could
not have taken the candidate's action) is *unsupported*; :func:`replay_candidate` counts them.

A candidate with a ``frontier_budget`` decides on windows built from other runs' scores, so its
replay interleaves every run's steps and ends in the logs' arrival order (a run ends at its last
step's arrival + latency, with its logged domain), and past its first deviation a run is walked on
with the *logged* action (its ``pi`` stays 0): the candidate's windows see its own scores over the
whole run and the spend the deployment made, exploration included, as the live engine counts it.
The logging policy so reproduces its logged decisions. ``epochs`` (run id -> int) restarts the
windows per group (a router restart; default one group). Other candidates are replayed run by run.

Candidates must be deterministic (an ``explore`` block is stripped by the caller). Knobs:
``backends`` (the deployment's backend states; default :func:`router.replay.default_backends`),
``prices`` (:class:`training.eval.outcome.Prices`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.driver import Served
from router.core.figures import cache_figures
from router.core.record import logged_end, logged_result
from training.eval.outcome import Prices, RunRecord, records_from_frames, run_warm, step_costs

if TYPE_CHECKING:
    from features.prefix import RunPrefix, StepView
    from features.runlog import RunLog
    from models.predictor import Predictor
    from models.types import Predictions
    from router.core.engine import StepPlan
    from router.policy.types import BackendState, Decision, Policy, RunState, Tier

__all__ = [
    "OPEError",
    "LoggedRuns",
    "Replayed",
    "CachedPredictor",
    "load_logged",
    "replay_candidate",
    "step_costs",
]


class OPEError(ValueError):
    """The logs cannot support the evaluation asked for; one line meant for a person."""


@dataclass
class LoggedRuns:
    """The evaluable runs of a log (module docstring); run ``i`` is steps ``[ptr[i], ptr[i+1])``."""

    run_ids: list[str]
    ptr: np.ndarray
    a: np.ndarray
    mu: np.ndarray
    explore: np.ndarray
    success: np.ndarray  # per run, 0/1
    cost: np.ndarray  # per step, USD
    X: np.ndarray  # per step, the logged features (NaN where not logged)
    records: dict[str, RunRecord]
    steps: Any  # the steps frame of the kept runs, sorted by (run_id, step)
    started: dict[str, float]
    left_out: dict[str, int] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)  # run id -> its logged domain (run context)
    warm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per step, warm prefix

    def figures(self) -> dict[str, float | None]:
        """The logged tiers' cost (USD: total and frontier) and cross-turn cache hit rate, by the
        outcome model's prices and the one warm-prefix rule (:mod:`router.core.figures`)."""
        local = self.a == 0
        hit, _ = cache_figures(local, self.step_index(), self.steps["prompt_tokens"].to_numpy(), self.warm)
        return {
            "cost_usd": float(self.cost.sum()),
            "frontier_cost_usd": float(self.cost[~local].sum()),
            "cache_hit_rate": hit,
        }

    @property
    def n_runs(self) -> int:
        return len(self.run_ids)

    def step_index(self) -> np.ndarray:
        return np.concatenate([np.arange(e - s) for s, e in zip(self.ptr[:-1], self.ptr[1:], strict=True)])


def load_logged(log: RunLog, prices: Prices) -> LoggedRuns:
    """See the module docstring. ``log``: a :class:`features.runlog.RunLog`."""
    import pandas as pd

    from features.extract import N_FEATURES
    from features.logged import run_context

    steps, runs = log.steps, log.runs
    if len(steps) == 0:
        raise OPEError("the run log has no step records: nothing to evaluate")
    no_prop = int(steps["propensity"].isna().sum()) if "propensity" in steps else len(steps)
    if no_prop:
        raise OPEError(
            f"{no_prop} of {len(steps)} logged steps carry no propensity (written without exploration "
            "logging); off-policy evaluation needs every decision's propensity"
        )
    left: dict[str, int] = {}
    outcome = dict(zip(runs["run_id"].astype(str), runs["outcome"], strict=True)) if len(runs) else {}
    sid = steps["run_id"].astype(str)
    known = sid.map(lambda r: outcome.get(r) in ("success", "failure"))
    tier_ok = steps["tier"].isin(["local", "frontier"]).groupby(sid).transform("all")
    k = pd.to_numeric(steps["step"]).to_numpy()
    first = np.r_[True, sid.to_numpy()[1:] != sid.to_numpy()[:-1]]
    pos = np.arange(len(k))
    expect = pos - np.maximum.accumulate(np.where(first, pos, 0))
    gaps = pd.Series(k != expect, index=steps.index).groupby(sid).transform("any")
    for reason, bad in (
        ("outcome unknown", ~known),
        ("a step with no tier", known & ~tier_ok),
        ("gaps in step indices", known & tier_ok & gaps),
    ):
        n = int(sid[bad.to_numpy()].nunique())
        if n:
            left[reason] = n
    keep = (known & tier_ok & ~gaps).to_numpy()
    st = steps[keep].reset_index(drop=True)
    if len(st) == 0:
        raise OPEError(
            f"no run of the log can be evaluated ({', '.join(f'{v} {k}' for k, v in left.items())})"
        )
    recs = records_from_frames(runs, st)
    ids = st["run_id"].astype(str).to_numpy()
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ptr = np.r_[bounds, len(ids)].astype(np.int64)
    run_ids = [str(ids[i]) for i in bounds]
    a = (st["tier"] == "frontier").to_numpy().astype(np.int8)
    spans = list(zip(run_ids, ptr[:-1], ptr[1:], strict=True))
    cost = np.concatenate([step_costs(recs[r], a[s:e], prices) for r, s, e in spans])
    warm = np.concatenate([run_warm(recs[r], a[s:e]) for r, s, e in spans])
    X = np.full((len(st), N_FEATURES), np.nan)
    if "features" in st:
        for i, f in enumerate(st["features"].tolist()):
            if f is not None and not (isinstance(f, float)) and len(f) == N_FEATURES:
                X[i] = np.asarray(f, dtype=np.float64)
    started: dict[str, float] = {}
    if len(runs) and "started_at" in runs:
        for r, t in zip(runs["run_id"].astype(str), runs["started_at"], strict=True):
            if t is not None and not pd.isna(t):
                started[r] = float(t)
    return LoggedRuns(
        run_ids=run_ids,
        ptr=ptr,
        a=a,
        mu=pd.to_numeric(st["propensity"]).to_numpy(dtype=np.float64),
        explore=st["explore"].fillna(False).astype(bool).to_numpy()
        if "explore" in st
        else np.zeros(len(st), bool),
        success=np.array([1.0 if outcome[r] == "success" else 0.0 for r in run_ids]),
        cost=cost,
        X=X,
        records=recs,
        steps=st,
        started=started,
        left_out=left,
        domains=run_context(runs)[0],
        warm=warm,
    )


class CachedPredictor:
    """``inner``'s predictions for the logged feature vectors, computed in one batch; any other
    vector is predicted on demand. While a candidate agrees with the log, its replayed features are
    the logged ones, so a replay asks the model row by row only at the few steps where it could not
    be batched. Same values as ``inner`` (``predict_batch`` equals ``predict_features`` row-wise)."""

    def __init__(self, inner: Predictor, X: np.ndarray):
        self.inner = inner
        self.version = getattr(inner, "version", "none")
        self.needs_features = getattr(inner, "needs_features", True)
        uniq = np.unique(np.ascontiguousarray(X, dtype=np.float64), axis=0) if len(X) else X
        self._cache = (
            dict(zip((r.tobytes() for r in uniq), inner.predict_batch(uniq), strict=True))
            if len(uniq)
            else {}
        )

    def predict_features(self, x: np.ndarray) -> Predictions:
        row = np.ascontiguousarray(x, dtype=np.float64)
        hit = self._cache.get(row.tobytes())
        return hit if hit is not None else self.inner.predict_features(row)

    def predict(self, prefix: RunPrefix) -> Predictions:
        return self.inner.predict(prefix)

    def predict_batch(self, X: np.ndarray) -> list[Predictions]:
        return [self.predict_features(r) for r in np.asarray(X, dtype=np.float64)]


@dataclass
class Replayed:
    """A candidate's replayed decisions on logged runs (module docstring)."""

    pi: np.ndarray
    pf: np.ndarray
    deviated_runs: int
    unsupported_runs: int
    first_unsupported: tuple[str, int] | None
    reasons: dict[str, int]


class _OPEPort:
    """The off-policy replay's I/O (:class:`router.core.driver.StepPort`) for one logged step:
    the deployment's backends, no admission, the candidate's decision compared with the log (and
    the logged action forced past its deviation), the logged result served."""

    __slots__ = ("template", "logged", "replicas", "why", "i", "j", "run", "off", "view", "pi", "pf", "tally")

    def __init__(self, template: list[BackendState], logged: LoggedRuns):
        n = len(logged.a)
        st = logged.steps
        self.template = template
        self.logged = logged
        self.replicas: list[object] = st["replica"].tolist() if "replica" in st else [None] * n
        self.why: list[object] = st["reason"].tolist() if "reason" in st else [None] * n
        self.i = self.j = 0
        self.run: RunState | None = None
        self.off = False  # the run's walk is past the candidate's deviation
        self.view: StepView | None = None
        self.pi, self.pf = np.zeros(n), np.zeros(n)
        self.tally = _Tally()

    def backends(self) -> list[BackendState]:
        return [replace(b) for b in self.template]

    def claim(self, limit: int | None) -> bool:  # no admission in a replay: never asked
        return True

    def forced(self, plan: StepPlan) -> Decision | None:
        i, d, lg, v, run = self.i, plan.decision, self.logged, self.view, self.run
        assert v is not None and run is not None
        c = 1 if d.tier == "frontier" else 0
        t = self.tally
        if not self.off:
            self.pf[i] = float(c)
            t.reasons[d.reason] = t.reasons.get(d.reason, 0) + 1
            if c != lg.a[i]:
                self.off = True
                t.deviated += 1
                if lg.mu[i] >= 1.0 - 1e-12:
                    t.unsupported += 1
                    if t.first_bad is None:
                        t.first_bad = (run.run_id, self.j)
            else:
                self.pi[i] = 1.0
        if not self.off:
            return None
        # past its deviation the log says nothing of the candidate's outcome; the run is walked
        # on with the logged action so the candidate's budget state still sees its own scores
        # on the whole run and the spend the deployment made (``_logged_action``)
        return _logged_action(d, run, v.tier, self.replicas[i], self.why[i])

    def serve(self, plan: StepPlan, backend: BackendState | None) -> Served:
        v = self.view
        assert v is not None
        return Served(logged_result(v, v.cached_tokens), logged_end(v))


@dataclass
class _Tally:
    deviated: int = 0
    unsupported: int = 0
    first_bad: tuple[str, int] | None = None
    reasons: dict[str, int] = field(default_factory=dict)


def replay_candidate(
    logged: LoggedRuns,
    policy: Policy,
    predictor: Predictor,
    backends: list[BackendState] | None = None,
    epochs: Mapping[str, int] | None = None,
) -> Replayed:
    """See the module docstring."""
    from features.extract import step_views, steps_columns
    from router.core.budget import BudgetTracker
    from router.core.engine import StepEngine
    from router.core.record import logged_request
    from router.core.runs import RunTrack
    from router.policy.budget import budget_of
    from router.policy.types import RunState
    from router.replay import default_backends

    template = [replace(b) for b in (backends if backends is not None else default_backends())]
    cols = steps_columns(logged.steps)
    engine = StepEngine(max_steps=1 << 30)
    stateful = budget_of(policy) is not None  # its decisions read state built from other runs
    port = _OPEPort(template, logged)

    # every step and every run end in the logs' arrival order (per epoch), so a stateful (budgeted)
    # candidate reads the threshold its own scores on the runs ended before would have set
    events: list[tuple[int, float, int, int, int]] = []  # (epoch, time, 0 end / 1 step, run, step)
    for k, (r, lo, hi) in enumerate(zip(logged.run_ids, logged.ptr[:-1], logged.ptr[1:], strict=True)):
        ep = int(epochs.get(r, 0)) if epochs is not None else 0
        t_last = 0.0
        for j in range(hi - lo):
            v = step_views(cols, lo + j)
            t = float(v.arrival_s) if v.arrival_s is not None else t_last
            events.append((ep, t, 1, k, j))
            t_last = t + (float(v.latency_s) if v.latency_s is not None else 0.0)
        events.append((ep, t_last, 0, k, hi - lo))
    if stateful:  # else run by run, as logged (nothing crosses runs)
        events.sort()
    live: dict[int, tuple[RunState, RunTrack, list[bool]]] = {}
    epoch: int | None = None
    for ep, _t, kind, k, j in events:
        if ep != epoch:  # a new router process: its budget windows start afresh
            epoch, engine.frontier_budgets = ep, BudgetTracker()
        r, lo = logged.run_ids[k], int(logged.ptr[k])
        if kind == 0:
            got = live.pop(k, None)
            if got is not None:
                engine.run_ended(got[0])
            continue
        if k not in live:
            track0 = RunTrack.new(r, logged.started.get(r, step_views(cols, lo).arrival_s))
            track0.domain = logged.domains.get(r)
            live[k] = (RunState(run_id=r), track0, [False])
        run, track, off = live[k]
        if off[0] and not stateful:  # nothing of the candidate depends on the rest of this run
            continue
        i = lo + j
        v = step_views(cols, i)
        # the run context (C2): the logged signals, through the one converter of a logged step
        req = logged_request(cols, i, v, label=logged.records[r].needs_frontier)
        port.i, port.j, port.run, port.off, port.view = i, j, run, off[0], v
        engine.step(run, track, req, port, now=v.arrival_s, policy=policy, predictor=predictor)
        off[0] = port.off
    tally = port.tally
    return Replayed(port.pi, port.pf, tally.deviated, tally.unsupported, tally.first_bad, tally.reasons)


def _logged_action(d: Decision, run: RunState, tier: object, replica: object, reason: object) -> Decision:
    """``d`` with the logged tier, replica and reason (the candidate's scores kept)."""
    t: Tier = "frontier" if tier == "frontier" else "local"
    return replace(
        d,
        tier=t,
        backend=str(replica) if isinstance(replica, str) and replica else d.backend,
        reason=str(reason) if isinstance(reason, str) and reason else d.reason,
        switched=run.tier is not None and run.tier != t,
    )
