"""The simulated deployment of the learning loop: paired tasks arrive, the router serves them through
the what-if simulator, outcomes are drawn from what the task's runs recorded.

Algorithm:

- **Tasks** (:meth:`World.from_log`): every task with runs of both the weak (local) and the strong
  (frontier) model in a paired run log (shipped tau2 pairs: ``task_id`` ``<domain>/<n>``). A task
  keeps the weak model's logged trajectory (its steps: tokens, tool calls, pauses; the first weak
  run when there are several) and the recorded success rates ``p_weak`` / ``p_strong`` (means over
  all the task's trials of each player, :func:`training.eval.trials.task_success`, the outcome
  model bench and OPE read too); ``needs_frontier`` = ``p_weak < 0.5 <= p_strong``.
- **Arrivals** (:meth:`World.arrivals`): ``n`` runs drawn with replacement from a task list, each a
  copy of its task's trajectory under a fresh run id, starting at Poisson times (``rate`` per
  second, seeded).
- **Serving** (:meth:`World.serve`): the what-if simulator (:class:`router.sim.simulator.Simulator`,
  the router's step engine) with ``log_steps=True``, so the engine writes the run-log step records
  (features, predictions, decision, propensity, explore flag), and ``scrape=False`` (the router's
  own in-flight view, as a sidecar without /metrics: the features a replay can rebuild). No
  admission control (the deployment is sized for its traffic).
- **Outcomes** (the demo's stated outcome model, :mod:`training.eval.outcome`): a run first on the
  frontier at step ``k`` succeeds with probability ``w p_strong + (1 - w) p_weak`` (``w`` by the
  outcome variant, 1 for ``escalate-anytime``); a run that stays local with ``p_weak``.
  :meth:`World.draw` draws the outcome (seeded) for the log; :meth:`World.truth` gives the
  expectation (the simulated truth a policy is scored by). Cost is the outcome model's
  (:func:`training.eval.outcome.run_costs` at :class:`~training.eval.outcome.Prices`), net value =
  ``value_of_success x success - cost``.

Knobs: ``weak_model`` / ``strong_model`` (roles), ``domain`` (a task_id prefix), ``prices``,
``variant``, ``value_of_success``, the simulator's ``SimConfig`` (:func:`sim_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router.core.accounting import gpu_usd
from training.eval.outcome import Prices, RunRecord, parse_variant, records_from_frames, run_costs
from training.eval.trials import task_success

__all__ = ["Task", "World", "Served", "sim_config", "sim_backends"]


@dataclass
class Task:
    task_id: str
    steps: Any  # the weak run's step rows (its own run_id)
    p_weak: float
    p_strong: float
    record: RunRecord

    @property
    def needs_frontier(self) -> bool:
        return self.p_weak < 0.5 <= self.p_strong


@dataclass
class Served:
    """One batch of runs served by a policy: step records, tiers and per-run figures."""

    run_ids: list[str]
    task_of: dict[str, str]
    starts: dict[str, float]
    records: list[Any]  # features.schema.Step
    tiers: dict[str, np.ndarray]  # run -> 0 local / 1 frontier per step
    success_p: np.ndarray  # expected success per run (truth)
    cost: np.ndarray  # USD per run (outcome model)
    explored: np.ndarray  # run explored (any step with explore)

    def net(self, value_of_success: float) -> np.ndarray:
        return value_of_success * self.success_p - self.cost

    def escalated(self) -> np.ndarray:
        return np.array([float(self.tiers[r].any()) for r in self.run_ids])


def sim_config(seed: int = 0, replicas: int = 4, gpu: str = "a100", prices: Prices | None = None) -> Any:
    """The loop's deployment: ``replicas`` local replicas (KV GB of router.policy.defaults), the outcome model's frontier
    prices, step records logged, no /metrics scrape."""
    from router.sim.frontier import FrontierConfig
    from router.sim.profiles import load_profile
    from router.sim.simconfig import SimConfig

    p = prices or Prices()
    return SimConfig(
        profile=load_profile(None, gpu),
        replicas=replicas,
        frontier=FrontierConfig(
            price_in_per_m=p.frontier_in_per_m,
            price_cached_in_per_m=p.frontier_cached_in_per_m,
            price_out_per_m=p.frontier_out_per_m,
        ),
        gpu_hour_usd=p.gpu_hour_usd,
        log_steps=True,
        scrape=False,
        seed=seed,
    )


def sim_backends(cfg: Any) -> list[Any]:
    """Static backend states priced like the simulator's (for replaying a candidate on its logs):
    the policy's tier economics read only these prices and latency terms."""
    from router.policy.types import BackendState

    prof, fc = cfg.profile, cfg.frontier
    ctx = min(prof.max_context, cfg.kv_blocks() * cfg.block_tokens)
    out = [
        BackendState(
            f"local-{i}",
            "local",
            cfg.local_model,
            max_context=ctx,
            prefill_s_per_token=prof.b,
            ttft_base_s=prof.a,
            gpu_usd_per_hour=gpu_usd(3600.0, cfg.gpu_hour_usd, prof.gpus_per_replica),
        )
        for i in range(cfg.replicas)
    ]
    out.append(
        BackendState(
            fc.name,
            "frontier",
            fc.model,
            max_context=fc.max_context,
            price_in_per_m=fc.price_in_per_m,
            price_cached_in_per_m=fc.price_cached_in_per_m,
            price_out_per_m=fc.price_out_per_m,
            prefill_s_per_token=fc.prefill_s_per_token,
            ttft_base_s=fc.ttft_p50_s,
        )
    )
    return out


@dataclass
class World:
    tasks: dict[str, Task]
    prices: Prices = field(default_factory=Prices)
    variant: Any = "escalate-anytime"
    value_of_success: float = 1.0

    @classmethod
    def from_log(
        cls, log: Any, weak_model: str, strong_model: str, domain: str | None = None, **kw: Any
    ) -> World:
        runs, steps = log.runs, log.steps
        runs = runs[runs["task_id"].notna() & runs["outcome"].isin(["success", "failure"])]
        if domain is not None:
            runs = runs[runs["task_id"].astype(str).str.startswith(f"{domain}/")]
        # the one outcome model (training.eval.trials): mean over all of a player's trials on a task
        rate = {m: task_success(runs, m)["p"] for m in (weak_model, strong_model)}
        weak_runs = runs[runs["model"] == weak_model].drop_duplicates("task_id")
        with_steps = set(steps["run_id"].astype(str))
        tasks: dict[str, Task] = {}
        for rid, tid in zip(weak_runs["run_id"].astype(str), weak_runs["task_id"].astype(str), strict=True):
            if tid not in rate[strong_model].index or rid not in with_steps:
                continue
            st = steps[steps["run_id"] == rid].sort_values("step").reset_index(drop=True)
            rec = records_from_frames(None, st)[rid]
            tasks[tid] = Task(tid, st, float(rate[weak_model][tid]), float(rate[strong_model][tid]), rec)
        if not tasks:
            raise ValueError(f"no task has runs of both {weak_model} (with steps) and {strong_model}")
        return cls(tasks=dict(sorted(tasks.items())), **kw)

    # ------------------------------------------------------------------ arrivals and serving
    def arrivals(
        self, task_ids: list[str], n: int | None = None, *, rate: float, seed: int, prefix: str
    ) -> tuple[Any, Any, dict[str, float]]:
        """``(runs frame, steps frame, start per run)`` of ``n`` runs drawn with replacement from
        ``task_ids`` (module docstring); ``n=None``: each listed task once, in order."""
        import pandas as pd

        from features.runlog import conform

        rng = np.random.default_rng(seed)
        if n is None:
            n, pick = len(task_ids), np.arange(len(task_ids))
        else:
            pick = rng.integers(0, len(task_ids), size=n)
        gaps = rng.exponential(1.0 / rate, size=n)
        t0 = np.cumsum(gaps) - gaps[0]
        runs, frames, starts = [], [], {}
        for i, (j, t) in enumerate(zip(pick, t0, strict=True)):
            task = self.tasks[task_ids[int(j)]]
            rid = f"{prefix}-{i:05d}"
            st = task.steps.copy()
            st["run_id"] = rid
            # the trajectory relative to its start; the serving router stamps the times
            for c in (
                "features",
                "predictions",
                "decision",
                "reason",
                "tier",
                "replica",
                "propensity",
                "explore",
            ):
                st[c] = None
            frames.append(st)
            runs.append(
                {
                    "record": "run",
                    "run_id": rid,
                    "source": "loop",
                    "task_id": task.task_id,
                    "started_at": float(t),
                    "needs_frontier": task.needs_frontier,
                    "schema_version": 1,
                }  # fmt: skip
            )
            starts[rid] = float(t)
        steps = pd.concat(frames, ignore_index=True)
        return conform(pd.DataFrame(runs)), steps, starts

    def serve(
        self, runs: Any, steps: Any, starts: dict[str, float], policy: Any, predictor: Any, cfg: Any
    ) -> Served:
        """Serve the runs under ``policy`` in the simulator; expected success and cost per run."""
        from router.sim.simulator import Simulator
        from router.sim.workload import Workload

        wl = Workload.from_frames(steps, runs)
        st = np.array([starts[r.run_id] for r in wl.runs])
        res = Simulator(wl, policy, cfg, st, predictor=predictor).run()
        task_of = dict(zip(runs["run_id"].astype(str), runs["task_id"].astype(str), strict=True))
        by_run: dict[str, list[Any]] = {}
        for rec in res.records or []:
            by_run.setdefault(rec.run_id, []).append(rec)
        ids = [r.run_id for r in wl.runs]
        tiers, succ, cost, expl = {}, np.zeros(len(ids)), np.zeros(len(ids)), np.zeros(len(ids), dtype=bool)
        v = parse_variant(self.variant)
        for i, rid in enumerate(ids):
            recs = sorted(by_run.get(rid, []), key=lambda r: r.step)
            t = np.array([1 if r.tier == "frontier" else 0 for r in recs], dtype=np.int64)
            tiers[rid] = t
            task = self.tasks[task_of[rid]]
            succ[i] = self.expected(task, t, v)
            cost[i] = run_costs(task.record, t, self.prices)[0]
            expl[i] = any(bool(r.explore) for r in recs)
        return Served(ids, task_of, starts, list(res.records or []), tiers, succ, cost, expl)

    @staticmethod
    def expected(task: Task, tiers: np.ndarray, variant: Any) -> float:
        idx = np.flatnonzero(tiers == 1)
        if idx.size == 0:
            return task.p_weak
        w = variant.weight(int(idx[0]), tiers, task.record)
        return w * task.p_strong + (1.0 - w) * task.p_weak

    def run_records(self, served: Served, seed: int) -> list[dict[str, Any]]:
        """Run records with outcomes drawn from the outcome model (the deployment's labels)."""
        rng = np.random.default_rng(seed)
        u = rng.random(len(served.run_ids))
        out = []
        for i, rid in enumerate(served.run_ids):
            ok = bool(u[i] < served.success_p[i])
            task = self.tasks[served.task_of[rid]]
            out.append(
                {
                    "record": "run",
                    "run_id": rid,
                    "source": "loop",
                    "task_id": task.task_id,
                    "started_at": served.starts[rid],
                    "outcome": "success" if ok else "failure",
                    "reward": 1.0 if ok else 0.0,
                    "needs_frontier": task.needs_frontier,
                    "n_steps": int(len(served.tiers[rid])),
                    "schema_version": 1,
                }  # fmt: skip
            )
        return out
