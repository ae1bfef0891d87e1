"""Fixtures of the multi-router tests (tests/test_multi_router*.py; parts in multi_router_support.py)
and of the protocol/client tests (``small_bundle``, ``proto_fakes``, ``sidecar``; parts in
protocol_support.py).

Module-scoped: each module that asks for one gets its own private redis-server / fakes / cluster.
"""

from __future__ import annotations

import os

# The suite's own process imports the simulator's modules from source, never the mypyc build
# (router/native.py): it runs for 12 minutes with fake backends and servers in threads, tests patch
# the simulator's methods to watch its bookkeeping (a compiled class calls its own methods past a
# patch), and CI's first run with the build in this process segfaulted at interpreter exit after
# every test had passed (not reproduced here: three full runs). The decision is taken once, at the
# first import of ``router``; the variable is then restored, so the processes the tests start (the
# CLI, bench scripts, tests/test_native.py's pure-vs-compiled comparison) use the build.
_native_env = os.environ.get("RUNROUTE_NATIVE")
os.environ["RUNROUTE_NATIVE"] = "0"
import router.native

assert not router.native.active(), router.native.status()
if _native_env is None:
    del os.environ["RUNROUTE_NATIVE"]
else:
    os.environ["RUNROUTE_NATIVE"] = _native_env

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from multi_router_support import (
    FAKE_BASE_MS,
    REDIS_BIN,
    Cluster,
    RedisProc,
    free_port,
    running_cluster,
)
from protocol_support import running_sidecar, sidecar_settings

from router.fakes.launch import fake_in_thread


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory) -> Iterator[RedisProc]:
    if REDIS_BIN is None:  # .ci/run installs it: a missing one is a broken environment, never a skip
        pytest.fail("redis-server is not installed (apt-get install redis-server); Redis tests need it")
    r = RedisProc(free_port(), tmp_path_factory.mktemp("redis"))
    r.start()
    try:
        yield r
    finally:
        r.kill()


@pytest.fixture(scope="module")
def fakes():
    knobs = dict(model="local-model", base_ms=FAKE_BASE_MS, prefill_ms_per_token=0.0, decode_ms_per_token=0.0)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("vllm", name="v1", **knobs) as v1,
        fake_in_thread("frontier", name="fr", model="frontier-model", zero_latency=True) as fr,
    ):
        yield v0, v1, fr


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    """A small real bundle whose P(frontier) stays ~0.15 (labels unrelated to the features)."""
    from features.extract import N_FEATURES
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, N_FEATURES))
    y = (rng.random(300) < 0.15).astype(int)
    est = EscalationClassifier(n_estimators=10, calibration="sigmoid", cv=3, n_jobs=1).fit(X, y)
    out = tmp_path_factory.mktemp("bundle") / "b"
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.95, "p_frontier_down": 0.0}).save(out)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_proc, fakes, bundle_dir) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("routers"), redis_proc, fakes, bundle_dir) as c:
        yield c


@pytest.fixture
def live(cluster: Cluster) -> Cluster:
    """The cluster with Redis and both routers up (an earlier test may have left one down)."""
    if not cluster.redis.ping():
        cluster.redis.kill()
        cluster.redis.start()
    for r in (cluster.a, cluster.b):
        if not r.alive():
            r.start()
    return cluster


# ---------------------------------------------------------------- protocol and client tests


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


@pytest.fixture
def sidecar(tmp_path, proto_fakes, small_bundle):
    """A factory: ``with sidecar(**settings_overrides) as (url, app): ...``."""

    def make(**over: Any):
        return running_sidecar(sidecar_settings(tmp_path, proto_fakes, small_bundle, **over))

    return make
