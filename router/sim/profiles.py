"""Local-node profiles: the step-time coefficients of the simulated vLLM replica.

A profile prices one continuous-batching iteration (seconds)::

    t = a + b * sum(prefill tokens) + c * sum(l * (s + l)) + d * sum(decode context) + e * batch

and carries the node's KV bytes per token, context limit, chunked-prefill token budget and
``max_num_seqs``. The shipped profiles (``profiles/*.json``) were written by
:mod:`router.sim.fit_profiles` from ../shared/data/gpu_profiles, each with its provenance and fit error.

A profile may also carry the node's memory (``gpu_memory_gb``, ``gpu_memory_utilization``, ``weights_gb``,
``reserve_gb``): :meth:`NodeProfile.default_kv_cache_gb` is then the KV cache a vLLM replica gets,
``gpu_memory_gb * gpu_memory_utilization - weights_gb - reserve_gb`` (vLLM's ``--gpu-memory-utilization``
budget less the weights and the profiled activation/graph reserve), and ``references`` (the cited
figures the fit is checked against). :func:`profile_table` lists every shipped profile with its sources.

``load_profile(spec, gpu)``: ``spec`` is a shipped name (``a100-llama-3-8b``), a path to a JSON file
with the same keys (coefficients fitted by the user on their own vLLM), or ``None`` for the GPU's
default (:data:`DEFAULT_PROFILE`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "NodeProfile",
    "ProfileError",
    "load_profile",
    "list_profiles",
    "profile_table",
    "DEFAULT_PROFILE",
    "PROFILE_DIR",
]

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
    gpu_memory_gb: float = 0.0  # 0: unknown (no derived KV size)
    gpu_memory_utilization: float = 0.9  # vLLM's default --gpu-memory-utilization
    weights_gb: float = 0.0
    reserve_gb: float = 0.0  # activations of a full-budget forward pass, CUDA graphs, non-torch memory
    references: tuple[dict[str, Any], ...] = ()

    def default_kv_cache_gb(self) -> float | None:
        """KV GB per replica vLLM leaves: memory x utilisation - weights - reserve (None if unknown)."""
        if self.gpu_memory_gb <= 0:
            return None
        kv = self.gpu_memory_gb * self.gpu_memory_utilization * self.gpus_per_replica
        kv -= self.weights_gb + self.reserve_gb * self.gpus_per_replica
        return round(kv, 1) if kv > 0 else None

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
        try:
            mem: dict[str, float] = {
                k: float(obj[k])
                for k in ("gpu_memory_gb", "gpu_memory_utilization", "weights_gb", "reserve_gb")
                if k in obj
            }
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{source}: not a node profile (bad memory field: {e})") from None
        if any(v < 0 for v in mem.values()) or not 0 < mem.get("gpu_memory_utilization", 0.9) <= 1:
            raise ProfileError(f"{source}: memory fields must be >= 0 and gpu_memory_utilization in (0, 1]")
        kw: dict[str, Any] = {**vals, **extra, **mem}
        refs = obj.get("references", [])
        return cls(
            name=str(obj.get("name", Path(source).stem)),
            gpu=str(obj.get("gpu", "")),
            provenance=dict(obj.get("provenance", {})),
            fit_error=dict(obj.get("fit_error", {})),
            references=tuple(dict(r) for r in refs) if isinstance(refs, list) else (),
            **kw,
        )


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def profile_table() -> list[dict[str, Any]]:
    """One row per shipped profile: name, GPU, default for, coefficients, derived KV GB, sources, fit error."""
    defaults = {v: k for k, v in DEFAULT_PROFILE.items()}
    out = []
    for name in list_profiles():
        p = load_profile(name)
        src = p.provenance.get("source", [])
        terms = p.provenance.get("terms", {})
        out.append(
            {
                "name": p.name,
                "gpu": p.gpu,
                "default_for": defaults.get(p.name),
                "coefficients": {k: getattr(p, k) for k in "abcde"},
                "terms": {k: str(terms.get(k, "")).split(":")[0] for k in "abcde"},
                "default_kv_cache_gb": p.default_kv_cache_gb(),
                "sources": [src] if isinstance(src, str) else list(src),
                "fit_error": p.fit_error,
                "references": list(p.references),
            }
        )
    return out


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
