"""Local-node profiles: the step-time coefficients of the simulated vLLM replica.

A profile prices one continuous-batching iteration (seconds)::

    t = a + b * sum(prefill tokens) + c * sum(l * (s + l)) + d * sum(decode context) + e * batch

and carries the node's KV bytes per token, context limit, chunked-prefill token budget and
``max_num_seqs``. The shipped profiles (``profiles/*.json``) were written by
:mod:`router.sim.fit_profiles` from ../shared/data/gpu_profiles, each with its provenance and fit error.

``load_profile(spec, gpu)``: ``spec`` is a shipped name (``a100-llama-3-8b``), a path to a JSON file
with the same keys (coefficients fitted by the user on their own vLLM), or ``None`` for the GPU's
default (:data:`DEFAULT_PROFILE`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["NodeProfile", "ProfileError", "load_profile", "list_profiles", "DEFAULT_PROFILE", "PROFILE_DIR"]

PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = {"a100": "a100-llama-3-8b", "h100": "h100-llama-2-7b"}


class ProfileError(ValueError):
    """A node profile cannot be found or is malformed (one line)."""


@dataclass(frozen=True)
class NodeProfile:
    """Coefficients (seconds) and node limits; see the module docstring for the formula."""

    name: str
    a: float
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0
    e: float = 0.0
    kv_bytes_per_token: int = 131072
    max_context: int = 131072
    token_budget: int = 8192  # chunked prefill: tokens per iteration (decode tokens count 1 each)
    max_num_seqs: int = 256
    gpus_per_replica: int = 1
    gpu: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    fit_error: dict[str, Any] = field(default_factory=dict)

    def kv_capacity_tokens(self, kv_cache_gb: float) -> int:
        return int(kv_cache_gb * 1e9 // self.kv_bytes_per_token)

    def iteration_s(self, prefill_tokens: float, prefill_quad: float, decode_ctx: float, batch: int) -> float:
        return self.a + self.b * prefill_tokens + self.c * prefill_quad + self.d * decode_ctx + self.e * batch

    @classmethod
    def from_dict(cls, obj: dict[str, Any], source: str = "<dict>") -> NodeProfile:
        try:
            coef = obj.get("coefficients", obj)
            vals: dict[str, float] = {k: float(coef[k]) for k in "abcde" if k in coef}
            if "a" not in vals:
                raise KeyError("a")
            if any(v < 0 for v in vals.values()):
                raise ProfileError(f"{source}: coefficients must be >= 0")
            extra: dict[str, int] = {
                k: int(obj[k])
                for k in (
                    "kv_bytes_per_token",
                    "max_context",
                    "token_budget",
                    "max_num_seqs",
                    "gpus_per_replica",
                )
                if k in obj
            }
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{source}: not a node profile (bad or missing {e})") from None
        if extra.get("token_budget", 1) < 1 or extra.get("max_num_seqs", 1) < 1:
            raise ProfileError(f"{source}: token_budget and max_num_seqs must be >= 1")
        kw: dict[str, Any] = {**vals, **extra}
        return cls(
            name=str(obj.get("name", Path(source).stem)),
            gpu=str(obj.get("gpu", "")),
            provenance=dict(obj.get("provenance", {})),
            fit_error=dict(obj.get("fit_error", {})),
            **kw,
        )


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(spec: str | None = None, gpu: str = "a100") -> NodeProfile:
    """A shipped profile by name, a user JSON by path, or the GPU's default when ``spec`` is None."""
    if spec is None:
        if gpu not in DEFAULT_PROFILE:
            raise ProfileError(f"unknown gpu '{gpu}' (expected one of {sorted(DEFAULT_PROFILE)})")
        spec = DEFAULT_PROFILE[gpu]
    path = Path(spec)
    if not (path.suffix == ".json" and path.exists()):
        path = PROFILE_DIR / f"{spec}.json"
        if not path.exists():
            raise ProfileError(
                f"unknown node profile '{spec}' (shipped: {', '.join(list_profiles())}; "
                "or pass a path to a JSON file)"
            )
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"{path}: unreadable profile ({e})") from None
    if not isinstance(obj, dict):
        raise ProfileError(f"{path}: a profile must be a JSON object")
    return NodeProfile.from_dict(obj, str(path))
