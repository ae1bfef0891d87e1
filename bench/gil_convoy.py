"""Does releasing the GIL for a one-row LightGBM prediction cost the event loop when another thread is busy?

Algorithm: a small real bundle (``EscalationClassifier``, 100 trees) predicts one row at a time
through the sidecar's fast path (``models.forest.MergedPredictor``: one C call), on the main thread, while a
background thread does what the sidecar's other threads do: encode records with orjson (the run-log
writer) in a loop. Two bindings of the same C function are timed, interleaved in rounds so the
machine's load hits both alike: ``CDLL`` (the sidecar's: releases the GIL for the call) and
``PyDLL`` (keeps it). Per binding: p50 / p99 / max wall time of one prediction, in microseconds,
with the other thread idle and busy. A GIL convoy would show as the CDLL binding's p50/p99 jumping
to the switch interval (5 ms) with the busy thread.

Knobs: ``--rounds`` (10), ``--per-round`` (2,000 predictions per binding per round), ``--record-kb``
(size of the record the busy thread encodes, 64).

Usage: ``.venv/bin/python bench/gil_convoy.py``. On a shared machine read the ratio of the two
bindings within one run, not the absolute figures.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from features.extract import N_FEATURES  # noqa: E402
from models.bundle import ModelBundle  # noqa: E402
from models.escalation import EscalationClassifier  # noqa: E402


def _busy(stop: threading.Event, kb: int) -> None:
    import orjson

    rec = {"features": [float(i) for i in range(kb * 1024 // 20)], "run_id": "r", "step": 1}
    while not stop.is_set():
        orjson.dumps(rec)


def _time(fn: Callable[[], float], n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t
    return out * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=2000)
    ap.add_argument("--record-kb", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, N_FEATURES))
    y = (rng.random(2000) < 0.2).astype(int)
    est = EscalationClassifier(n_estimators=100, calibration="sigmoid", cv=3, n_jobs=1).fit(X, y)
    b = ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.9, "p_frontier_down": 0.5})
    b.predict_features(X[0])
    esc = b._merged or b._prepare_fast()[0]  # the sidecar's predictor (the merged booster)
    from lightgbm.basic import _LIB

    bindings = {
        "CDLL (the sidecar's: releases the GIL)": esc._fn,
        "PyDLL (keeps the GIL)": ctypes.PyDLL(_LIB._name).LGBM_BoosterPredictForMatSingleRowFast,
    }
    res: dict[tuple[str, bool], list[np.ndarray]] = {}
    for busy in (False, True):
        stop = threading.Event()
        th = threading.Thread(target=_busy, args=(stop, a.record_kb), daemon=True)
        if busy:
            th.start()
        for _ in range(a.rounds):
            for name, fn in bindings.items():
                esc._fn = fn
                res.setdefault((name, busy), []).append(_time(esc, a.per_round))
        stop.set()
        if busy:
            th.join()
    print(
        f"one-row prediction, {a.rounds} x {a.per_round} per binding (us; load avg {os.getloadavg()[0]:.1f})"
    )
    print("| binding | other thread | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    for (name, busy), parts in res.items():
        t = np.concatenate(parts)
        q = np.percentile(t, [50, 99])
        print(f"| {name} | {'orjson loop' if busy else 'idle'} | {q[0]:.1f} | {q[1]:.1f} | {t.max():.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
