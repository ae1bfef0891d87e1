"""The hot path's protocol work per request, in process: pass-through vs translation, per protocol.

Algorithm: the bodies of ``bench/realistic_load.py`` (one agent run of ``--steps`` steps, 2 KB to
200 KB, the same conversation in chat, Responses and Messages) and the answers of
``bench/proto_backend.py`` (JSON and the 16-event stream). Per request, timed with
``perf_counter_ns`` over ``--reps`` passes of every step: the adapter's ``read`` (parse +
validation), ``step_request`` (the engine's view: the whole estimate at step 0, then the
previous step's total + the new turns, as the sidecar does for a run it saw), ``outbound`` (the bytes sent upstream) and the
capture of the answer (``json``, or every SSE event + ``finish_stream``) plus ``counts``/``tools``.
Cases: ``chat`` (chat client, chat backend), ``<p> pass`` (the backend speaks ``p``: the fast
path), ``<p> xlate`` (a chat-only backend: the request and the answer are translated). Prints
p50/p99 in microseconds per case and mode, the added p50 of each case over chat, and writes a PNG
(``--png``). This is the protocol work only (no sockets, no engine), the part that differs between
protocols; ``overhead.py --realistic --protocol P`` measures the whole sidecar end to end.

Knobs: ``--steps`` (50), ``--reps`` (20), ``--min-body`` / ``--max-body`` (2048 / 204800), ``--png``.
Usage: ``.venv/bin/python bench/protocol_cost.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import proto_backend  # noqa: E402
import realistic_load  # noqa: E402

from router.server.protocols.chat import ChatAdapter  # noqa: E402
from router.server.protocols.messages import MessagesAdapter  # noqa: E402
from router.server.protocols.responses import ResponsesAdapter  # noqa: E402

__all__ = ["main"]


def _answer(proto: str, stream: bool) -> list[bytes] | bytes:
    import orjson

    chunks, end, body = proto_backend._events(proto, "fake-model", 5000)  # noqa: SLF001 - same shapes
    if not stream:
        return orjson.dumps(body)
    events = [e for c in chunks for e in c.split(b"\n\n") if e]
    return events + [e for e in end.split(b"\n\n") if e]


def _time_case(
    adapter, client: str, backend: str, bodies: list[bytes], stream: bool, reps: int
) -> list[float]:
    answer = _answer(backend, stream)
    models = {"fake-model": "local"}
    out = []
    for _ in range(reps):
        for k, raw in enumerate(bodies):
            t0 = time.perf_counter_ns()
            req = adapter.read(raw, models, None)
            # as the sidecar: the whole estimate at a run's first step, then previous + new turns
            adapter.step_request(req, None if k == 0 else 1000 * k)
            adapter.outbound(req, backend, "fake-model", "local-0")
            cap = adapter.capture(req, backend)
            if stream:  # as the SSE relay does: only events with a marker reach the capture
                marks = cap.markers
                for ev in answer:
                    if marks is None or any(m in ev for m in marks):
                        cap.event(ev)
                cap.finish_stream()
            else:
                cap.json(answer)
            cap.counts()
            cap.tools()
            out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--min-body", type=int, default=2048)
    ap.add_argument("--max-body", type=int, default=204800)
    ap.add_argument("--png", type=Path, default=Path("protocol_cost.png"))
    a = ap.parse_args(argv)
    adapters = {"chat": ChatAdapter(), "responses": ResponsesAdapter(), "messages": MessagesAdapter()}
    cases = [
        ("chat", "chat", "chat"),
        ("responses pass", "responses", "responses"),
        ("responses xlate", "responses", "chat"),
    ]
    cases += [("messages pass", "messages", "messages"), ("messages xlate", "messages", "chat")]
    results: dict[tuple[str, str], tuple[float, float]] = {}
    for mode in ("ns", "s"):
        stream = mode == "s"
        for label, client, backend in cases:
            gen = realistic_load.BODIES[client](
                "fake-model", a.steps, a.min_body, a.max_body, stream, "header"
            )
            bodies = [gen.body(0, 0, k, "rr-0") for k in range(a.steps)]
            xs = sorted(_time_case(adapters[client], client, backend, bodies, stream, a.reps))
            results[(mode, label)] = (statistics.median(xs), xs[int(0.99 * (len(xs) - 1))])
    print(
        f"protocol work per request (us), {a.steps} steps x {a.reps} reps, bodies {a.min_body}-{a.max_body} B"
    )
    print(f"{'mode':6} {'case':18} {'p50':>9} {'p99':>9} {'+p50 vs chat':>13}")
    for (mode, label), (p50, p99) in results.items():
        base = results[(mode, "chat")][0]
        print(f"{mode:6} {label:18} {p50:9.1f} {p99:9.1f} {p50 - base:13.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [lbl for lbl, _, _ in cases]
    for i, mode in enumerate(("ns", "s")):
        ax.bar(
            [j + 0.4 * i for j in range(len(labels))],
            [results[(mode, lbl)][0] for lbl in labels],
            0.4,
            label=mode,
        )
    ax.set_xticks([j + 0.2 for j in range(len(labels))], labels, rotation=15)
    ax.set_ylabel("p50 us per request")
    ax.set_title("protocol work per request: pass-through vs translation")
    ax.legend(title="mode")
    fig.tight_layout()
    fig.savefig(a.png)
    print(f"plot: {a.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
