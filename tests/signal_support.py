"""Shared pieces of the observed-trouble and run-context tests (tests/test_signals.py,
tests/test_run_context.py): fake upstreams, router settings, one chat step, the run log."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from features.extract import FEATURE_NAMES
from models.predictor import FeaturePredictor
from models.types import Predictions
from router.fakes.launch import fake_in_thread
from router.server.settings import RouterSettings

NEW_VF = FEATURE_NAMES.index("new_sig_verifier_failed")


class SignalPredictor(FeaturePredictor):
    """P(frontier) 0.9 at a step that sees a new verifier_failed signal, else 0; 10k tokens left (so
    with the frontier's prices a run with P = 0 is worth bringing back, one with 0.9 escalating)."""

    version = "signal-test"

    def predict_features(self, x: np.ndarray) -> Predictions:
        p = 0.9 if x[NEW_VF] > 0 else 0.0
        return Predictions(p_frontier=p, remaining_tokens_p50=10000.0, remaining_steps_p50=3.0)


@contextmanager
def signal_fakes() -> Iterator[tuple[Any, Any]]:
    """Fake vLLM + fake frontier on loopback threads (the tests' module-scoped ``fakes``)."""
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.1)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-front") as fr,
    ):
        yield v0, fr


def make_settings(tmp_path: Path, fakes, **over) -> RouterSettings:
    v0, fr = fakes
    os.environ["RR_TEST_FRONTIER_KEY"] = "sk-front"
    base = {
        "local": {"urls": [v0.url], "model": "local-model"},
        "frontier": {
            "url": fr.base_url,
            "model": "frontier-model",
            "api_key_env": "RR_TEST_FRONTIER_KEY",
            "price_in_per_m": 10.0,
            "price_cached_in_per_m": 1.0,
            "price_out_per_m": 30.0,
        },
        "policy": {
            "kind": "learned",
            "p_frontier_up": 0.5,
            "p_frontier_down": 0.3,
            "min_dwell_steps": 3,
            "max_switches": 4,
            "value_of_success_usd": 5.0,
        },
        # the learned kind wants a bundle source; the stand-in predictor is installed instead
        "bundle": {"path": str(tmp_path / "unused-bundle"), "watch_s": 0},
        "scrape": {"interval_s": 0},
        "runlog": {"dir": str(tmp_path / "logs")},
        "context": {"embed": "off"},
    }
    base.update(over)
    return RouterSettings.load(None, **base)


def step_request(
    c: httpx.Client, run_id: str, k: int, headers: dict[str, str] | None = None
) -> httpx.Response:
    msgs = [
        {"role": "system", "content": "You are a careful airline agent."},
        {"role": "user", "content": "Change my flight to Las Vegas."},
    ]
    for i in range(k):
        msgs += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "go on"}]
    r = c.post(
        "/v1/chat/completions",
        json={"model": "auto", "messages": msgs},
        headers={"x-run-id": run_id, **(headers or {})},
    )
    assert r.status_code == 200, r.text
    return r


def read_log(tmp_path: Path):
    from features.runlog import read_runlog

    return read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))
