"""What-if capacity forecasts: closed-loop replay of logged runs through the router's own policy objects.

Algorithm (one capacity point = one :class:`Simulator` run):

1. **Workload** (:meth:`Workload.from_runlog`): each logged run becomes a list of steps (prompt and
   output tokens, logged tool pause, tool calls/results) plus a *block chain* for the prefix cache:
   the step's ``hash_ids`` when logged (Mooncake, 512-token blocks), otherwise a run-private chain
   derived from the growing prompt: step k shares its first ``reuse // block_tokens`` blocks with step
   k-1's chain (``reuse`` = ``prefix_reuse_tokens`` when logged, else the previous prompt + output) and
   gets fresh ids for the rest, over its prompt + output (what vLLM would hold after the step).
2. **Closed loop**: run starts follow the arrival process (:mod:`router.sim.arrivals`); step k+1 of a
   run arrives when step k finished plus step k+1's logged tool pause.
3. **Per step**, exactly as the sidecar does it: extend the run's :class:`RunPrefix` with the replayed
   history (simulated latency, tier, cached tokens), ``predictor.predict(prefix)`` (the bundle, or a
   constant), with ``local_cache_pressure`` from the node model as the sidecar reads it from vLLM's
   counters: hashed blocks newly written into the prefix cache of the run's local replica (the last
   one that served it) since the run's previous step ended / that replica's capacity in blocks,
   clipped to 1 (1 after a scale-to-zero wipe; None before the run was served locally); fill one
   :class:`BackendState` per simulated replica from its live state (running,
   waiting, KV usage, the run's warm prefix tokens, remaining wake time) and one for the frontier,
   ``build_snapshot``, ``policy.decide``, ``apply_decision``. At a run's first step the optional
   ``admission(snapshot, load) -> "admit-local" | "spill" | "reject"`` hook is consulted first: a
   spilled run is served by the frontier for all its steps without asking the policy; a rejected run's
   steps are all rejected.
4. The chosen local replica (:mod:`router.sim.node`) or the frontier (:mod:`router.sim.frontier`)
   serves the step; the completion event schedules the run's next step.
5. Each step ends exactly once as served-local, served-frontier, spilled or rejected (checked);
   :func:`scorecard` turns the per-step arrays into the ARCHITECTURE.md scorecard.

:func:`run_grid` runs every (policy x replicas x KV size) point on the same arrivals and adds the
built-in answers (:func:`answers`): the fewest replicas holding the p95 short-step SLO, scale-to-zero
vs always-on cost, and what doubling the KV cache does to the hit rate.

Knobs (:class:`SimConfig`): ``replicas``, ``kv_cache_gb`` (per replica), ``profile``,
``block_tokens`` (512: the Mooncake block size; also the KV allocation unit), ``frontier``
(:class:`FrontierConfig`), ``gpu_hour_usd`` (0.20 per GPU), ``scale_to_zero``, ``wake_s``
(267-282 s), ``idle_reap_s`` (1800 s), ``slo_short_s`` (p95 target and per-step SLO of short steps),
``slo_ttft_s`` (per-step SLO of long steps: their TTFT), ``local_model``, ``seed``, ``fast_forward``
(False = step every decode iteration; same results, slower: the reference in tests).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from features.prefix import RunPrefix, StepView
from models.types import Predictions
from router.policy.types import BackendState, Decision, Policy, RunState, Snapshot, apply_decision
from router.sim.engine import EventLoop
from router.sim.frontier import Frontier, FrontierConfig
from router.sim.node import Replica, Request
from router.sim.profiles import NodeProfile

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import RunLog

__all__ = [
    "SimError",
    "StepSpec",
    "RunSpec",
    "Workload",
    "SimConfig",
    "SimResult",
    "Simulator",
    "scorecard",
    "details",
    "SCORECARD_KEYS",
    "GridPoint",
    "run_grid",
    "answers",
    "admission_from_controller",
    "LazyFeatures",
    "SERVED_LOCAL",
    "SERVED_FRONTIER",
    "SPILLED",
    "REJECTED",
]

SERVED_LOCAL, SERVED_FRONTIER, SPILLED, REJECTED = 1, 2, 3, 4

# The inner loop builds BackendState positionally (keywords cost ~30% more); fail at import, not
# silently, if its field order ever changes.
_BACKEND_FIELDS = (
    "name",
    "tier",
    "model",
    "healthy",
    "max_context",
    "running",
    "waiting",
    "kv_usage",
    "warm_prefix_tokens",
    "price_in_per_m",
    "price_cached_in_per_m",
    "price_out_per_m",
    "prefill_s_per_token",
    "ttft_base_s",
)
if tuple(f.name for f in fields(BackendState)) != _BACKEND_FIELDS:  # pragma: no cover
    raise RuntimeError("router.sim.whatif: BackendState fields changed; update Simulator._backends")
SHORT_STEP_TOKENS = 64

SCORECARD_KEYS: tuple[str, ...] = (
    "policy",
    "replicas",
    "kv_cache_gb",
    "runs_completed",
    "runs_rejected",
    "runs_spilled",
    "run_completion_s_p50",
    "run_completion_s_p95",
    "step_latency_s_p50",
    "step_latency_s_p95",
    "step_latency_s_p99",
    "short_step_latency_s_p95",
    "ttft_s_p95",
    "cache_hit_rate",
    "cache_hit_upper_bound",
    "cost_usd",
    "escalation_rate",
    "flaps_per_run",
    "slo_attainment",
)


class SimError(ValueError):
    """A bad simulator input (workload, config or a policy answer naming no backend); one line."""


# --------------------------------------------------------------------------------------- workload


class StepSpec:
    """One logged step, pre-extracted for the inner loop (no pandas, no pydantic)."""

    __slots__ = (
        "prompt",
        "completion",
        "pause",
        "chain",
        "n_lookup",
        "n_cacheable",
        "upper",
        "short",
        "tool_calls",
        "tool_call_keys",
        "tool_results_n",
        "errors",
        "result_tokens",
        "structured",
    )

    def __init__(
        self,
        prompt: int,
        completion: int,
        pause: float,
        chain: tuple[int, ...],
        n_lookup: int,
        n_cacheable: int,
        upper: int,
        tool_calls: tuple[str, ...] = (),
        tool_call_keys: tuple[str, ...] = (),
        tool_results_n: int = 0,
        errors: tuple[bool, ...] = (),
        result_tokens: tuple[int, ...] = (),
        structured: bool | None = None,
    ):
        self.prompt = prompt
        self.completion = completion
        self.pause = pause
        self.chain = chain
        self.n_lookup = n_lookup
        self.n_cacheable = n_cacheable
        self.upper = upper
        self.tool_calls = tool_calls
        self.tool_call_keys = tool_call_keys
        self.tool_results_n = tool_results_n
        self.errors = errors
        self.result_tokens = result_tokens
        self.structured = structured
        self.short = completion <= SHORT_STEP_TOKENS or bool(tool_calls) or bool(structured)


@dataclass
class RunSpec:
    run_id: str
    steps: list[StepSpec]
    started_s: float = math.nan
    needs_frontier: bool | None = None


def _lead_common(a: Sequence[int], b: Sequence[int], n: int) -> int:
    i = 0
    lim = min(n, len(a), len(b))
    while i < lim and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Workload:
    """Runs ready for replay; immutable during simulation and shared by all grid points."""

    runs: list[RunSpec]
    block_tokens: int = 512

    @property
    def n_steps(self) -> int:
        return sum(len(r.steps) for r in self.runs)

    def mean_steps_per_run(self) -> float:
        return self.n_steps / max(len(self.runs), 1)

    def logged_starts(self) -> np.ndarray:
        return np.array([r.started_s for r in self.runs], dtype=float)

    @classmethod
    def from_runlog(cls, log: RunLog, block_tokens: int = 512, limit_runs: int | None = None) -> Workload:
        return cls.from_frames(log.steps, log.runs, block_tokens=block_tokens, limit_runs=limit_runs)

    @classmethod
    def from_frames(
        cls,
        steps: pd.DataFrame,
        runs: pd.DataFrame | None = None,
        *,
        block_tokens: int = 512,
        limit_runs: int | None = None,
    ) -> Workload:
        """Build from run-log frames (``steps`` sorted by run and step, as ``read_runlog`` returns them)."""
        if block_tokens < 1:
            raise SimError("block_tokens must be >= 1")
        if steps is None or len(steps) == 0:
            raise SimError("the run log holds no step records to replay")
        steps = steps.sort_values(["run_id", "step"], kind="stable")
        n = len(steps)

        def col(name: str, default: Any = None) -> list[Any]:
            if name not in steps.columns:
                return [default] * n
            return steps[name].tolist()

        import pandas as pd

        def isnull(v: Any) -> bool:
            return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))

        rid, prompt, comp = col("run_id"), col("prompt_tokens"), col("completion_tokens")
        pause, reuse, hashes = col("tool_pause_s"), col("prefix_reuse_tokens"), col("hash_ids")
        arrival = col("arrival_s")
        tcalls, tkeys, trn = col("tool_calls"), col("tool_call_keys"), col("tool_results_n", 0)
        terr, ttok, struct = col("tool_result_errors"), col("tool_result_tokens"), col("structured")

        starts: dict[str, float] = {}
        labels: dict[str, bool | None] = {}
        if runs is not None and len(runs):
            for r_id, sa, nf in zip(
                runs["run_id"].tolist(),
                runs["started_at"].tolist(),
                runs["needs_frontier"].tolist(),
                strict=True,
            ):
                if not isnull(sa):
                    starts[r_id] = float(sa)
                labels[r_id] = None if isnull(nf) else bool(nf)

        def tup(v: Any) -> tuple[Any, ...]:
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return ()
            return tuple(v.tolist() if hasattr(v, "tolist") else v)

        out: list[RunSpec] = []
        cur: RunSpec | None = None
        fresh = -1  # run-private block ids are negative, so they never collide with logged hash_ids
        chain_prev: tuple[int, ...] = ()
        seen: set[int] = set()
        prev_total = 0
        B = block_tokens
        for i in range(n):
            r = rid[i]
            if cur is None or r != cur.run_id:
                if limit_runs is not None and len(out) >= limit_runs:
                    break
                st = starts.get(r, math.nan)
                if math.isnan(st) and not isnull(arrival[i]):
                    st = float(arrival[i])
                cur = RunSpec(run_id=r, steps=[], started_s=st, needs_frontier=labels.get(r))
                out.append(cur)
                chain_prev, seen, prev_total = (), set(), 0
            p = int(prompt[i])
            c = int(comp[i])
            if p < 0 or c < 0:
                raise SimError(f"run {r}: negative token counts")
            k = len(cur.steps)
            logged_reuse = None if isnull(reuse[i]) else int(reuse[i])
            h = hashes[i]
            if h is not None and not (isinstance(h, float) and math.isnan(h)) and len(h):
                # logged block hashes: the repeated prefix = leading blocks seen earlier in the run
                chain = tuple(int(x) for x in (h.tolist() if hasattr(h, "tolist") else h))
                n_lookup = min(p // B, len(chain))
                n_cache = n_lookup
                rep = 0
                while rep < n_lookup and chain[rep] in seen:
                    rep += 1
                seen.update(chain[:n_cache])
                repeated = rep * B
            else:
                # run-private chain: share the blocks of the repeated prefix, fresh ids for the rest
                repeated = 0
                if k > 0:
                    repeated = logged_reuse if logged_reuse is not None else min(prev_total, p)
                total_full = (p + c) // B
                shared = min(repeated // B, len(chain_prev), total_full)
                ids = list(chain_prev[:shared])
                for _ in range(total_full - shared):
                    ids.append(fresh)
                    fresh -= 1
                chain = tuple(ids)
                n_lookup = min(p // B, len(chain))
                n_cache = len(chain)
            upper = max(repeated, logged_reuse or 0) if k > 0 else 0
            upper = min(upper, max(p - 1, 0))
            pz = 0.0 if isnull(pause[i]) else max(0.0, float(pause[i]))
            s_val = None if isnull(struct[i]) else bool(struct[i])
            cur.steps.append(
                StepSpec(
                    p,
                    c,
                    pz,
                    chain,
                    n_lookup,
                    n_cache,
                    upper,
                    tup(tcalls[i]),
                    tup(tkeys[i]),
                    0 if isnull(trn[i]) else int(trn[i]),
                    tup(terr[i]),
                    tup(ttok[i]),
                    s_val,
                )
            )
            chain_prev = chain
            prev_total = p + c
        return cls(runs=out, block_tokens=B)


# --------------------------------------------------------------------------------------- config


@dataclass
class SimConfig:
    profile: NodeProfile
    replicas: int = 2
    kv_cache_gb: float = 16.0
    block_tokens: int = 512
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    gpu_hour_usd: float = 0.20
    scale_to_zero: bool = False
    wake_s: tuple[float, float] = (267.0, 282.0)
    idle_reap_s: float = 1800.0
    slo_short_s: float = 5.0
    slo_ttft_s: float = 5.0
    local_model: str = "local"
    seed: int = 0
    fast_forward: bool = True  # False: one event per decode iteration (the reference for tests)

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise SimError("replicas must be >= 0")
        if self.kv_cache_gb <= 0:
            raise SimError("kv_cache_gb must be > 0")
        if self.wake_s[0] > self.wake_s[1] or self.wake_s[0] < 0:
            raise SimError("wake_s must be (low, high) with 0 <= low <= high")
        if self.gpu_hour_usd < 0:
            raise SimError("gpu_hour_usd must be >= 0")

    def kv_blocks(self) -> int:
        return self.profile.kv_capacity_tokens(self.kv_cache_gb) // self.block_tokens


@dataclass
class SimResult:
    """Per-step arrays (indexed by global step id) and per-run/totals of one simulation."""

    policy: str
    config: SimConfig
    outcome: np.ndarray
    latency: np.ndarray
    ttft: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    upper: np.ndarray
    short: np.ndarray
    step_index: np.ndarray
    run_of_step: np.ndarray
    run_completion_s: np.ndarray  # nan for runs not completed
    run_status: np.ndarray  # 0 policy-routed, 1 spilled, 2 rejected
    run_switches: np.ndarray
    run_frontier_steps: np.ndarray
    frontier_cost_usd: float
    gpu_hours: float
    cold_starts: int
    makespan_s: float
    wall_s: float
    cpu_s: float  # this process's CPU time (the machine is shared: wall time is noisy)
    events: int
    rate_limited: int
    iterations: int

    @property
    def local_cost_usd(self) -> float:
        return self.gpu_hours * self.config.gpu_hour_usd

    @property
    def cost_usd(self) -> float:
        return self.frontier_cost_usd + self.local_cost_usd


class _Run:
    __slots__ = (
        "idx",
        "spec",
        "state",
        "prefix",
        "k",
        "start_t",
        "g0",
        "status",
        "frontier_steps",
        "on_local",
        "local_tokens",
        "cache_rep",
        "cache_mark",
        "cache_wipes",
    )

    def __init__(self, idx: int, spec: RunSpec, g0: int):
        self.idx = idx
        self.spec = spec
        self.state = RunState(run_id=spec.run_id)
        self.prefix = RunPrefix(run_id=spec.run_id, steps=[])
        self.k = 0
        self.start_t = 0.0
        self.g0 = g0
        self.status = 0
        self.frontier_steps = 0
        self.on_local = False  # counted in the active-local-runs figure the admission hook sees
        self.local_tokens = 0  # uncached prompt + output tokens served locally
        # local_cache_pressure: the run's local replica (the last that served it) and that replica's
        # inserted-block counter and wipe count when the run's previous step ended
        self.cache_rep: Replica | None = None
        self.cache_mark = 0
        self.cache_wipes = 0


class LazyFeatures(Mapping[str, float]):
    """The snapshot's named features, extracted (``features.extract.extract_dict``) on first read.

    Policies that never read ``snapshot.features`` (all of router.policy's today) then cost nothing
    for them; a policy that reads them gets exactly what the sidecar would compute. When the vector
    was already extracted for the predictor it is reused.
    """

    __slots__ = ("_prefix", "_vec", "_d")

    def __init__(self, prefix: RunPrefix, vec: Any = None):
        self._prefix = prefix
        self._vec = vec
        self._d: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._d is None:
            from features.extract import FEATURE_NAMES, extract_dict

            if self._vec is not None:
                self._d = {n: float(v) for n, v in zip(FEATURE_NAMES, self._vec, strict=True)}
            else:
                self._d = extract_dict(self._prefix)
        return self._d

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class _ConstPredictor:
    def __init__(self) -> None:
        self.p = Predictions(p_frontier=0.0)

    def predict(self, prefix: RunPrefix) -> Predictions:
        return self.p


AdmissionHook = Callable[[Snapshot, Any], Any]


def _verdict(v: Any) -> str:
    s = getattr(v, "verdict", v)
    if s not in ("admit-local", "spill", "reject"):
        raise SimError(f"admission hook returned {s!r} (expected admit-local, spill or reject)")
    return str(s)


def admission_from_controller(controller: Any) -> AdmissionHook:
    """Adapt :class:`router.policy.admission.AdmissionController` to the simulator's admission hook."""

    def hook(snap: Snapshot, load: Any) -> str:
        return controller.decide(load, priority=snap.run.priority, tenant=snap.run.tenant).verdict

    return hook


class Simulator:
    """One closed-loop replay of ``workload`` under ``policy`` at one capacity point.

    ``predictor``: anything with ``predict(prefix) -> Predictions`` (a ``ModelBundle``); default a
    constant (p_frontier 0). ``snapshot_builder``: default :func:`router.policy.snapshot.build_snapshot`
    (the sidecar's). ``admission``: optional hook ``(snapshot, load) -> verdict`` consulted at step 0,
    where ``load`` is a :class:`router.policy.admission.LoadSnapshot` of the simulated local tier.
    ``starts``: run start times (seconds), one per run.
    """

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        config: SimConfig,
        starts: np.ndarray,
        *,
        predictor: Any = None,
        snapshot_builder: Callable[..., Snapshot] | None = None,
        admission: AdmissionHook | None = None,
    ):
        if len(starts) != len(workload.runs):
            raise SimError(f"{len(starts)} start times for {len(workload.runs)} runs")
        if workload.block_tokens != config.block_tokens:
            raise SimError("workload and config disagree on block_tokens")
        if snapshot_builder is None:
            from router.policy.snapshot import build_snapshot

            snapshot_builder = build_snapshot
        self.workload = workload
        self.policy = policy
        self.cfg = config
        self.starts = np.asarray(starts, dtype=float)
        self.predictor = predictor if predictor is not None else _ConstPredictor()
        # a bundle exposes predict_features: extract the vector once, for the model and the snapshot
        self._predict_features = getattr(self.predictor, "predict_features", None)
        if self._predict_features is not None:
            from features.extract import extract

            self._extract = extract
        self.build_snapshot = snapshot_builder
        self.admission = admission
        if admission is not None:
            from router.policy.admission import LoadSnapshot

            self._load_snapshot = LoadSnapshot
        self.loop = EventLoop(start=0.0, seed=config.seed)
        blocks = config.kv_blocks()
        self.replicas = [
            Replica(
                f"local-{i}",
                config.profile,
                self.loop,
                blocks,
                config.block_tokens,
                self._local_done,
                scale_to_zero=config.scale_to_zero,
                wake_s=config.wake_s,
                idle_reap_s=config.idle_reap_s,
                fast_forward=config.fast_forward,
            )
            for i in range(config.replicas)
        ]
        self.by_name = {r.name: r for r in self.replicas}
        self.frontier = Frontier(config.frontier, self.loop.rng, config.block_tokens)
        self.local_max_context = min(config.profile.max_context, blocks * config.block_tokens)
        n = workload.n_steps
        self.outcome = np.zeros(n, dtype=np.int8)
        self.latency = np.full(n, np.nan)
        self.ttft = np.full(n, np.nan)
        self.cached = np.zeros(n, dtype=np.int64)
        self._runs: list[_Run] = []
        g = 0
        for i, spec in enumerate(workload.runs):
            self._runs.append(_Run(i, spec, g))
            g += len(spec.steps)
        self.run_completion = np.full(len(workload.runs), np.nan)
        self._active_local = 0
        self._runs_left = len(workload.runs)
        self._last_end = 0.0
        self._run_rate: float | None = None
        self._gpu_price = config.gpu_hour_usd * config.profile.gpus_per_replica

    # ------------------------------------------------------------------ state the policy sees
    def _backends(self, run: _Run, s: StepSpec, t: float) -> list[BackendState]:
        B = self.cfg.block_tokens
        prof = self.cfg.profile
        out = []
        for rep in self.replicas:
            warm = rep.lookup(s.chain, s.n_lookup) * B
            usage = (rep.used - len(rep.lru)) / rep.capacity
            out.append(
                BackendState(
                    rep.name,
                    "local",
                    self.cfg.local_model,
                    True,
                    self.local_max_context,
                    len(rep.running),
                    len(rep.waiting),
                    usage,
                    warm if warm < s.prompt else s.prompt,
                    self._gpu_price,
                    0.0,
                    0.0,
                    prof.b,
                    prof.a if rep.state == "on" else prof.a + rep.wake_remaining(t),
                )
            )
        fc = self.cfg.frontier
        fr = self.frontier
        out.append(
            BackendState(
                name=fc.name,
                tier="frontier",
                model=fc.model,
                healthy=True,
                max_context=fc.max_context,
                running=fr.running(t),
                warm_prefix_tokens=fr.cached_tokens(run.idx, s.chain, s.n_lookup, s.prompt, t),
                price_in_per_m=fc.price_in_per_m,
                price_cached_in_per_m=fc.price_cached_in_per_m,
                price_out_per_m=fc.price_out_per_m,
                prefill_s_per_token=fc.prefill_s_per_token,
                ttft_base_s=fc.ttft_p50_s,
            )
        )
        return out

    def _load(self) -> Any:
        return self._load_snapshot(
            healthy_replicas=len(self.replicas),
            active_local_runs=self._active_local,
            run_token_rate=self._run_rate,
            waiting_requests=sum(len(r.waiting) for r in self.replicas),
        )

    # ------------------------------------------------------------------ events
    def _start_run(self, run: _Run) -> None:
        run.start_t = self.loop.now
        self._arrive(run)

    def _arrive(self, run: _Run) -> None:
        t = self.loop.now
        s = run.spec.steps[run.k]
        prefix = run.prefix
        prefix.now_s = t
        prefix.run_started_s = run.start_t
        prefix.new_prompt_tokens = s.prompt
        prefix.new_tool_results_n = s.tool_results_n
        prefix.new_tool_result_errors = s.errors
        prefix.new_tool_result_tokens = s.result_tokens
        prefix.new_tool_pause_s = s.pause if run.k else None
        # prefix-cache turnover on the run's local replica since its previous step (features.prefix)
        rep = run.cache_rep
        if rep is None:
            prefix.local_cache_pressure = None
        elif rep.wipes != run.cache_wipes:
            prefix.local_cache_pressure = 1.0
        else:
            d = (rep.inserted - run.cache_mark) / rep.capacity
            prefix.local_cache_pressure = d if d < 1.0 else 1.0
        backends = self._backends(run, s, t)
        if self._predict_features is not None:
            vec = self._extract(prefix)
            preds = self._predict_features(vec)
            feats = LazyFeatures(prefix, vec)
        else:
            preds = self.predictor.predict(prefix)
            feats = LazyFeatures(prefix)
        # a read-only Mapping where Snapshot says dict: policies only read it
        snap = self.build_snapshot(
            run.state,
            prefix,
            preds,
            backends,
            label_needs_frontier=run.spec.needs_frontier,
            features=cast(dict, feats),
        )
        if run.k == 0 and self.admission is not None:
            verdict = _verdict(self.admission(snap, self._load()))
            run.state.admitted = verdict
            if verdict == "reject":
                run.status = 2
                self._reject_rest(run)
                return
            if verdict == "spill":
                run.status = 1
        if run.status == 1:
            fc = self.cfg.frontier
            dec = Decision(tier="frontier", backend=fc.name, model=fc.model, reason="admission-spill")
        else:
            dec = self.policy.decide(snap)
        apply_decision(run.state, dec, run.k)
        if dec.tier == "local":
            rep = self.by_name.get(dec.backend)
            if rep is None:
                raise SimError(
                    f"policy {getattr(self.policy, 'name', self.policy)!r} chose backend {dec.backend!r}, "
                    "which does not exist"
                )
            req = Request(run, s.prompt, s.completion, s.chain, s.n_lookup, t, self.cfg.block_tokens)
            if not rep.submit(req):
                run.status = 2
                self._reject_rest(run)
                return
            run.cache_rep = rep
            self._mark_local_active(run, True)
        else:
            ttft, lat, cached, _cost = self.frontier.serve(
                run.idx, s.prompt, s.completion, s.chain, s.n_lookup, s.n_cacheable, t
            )
            run.frontier_steps += 1
            self._mark_local_active(run, False)
            self.loop.schedule(t + lat, self._frontier_done, (run, t, ttft, lat, cached))

    def _mark_local_active(self, run: _Run, local: bool) -> None:
        if local != run.on_local:
            run.on_local = local
            self._active_local += 1 if local else -1

    def _reject_rest(self, run: _Run) -> None:
        g = run.g0 + run.k
        end = run.g0 + len(run.spec.steps)
        if np.any(self.outcome[g:end] != 0):
            raise SimError(f"run {run.spec.run_id}: a step was accounted twice")
        self.outcome[g:end] = REJECTED
        self._mark_local_active(run, False)
        self._run_ended()

    def _run_ended(self) -> None:
        self._last_end = self.loop.now
        self._runs_left -= 1
        if self._runs_left == 0:
            self.loop.stop()

    def _local_done(self, req: Request) -> None:
        run: _Run = req.key
        run.local_tokens += req.prompt - req.cached + req.gen_target
        self._step_done(
            run,
            req.arrival,
            req.first_token_t - req.arrival,
            req.end_t - req.arrival,
            req.cached,
            SERVED_LOCAL,
            "local",
        )

    def _frontier_done(self, arg: tuple[_Run, float, float, float, int]) -> None:
        run, t0, ttft, lat, cached = arg
        self._step_done(
            run, t0, ttft, lat, cached, SPILLED if run.status == 1 else SERVED_FRONTIER, "frontier"
        )

    def _step_done(
        self, run: _Run, t0: float, ttft: float, lat: float, cached: int, code: int, tier: str
    ) -> None:
        g = run.g0 + run.k
        if self.outcome[g] != 0:
            raise SimError(f"run {run.spec.run_id} step {run.k}: accounted twice")
        self.outcome[g] = code
        self.latency[g] = lat
        self.ttft[g] = ttft
        self.cached[g] = cached
        rep = run.cache_rep
        if rep is not None:
            run.cache_mark = rep.inserted
            run.cache_wipes = rep.wipes
        s = run.spec.steps[run.k]
        run.prefix.append(
            StepView(
                prompt_tokens=s.prompt,
                completion_tokens=s.completion,
                cached_tokens=cached,
                tool_calls=s.tool_calls,
                tool_call_keys=s.tool_call_keys,
                tool_results_n=s.tool_results_n,
                tool_result_errors=s.errors,
                tool_result_tokens=s.result_tokens,
                tool_pause_s=s.pause if run.k else None,
                arrival_s=t0,
                latency_s=lat,
                structured=s.structured,
                tier=tier,
            )
        )
        run.k += 1
        t = self.loop.now
        if run.k < len(run.spec.steps):
            self.loop.schedule(t + run.spec.steps[run.k].pause, self._arrive, run)
        else:
            dur = t - run.start_t
            self.run_completion[run.idx] = dur
            if run.local_tokens and dur > 0:  # EWMA of tokens/s one active run puts on the local tier
                r = run.local_tokens / dur
                self._run_rate = r if self._run_rate is None else 0.9 * self._run_rate + 0.1 * r
            self._mark_local_active(run, False)
            self.frontier.forget(run.idx)
            self._run_ended()

    # ------------------------------------------------------------------ driver
    def run(self) -> SimResult:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        for run, st in zip(self._runs, self.starts, strict=True):
            self.loop.schedule(float(st), self._start_run, run)
        self.loop.run()
        makespan = max(self._last_end, float(self.starts.max()) if len(self.starts) else 0.0)
        if self.cfg.scale_to_zero:
            for r in self.replicas:
                r.finalize(makespan)
            gpu_s = sum(r.billed_s for r in self.replicas)
        else:
            gpu_s = makespan * len(self.replicas)
        gpu_hours = gpu_s / 3600 * self.cfg.profile.gpus_per_replica
        if np.any(self.outcome == 0):
            missing = int(np.sum(self.outcome == 0))
            raise SimError(f"{missing} step(s) were never served, spilled or rejected (simulator bug)")
        w = self.workload
        ns = w.n_steps
        prompt = np.empty(ns, dtype=np.int64)
        upper = np.empty(ns, dtype=np.int64)
        short = np.empty(ns, dtype=bool)
        sidx = np.empty(ns, dtype=np.int64)
        rofs = np.empty(ns, dtype=np.int64)
        g = 0
        for i, spec in enumerate(w.runs):
            for k, s in enumerate(spec.steps):
                prompt[g], upper[g], short[g], sidx[g], rofs[g] = s.prompt, s.upper, s.short, k, i
                g += 1
        return SimResult(
            policy=str(getattr(self.policy, "name", type(self.policy).__name__)),
            config=self.cfg,
            outcome=self.outcome,
            latency=self.latency,
            ttft=self.ttft,
            cached=self.cached,
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
            cold_starts=sum(r.cold_starts for r in self.replicas),
            makespan_s=makespan,
            wall_s=time.perf_counter() - t_wall,
            cpu_s=time.process_time() - t_cpu,
            events=self.loop.events_run,
            rate_limited=self.frontier.rate_limited,
            iterations=sum(r.iterations for r in self.replicas),
        )


# --------------------------------------------------------------------------------------- scorecard


def _pct(x: np.ndarray, q: float) -> float | None:
    return None if x.size == 0 else round(float(np.percentile(x, q)), 6)


def scorecard(res: SimResult) -> dict[str, Any]:
    """The ARCHITECTURE.md scorecard of one simulation (keys: :data:`SCORECARD_KEYS`, in order).

    Served steps = local + frontier + spilled. Short step: <= 64 output tokens or a tool call.
    ``cache_hit_rate`` = cached / prompt tokens over local steps with index >= 1 (the 2nd step on);
    ``cache_hit_upper_bound`` = tokens repeating the run's earlier prefix / prompt tokens, same steps.
    ``escalation_rate`` = policy-routed runs with at least one frontier step / policy-routed runs.
    ``flaps_per_run`` = mean switches per policy-routed run. ``slo_attainment`` = served steps within
    the per-step SLO (short steps: latency <= ``slo_short_s``; others: TTFT <= ``slo_ttft_s``).
    ``cost_usd`` = frontier tokens x prices + local GPU-hours x ``gpu_hour_usd``.
    """
    cfg = res.config
    served = (res.outcome == SERVED_LOCAL) | (res.outcome == SERVED_FRONTIER) | (res.outcome == SPILLED)
    lat, ttft = res.latency[served], res.ttft[served]
    short = res.short[served]
    local2 = (res.outcome == SERVED_LOCAL) & (res.step_index >= 1)
    ptok = float(res.prompt[local2].sum())
    routed = res.run_status == 0
    completed = ~np.isnan(res.run_completion_s)
    ok = np.where(short, lat <= cfg.slo_short_s, ttft <= cfg.slo_ttft_s)
    card = {
        "policy": res.policy,
        "replicas": cfg.replicas,
        "kv_cache_gb": cfg.kv_cache_gb,
        "runs_completed": int(completed.sum()),
        "runs_rejected": int((res.run_status == 2).sum()),
        "runs_spilled": int((res.run_status == 1).sum()),
        "run_completion_s_p50": _pct(res.run_completion_s[completed], 50),
        "run_completion_s_p95": _pct(res.run_completion_s[completed], 95),
        "step_latency_s_p50": _pct(lat, 50),
        "step_latency_s_p95": _pct(lat, 95),
        "step_latency_s_p99": _pct(lat, 99),
        "short_step_latency_s_p95": _pct(lat[short], 95),
        "ttft_s_p95": _pct(ttft, 95),
        "cache_hit_rate": round(float(res.cached[local2].sum()) / ptok, 6) if ptok else None,
        "cache_hit_upper_bound": round(float(res.upper[local2].sum()) / ptok, 6) if ptok else None,
        "cost_usd": round(res.cost_usd, 6),
        "escalation_rate": round(float((res.run_frontier_steps[routed] > 0).mean()), 6)
        if routed.any()
        else None,
        "flaps_per_run": round(float(res.run_switches[routed].mean()), 6) if routed.any() else None,
        "slo_attainment": round(float(ok.mean()), 6) if ok.size else None,
    }
    assert tuple(card) == SCORECARD_KEYS
    return card


def details(res: SimResult) -> dict[str, Any]:
    """Figures beside the scorecard: cost split, cold starts, step outcomes, simulator speed."""
    oc = res.outcome
    return {
        "policy": res.policy,
        "replicas": res.config.replicas,
        "kv_cache_gb": res.config.kv_cache_gb,
        "scale_to_zero": res.config.scale_to_zero,
        "node_profile": res.config.profile.name,
        "frontier_cost_usd": round(res.frontier_cost_usd, 6),
        "local_cost_usd": round(res.local_cost_usd, 6),
        "gpu_hours": round(res.gpu_hours, 6),
        "cold_starts": res.cold_starts,
        "cold_start_cost_usd": round(
            res.cold_starts
            * sum(res.config.wake_s)
            / 2
            / 3600
            * res.config.profile.gpus_per_replica
            * res.config.gpu_hour_usd,
            6,
        ),
        "steps_local": int((oc == SERVED_LOCAL).sum()),
        "steps_frontier": int((oc == SERVED_FRONTIER).sum()),
        "steps_spilled": int((oc == SPILLED).sum()),
        "steps_rejected": int((oc == REJECTED).sum()),
        "makespan_s": round(res.makespan_s, 3),
        "rate_limited": res.rate_limited,
        "sim_wall_s": round(res.wall_s, 4),
        "sim_cpu_s": round(res.cpu_s, 4),
        "sim_steps_per_cpu_s": round(len(oc) / res.cpu_s, 1) if res.cpu_s else None,
        "events": res.events,
        "node_iterations": res.iterations,
    }


# --------------------------------------------------------------------------------------- grid


@dataclass
class GridPoint:
    scorecard: dict[str, Any]
    details: dict[str, Any]


def run_grid(
    workload: Workload,
    policies: dict[str, Callable[[], Policy]],
    replicas: Sequence[int],
    kv_cache_gb: Sequence[float],
    base: SimConfig,
    starts: np.ndarray,
    *,
    predictor: Any = None,
    snapshot_builder: Callable[..., Snapshot] | None = None,
    admission_factory: Callable[[], AdmissionHook] | None = None,
    compare_always_on: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every (policy x replicas x KV) point on the same ``starts``; returns scorecards, details, answers.

    ``policies`` maps a label to a factory (a fresh policy object per point); ``admission_factory``
    likewise makes a fresh admission hook per simulation (controllers keep hysteresis state). With
    ``base.scale_to_zero`` and ``compare_always_on`` each point also runs always-on (``always_on``).
    """
    cards: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    always_on: list[dict[str, Any]] = []
    for label, factory in policies.items():
        for n in replicas:
            for kv in kv_cache_gb:
                cfg = replace(base, replicas=int(n), kv_cache_gb=float(kv))
                res = Simulator(
                    workload,
                    factory(),
                    cfg,
                    starts,
                    predictor=predictor,
                    snapshot_builder=snapshot_builder,
                    admission=admission_factory() if admission_factory else None,
                ).run()
                res.policy = label
                cards.append(scorecard(res))
                dets.append(details(res))
                if progress:
                    progress(f"{label} replicas={n} kv={kv}GB: {len(res.outcome)} steps in {res.wall_s:.2f}s")
                if compare_always_on and base.scale_to_zero:
                    res2 = Simulator(
                        workload,
                        factory(),
                        replace(cfg, scale_to_zero=False),
                        starts,
                        predictor=predictor,
                        snapshot_builder=snapshot_builder,
                        admission=admission_factory() if admission_factory else None,
                    ).run()
                    res2.policy = label
                    always_on.append(
                        {
                            **scorecard(res2),
                            **{
                                k: v
                                for k, v in details(res2).items()
                                if k in ("gpu_hours", "local_cost_usd", "scale_to_zero")
                            },
                        }
                    )
    out: dict[str, Any] = {"scorecards": cards, "details": dets}
    if always_on:
        out["always_on"] = always_on
    out["answers"] = answers(cards, dets, always_on, base.slo_short_s)
    return out


def answers(
    cards: list[dict[str, Any]],
    dets: list[dict[str, Any]],
    always_on: list[dict[str, Any]],
    slo_short_s: float,
) -> dict[str, Any]:
    """The built-in questions, answered from the grid's scorecards."""
    fewest: dict[str, dict[str, Any]] = {}
    for c in cards:
        key = f"{c['policy']}@{c['kv_cache_gb']:g}GB"
        p95 = c["short_step_latency_s_p95"]
        ent = fewest.setdefault(
            key,
            {
                "policy": c["policy"],
                "kv_cache_gb": c["kv_cache_gb"],
                "replicas": None,
                "short_step_latency_s_p95": None,
            },
        )
        if (
            p95 is not None
            and p95 <= slo_short_s
            and (ent["replicas"] is None or c["replicas"] < ent["replicas"])
        ):
            ent["replicas"], ent["short_step_latency_s_p95"] = c["replicas"], p95
    kv_pairs = []
    by = {(c["policy"], c["replicas"], c["kv_cache_gb"]): c for c in cards}
    for (pol, n, kv), c in sorted(by.items(), key=lambda x: (x[0][0], x[0][1], x[0][2])):
        d = by.get((pol, n, kv * 2))
        if d is not None and c["cache_hit_rate"] is not None and d["cache_hit_rate"] is not None:
            kv_pairs.append(
                {
                    "policy": pol,
                    "replicas": n,
                    "kv_cache_gb": kv,
                    "cache_hit_rate": c["cache_hit_rate"],
                    "kv_cache_gb_doubled": kv * 2,
                    "cache_hit_rate_doubled": d["cache_hit_rate"],
                    "short_step_latency_s_p95": c["short_step_latency_s_p95"],
                    "short_step_latency_s_p95_doubled": d["short_step_latency_s_p95"],
                    "cache_hit_upper_bound": c["cache_hit_upper_bound"],
                }
            )
    out: dict[str, Any] = {
        "slo_short_step_s": slo_short_s,
        "fewest_replicas_for_short_step_slo": list(fewest.values()),
        "kv_doubling": kv_pairs,
    }
    if always_on:
        s2z = []
        ao = {(c["policy"], c["replicas"], c["kv_cache_gb"]): c for c in always_on}
        for c, d in zip(cards, dets, strict=True):
            a = ao.get((c["policy"], c["replicas"], c["kv_cache_gb"]))
            if a is None:
                continue
            s2z.append(
                {
                    "policy": c["policy"],
                    "replicas": c["replicas"],
                    "kv_cache_gb": c["kv_cache_gb"],
                    "cost_usd_scale_to_zero": c["cost_usd"],
                    "cost_usd_always_on": a["cost_usd"],
                    "gpu_hours_scale_to_zero": d["gpu_hours"],
                    "gpu_hours_always_on": a["gpu_hours"],
                    "cold_starts": d["cold_starts"],
                    "cold_start_cost_usd": d["cold_start_cost_usd"],
                    "short_step_latency_s_p95_scale_to_zero": c["short_step_latency_s_p95"],
                    "short_step_latency_s_p95_always_on": a["short_step_latency_s_p95"],
                    "slo_attainment_scale_to_zero": c["slo_attainment"],
                    "slo_attainment_always_on": a["slo_attainment"],
                }
            )
        out["scale_to_zero_vs_always_on"] = s2z
    return out
