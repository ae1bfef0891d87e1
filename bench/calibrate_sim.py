"""Calibration: the same closed-loop workload through a live fake vLLM (directly, and through the sidecar)
and through the simulator; prints p50/p95 step latency and cache hit rate with % errors.

Usage::

    .venv/bin/python bench/calibrate_sim.py [--runs 4] [--steps 6] [--seed 0] [--no-sidecar]

Algorithm:

1. Start a fake vLLM on loopback with latency constants the simulator can match exactly
   (``base_ms = decode_ms_per_token``, ``batch_slowdown = 0``; see ``router.sim.calibrate``).
2. Drive ``--runs`` agent runs concurrently, closed loop: each run has its own system prompt, each
   step sends the whole conversation (so consecutive prompts share their prefix), asks for a seeded
   number of output tokens, appends the answer and a seeded tool result, then sleeps a seeded tool
   pause. Run starts are staggered. Measured per step: client-side latency, usage prompt / completion
   / cached tokens, the actual pause and each run's actual start time.
3. Replay the measured runs (same starts, pauses, token counts; ``prefix_reuse_tokens`` = previous prompt
   + completion) in the simulator with ``profile_from_fake`` and the fake's block size and capacity,
   one replica, the always-local policy.
4. The same workload through the sidecar (``router.server.app.create_app``; local tier = the fake,
   always-local policy) when ``router.server.app`` is importable, unless ``--no-sidecar``.
5. Print measured vs simulated p50/p95 step latency and cache hit rate (steps >= 2) and % errors
   (acceptance: within 10%).

Load matters: the simulator batches at iteration level like vLLM (a prefill lengthens the iteration
every running decode shares), the fake serves each request independently. At the default 4
concurrent runs the two agree within ~5%; at 12 concurrent runs the simulator's step latency is
15-27% higher, which is that coupling, not a calibration error.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KNOBS = {
    "model": "local-model",
    "base_ms": 40.0,
    "decode_ms_per_token": 40.0,
    "prefill_ms_per_token": 0.08,
    "batch_slowdown": 0.0,
    "block_size": 32,
    "capacity_blocks": 16384,
    "max_concurrency": 64,
    "max_tokens_cap": 256,
}


def plan(n_runs: int, n_steps: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    runs = []
    for i in range(n_runs):
        words = " ".join(f"w{rng.randrange(10_000)}" for _ in range(rng.randrange(300, 900)))
        runs.append(
            {
                "id": f"cal-{seed}-{i}",
                "start_s": i * 0.35,
                "system": f"You are agent {i}. {words}",
                "steps": [
                    {
                        "max_tokens": rng.randrange(8, 40),
                        "tool_words": rng.randrange(30, 200),
                        "pause_s": rng.uniform(0.2, 1.0),
                    }
                    for _ in range(n_steps)
                ],
            }
        )
    return runs


async def drive(base_url: str, runs: list[dict[str, Any]], headers_fn=None) -> list[dict[str, Any]]:
    import aiohttp

    out: list[dict[str, Any]] = []
    t_origin = time.perf_counter()
    async with aiohttp.ClientSession() as http:

        async def one(run: dict[str, Any]) -> None:
            await asyncio.sleep(run["start_s"])
            started = time.perf_counter() - t_origin
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": run["system"]},
                {"role": "user", "content": "Start the task."},
            ]
            rng = random.Random(run["id"])
            last_end = None
            for k, st in enumerate(run["steps"]):
                if k:
                    await asyncio.sleep(st["pause_s"])
                t0 = time.perf_counter()
                pause = 0.0 if last_end is None else t0 - last_end
                body = {"model": "local-model", "messages": msgs, "max_tokens": st["max_tokens"]}
                hdr = {"X-Run-Id": run["id"]} if headers_fn else {}
                async with http.post(f"{base_url}/v1/chat/completions", json=body, headers=hdr) as resp:
                    data = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {data}")
                t1 = time.perf_counter()
                last_end = t1
                u = data["usage"]
                cached = ((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
                out.append(
                    {
                        "run_id": run["id"],
                        "step": k,
                        "started_s": started,
                        "latency_s": t1 - t0,
                        "pause_s": pause,
                        "prompt_tokens": u["prompt_tokens"],
                        "completion_tokens": u["completion_tokens"],
                        "cached_tokens": cached,
                    }
                )
                text = data["choices"][0]["message"].get("content") or ""
                msgs.append({"role": "assistant", "content": text})
                msgs.append(
                    {
                        "role": "user",
                        "content": " ".join(f"r{rng.randrange(1000)}" for _ in range(st["tool_words"])),
                    }
                )

        await asyncio.gather(*(one(r) for r in runs))
    return out


def simulate(measured: list[dict[str, Any]]) -> dict[str, float]:
    from features.runlog import records_to_frame
    from features.schema import Run, Step
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.calibrate import profile_from_fake, sim_kv_for_fake, step_figures
    from router.sim.whatif import SimConfig, Simulator, Workload

    recs: list[Any] = []
    by_run: dict[str, list[dict[str, Any]]] = {}
    for m in measured:
        by_run.setdefault(m["run_id"], []).append(m)
    for rid, steps in by_run.items():
        steps.sort(key=lambda s: s["step"])
        recs.append(Run(run_id=rid, source="calibration", started_at=steps[0]["started_s"]))
        prev = None
        for s in steps:
            reuse = (
                None
                if prev is None
                else min(prev["prompt_tokens"] + prev["completion_tokens"], s["prompt_tokens"])
            )
            recs.append(
                Step(
                    run_id=rid,
                    step=s["step"],
                    prompt_tokens=s["prompt_tokens"],
                    completion_tokens=s["completion_tokens"],
                    tool_pause_s=s["pause_s"] if prev else None,
                    prefix_reuse_tokens=reuse,
                )
            )
            prev = s
    df = records_to_frame(recs)
    prof, _notes = profile_from_fake(KNOBS)
    kv = sim_kv_for_fake(KNOBS)
    w = Workload.from_frames(
        df[df.record == "step"], df[df.record == "run"], block_tokens=int(kv["block_tokens"])
    )
    starts = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    cfg = SimConfig(
        profile=prof, replicas=1, kv_cache_gb=float(kv["kv_cache_gb"]), block_tokens=int(kv["block_tokens"])
    )
    res = Simulator(w, build_policy("always-local"), cfg, starts).run()
    return step_figures(res.latency, res.prompt, res.cached, res.step_index)


def measured_figures(measured: list[dict[str, Any]]) -> dict[str, float]:
    from router.sim.calibrate import step_figures

    return step_figures(
        [m["latency_s"] for m in measured],
        [m["prompt_tokens"] for m in measured],
        [m["cached_tokens"] for m in measured],
        [m["step"] for m in measured],
    )


def report(label: str, measured: list[dict[str, Any]]) -> bool:
    from router.sim.calibrate import percent_errors

    meas = measured_figures(measured)
    sim = simulate(measured)
    err = percent_errors(meas, sim)
    print(f"\n{label}: {len(measured)} steps")
    print(f"{'figure':<22}{'measured':>12}{'simulated':>12}{'error %':>10}")
    for k in meas:
        print(f"{k:<22}{meas[k]:>12.4f}{sim[k]:>12.4f}{err[k]:>10.2f}")
    ok = all(abs(v) <= 10 for v in err.values())
    print(f"within 10%: {'yes' if ok else 'NO'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sidecar", action="store_true")
    args = ap.parse_args()
    try:
        from router.fakes.launch import fake_in_thread
    except ImportError:
        print("router.fakes.launch is not available: cannot run the live side of the calibration")
        sys.exit(2)
    runs = plan(args.runs, args.steps, args.seed)
    print(f"fake vLLM knobs: {KNOBS}")
    ok = True
    with fake_in_thread("vllm", **KNOBS) as fake:
        measured = asyncio.run(drive(fake.base_url.rstrip("/").removesuffix("/v1"), runs))
        ok &= report("fake vLLM, direct", measured)
    if args.no_sidecar:
        sys.exit(0 if ok else 1)
    try:
        from router.server.app import create_app, serve_in_thread
        from router.server.settings import RouterSettings
    except ImportError:
        print("router.server.app not available: sidecar comparison skipped")
        sys.exit(0 if ok else 1)
    runs2 = plan(args.runs, args.steps, args.seed + 1)  # fresh system prompts: a cold cache again
    with fake_in_thread("vllm", **KNOBS) as fake, tempfile.TemporaryDirectory() as tmp:
        settings = RouterSettings(
            local={"urls": [fake.url], "model": "local-model"},
            policy={"kind": "always-local"},
            runlog={"dir": str(Path(tmp) / "logs")},
            scrape={"interval_s": 0.5},
        )
        with serve_in_thread(create_app(settings)) as url:
            measured = asyncio.run(drive(url, runs2, headers_fn=True))
        ok &= report("sidecar + fake vLLM", measured)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
