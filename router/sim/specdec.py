"""Speculative decoding in the node model: tokens per decode iteration from a measured or assumed acceptance.

Algorithm (applied per request by :meth:`SpecDecode.apply`; the node prices it, :mod:`router.sim.node`):

- A decode iteration verifies the drafted tokens of each request in one forward pass and emits the
  accepted ones plus one (the target's own next token): ``E`` tokens on average
  (``tokens_per_iteration``), at the cost of ``V`` extra tokens in the pass
  (``proposed_per_iteration``, priced like prefill tokens: ``b * V``) and of the drafter
  (``draft_s`` per iteration). A request of ``n`` output tokens then needs ``ceil((n - 1) / E)``
  decode iterations after the prefill iteration that emits its first token, and its context grows
  by ``E`` tokens per iteration.
- **Prompt lookup** (vLLM ``method: "ngram"`` with ``prompt_lookup_min/max`` and
  ``num_speculative_tokens``): ``E`` and ``V`` per step kind (``tool_call``: the step made tool
  calls; ``free_text``: the rest) as *measured* by :mod:`router.sim.spec_measure` on the logged
  tau-bench / tau2-bench assistant outputs, read from the shipped
  ``prompt_lookup_acceptance.json`` (with its provenance). No draft model: ``draft_s = 0``.
- **EAGLE-style** (a draft head): an assumed per-token acceptance ``alpha`` (a parameter, not a
  measurement), i.i.d. per position: ``E = (1 - alpha^(k+1)) / (1 - alpha)`` (Leviathan et al.),
  ``V = k``; the head runs ``k`` times per iteration, each costing ``draft_cost_ratio`` of the
  target's fixed per-iteration time: ``draft_s = k * draft_cost_ratio * a``.
- **Draft model** (a separate small model, vLLM ``method: "draft_model"``): the same assumed
  acceptance as EAGLE, and a stated cost per *proposed token*: each decoding request's ``V = k``
  drafts cost ``draft_s_per_token`` seconds each, so an iteration's drafting time is
  ``draft_s_per_token * sum(V)`` over its decoding requests (it grows with the batch, unlike the
  head's per-iteration ``draft_s``). The figure is a parameter (``ms=``), e.g. a small model's
  batch-1 decode step time divided by the batch it runs at; not fitted, and not scaled by TP.

Knobs (:class:`SpecDecode`): ``method``, ``num_speculative_tokens`` (k), the two :class:`KindRate`
(``tool_call``, ``free_text``), ``draft_cost_ratio``, ``draft_s_per_token`` (draft model, seconds per
proposed token), ``source`` (where the rates come from).
:func:`parse_spec` reads the CLI form: ``prompt-lookup`` (the shipped default configuration),
``prompt-lookup:min=2,max=4,k=4`` (a measured configuration), ``eagle:alpha=0.7,k=4[,draft=0.05]``,
``draft-model:alpha=0.7,ms=1.5[,k=4]`` (ms per proposed token).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.sim.profiles import NodeProfile

if TYPE_CHECKING:
    from router.sim.node import Request

__all__ = [
    "ACCEPTANCE_FILE",
    "KindRate",
    "SpecDecode",
    "SpecError",
    "draft_model",
    "eagle",
    "prompt_lookup",
    "parse_spec",
    "load_acceptance",
]

ACCEPTANCE_FILE = Path(__file__).with_name("prompt_lookup_acceptance.json")


class SpecError(ValueError):
    """A bad speculative-decoding spec or acceptance file (one line)."""


@dataclass(frozen=True)
class KindRate:
    tokens_per_iteration: float  # E >= 1: tokens a decode iteration emits on average
    proposed_per_iteration: float = 0.0  # V >= 0: draft tokens verified per iteration

    def __post_init__(self) -> None:
        if not self.tokens_per_iteration >= 1.0 or not self.proposed_per_iteration >= 0.0:
            raise SpecError("tokens_per_iteration must be >= 1 and proposed_per_iteration >= 0")


@dataclass(frozen=True)
class SpecDecode:
    method: str
    num_speculative_tokens: int
    tool_call: KindRate
    free_text: KindRate
    draft_cost_ratio: float = 0.0
    source: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    draft_s_per_token: float = 0.0  # a draft model's seconds per proposed token (per request)

    def draft_s(self, profile: NodeProfile) -> float:
        """Drafter seconds per decode iteration (0 for prompt lookup)."""
        return self.num_speculative_tokens * self.draft_cost_ratio * profile.a

    def apply(self, req: Request, tool_call: bool) -> None:
        """Set a :class:`router.sim.node.Request`'s iterations, context growth and verified drafts."""
        rate = self.tool_call if tool_call else self.free_text
        e = rate.tokens_per_iteration
        n = req.gen_target
        req.it_target = 1 + (math.ceil((n - 1) / e) if n > 1 else 0)
        req.grow = e
        req.c0 = req.prompt + 1 - e
        req.vt = rate.proposed_per_iteration

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "tool_call": vars(self.tool_call),
            "free_text": vars(self.free_text),
            "draft_cost_ratio": self.draft_cost_ratio,
            "draft_s_per_token": self.draft_s_per_token,
            "source": self.source,
            **dict(self.params),
        }


def eagle(alpha: float, k: int = 4, draft_cost_ratio: float = 0.05) -> SpecDecode:
    """EAGLE-style drafting with an assumed per-token acceptance ``alpha`` (same for both kinds)."""
    if not 0.0 <= alpha < 1.0 or k < 1 or draft_cost_ratio < 0:
        raise SpecError("eagle: need 0 <= alpha < 1, k >= 1, draft >= 0")
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    rate = KindRate(e, float(k))
    return SpecDecode(
        "eagle",
        k,
        rate,
        rate,
        draft_cost_ratio,
        source="parameter (assumed acceptance, not measured)",
        params=(("alpha", alpha),),
    )


def draft_model(alpha: float, ms_per_token: float, k: int = 4) -> SpecDecode:
    """A separate draft model: EAGLE's assumed acceptance, drafting priced per proposed token."""
    if not 0.0 <= alpha < 1.0 or k < 1 or ms_per_token < 0:
        raise SpecError("draft-model: need 0 <= alpha < 1, k >= 1, ms >= 0")
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    rate = KindRate(e, float(k))
    return SpecDecode(
        "draft-model",
        k,
        rate,
        rate,
        0.0,
        source="parameters (assumed acceptance and draft cost, not measured)",
        params=(("alpha", alpha),),
        draft_s_per_token=ms_per_token / 1000.0,
    )


def load_acceptance(path: str | Path | None = None) -> dict[str, Any]:
    p = Path(path) if path is not None else ACCEPTANCE_FILE
    try:
        obj = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"{p}: unreadable acceptance file ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("configs"), list) or not obj["configs"]:
        raise SpecError(f"{p}: not an acceptance file (no 'configs' list)")
    return obj


def prompt_lookup(
    min_n: int | None = None, max_n: int | None = None, k: int | None = None, path: str | Path | None = None
) -> SpecDecode:
    """The measured prompt-lookup rates of one configuration (default: the file's ``default``)."""
    obj = load_acceptance(path)
    cfgs = obj["configs"]
    if min_n is None and max_n is None and k is None:
        cfg = cfgs[int(obj.get("default", 0))]
    else:
        hits = [
            c
            for c in cfgs
            if (min_n is None or c["prompt_lookup_min"] == min_n)
            and (max_n is None or c["prompt_lookup_max"] == max_n)
            and (k is None or c["num_speculative_tokens"] == k)
        ]
        if not hits:
            have = ", ".join(
                f"min={c['prompt_lookup_min']},max={c['prompt_lookup_max']},k={c['num_speculative_tokens']}"
                for c in cfgs
            )
            raise SpecError(f"prompt-lookup: no measured configuration matches (measured: {have})")
        cfg = hits[0]

    def rate(kind: str) -> KindRate:
        m = cfg["kinds"][kind]
        return KindRate(float(m["tokens_per_iteration"]), float(m["proposed_per_iteration"]))

    return SpecDecode(
        "prompt-lookup",
        int(cfg["num_speculative_tokens"]),
        rate("tool_call"),
        rate("free_text"),
        0.0,
        source=f"measured: {Path(path).name if path else ACCEPTANCE_FILE.name}",
        params=(
            ("prompt_lookup_min", cfg["prompt_lookup_min"]),
            ("prompt_lookup_max", cfg["prompt_lookup_max"]),
        ),
    )


def parse_spec(text: str | None) -> SpecDecode | None:
    """``none`` | ``prompt-lookup[:min=,max=,k=]`` | ``eagle:alpha=A[,k=K][,draft=R]``."""
    if not text or text == "none":
        return None
    kind, _, rest = text.partition(":")
    kv: dict[str, str] = {}
    for part in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, val = part.partition("=")
        if not eq:
            raise SpecError(f"--spec {text!r}: expected key=value, got {part!r}")
        kv[key.strip()] = val.strip()
    try:
        if kind == "prompt-lookup":
            unknown = set(kv) - {"min", "max", "k"}
            if unknown:
                raise SpecError(f"--spec prompt-lookup: unknown keys {sorted(unknown)}")
            ints = {key: int(v) for key, v in kv.items()}
            return prompt_lookup(ints.get("min"), ints.get("max"), ints.get("k"))
        if kind == "draft-model":
            unknown = set(kv) - {"alpha", "k", "ms"}
            if unknown or "alpha" not in kv or "ms" not in kv:
                raise SpecError(
                    "--spec draft-model: needs alpha=A and ms=M (ms per proposed token; optionally k=K)"
                )
            return draft_model(float(kv["alpha"]), float(kv["ms"]), int(kv.get("k", 4)))
        if kind == "eagle":
            unknown = set(kv) - {"alpha", "k", "draft"}
            if unknown or "alpha" not in kv:
                raise SpecError("--spec eagle: needs alpha=A (and optionally k=K, draft=R)")
            return eagle(float(kv["alpha"]), int(kv.get("k", 4)), float(kv.get("draft", 0.05)))
    except ValueError as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"--spec {text!r}: {e}") from None
    raise SpecError(
        f"--spec {text!r}: expected none, prompt-lookup[:min=,max=,k=], eagle:alpha=A or draft-model:alpha=A,ms=M"
    )
