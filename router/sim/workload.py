"""Workloads for the what-if simulator: logged runs pre-extracted for the inner loop.

Algorithm (:meth:`Workload.from_runlog` / :meth:`Workload.from_frames`): each logged run becomes a
list of :class:`StepSpec` (prompt and output tokens, logged tool pause, tool calls/results, the
request fields the features read) plus a *block chain* for the prefix cache: the step's
``hash_ids`` when logged (Mooncake, 512-token blocks), otherwise a run-private chain derived from
the growing prompt: step k shares its first ``reuse // block_tokens`` blocks with step k-1's chain
(``reuse`` = ``prefix_reuse_tokens`` when logged, else the previous prompt + output) and gets fresh
(negative, so never colliding with logged) ids for the rest, over its prompt + output (what vLLM
would hold after the step). ``upper`` is the step's cross-turn cache upper bound: prompt tokens
repeating the run's earlier prefix. A step is *short* when it has <= :data:`SHORT_STEP_TOKENS`
output tokens, produced a tool call or is structured.

Knobs: ``block_tokens`` (512, the Mooncake block size), ``limit_runs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.figures import is_short, upper_bound_tokens
from router.core.prefix_cache import chains_form_forest
from router.policy.defaults import SHORT_STEP_TOKENS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import RunLog

__all__ = ["SimError", "SHORT_STEP_TOKENS", "StepSpec", "RunSpec", "Workload"]


class SimError(ValueError):
    """A bad simulator input (workload, config or a policy answer naming no backend); one line."""


class StepSpec:
    """One logged step, pre-extracted for the inner loop (no pandas, no pydantic)."""

    __slots__ = (
        "prompt",
        "completion",
        "pause",
        "chain",
        "n_lookup",
        "n_cacheable",
        "upper",
        "short",
        "tool_calls",
        "tool_call_keys",
        "tool_results_n",
        "errors",
        "result_tokens",
        "structured",
        "n_tools",
        "wants_json",
        "signals",
        "request",
    )

    def __init__(
        self,
        prompt: int,
        completion: int,
        pause: float,
        chain: tuple[int, ...],
        n_lookup: int,
        n_cacheable: int,
        upper: int,
        tool_calls: tuple[str, ...] = (),
        tool_call_keys: tuple[str, ...] = (),
        tool_results_n: int = 0,
        errors: tuple[bool, ...] = (),
        result_tokens: tuple[int, ...] = (),
        structured: bool | None = None,
        n_tools: int = 0,
        wants_json: bool = False,
        signals: tuple[str, ...] = (),
    ):
        self.prompt = prompt
        self.completion = completion
        self.pause = pause
        self.chain = chain
        self.n_lookup = n_lookup
        self.n_cacheable = n_cacheable
        self.upper = upper
        self.tool_calls = tool_calls
        self.tool_call_keys = tool_call_keys
        self.tool_results_n = tool_results_n
        self.errors = errors
        self.result_tokens = result_tokens
        self.structured = structured
        self.n_tools = n_tools
        self.wants_json = wants_json
        self.signals = signals  # signal kinds posted on the run since the previous step (Step.signals)
        self.short = is_short(completion, bool(tool_calls), bool(structured))
        self.request: Any = None  # the simulator's router.core.record.StepRequest, built on first use


@dataclass
class RunSpec:
    run_id: str
    steps: list[StepSpec]
    started_s: float = math.nan
    needs_frontier: bool | None = None
    domain: str | None = None  # the run record's domain (RunPrefix.domain)
    task_embedding: Any = None  # the run record's task embedding (RunPrefix.task_embedding)


def _lead_common(a: Sequence[int], b: Sequence[int], n: int) -> int:
    i = 0
    lim = min(n, len(a), len(b))
    while i < lim and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Workload:
    """Runs ready for replay; immutable during simulation and shared by all grid points."""

    runs: list[RunSpec]
    block_tokens: int = 512

    @property
    def n_steps(self) -> int:
        return sum(len(r.steps) for r in self.runs)

    def forest_chains(self) -> bool:
        """Whether the steps' block chains form a forest (one predecessor per block id, as hash
        chains have: :func:`router.core.prefix_cache.chains_form_forest`); kept while the runs and
        their step counts stay as they were."""
        key = (len(self.runs), self.n_steps)
        memo = self.__dict__.get("_forest")
        if memo is None or memo[0] != key:
            memo = self.__dict__["_forest"] = (
                key,
                chains_form_forest(s.chain for r in self.runs for s in r.steps),
            )
        return bool(memo[1])

    def mean_steps_per_run(self) -> float:
        return self.n_steps / max(len(self.runs), 1)

    def logged_starts(self) -> np.ndarray:
        return np.array([r.started_s for r in self.runs], dtype=float)

    @classmethod
    def from_runlog(cls, log: RunLog, block_tokens: int = 512, limit_runs: int | None = None) -> Workload:
        return cls.from_frames(log.steps, log.runs, block_tokens=block_tokens, limit_runs=limit_runs)

    @classmethod
    def from_frames(
        cls,
        steps: pd.DataFrame,
        runs: pd.DataFrame | None = None,
        *,
        block_tokens: int = 512,
        limit_runs: int | None = None,
    ) -> Workload:
        """Build from run-log frames (``steps`` sorted by run and step, as ``read_runlog`` returns them)."""
        if block_tokens < 1:
            raise SimError("block_tokens must be >= 1")
        if steps is None or len(steps) == 0:
            raise SimError("the run log holds no step records to replay")
        steps = steps.sort_values(["run_id", "step"], kind="stable")
        n = len(steps)

        def col(name: str, default: object = None) -> list[Any]:
            if name not in steps.columns:
                return [default] * n
            return steps[name].tolist()

        from features.logged import opt  # the one missing-value test of a logged cell

        def isnull(v: object) -> bool:
            return opt(v) is None

        rid, prompt, comp = col("run_id"), col("prompt_tokens"), col("completion_tokens")
        pause, reuse, hashes = col("tool_pause_s"), col("prefix_reuse_tokens"), col("hash_ids")
        arrival = col("arrival_s")
        tcalls, tkeys, trn = col("tool_calls"), col("tool_call_keys"), col("tool_results_n", 0)
        terr, ttok, struct = col("tool_result_errors"), col("tool_result_tokens"), col("structured")
        ntools, wjson, sigs = col("n_tools_offered"), col("wants_json"), col("signals")

        starts: dict[str, float] = {}
        labels: dict[str, bool | None] = {}
        from features.logged import run_context

        domains, embeddings = run_context(runs) if runs is not None else ({}, {})
        if runs is not None and len(runs):
            for r_id, sa, nf in zip(
                runs["run_id"].tolist(),
                runs["started_at"].tolist(),
                runs["needs_frontier"].tolist(),
                strict=True,
            ):
                if not isnull(sa):
                    starts[r_id] = float(sa)
                labels[r_id] = None if isnull(nf) else bool(nf)

        def tup(v: Any) -> tuple[Any, ...]:
            if isnull(v):
                return ()
            return tuple(v.tolist() if hasattr(v, "tolist") else v)

        out: list[RunSpec] = []
        cur: RunSpec | None = None
        fresh = -1  # run-private block ids are negative, so they never collide with logged hash_ids
        chain_prev: tuple[int, ...] = ()
        seen: set[int] = set()
        prev_total = 0
        B = block_tokens
        for i in range(n):
            r = rid[i]
            if cur is None or r != cur.run_id:
                if limit_runs is not None and len(out) >= limit_runs:
                    break
                st = starts.get(r, math.nan)
                if math.isnan(st) and not isnull(arrival[i]):
                    st = float(arrival[i])
                cur = RunSpec(
                    run_id=r,
                    steps=[],
                    started_s=st,
                    needs_frontier=labels.get(r),
                    domain=domains.get(str(r)),
                    task_embedding=embeddings.get(str(r)),
                )
                out.append(cur)
                chain_prev, seen, prev_total = (), set(), 0
            p = int(prompt[i])
            c = int(comp[i])
            if p < 0 or c < 0:
                raise SimError(f"run {r}: negative token counts")
            k = len(cur.steps)
            logged_reuse = None if isnull(reuse[i]) else int(reuse[i])
            h = hashes[i]
            if not isnull(h):
                # logged block hashes: the repeated prefix = leading blocks seen earlier in the run.
                # An empty list is logged too (a prompt shorter than one block holds no full block),
                # not "not logged": a chain made up over prompt + output would cache blocks vLLM never does
                chain = tuple(int(x) for x in (h.tolist() if hasattr(h, "tolist") else h))
                n_lookup = min(p // B, len(chain))
                n_cache = n_lookup
                rep = 0
                while rep < n_lookup and chain[rep] in seen:
                    rep += 1
                seen.update(chain[:n_cache])
                repeated = rep * B
            else:
                # run-private chain: share the blocks of the repeated prefix, fresh ids for the rest
                repeated = 0
                if k > 0:
                    repeated = logged_reuse if logged_reuse is not None else min(prev_total, p)
                total_full = (p + c) // B
                shared = min(repeated // B, len(chain_prev), total_full)
                ids = list(chain_prev[:shared])
                for _ in range(total_full - shared):
                    ids.append(fresh)
                    fresh -= 1
                chain = tuple(ids)
                n_lookup = min(p // B, len(chain))
                n_cache = len(chain)
            upper = max(repeated, logged_reuse or 0) if k > 0 else 0
            upper = upper_bound_tokens(upper, p)
            pz = 0.0 if isnull(pause[i]) else max(0.0, float(pause[i]))
            s_val = None if isnull(struct[i]) else bool(struct[i])
            cur.steps.append(
                StepSpec(
                    p,
                    c,
                    pz,
                    chain,
                    n_lookup,
                    n_cache,
                    upper,
                    tup(tcalls[i]),
                    tup(tkeys[i]),
                    0 if isnull(trn[i]) else int(trn[i]),
                    tup(terr[i]),
                    tup(ttok[i]),
                    s_val,
                    0 if isnull(ntools[i]) else int(ntools[i]),
                    False if isnull(wjson[i]) else bool(wjson[i]),
                    tup(sigs[i]),
                )
            )
            chain_prev = chain
            prev_total = p + c
        return cls(runs=out, block_tokens=B)
