"""Fake backends that follow the real APIs (vLLM's OpenAI server, an OpenAI-like frontier API).

For tests, the demo and benchmarks: ``start_fake`` (async), ``fake_in_thread`` (sync),
``start_fake_process`` (subprocess), or ``runroute fake-backend --kind vllm|frontier``.
See ``router.fakes.vllm`` and ``router.fakes.frontier`` for the engine models and knobs.
"""

from router.fakes.frontier import FakeFrontier, FrontierKnobs
from router.fakes.launch import (
    FAKE_KINDS,
    FakeProcess,
    FakeThread,
    RunningFake,
    fake_in_thread,
    make_fake,
    start_fake,
    start_fake_process,
)
from router.fakes.server import FakeServer, KnobError
from router.fakes.vllm import FakeVllm, VllmKnobs

__all__ = [
    "FAKE_KINDS",
    "FakeFrontier",
    "FakeProcess",
    "FakeServer",
    "FakeThread",
    "FakeVllm",
    "FrontierKnobs",
    "KnobError",
    "RunningFake",
    "VllmKnobs",
    "fake_in_thread",
    "make_fake",
    "start_fake",
    "start_fake_process",
]
