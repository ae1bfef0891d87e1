"""Default figures of the two tiers, in one place for the sidecar's settings, the simulator and replay.

Local (a vLLM replica): ``max_context`` 32,768 tokens, ``prefill_s_per_token`` 1e-4 s,
``ttft_base_s`` 0.02 s. Frontier (an OpenAI-class API): ``name`` ``frontier``, ``max_context``
131,072, prices from :mod:`router.policy.defaults` (USD per 1M input / cached input / output), ``ttft_base_s``
0.4 s. Deployments override every one of them in config; these are what an unset field means.
"""

from __future__ import annotations

from router.policy.defaults import FRONTIER_CACHED_IN_PER_M, FRONTIER_IN_PER_M, FRONTIER_OUT_PER_M

__all__ = ["LOCAL_DEFAULTS", "FRONTIER_DEFAULTS"]

LOCAL_DEFAULTS: dict[str, float | int] = {
    "max_context": 32768,
    "prefill_s_per_token": 0.0001,
    "ttft_base_s": 0.02,
}
FRONTIER_DEFAULTS: dict[str, float | int | str] = {
    "name": "frontier",
    "max_context": 131072,
    "price_in_per_m": FRONTIER_IN_PER_M,
    "price_cached_in_per_m": FRONTIER_CACHED_IN_PER_M,
    "price_out_per_m": FRONTIER_OUT_PER_M,
    "ttft_base_s": 0.4,
}
