"""Default figures of the two tiers, in one place for the sidecar's settings, the simulator and replay.

Local (a vLLM replica): ``max_context`` 32,768 tokens, ``prefill_s_per_token`` 1e-4 s,
``ttft_base_s`` 0.02 s. Frontier (an OpenAI-class API): ``name`` ``frontier``, ``max_context``
131,072, prices 2.0 / 0.5 / 8.0 USD per 1M input / cached input / output tokens, ``ttft_base_s``
0.4 s. Deployments override every one of them in config; these are what an unset field means.
"""

from __future__ import annotations

__all__ = ["LOCAL_DEFAULTS", "FRONTIER_DEFAULTS"]

LOCAL_DEFAULTS: dict[str, float | int] = {
    "max_context": 32768,
    "prefill_s_per_token": 0.0001,
    "ttft_base_s": 0.02,
}
FRONTIER_DEFAULTS: dict[str, float | int | str] = {
    "name": "frontier",
    "max_context": 131072,
    "price_in_per_m": 2.0,
    "price_cached_in_per_m": 0.5,
    "price_out_per_m": 8.0,
    "ttft_base_s": 0.4,
}
