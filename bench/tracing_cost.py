"""Per-step cost of the sidecar's tracing hooks (:mod:`router.server.tracing`), in process.

Algorithm: build the :class:`~router.server.tracing.Tracing` the sidecar builds (memory exporter,
or ``--exporter``), then for ``--steps`` steps run exactly the hooks the proxy runs for one served
step — ``start_step`` (with a client ``traceparent`` on every other step), ``start_upstream``
(traceparent injected into the upstream headers), ``end_step`` with a real run-log record (which
ends the upstream span) — and time each step with ``perf_counter`` and ``process_time``. With
tracing off the proxy runs one ``is None`` test per hook instead; that is timed too. Prints p50 /
p90 / p99 wall microseconds per step and the mean CPU microseconds per step, for ``--reps``
repetitions (the machine is shared: the spread between repetitions is the noise).

This isolates the hooks from the rest of the request (HTTP, the engine, the upstream); the
end-to-end figure is ``bench/overhead.py --realistic --variant trace:tracing.enabled=true,tracing.exporter=memory``.

Usage: ``.venv/bin/python bench/tracing_cost.py [--steps 20000] [--reps 5] [--exporter memory]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from features.schema import Step
from router.server.settings import TracingSettings
from router.server.tracing import Tracing

__all__ = ["main"]


def _record(i: int) -> Step:
    return Step.model_construct(
        run_id=f"run-{i % 1000}",
        step=i % 50,
        prompt_tokens=4000 + i % 3000,
        cached_tokens=3500,
        completion_tokens=40,
        tier="local",
        replica="local-0",
        model="local-model",
        status=200,
        error_code=None,
        reason="pinned",
        admission=None,
    )


def _one_rep(tr: Tracing | None, steps: int) -> tuple[list[float], float]:
    backend = SimpleNamespace(
        name="local-0", tier="local", model="local-model", root="http://10.0.0.5:8000",
        headers={"content-type": "application/json"},
    )  # fmt: skip
    recs = [_record(i) for i in range(steps)]
    client = [{"traceparent": f"00-{i:032x}-{i:016x}-01"} if i % 2 else {} for i in range(1, steps + 1)]
    walls = []
    c0 = time.process_time()
    for i in range(steps):
        t = time.perf_counter()
        if tr is not None:
            span = tr.start_step(client[i])
            up, _hdr = tr.start_upstream(span, backend, backend.headers)
            tr.end_step(span, recs[i], up)
        else:  # the proxy with tracing off: one test per hook
            span = None
            if span is not None:
                raise AssertionError
        walls.append(time.perf_counter() - t)
    cpu = (time.process_time() - c0) / steps
    if tr is not None and tr.memory is not None:
        tr.memory.clear()
    return walls, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--exporter", default="memory", choices=["memory", "console"])
    a = ap.parse_args(argv)
    tr = Tracing(TracingSettings(enabled=True, exporter=a.exporter))
    table = Table(title=f"tracing hooks per step ({a.steps} steps per rep, exporter {a.exporter}; us)")
    for col in ("rep", "mode", "p50", "p90", "p99", "CPU mean"):
        table.add_column(col, justify="right")
    p50s: dict[str, list[float]] = {"off": [], "on": []}
    for rep in range(1, a.reps + 1):
        for mode, t in (("off", None), ("on", tr)):
            walls, cpu = _one_rep(t, a.steps)
            q = statistics.quantiles(walls, n=100)
            p50s[mode].append(q[49] * 1e6)
            table.add_row(str(rep), mode, *(f"{x * 1e6:.1f}" for x in (q[49], q[89], q[98], cpu)))
    console = Console()
    console.print(table)
    for mode, v in p50s.items():
        console.print(
            f"tracing {mode}: p50 per step {statistics.median(v):.1f} us "
            f"(reps {min(v):.1f}..{max(v):.1f} us: the spread is the machine's noise)"
        )
    tr.shutdown()


if __name__ == "__main__":
    main()
