"""Plain prediction types shared by the predictors, the policy layer, the router and the simulator."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Predictions"]


@dataclass(frozen=True, slots=True)
class Predictions:
    """What the bundle predicts for a run at step k, before generation starts.

    - ``p_frontier``: calibrated P(run needs the frontier | prefix at step k), in [0, 1].
    - ``cache_reuse_tokens``: prompt tokens of the next step that will hit the local prefix cache if
      the run stays on its local replica (the learned model's; what policies decide on).
    - ``cache_index_tokens``: the same read from the router's prefix index
      (:mod:`router.core.prefix_index`): the blocks of the step's chain the index says the chosen
      local replica holds x the index's block size in tokens (token blocks in the simulator and
      replay; in the sidecar character blocks of ``block_chars / 4`` tokens each). Set by the step
      engine at commit, after the decision (so no decision depends on the block mode); None
      without an index, off the local tier or before commit.
    - ``remaining_steps_p50/p90``, ``remaining_tokens_p50/p90``: remaining work quantiles
      (tokens = prompt + completion tokens of the remaining steps).
    - ``p_success_local`` / ``p_success_frontier``: P(run succeeds | stays local) and P(run succeeds
      | escalates now) from the benefit model (:mod:`models.benefit`); None without one, or when
      the run's domain is unknown.
    - ``benefit``: ``p_success_frontier - p_success_local`` (the policy prices it with the value of
      success and the extra cost); None when the two are.
    - ``domain_mode``: ``"model"`` (the domain's own model, active by its CV evidence) or
      ``"prior"`` (base rates: the prior policy); ``domain_reason``: why, in one line.
    """

    p_frontier: float
    cache_reuse_tokens: float = 0.0
    remaining_steps_p50: float = 1.0
    remaining_steps_p90: float = 1.0
    remaining_tokens_p50: float = 0.0
    remaining_tokens_p90: float = 0.0
    p_success_local: float | None = None
    p_success_frontier: float | None = None
    benefit: float | None = None
    domain_mode: str | None = None
    domain_reason: str | None = None
    cache_index_tokens: float | None = None

    def with_cache_index(self, tokens: float) -> Predictions:
        """A copy with ``cache_index_tokens`` set (``dataclasses.replace`` without its per-call field
        introspection: the step engine calls this at every local commit)."""
        return Predictions(
            self.p_frontier,
            self.cache_reuse_tokens,
            self.remaining_steps_p50,
            self.remaining_steps_p90,
            self.remaining_tokens_p50,
            self.remaining_tokens_p90,
            self.p_success_local,
            self.p_success_frontier,
            self.benefit,
            self.domain_mode,
            self.domain_reason,
            tokens,
        )

    def as_dict(self) -> dict[str, float]:
        """The numeric predictions (the run log's ``predictions`` map: floats only; the benefit
        fields appear once set)."""
        out = {
            "p_frontier": self.p_frontier,
            "cache_reuse_tokens": self.cache_reuse_tokens,
            "remaining_steps_p50": self.remaining_steps_p50,
            "remaining_steps_p90": self.remaining_steps_p90,
            "remaining_tokens_p50": self.remaining_tokens_p50,
            "remaining_tokens_p90": self.remaining_tokens_p90,
        }
        for k in ("p_success_local", "p_success_frontier", "benefit", "cache_index_tokens"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out
