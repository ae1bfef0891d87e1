"""How much latency and CPU the runroute sidecar adds, measured through ../shared/bench-peers.

Algorithm (the peers' harness, unchanged and run from its own folder — nothing is copied):

1. Start the peers' ``fake_backend.py`` (OpenAI-compatible, fixed 20 ms per request, 16 SSE chunks
   when streaming) on a free loopback port, pinned to core 0 (``taskset -c 0``).
2. Start ``runroute serve --config <generated yaml>`` pinned alone to core 1: one uvicorn worker
   (uvloop + httptools), the *learned* policy with a real bundle (``--bundle``; trained from the
   shipped data/ when absent, as ``runroute serve`` does), the /metrics scraper, the run-log writer
   (fsync every 0.5 s) and Prometheus metrics all on. The frontier tier points at the same fake
   (it is never chosen: the point is the router's own cost).
3. Run the peers' ``run_matrix.py`` (open-loop Poisson load from ``loadgen.py`` pinned to core 0,
   latency from the scheduled send time, bounded cells, CPU read from /proc, idle-wait between
   cells) twice: ``direct`` to the fake, and ``runroute`` with ``model: auto``.
4. Print the peers' ``summarize.py`` table for both systems (p50/p99, added p50/p99 over direct,
   TTFB, errors, achieved rate, SUT CPU ms per request, highest rate held), then the peers'
   recorded figures for vllm-router, the mini proxies and LiteLLM from ``results/summary.md``.

The load generator sends the same ~2 KB body every time, so all its requests form *one* run
(hash of the opening messages). The run's history is bounded (``--history-steps``, default 100
steps: a long agent run); feature extraction is O(steps in the history), so this bounds the
per-request feature cost at that of a 100-step run.

Knobs: ``--rates`` (default 50,200,400), ``--modes`` (ns,s), ``--duration`` (s per cell, default 8),
``--reps`` (1), ``--drain`` (s), ``--bundle`` (path), ``--history-steps``, ``--out`` (JSONL results,
default a temp dir), ``--peers`` (the bench-peers folder), ``--skip-direct``, ``--mini`` (also run the
peers' bare FastAPI+aiohttp pass-through in this same run, pinned the same way: on a shared machine
its figures show how much of the added latency is the machine, not the router).

``--realistic`` (first or anywhere on the line) runs the realistic mode instead, with its own options
(:mod:`realistic`, bench/realistic.py: 1,000 concurrent runs whose bodies grow from 2 KB to 200 KB,
beside the bare pass-through and, with ``--ref-tree``, another checkout's sidecar).

Usage: ``.venv/bin/python bench/overhead.py [--duration 8]`` (about 3-4 minutes with defaults).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from sut_procs import die_with_parent, exit_on_signals, free_port, stop, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT.parent / "shared" / "bench-peers"


def peer_rows(peers: Path) -> list[str]:
    """The peers' recorded rows (vllm-router, mini proxies, LiteLLM) and their 'held' lines."""
    text = (peers / "results" / "summary.md").read_text()
    keep = [ln for ln in text.splitlines() if re.match(r"\| (vrouter|mini|mini_aiohttp|litellm\d) \|", ln)]
    held = [ln for ln in text.splitlines() if re.match(r"- (vrouter|mini|mini_aiohttp|litellm\d) ", ln)]
    return keep + [""] + held


def main() -> int:
    if "--realistic" in sys.argv[1:]:  # its own module and options (bench/realistic.py)
        import realistic

        return realistic.main([x for x in sys.argv[1:] if x != "--realistic"])
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="--realistic: see bench/realistic.py"
    )
    ap.add_argument("--rates", default="50,200,400")
    ap.add_argument("--modes", default="ns,s")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--drain", type=float, default=10.0)
    ap.add_argument("--bundle", type=Path, default=ROOT / "runroute-bundle")
    ap.add_argument("--history-steps", type=int, default=100)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--peers", type=Path, default=PEERS)
    ap.add_argument("--skip-direct", action="store_true")
    ap.add_argument(
        "--mini",
        action="store_true",
        help="also run the peers' mini_proxy_aiohttp (bare FastAPI+aiohttp pass-through) pinned to core 1 in "
        "this same run: a same-conditions reference when the machine is shared",
    )
    a = ap.parse_args()

    if shutil.which("taskset") is None:
        raise SystemExit("overhead: needs taskset (util-linux) for CPU pinning")
    exit_on_signals()  # SIGTERM/SIGHUP run the finally blocks: no sidecar outlives the bench
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="runroute-overhead-"))
    out = a.out or work / "results.jsonl"
    if not a.bundle.exists():
        sys.path.insert(0, str(ROOT))
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from runroute.commands.serve import train_default_bundle

        train_default_bundle(a.bundle)

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    bport, rport = free_port(), free_port()
    backend = subprocess.Popen(
        ["taskset", "-c", "0", py, str(a.peers / "fake_backend.py"), "--port", str(bport)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    sut = None
    try:
        wait_ready(f"http://127.0.0.1:{bport}/health", 30)
        cfg = work / "runroute.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "local": {"urls": [f"http://127.0.0.1:{bport}"], "model": "fake-model"},
                    "frontier": {
                        "url": f"http://127.0.0.1:{bport}",
                        "model": "fake-model-frontier",
                        "allow_no_key": True,
                    },
                    "policy": {"kind": "learned"},
                    "bundle": {"path": str(a.bundle.resolve()), "watch_s": 2},
                    "runlog": {"dir": str(work / "logs")},
                    "scrape": {"interval_s": 1},
                    "server": {"run_history_steps": a.history_steps},
                }
            )
        )
        sut = subprocess.Popen(
            ["taskset", "-c", "1", py, "-m", "runroute", "serve", "--config", str(cfg), "--port", str(rport)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "sut.err", "w"),  # noqa: SIM115
            preexec_fn=die_with_parent,
        )
        wait_ready(f"http://127.0.0.1:{rport}/ready", 60)
        common = [
            py,
            str(a.peers / "run_matrix.py"),
            "--rates",
            a.rates,
            "--modes",
            a.modes,
            "--reps",
            str(a.reps),
            "--duration",
            str(a.duration),
            "--lg-cpus",
            "0",
            "--out",
            str(out),
            "--drain",
            str(a.drain),
            "--idle-max",
            "20",
            "--pause",
            "1",
            "--watch",
            f"backend={backend.pid}",
        ]
        if not a.skip_direct:
            subprocess.run(common + ["--system", "direct", "--url", f"http://127.0.0.1:{bport}"], check=True)
        subprocess.run(
            common
            + [
                "--system",
                "runroute",
                "--url",
                f"http://127.0.0.1:{rport}",
                "--model",
                "auto",
                "--watch",
                f"sut={sut.pid}",
            ],
            check=True,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{rport}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        stop(sut)
        if a.mini:  # the peers' bare pass-through, same pinning, same moment
            mport = free_port()
            mini = subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    "1",
                    py,
                    "-m",
                    "uvicorn",
                    "mini_proxy_aiohttp:app",
                    "--app-dir",
                    str(a.peers),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(mport),
                    "--loop",
                    "uvloop",
                    "--http",
                    "httptools",
                    "--workers",
                    "1",
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                env={**env, "UPSTREAM": f"http://127.0.0.1:{bport}"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
            try:
                wait_ready(f"http://127.0.0.1:{mport}/v1/models", 30)
                subprocess.run(
                    common
                    + [
                        "--system",
                        "mini_aiohttp",
                        "--url",
                        f"http://127.0.0.1:{mport}",
                        "--watch",
                        f"sut={mini.pid}",
                    ],
                    check=True,
                )
            finally:
                stop(mini)
    finally:
        if sut is not None:
            stop(sut)
        stop(backend)
    print()
    print(f"## runroute overhead (this run; results {out})")
    table = subprocess.run(
        [py, str(a.peers / "summarize.py"), str(out)], capture_output=True, text=True, check=True
    )
    print(table.stdout)
    decisions = [ln for ln in metrics.splitlines() if ln.startswith("runroute_decisions_total")]
    print("router decisions during the run:", "; ".join(decisions) or "none")
    print()
    print("## peers, recorded 2026-11-29 on this machine type (../shared/bench-peers/results/summary.md)")
    print(
        "| system | stream | rate | p50 ms (reps) | p99 ms (reps) | added p50 | added p99 | ttfb p50/p99 ms | errors | achieved req/s | SUT CPU ms/req | holds |"
    )
    print("\n".join(peer_rows(a.peers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
