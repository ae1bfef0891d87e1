"""Prefix-aware placement on the Mooncake conversation hour: hit rates vs the reachable figure, p95s.

Usage::

    .venv/bin/python bench/prefix_placement.py [--data ../shared/data] [--replicas N] [--kv-cache-gb auto|16]
        [--gpu a100] [--slo-s 10] [--no-find] [--limit-runs N] [--runs-window 0:20] [--split-min 20]
        [--policies always-local,prefix-aware] [--scoring '{"kv_tokens": 2000}']
        [--out runroute-report/prefix_placement]

Algorithm:

1. Import the whole Mooncake conversation trace (``features.importers.mooncake``; the trace's
   ``hash_ids`` are the block chains) and replay it closed-loop with its logged run starts
   (``--arrivals trace``) through the what-if simulator at one deployment (node profile of
   ``--gpu``, ``--kv-cache-gb`` per replica (default ``auto``: what ``runroute whatif`` derives for
   the profile's GPU, 58.2 GB on the A100-80GB profile; the fallback constant where the profile has
   no memory figures), ``--replicas``; default the capacity pre-check's
   suggested start) under ``always-local`` (load-balanced, the baseline), ``session-sticky`` and
   ``prefix-aware`` (:class:`router.policy.baselines.PrefixAwarePolicy`: the prefix index + the
   prefix-cost pick). The simulator places through the step engine's prefix index, as the sidecar.
2. Hit rates over the steps the scorecard counts (each run's 2nd step on, served locally) and over
   all steps (first steps of runs too: reuse *across* runs):
   - **infinite-cache bound**: prompt tokens repeating an earlier prefix (the scorecard's
     ``cache_hit_upper_bound`` for the 2nd step on: the run's own earlier prefix; for all steps
     the logged ``prefix_reuse_tokens``: any earlier request's);
   - **reachable**: a perfect placement that can use every replica's KV as one pooled LRU prefix
     cache of ``replicas x KV blocks`` (:func:`training.dataset.lru_replay`, the simulator's cache
     model, steps in logged arrival order, each admitted alone): what placement could reach at the
     deployment's total KV size, with no load and no concurrency. **Not a bound**: per-replica LRU
     can beat one pooled LRU (partitioning keeps a hot set LRU would flush: session-sticky and
     prefix-aware exceed it); kept as the issue's reference figure;
   - **KV bound**: Belady's MIN on the same pooled KV (:func:`belady_hits`, same order): the
     replicas' caches together hold at most that many distinct blocks and MIN is the optimal
     eviction for one cache, so no placement with per-replica caches of that total size holds
     more of the requested blocks (it counts any held block of a step's chain, not only its
     leading run; up to the per-step cap). Caveat for both: logged arrival order, while the
     closed-loop simulation serves later steps when earlier ones finish;
   - each policy's simulated ``cached / prompt`` and its share of the reachable figure
     (target >= 80%), beside its short-step p95, per-step p95 (all steps, end to end) and TTFT
     p95 (target: no worse than always-local's).
3. The cached-token prediction read from the index (the engine's belief of the matched prefix on
   the replica it chose, ``StepPlan.warm_tokens``) against the simulated cached tokens (the node's
   cache model, which also holds running requests' blocks and evicts on admission): MAE per step on
   the last 20% of the hour by arrival time, on every run's first step and on all steps, beside
   predicting 0. No learned correction is trained or added here.
4. Unless ``--no-find``: ``find replicas`` for ``--slo-s`` (short-step p95) per policy, before
   (always-local) and after (prefix-aware), as ``runroute whatif --find replicas`` does.
5. Unless ``--split-min 0``: the same figures over the steps of the runs starting at or after
   minute ``--split-min`` of the whole-hour simulation (the part held out of a knob search on the
   first 20 minutes).
6. A rich table, ``<out>.json`` and ``<out>.png``.

Knobs: the prefix-aware knobs are its config defaults unless ``--scoring`` overrides some (a knob
search); ``--runs-window START:END`` simulates only the runs whose logged start lies in it (minutes).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

POLICIES = ("always-local", "session-sticky", "prefix-aware")


def reachable(
    log: Any, work: Any, blocks: int, replicas: int, bt: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per workload step (run, step order): the pooled-LRU hit, the any-earlier-request bound and
    the pooled Belady hit (:func:`belady_hits`)."""
    from training.dataset import lru_replay

    st = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    order = np.argsort(st["arrival_s"].to_numpy(dtype=np.float64), kind="stable")
    sub = st.iloc[order]
    hits, _ = lru_replay(
        sub["hash_ids"].tolist(),
        sub["run_id"].tolist(),
        sub["prompt_tokens"].to_numpy(),
        blocks * replicas,
        bt,
        sub["completion_tokens"].to_numpy(),
    )
    out = np.empty(len(st))
    out[order] = hits
    opt = np.empty(len(st))
    chains = [[int(b) for b in c] for c in sub["hash_ids"].tolist()]
    opt[order] = belady_hits(chains, sub["prompt_tokens"].to_numpy(), blocks * replicas, bt)
    anyprev = st["prefix_reuse_tokens"].fillna(0).to_numpy(dtype=np.float64)
    anyprev = np.minimum(anyprev, np.maximum(st["prompt_tokens"].to_numpy(dtype=np.float64) - 1, 0))
    if len(out) != work.n_steps:
        raise RuntimeError("the workload and the log disagree on the steps")
    return out, anyprev, opt


def belady_hits(chains: list[list[int]], prompts: np.ndarray, capacity: int, bt: int) -> np.ndarray:
    """Cached tokens per step (steps in the given order) under Belady's MIN on one cache of
    ``capacity`` blocks: on a miss the block is cached unless every cached block is needed again
    sooner, else the one needed latest is evicted (optimal offline eviction, with bypass). A step's
    hit = its chain's blocks found cached, capped like the node cache's count (its full prompt
    blocks, at most ``prompt - 1`` tokens in whole blocks)."""
    import heapq

    refs = [b for c in chains for b in c]
    never = len(refs) + 1
    nxt = [never] * len(refs)
    seen: dict[int, int] = {}
    for i in range(len(refs) - 1, -1, -1):
        nxt[i] = seen.get(refs[i], never)
        seen[refs[i]] = i
    cache: dict[int, int] = {}  # block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped
    out = np.zeros(len(chains))
    i = 0
    for k, c in enumerate(chains):
        hit = 0
        for b in c:
            nu = nxt[i]
            i += 1
            if b in cache:
                hit += 1
            elif len(cache) >= capacity:
                while -heap[0][0] != cache.get(heap[0][1], -1):
                    heapq.heappop(heap)
                if -heap[0][0] <= nu:
                    continue  # bypass: every cached block is needed no later than this one
                del cache[heapq.heappop(heap)[1]]
            cache[b] = nu
            heapq.heappush(heap, (-nu, b))
        p = int(prompts[k])
        out[k] = min(hit, p // bt, max(p - 1, 0) // bt) * bt
    return out


def run_start_s(log: Any) -> Any:
    """Each run's logged start (its first step's arrival), seconds from the trace's first arrival."""
    st = log.steps
    first = st.groupby("run_id", sort=False)["arrival_s"].min()
    return first - float(st["arrival_s"].min())


def split_figures(log: Any, res: Any, reach: np.ndarray, opt: np.ndarray, split_s: float) -> dict[str, Any]:
    """Hit rate, reachable, share and p95s over the steps of the runs starting at or after
    ``split_s`` (the whole hour simulated, so the caches are warm at the split)."""
    from router.core.figures import step_figures
    from router.sim.scorecard import SERVED_FRONTIER, SERVED_LOCAL, SPILLED

    st = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    rs = run_start_s(log)
    m = st["run_id"].map(rs).to_numpy(dtype=np.float64) >= split_s
    oc = res.outcome
    served = m & ((oc == SERVED_LOCAL) | (oc == SERVED_FRONTIER) | (oc == SPILLED))
    local = m & (oc == SERVED_LOCAL)
    f = step_figures(
        served=served,
        local=local,
        step=res.step_index,
        prompt=res.prompt,
        cached=res.cached,
        upper=res.upper,
        latency=res.latency,
        ttft=res.ttft,
        short=res.short,
    )
    later = local & (res.step_index >= 1)
    p2 = float(res.prompt[later].sum())
    rch = float(reach[later].sum()) / p2 if p2 else None
    kvb = float(opt[later].sum()) / p2 if p2 else None
    hit = f["cache_hit_rate"]
    return {
        "runs": int(len(set(st["run_id"][m]))),
        "hit_rate": hit,
        "reachable": rch,
        "share_of_reachable": hit / rch if hit is not None and rch else None,
        "kv_bound": kvb,
        "short_step_latency_s_p95": f["short_step_latency_s_p95"],
        "step_latency_s_p95": f["step_latency_s_p95"],
    }


def index_sim(*args: Any) -> Any:
    """A :class:`~router.sim.simulator.Simulator` that also keeps, per step, the engine's prefix-index
    belief of the step's cached tokens on the replica it chose (``plan.warm_tokens``)."""
    from router.sim.simulator import Simulator

    class _Sim(Simulator):
        def _step_done(self, run: Any, ttft: float, lat: float, cached: int, code: int, tier: str) -> None:
            self.index_pred[run.g0 + run.k] = run.turn.planned.warm_tokens if tier == "local" else 0
            super()._step_done(run, ttft, lat, cached, code, tier)

    sim = _Sim(*args)
    sim.index_pred = np.zeros(len(sim.outcome))  # type: ignore[attr-defined]
    return sim


def index_mae(log: Any, res: Any, pred: np.ndarray, share: float) -> dict[str, Any]:
    """MAE (tokens per step) of the index's cached-token belief vs the simulated cached tokens, and
    of predicting 0: on the steps arriving in the last ``share`` of the trace's time span (by logged
    arrival) and on every run's first step."""
    st = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    arrival = st["arrival_s"].to_numpy(dtype=np.float64)
    t0, t1 = float(np.nanmin(arrival)), float(np.nanmax(arrival))
    from router.sim.scorecard import SERVED_LOCAL

    local = res.outcome == SERVED_LOCAL
    act = res.cached.astype(np.float64)
    out: dict[str, Any] = {}
    for name, m in (
        ("held_out_last_share", local & (arrival >= t1 - share * (t1 - t0))),
        ("first_steps", local & (res.step_index == 0)),
        ("all_steps", local),
    ):
        n = int(m.sum())
        out[name] = {
            "steps": n,
            "mae_index": float(np.abs(pred[m] - act[m]).mean()) if n else None,
            "mae_predict_0": float(act[m].mean()) if n else None,
            "mean_cached": float(act[m].mean()) if n else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--replicas", type=int, default=None)
    ap.add_argument("--kv-cache-gb", default="auto", help="GB per replica, or auto (as whatif)")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--slo-s", type=float, default=10.0)
    ap.add_argument("--no-find", action="store_true")
    ap.add_argument("--limit-runs", type=int, default=None)
    ap.add_argument(
        "--runs-window",
        default=None,
        help="START:END minutes: simulate only the runs whose logged start lies in it (a tuning split)",
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, always-local first")
    ap.add_argument(
        "--scoring",
        default=None,
        help="JSON overriding prefix-aware's scoring block, e.g. '{\"min_gain_tokens\": 1024}' (knob search)",
    )
    ap.add_argument(
        "--split-min",
        type=float,
        default=20.0,
        help="also report the steps of runs starting at or after this minute (0: off)",
    )
    ap.add_argument("--out", type=Path, default=Path("runroute-report/prefix_placement"))
    a = ap.parse_args()

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from features.importers.mooncake import import_mooncake
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.precheck import capacity_check
    from router.sim.profiles import load_profile
    from router.sim.scorecard import SERVED_LOCAL, scorecard
    from router.sim.search import SLO, find
    from router.sim.whatif import SimConfig, Workload

    con = Console(width=150)
    t0 = time.perf_counter()
    with con.status("importing the Mooncake conversation trace"):
        log = RunLog.from_frame(import_mooncake(a.data / "mooncake" / "conversation_trace.jsonl"))
        if a.limit_runs is not None:
            keep = log.steps["run_id"].drop_duplicates().iloc[: a.limit_runs]
            log = RunLog.from_frame(log.steps[log.steps["run_id"].isin(set(keep))])
        if a.runs_window is not None:
            lo_m, hi_m = (float(x) for x in a.runs_window.split(":"))
            rs = run_start_s(log)
            keep = set(rs.index[(rs >= lo_m * 60) & (rs < hi_m * 60)])
            log = RunLog.from_frame(log.steps[log.steps["run_id"].isin(keep)])
        work = Workload.from_runlog(log)
        starts = run_starts("trace", len(work.runs), logged_starts=work.logged_starts())
    prof = load_profile(None, a.gpu)
    if str(a.kv_cache_gb).strip().lower() == "auto":  # the deployment's KV size, as whatif derives it
        from router.policy.defaults import KV_CACHE_GB

        a.kv_cache_gb = prof.default_kv_cache_gb() or KV_CACHE_GB
    else:
        a.kv_cache_gb = float(a.kv_cache_gb)
    base = SimConfig(profile=prof, kv_cache_gb=a.kv_cache_gb, slo_short_s=a.slo_s)
    n_rep = a.replicas or int(capacity_check(work, starts, base, [1, 2, 4, 8])["suggested_start_replicas"])
    cfg = SimConfig(profile=prof, kv_cache_gb=a.kv_cache_gb, slo_short_s=a.slo_s, replicas=n_rep)
    blocks, bt = cfg.kv_blocks(), cfg.block_tokens
    over = json.loads(a.scoring) if a.scoring else None

    def make_policy(kind: str) -> Any:
        if kind == "prefix-aware" and over is not None:
            from router.policy.config import PrefixAwareConfig

            sc = PrefixAwareConfig().scoring.model_dump() | over
            return build_policy({"kind": kind, "scoring": sc})
        return build_policy(kind)

    con.print(
        f"{len(work.runs):,} runs, {work.n_steps:,} steps; {prof.name}, {n_rep} replicas x "
        f"{a.kv_cache_gb:g} GB KV = {blocks:,} blocks of {bt} tokens each"
    )
    with con.status("reachable hit rate (pooled LRU replay)"):
        reach, anyprev, opt = reachable(log, work, blocks, n_rep, bt)

    rows: list[dict[str, Any]] = []
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=con, transient=True) as prog:
        kinds = a.policies.split(",")
        task = prog.add_task("simulating", total=len(kinds))
        for kind in kinds:
            prog.update(task, description=f"simulating {kind}")
            sim = index_sim(work, make_policy(kind), cfg, starts)
            res = sim.run()
            sc = scorecard(res)
            mae = index_mae(log, res, sim.index_pred, 0.2)
            local = res.outcome == SERVED_LOCAL
            later = local & (res.step_index >= 1)
            p2, pall = float(res.prompt[later].sum()), float(res.prompt[local].sum())
            split = split_figures(log, res, reach, opt, a.split_min * 60) if a.split_min > 0 else None
            rows.append(
                {
                    "policy": kind,
                    "after_split": split,
                    "hit_rate": sc["cache_hit_rate"],
                    "hit_rate_all_steps": float(res.cached[local].sum()) / pall if pall else None,
                    "reachable": float(reach[later].sum()) / p2 if p2 else None,
                    "reachable_all_steps": float(reach[local].sum()) / pall if pall else None,
                    "kv_bound": float(opt[later].sum()) / p2 if p2 else None,
                    "infinite_bound": sc["cache_hit_upper_bound"],
                    "infinite_bound_all_steps": float(anyprev[local].sum()) / pall if pall else None,
                    "short_step_latency_s_p95": sc["short_step_latency_s_p95"],
                    "step_latency_s_p95": sc["step_latency_s_p95"],
                    "ttft_s_p95": sc["ttft_s_p95"],
                    "flaps_per_run": sc["flaps_per_run"],
                    "wall_s": round(res.wall_s, 1),
                    "cache_prediction_mae": mae,
                }
            )
            prog.advance(task)
    for r in rows:
        r["share_of_reachable"] = r["hit_rate"] / r["reachable"] if r["reachable"] else None
        r["share_of_kv_bound"] = r["hit_rate"] / r["kv_bound"] if r["kv_bound"] else None
        r["share_of_reachable_all_steps"] = (
            r["hit_rate_all_steps"] / r["reachable_all_steps"] if r["reachable_all_steps"] else None
        )

    t = Table(title=f"Mooncake conversation hour, {n_rep} x {prof.name}, {a.kv_cache_gb:g} GB KV each")
    for c in ("policy", "hit (2nd step on)", "of reachable", "hit (all)", "of reachable (all)",
              "of KV bound", "short p95 s", "step p95 s", "TTFT p95 s", "flaps/run"):  # fmt: skip
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(
            r["policy"],
            f"{r['hit_rate']:.1%}",
            f"{r['share_of_reachable']:.0%}",
            f"{r['hit_rate_all_steps']:.1%}",
            f"{r['share_of_reachable_all_steps']:.0%}",
            f"{r['share_of_kv_bound']:.0%}",
            f"{r['short_step_latency_s_p95']:.2f}",
            f"{r['step_latency_s_p95']:.2f}",
            f"{r['ttft_s_p95']:.2f}",
            f"{r['flaps_per_run']:.2f}",
        )
    con.print(t)
    if a.split_min > 0:
        for r in rows:
            sp = r["after_split"]
            con.print(
                f"{r['policy']}, runs starting at minute {a.split_min:g} on ({sp['runs']:,}): hit "
                f"{sp['hit_rate']:.1%} = {sp['share_of_reachable']:.0%} of reachable {sp['reachable']:.1%} "
                f"(KV bound {sp['kv_bound']:.1%}); "
                f"short p95 {sp['short_step_latency_s_p95']:.2f} s, step p95 {sp['step_latency_s_p95']:.2f} s"
            )
    r0 = rows[0]
    con.print(
        f"reachable (pooled LRU of {n_rep} x {blocks:,} blocks): {r0['reachable']:.1%} of prompt tokens "
        f"from the 2nd step on, {r0['reachable_all_steps']:.1%} over all steps; infinite-cache bound "
        f"{r0['infinite_bound']:.1%} / {r0['infinite_bound_all_steps']:.1%}; KV bound (Belady's MIN on the "
        f"pooled KV, logged order) {r0['kv_bound']:.1%}"
    )
    for r in rows:
        h, f = r["cache_prediction_mae"]["held_out_last_share"], r["cache_prediction_mae"]["first_steps"]
        con.print(
            f"{r['policy']}: cached-token prediction read from the index, MAE per step on the last 20% "
            f"by time {h['mae_index']:.0f} vs predicting 0 {h['mae_predict_0']:.0f} tokens ({h['steps']:,} "
            f"steps); first steps of runs {f['mae_index']:.0f} vs {f['mae_predict_0']:.0f} ({f['steps']:,})"
        )
    report: dict[str, Any] = {
        "trace": str(a.data / "mooncake" / "conversation_trace.jsonl"),
        "node_profile": prof.name,
        "replicas": n_rep,
        "kv_cache_gb": a.kv_cache_gb,
        "kv_blocks_per_replica": blocks,
        "runs_window_min": a.runs_window,
        "prefix_aware_scoring": over,
        "rows": rows,
    }
    if not a.no_find:
        slo = SLO(short_p95_s=a.slo_s)
        pols = {k: functools.partial(make_policy, k) for k in ("always-local", "prefix-aware")}
        with con.status(f"find replicas for short-step p95 <= {a.slo_s:g} s"):
            found = find(work, pols, base, starts, slo, start=n_rep)
        report["find_replicas"] = {
            "slo": slo.describe(),
            "results": [
                {
                    k: e.get(k)
                    for k in ("policy", "replicas", "short_step_latency_s_p95", "simulations", "floor_s")
                }
                for e in found["results"]
            ],
        }
        for e in report["find_replicas"]["results"]:
            con.print(f"find replicas ({slo.describe()}): {e['policy']}: {e['replicas']} replicas "
                      f"(short p95 {e['short_step_latency_s_p95']}, {e['simulations']} simulations)")  # fmt: skip
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(rows, a.out.with_suffix(".png"), report)
    con.print(f"wrote {a.out.with_suffix('.json')} and {a.out.with_suffix('.png')} ({report['wall_s']} s)")


def plot(rows: list[dict[str, Any]], path: Path, rep: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["policy"] for r in rows]
    x = np.arange(len(rows))
    ax1.bar(x - 0.2, [r["hit_rate"] for r in rows], 0.4, label="hit rate (2nd step on)")
    ax1.bar(x + 0.2, [r["hit_rate_all_steps"] for r in rows], 0.4, label="hit rate (all steps)")
    ax1.axhline(rows[0]["reachable"], ls="--", c="k", label="reachable (pooled LRU), 2nd step on")
    ax1.axhline(rows[0]["infinite_bound"], ls=":", c="gray", label="infinite cache, 2nd step on")
    ax1.set_xticks(x, names)
    ax1.set_ylabel("cached / prompt tokens")
    ax1.legend(fontsize=7)
    ax2.bar(x - 0.2, [r["short_step_latency_s_p95"] for r in rows], 0.4, label="short-step p95")
    ax2.bar(x + 0.2, [r["step_latency_s_p95"] for r in rows], 0.4, label="step p95")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("seconds")
    ax2.legend(fontsize=7)
    fig.suptitle(
        f"Mooncake conversation hour: {rep['replicas']} x {rep['node_profile']}, {rep['kv_cache_gb']:g} GB KV"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    # The per-step belief is read by a subclass of Simulator, which the compiled simulator modules
    # refuse (router/native.py): run as a script, this bench uses them as pure Python (same results,
    # tests/test_native.py). Set before anything imports router; not on import (a test importing this
    # file would turn the build off for its whole process).
    os.environ["RUNROUTE_NATIVE"] = "0"
    main()
