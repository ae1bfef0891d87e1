"""Per-step training datasets from whole logged runs.

Algorithm: every logged step k of every run becomes one row: the features of the prefix the router
saw when step k arrived (:func:`features.extract.iter_frame_prefixes` + :func:`features.extract.extract`,
the serving code path) and labels known only once the run ended:

- ``y_frontier`` (escalation): the run's ``needs_frontier`` label (tau2 weak-vs-strong pairing,
  tau-bench failures as written by the importers, router logs). With ``outcome_fallback`` a run of a
  source that has *no* ``needs_frontier`` labels at all falls back to its outcome (failure = 1,
  success = 0); unlabelled runs (e.g. the strong model's own tau2 runs) are NaN and left out of the
  escalation model.
- ``y_rem_steps`` = n_steps - k (the arriving step included, so >= 1) and ``y_rem_tokens`` = prompt +
  completion tokens of steps k..end.
- ``y_cache``: prompt tokens of step k that hit the local prefix cache. Where the log has
  ``cached_tokens`` (router logs, provider usage) that value; else, for steps with ``hash_ids``
  (Mooncake, synthetic), a prefix-cache replay (:func:`lru_replay`): all steps of a source with
  block hashes are replayed in arrival order, one at a time, through one cache of
  ``cache_capacity_blocks`` blocks, the simulator's node model (``router.core.prefix_cache``): a step
  hits the leading run of its full prompt blocks still cached (``* block_tokens``, at most prompt - 1
  tokens, as vLLM computes the last prompt token), writes its other blocks, and on release leaves
  them cached, tail first in the LRU order, so a prefix outlives its suffix. The replay also gives
  the feature ``local_cache_pressure`` = blocks newly inserted into the cache since this run's
  previous step / capacity, clipped to [0, 1] (``router.core.prefix_cache.turnover``; NaN on a run's
  first step): with the tool pause, it decides whether the run's blocks survived. Otherwise NaN.
- ``group``: the CV group, the run's ``task_id`` (steps of one task never straddle folds, whatever
  run or source they come from), else its ``run_id``.

Router logs close the loop: when a logged step carries a feature vector of the current spec, its
request-only fields (``new_n_tools_offered``, ``new_wants_json``, ``local_cache_pressure``), which
the run log does not otherwise store, are taken from it.

Knobs: ``cache_capacity_blocks``, ``block_tokens``, ``outcome_fallback``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, N_FEATURES, extract, iter_frame_prefixes
from features.runlog import RunLog
from router.core.prefix_cache import PrefixCache, turnover

__all__ = ["Dataset", "build_dataset", "lru_replay", "replay_cache_labels"]

_F = {n: i for i, n in enumerate(FEATURE_NAMES)}


@dataclass
class Dataset:
    """Feature rows ``X`` (n, len(FEATURE_NAMES)) and ``meta`` (one row each: run_id, group, source,
    step, y_frontier, y_cache, y_rem_steps, y_rem_tokens)."""

    X: np.ndarray
    meta: pd.DataFrame

    def __len__(self) -> int:
        return len(self.meta)

    @property
    def n_runs(self) -> int:
        return int(self.meta["run_id"].nunique())

    def subset(self, mask: np.ndarray) -> Dataset:
        return Dataset(self.X[mask], self.meta[mask].reset_index(drop=True))

    def sha256(self) -> str:
        """Hash of the features, labels and groups (the bundle's ``training_data_sha256``)."""
        h = hashlib.sha256()
        h.update(FEATURE_SPEC_VERSION.encode())
        h.update(np.ascontiguousarray(self.X).tobytes())
        for c in ("y_frontier", "y_cache", "y_rem_steps", "y_rem_tokens"):
            h.update(self.meta[c].to_numpy(dtype=np.float64).tobytes())
        h.update("\0".join(self.meta["group"].astype(str)).encode())
        return h.hexdigest()


def lru_replay(
    hash_lists: list[Any],
    run_ids: list[Any],
    prompt_tokens: np.ndarray,
    capacity_blocks: int,
    block_tokens: int,
    completion_tokens: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Replay steps (already in arrival order) through one prefix cache, one step at a time.

    The cache is the simulator's node model (``router.core.prefix_cache.PrefixCache``): each step is
    admitted alone (its ``hash_ids`` hashed, ``ceil((prompt + completion) / block_tokens)`` blocks in
    all, at most the capacity) and released at once. Returns (cached tokens per step: the leading
    cached blocks among its full prompt blocks, at most (prompt - 1) tokens in whole blocks; cache
    pressure per step: :func:`~router.core.prefix_cache.turnover` of the blocks inserted since the
    run's previous step, NaN on a run's first step)."""
    if capacity_blocks < 1:
        raise ValueError(f"cache capacity must be >= 1 block, got {capacity_blocks}")
    cache = PrefixCache(capacity_blocks, block_tokens)
    admit, release = cache.admit, cache.release
    last_seen: dict[Any, int] = {}
    hits = np.zeros(len(hash_lists), dtype=np.float64)
    pressure = np.full(len(hash_lists), np.nan)
    prompts = [int(x) for x in prompt_tokens]  # int(NaN) raises: token counts must be known
    outs = [0] * len(prompts) if completion_tokens is None else [int(x) for x in completion_tokens]
    for i, blocks in enumerate(hash_lists):
        chain = blocks.tolist() if isinstance(blocks, np.ndarray) else [int(b) for b in blocks]
        rid = run_ids[i]
        prev = last_seen.get(rid)
        if prev is not None:
            pressure[i] = turnover(cache.inserted, prev, capacity_blocks)
        p = prompts[i]
        n_chain = len(chain)
        n_blocks = -(-(p + outs[i]) // block_tokens)
        if n_blocks < n_chain:
            n_blocks = n_chain
        if n_blocks > capacity_blocks:
            n_blocks = capacity_blocks
        n_hashed = n_chain if n_chain < n_blocks else n_blocks
        n_lookup = p // block_tokens
        hits[i] = admit(chain, n_lookup if n_lookup < n_chain else n_chain, p, n_blocks) * block_tokens
        release(chain, n_hashed, n_blocks - n_hashed)  # nothing else is held: it always fits
        last_seen[rid] = cache.inserted
    return hits, pressure


def _frontier_labels(runs: pd.DataFrame, outcome_fallback: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    if runs.empty:
        return out
    nf = runs["needs_frontier"]
    labelled_sources = set(runs.loc[nf.notna(), "source"].astype(str))
    for rid, src, lab, outcome in zip(
        runs["run_id"], runs["source"].astype(str), nf, runs["outcome"], strict=True
    ):
        if lab is not None and not (isinstance(lab, float) and np.isnan(lab)) and lab is not pd.NA:
            out[str(rid)] = 1.0 if bool(lab) else 0.0
        elif outcome_fallback and src not in labelled_sources and outcome in ("success", "failure"):
            out[str(rid)] = 1.0 if outcome == "failure" else 0.0
    return out


def build_dataset(
    log: RunLog,
    *,
    cache_capacity_blocks: int = 8192,
    block_tokens: int = 512,
    outcome_fallback: bool = True,
    cache_labels: tuple[np.ndarray, np.ndarray] | None = None,
) -> Dataset:
    """Rows and labels from a :class:`~features.runlog.RunLog`; see the module docstring.

    ``cache_labels``: (y_cache, pressure) per step in (run, step) order, when the replay, which
    spans all runs of a source, ran elsewhere (a Dask task); else :func:`replay_cache_labels`."""
    steps = log.steps
    if steps.empty:
        raise ValueError("the run logs hold no step records: nothing to train on")
    steps = steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    n = len(steps)
    runs = log.runs.drop_duplicates("run_id")
    run_ids = steps["run_id"].astype(str).to_numpy()
    run_src = dict(zip(runs["run_id"].astype(str), runs["source"].astype(str), strict=True))
    run_task = {
        str(r): (None if t is None or (isinstance(t, float) and np.isnan(t)) else str(t))
        for r, t in zip(runs["run_id"], runs["task_id"], strict=True)
    }

    # remaining work (steps sorted by run, then step)
    pos = steps.groupby("run_id", sort=False).cumcount().to_numpy()
    size = steps.groupby("run_id", sort=False)["step"].transform("size").to_numpy()
    tok = steps["prompt_tokens"].to_numpy(dtype=np.float64) + steps["completion_tokens"].to_numpy(
        dtype=np.float64
    )
    rem_tok = pd.Series(tok[::-1]).groupby(run_ids[::-1], sort=False).cumsum().to_numpy()[::-1]

    # cache labels and pressure (given: computed elsewhere over all runs, e.g. training.dask_train)
    y_cache, pressure = (
        cache_labels
        if cache_labels is not None
        else replay_cache_labels(steps, run_src, cache_capacity_blocks, block_tokens)
    )

    # request-only fields from router-logged feature vectors of this spec
    logged = np.zeros(n, dtype=bool)
    logged_x: list[Any] = [None] * n
    if "features" in steps.columns and "feature_spec_version" in steps.columns:
        spec = steps["feature_spec_version"].to_numpy(dtype=object)
        feats = steps["features"].tolist()
        for j in np.flatnonzero(spec == FEATURE_SPEC_VERSION).tolist():
            f = feats[j]
            if f is not None and len(f) == N_FEATURES:
                logged[j] = True
                logged_x[j] = f

    X = np.empty((n, N_FEATURES), dtype=np.float64)
    i_tools, i_json, i_press = _F["new_n_tools_offered"], _F["new_wants_json"], _F["local_cache_pressure"]
    for i, prefix in iter_frame_prefixes(steps):
        if logged[i]:
            f = logged_x[i]
            prefix.new_n_tools_offered = int(f[i_tools])
            prefix.new_wants_json = bool(f[i_json])
            lp = float(f[i_press])
            prefix.local_cache_pressure = None if np.isnan(lp) else lp
        elif not np.isnan(pressure[i]):
            prefix.local_cache_pressure = float(pressure[i])
        extract(prefix, out=X[i])

    labels = _frontier_labels(runs, outcome_fallback)
    meta = pd.DataFrame(
        {
            "run_id": run_ids,
            "group": [run_task.get(r) or r for r in run_ids],
            "source": [run_src.get(r, "") for r in run_ids],
            "step": pos,
            "y_frontier": np.array([labels.get(r, np.nan) for r in run_ids], dtype=np.float64),
            "y_cache": y_cache,
            "y_rem_steps": (size - pos).astype(np.float64),
            "y_rem_tokens": rem_tok,
        }
    )
    return Dataset(X=X, meta=meta)


def replay_cache_labels(
    steps: pd.DataFrame,
    run_src: dict[str, str],
    cache_capacity_blocks: int,
    block_tokens: int,
    hash_chains: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(y_cache, local_cache_pressure)`` per row of ``steps`` (sorted by run, then step): the
    logged ``cached_tokens`` where present, else the per-source LRU replay (the module docstring).

    ``hash_chains``: the rows' block hashes in a compact form instead of ``steps["hash_ids"]`` (a
    sequence of arrays with a boolean ``present`` mask; ``training.dask_train`` packs millions)."""
    n = len(steps)
    run_ids = steps["run_id"].astype(str).to_numpy()
    pos = steps.groupby("run_id", sort=False).cumcount().to_numpy()
    y_cache = np.full(n, np.nan)
    pressure = np.full(n, np.nan)
    cached = pd.to_numeric(steps["cached_tokens"], errors="coerce").to_numpy(dtype=np.float64)
    has_cached = ~np.isnan(cached)
    y_cache[has_cached] = cached[has_cached]
    if hash_chains is None:
        hl = steps["hash_ids"] if "hash_ids" in steps.columns else pd.Series([None] * n)
        present = hl.notna().to_numpy()
    else:
        present = np.asarray(hash_chains.present, dtype=bool)
    has_hash = present & ~has_cached
    if has_hash.any():
        src = np.array([run_src.get(r, "") for r in run_ids], dtype=object)
        arrival = pd.to_numeric(steps["arrival_s"], errors="coerce").to_numpy(dtype=np.float64)
        prompt = steps["prompt_tokens"].to_numpy(dtype=np.float64)
        completion = np.nan_to_num(steps["completion_tokens"].to_numpy(dtype=np.float64), nan=0.0)
        hash_vals = hl.tolist() if hash_chains is None else hash_chains
        for s in sorted(set(src[has_hash])):
            idx = np.flatnonzero(has_hash & (src == s))
            order = idx[np.lexsort((pos[idx], np.nan_to_num(arrival[idx], nan=np.inf)))]
            hits, pr = lru_replay(
                [hash_vals[i] for i in order],
                [run_ids[i] for i in order],
                prompt[order],
                cache_capacity_blocks,
                block_tokens,
                completion[order],
            )
            y_cache[order] = hits
            pressure[order] = pr

    return y_cache, pressure
