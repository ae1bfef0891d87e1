"""Deployment defaults, each written once: what an unset price, SLO or KV size means everywhere.

Algorithm: none; these are the figures the sidecar's settings, the policy's cost model, the
simulator (``SimConfig``, ``runroute whatif``), evaluation (``training.eval.outcome.Prices``),
the fakes and the CLI fall back to when a deployment does not say. They sit in ``router.policy``
because that is the lowest import layer that needs one of them (the learned policy's GPU price,
the admission gate's short-step SLO); everything above imports them from here. A what-if of a
deployment therefore answers with the prices and SLO the sidecar serves with.

Knobs (every one is overridden per deployment in config; ``tests/test_defaults.py`` greps the
tree for a second copy of each literal):

- ``GPU_HOUR_USD`` (2.0): local GPU price, USD per GPU-hour (the learned policy's cost model
  prices local prefill with it; the simulator and evaluation bill local GPU time with it).
- ``FRONTIER_IN_PER_M`` / ``FRONTIER_CACHED_IN_PER_M`` / ``FRONTIER_OUT_PER_M`` (2.0 / 0.5 / 8.0)
  and ``FRONTIER_CACHE_WRITE_PER_M`` (2.5, 1.25 x input: the Anthropic-style cache-write
  premium): frontier prices, USD per 1M tokens.
- ``SLO_SHORT_STEP_S`` (2.0): per-step latency SLO of short steps (tool calls, short answers),
  which the admission gate admits against and the simulator and evaluation score against.
- ``SLO_TTFT_S`` (5.0): per-step SLO of long steps (more than the short-step output tokens):
  their time to first token. The simulator's scorecard and the evaluation score long steps
  against it; the sidecar's ``slo.ttft_s``. 5 s is the figure the what-if reports were made with
  (the sidecar said 1 s but read it nowhere; the evaluation used the short-step SLO, 2 s).
- ``SLO_STEP_S`` (10.0): per-step end-to-end latency target of the sidecar's SLO-attainment
  metric (``runroute_slo_steps_total``, ``slo.step_latency_s``).
- ``SHORT_STEP_TOKENS`` (64): a step with at most this many output tokens (or a tool call) is short.
- ``KV_CACHE_GB`` (16.0): KV cache per local replica, GB.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "GPU_HOUR_USD",
    "FRONTIER_IN_PER_M",
    "FRONTIER_CACHED_IN_PER_M",
    "FRONTIER_OUT_PER_M",
    "FRONTIER_CACHE_WRITE_PER_M",
    "SLO_SHORT_STEP_S",
    "SLO_TTFT_S",
    "SLO_STEP_S",
    "SHORT_STEP_TOKENS",
    "KV_CACHE_GB",
]

GPU_HOUR_USD: Final[float] = 2.0
FRONTIER_IN_PER_M: Final[float] = 2.0
FRONTIER_CACHED_IN_PER_M: Final[float] = 0.5
FRONTIER_OUT_PER_M: Final[float] = 8.0
FRONTIER_CACHE_WRITE_PER_M: Final[float] = 2.5
SLO_SHORT_STEP_S: Final[float] = 2.0
SLO_TTFT_S: Final[float] = 5.0
SLO_STEP_S: Final[float] = 10.0
SHORT_STEP_TOKENS: Final[int] = 64
KV_CACHE_GB: Final[float] = 16.0
