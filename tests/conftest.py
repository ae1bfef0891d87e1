"""Fixtures of the multi-router tests (tests/test_multi_router*.py; parts in multi_router_support.py)
and of the protocol/client tests (``small_bundle``, ``proto_fakes``, ``sidecar``; parts in
protocol_support.py).

Module-scoped: each module that asks for one gets its own private redis-server / fakes / cluster.
"""

from __future__ import annotations

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


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A ``pure_python`` test patches methods of the simulator's modules to watch its internals; a
    compiled (mypyc) class calls its own methods directly, past the patch. While the compiled
    modules serve (``router/native.py``), such a test runs in a pytest subprocess on the pure-Python
    source (``RUNROUTE_NATIVE=0``) and passes or fails with it; ``tests/test_native.py`` holds the
    compiled modules to the same results as their source."""
    if pyfuncitem.get_closest_marker("pure_python") is None:
        return None
    from router import native

    if not native.active():
        return None
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", pyfuncitem.nodeid],
        cwd=root,
        env={**os.environ, "RUNROUTE_NATIVE": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        pytest.fail(
            f"pure-Python run of {pyfuncitem.nodeid} failed:\n{res.stdout[-4000:]}{res.stderr[-2000:]}"
        )
    assert " passed" in res.stdout and " skipped" not in res.stdout, res.stdout[-2000:]
    return True
