"""Shared fixtures of the client tests: a small real bundle, loopback fakes of every protocol, and a
sidecar factory (real uvicorn, the learned policy) whose run log can be read back after it stops."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

TOOL_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory) -> Path:
    """A small real ModelBundle (LightGBM escalation model on synthetic rows); P(frontier) stays
    low, so the learned policy keeps runs local unless a test says otherwise."""
    from features.extract import N_FEATURES
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, N_FEATURES))
    y = (rng.random(400) < 0.15).astype(int)
    est = EscalationClassifier(n_estimators=20, calibration="sigmoid", cv=3, n_jobs=1).fit(X, y)
    out = tmp_path_factory.mktemp("bundle") / "b"
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.95, "p_frontier_down": 0.9}).save(out)
    return out


@pytest.fixture(scope="module")
def proto_fakes():
    """Two fake vLLM replicas (chat, responses, messages), a fake OpenAI frontier and a fake
    Anthropic frontier; runs finish after 3 tool turns."""
    knobs = dict(
        model="local-model",
        zero_latency=True,
        max_tool_turns=3,
        strict_model=False,
        max_model_len=200000,
        capacity_blocks=40000,
        max_tokens_cap=64,
    )
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("vllm", name="v1", **knobs) as v1,
        fake_in_thread(
            "frontier", model="frontier-model", zero_latency=True, api_key="sk-oa", max_tool_turns=3
        ) as oa,
        fake_in_thread(
            "anthropic",
            model="claude-fake",
            zero_latency=True,
            api_key="sk-an",
            strict_model=False,
            max_tool_turns=3,
        ) as an,
    ):
        yield {"v0": v0, "v1": v1, "openai": oa, "anthropic": an}


def sidecar_settings(tmp_path: Path, fakes: dict[str, Any], bundle: Path, **over: Any) -> RouterSettings:
    os.environ["RR_TEST_OA_KEY"] = "sk-oa"
    os.environ["RR_TEST_AN_KEY"] = "sk-an"
    base: dict[str, Any] = {
        "local": {"urls": [fakes["v0"].url, fakes["v1"].url], "model": "local-model", "max_context": 200000},
        "frontiers": [
            {
                "kind": "openai",
                "name": "openai",
                "url": fakes["openai"].url,
                "model": "frontier-model",
                "api_key_env": "RR_TEST_OA_KEY",
                "models": ["gpt-*"],
                "default": True,
            },
            {
                "kind": "anthropic",
                "name": "claude",
                "url": fakes["anthropic"].url,
                "model": "claude-fake",
                "api_key_env": "RR_TEST_AN_KEY",
                "models": ["claude-*"],
                "price_in_per_m": 3.0,
                "price_cached_in_per_m": 0.3,
                "price_cache_write_per_m": 3.75,
                "price_out_per_m": 15.0,
            },
        ],
        "policy": {"kind": "learned"},
        "bundle": {"path": str(bundle), "watch_s": 0},
        "scrape": {"interval_s": 0},
        "runlog": {"dir": str(tmp_path / "logs")},
    }
    base.update(over)
    return RouterSettings.load(None, **base)


@contextlib.contextmanager
def running_sidecar(settings: RouterSettings, **kw: Any):
    """``(url, app)`` of a sidecar on loopback; the run log is flushed when the block exits."""
    app = create_app(settings, **kw)
    with serve_in_thread(app) as url:
        yield url, app


def read_steps(tmp_path: Path):
    from features.runlog import read_runlog

    return read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))


@pytest.fixture
def sidecar(tmp_path, proto_fakes, small_bundle):
    """A factory: ``with sidecar(**settings_overrides) as (url, app): ...``."""

    def make(**over: Any):
        return running_sidecar(sidecar_settings(tmp_path, proto_fakes, small_bundle, **over))

    return make
