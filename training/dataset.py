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
  (Mooncake, synthetic), a prefix-cache replay (:func:`lru_replay`) through the *deployment's*
  cache: ``cache_capacity_blocks`` blocks per replica, by default the simulator's own definition for
  the configured node profile (:func:`node_cache_blocks` = ``router.sim.simconfig.SimConfig.kv_blocks``:
  ``kv_cache_gb`` / the profile's KV bytes per token / ``block_tokens``; a100-llama-3-8b at 16 GB:
  238 blocks = 122k tokens), and ``replicas`` such caches. A run is pinned to one replica (a stable
  crc32 of its run id, as the router pins runs); all steps of a source with block hashes that land on
  one replica are replayed in arrival order, one at a time, through that replica's cache, the
  simulator's node model (``router.core.prefix_cache``): a step
  hits the leading run of its full prompt blocks still cached (``* block_tokens``, at most prompt - 1
  tokens, as vLLM computes the last prompt token), writes its other blocks, and on release leaves
  them cached, tail first in the LRU order, so a prefix outlives its suffix. The replay also gives
  the feature ``local_cache_pressure`` = blocks newly inserted into the cache since this run's
  previous step / capacity, clipped to [0, 1] (``router.core.prefix_cache.turnover``; NaN on a run's
  first step): with the tool pause, it decides whether the run's blocks survived. Otherwise NaN.
  **Why the node model and not the prefix index** (:mod:`router.core.prefix_index`): a label is
  what the replica's *own* cache reports (vLLM's ``cached_tokens``), and the node model is the
  project's model of that cache (reference counts of running requests, eviction on admission, the
  simulator's and the fakes' cache); the index is the *router's belief* of it (what was sent
  where, no running requests, no eviction timing), the thing the cache-reuse prediction reads and
  the learned correction corrects. Labels built from the index would make the correction learn
  zero by construction. The Dask twin (:mod:`training.dask_replay`) calls this same replay, so
  there is no second copy of either model.
  **Synthetic cache labels never outweigh real ones**: when steps of non-synthetic sources have
  cache labels (logged ``cached_tokens``, a replayed real trace), the labels of the
  ``synthetic_sources`` are kept only for a deterministic subset of their runs (lowest crc32 of the
  run id first) holding at most ``synthetic_cache_share`` x the real labelled steps; the others are
  NaN (left out of the cache model; their features still train the other models). With 0 synthetic
  labels are dropped whenever real ones exist. Why keep any: the shipped real labels are Mooncake's
  human chat turns (pauses of minutes: the deployment's cache has long forgotten the run), while the
  router serves agents (tool pauses of seconds: ~90% of a prompt hits); a model that has seen only
  chat predicts ~5% hits for agent steps (demo synthetic held-out set: MAE 5,781 tokens vs 1,136 for
  the prefix bound). Subsampling rather than weights: the cache model's fit takes no weights from
  the job, and the row counts say plainly how much each kind contributes.
- ``group``: the CV group, the run's ``task_id`` (steps of one task never straddle folds, whatever
  run or source they come from), else its ``run_id``.

**No source from missingness** (the escalation model's rows): a feature that is missing at
different rates in different sources (tau-bench has no timestamps, so ``time_since_start_s`` /
``tool_pause_s`` / ``tool_pause_mean_s`` are NaN in every tau-bench row and almost never elsewhere;
``local_cache_pressure`` exists only where a cache replay or router log gives it) tells the model
*which dataset* a run came from, and the label base rates differ by dataset. Among the rows with a
``y_frontier`` label, every feature whose missing share differs between two sources (each with at
least ``min_source_rows`` rows) by more than ``missing_rate_tol`` is masked to missing in *every*
labelled row of the escalation model's matrix (:meth:`Dataset.escalation_X`; the names in
``Dataset.escalation_masked``): the trees never split on it, so at serving time its value is
ignored. That is dropping, chosen over equalising the rates by random masking: the differing
features here are missing in *all* rows of one source (equalising would mask them everywhere anyway),
and independent random masks would leave joint patterns a classifier can still read. Structural
missingness that every source shares (the first step has no pause) is kept. The other models
(cache reuse, remaining work) see the unmasked ``X``. ``tests/test_missingness.py`` checks that a
classifier cannot tell the source from the missingness pattern of :meth:`Dataset.escalation_X`.

Router logs close the loop: when a logged step carries a feature vector of the current spec, its
request-only fields (``new_n_tools_offered``, ``new_wants_json``, ``local_cache_pressure``), which
the run log does not otherwise store, are taken from it.

Knobs: ``missing_rate_tol`` (0.05), ``min_source_rows`` (50), ``cache_capacity_blocks`` (None: :func:`node_cache_blocks` of ``node_gpu`` / ``node_profile``
/ ``kv_cache_gb``), ``replicas``, ``block_tokens``, ``synthetic_sources``, ``synthetic_cache_share`` (1.0),
``outcome_fallback``.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, N_FEATURES, extract, iter_frame_prefixes
from features.runlog import RunLog
from router.core.prefix_cache import PrefixCache, turnover
from router.policy.defaults import KV_CACHE_GB


class PackedChains(Protocol):
    """Block-hash chains of many steps in a compact form (:class:`training.dask_replay.FlatChains`;
    named structurally here, since that module imports this one): ``chains[i]`` is step i's chain,
    ``present`` says which steps have one."""

    present: np.ndarray

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> np.ndarray: ...


class ChainSeq(Protocol):
    """Block-hash chains read by position (a list, :class:`PackedChains`, or a reordered view)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> np.ndarray | Sequence[int]: ...


__all__ = [
    "Dataset",
    "build_dataset",
    "capped_synthetic_runs",
    "lru_replay",
    "logged_feature_rows",
    "node_cache_blocks",
    "missingness_masked",
    "masked_features",
    "MISSING_MIN_ROWS",
    "replay_cache_labels",
    "source_missing_shares",
    "SYNTHETIC_SOURCES",
]

SYNTHETIC_SOURCES: tuple[str, ...] = ("synthetic",)  # features.generate writes source "synthetic"

_F = {n: i for i, n in enumerate(FEATURE_NAMES)}


@dataclass
class Dataset:
    """Feature rows ``X`` (n, len(FEATURE_NAMES)) and ``meta`` (one row each: run_id, group, source,
    step, y_frontier, y_cache, y_rem_steps, y_rem_tokens)."""

    X: np.ndarray
    meta: pd.DataFrame
    escalation_masked: tuple[str, ...] = ()  # features masked to NaN for the escalation model

    def escalation_X(self) -> np.ndarray:
        """``X`` with the :attr:`escalation_masked` features set to NaN: what the escalation model
        trains on (module docstring: no source from missingness)."""
        if not self.escalation_masked:
            return self.X
        Xe = self.X.copy()
        Xe[:, [_F[n] for n in self.escalation_masked]] = np.nan
        return Xe

    def __len__(self) -> int:
        return len(self.meta)

    @property
    def n_runs(self) -> int:
        return int(self.meta["run_id"].nunique())

    def subset(self, mask: np.ndarray) -> Dataset:
        return Dataset(self.X[mask], self.meta[mask].reset_index(drop=True), self.escalation_masked)

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
    hash_lists: ChainSeq,
    run_ids: Sequence[Hashable],
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
    last_seen: dict[Hashable, int] = {}
    n = len(hash_lists)
    hits = np.zeros(n, dtype=np.float64)
    pressure = np.full(n, np.nan)
    # token counts as Python ints a chunk at a time (a list of all of them held ~70 bytes per step)
    for lo in range(0, n, _REPLAY_CHUNK):
        hi = min(n, lo + _REPLAY_CHUNK)
        prompts = [int(x) for x in prompt_tokens[lo:hi]]  # int(NaN) raises: token counts must be known
        outs = [0] * (hi - lo) if completion_tokens is None else [int(x) for x in completion_tokens[lo:hi]]
        for i in range(lo, hi):
            blocks = hash_lists[i]
            chain = blocks.tolist() if isinstance(blocks, np.ndarray) else [int(b) for b in blocks]
            rid = run_ids[i]
            prev = last_seen.get(rid)
            if prev is not None:
                pressure[i] = turnover(cache.inserted, prev, capacity_blocks)
            p = prompts[i - lo]
            n_chain = len(chain)
            n_blocks = -(-(p + outs[i - lo]) // block_tokens)
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


_REPLAY_CHUNK = 1 << 16


class _Take:
    """``seq`` read through the positions ``idx`` without building the reordered list."""

    def __init__(self, seq: ChainSeq, idx: np.ndarray) -> None:
        self.seq, self.idx = seq, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int, /) -> np.ndarray | Sequence[int]:
        return self.seq[int(self.idx[i])]


def node_cache_blocks(
    node_gpu: str = "a100",
    node_profile: str | None = None,
    kv_cache_gb: float = KV_CACHE_GB,
    block_tokens: int = 512,
) -> int:
    """KV blocks of one replica of the node profile: the simulator's own definition
    (``SimConfig.kv_blocks``), so training's cache labels and the what-if deployment agree."""
    from router.sim.profiles import load_profile
    from router.sim.simconfig import SimConfig

    prof = load_profile(node_profile, node_gpu)
    return SimConfig(profile=prof, kv_cache_gb=kv_cache_gb, block_tokens=block_tokens).kv_blocks()


def _replica_of(run_ids: list[str], replicas: int) -> np.ndarray:
    if replicas <= 1:
        return np.zeros(len(run_ids), dtype=np.int64)
    return np.array([zlib.crc32(r.encode()) % replicas for r in run_ids], dtype=np.int64)


def source_missing_shares(X: np.ndarray, source: np.ndarray, min_rows: int = 1) -> pd.DataFrame:
    """Share of NaN per feature (columns) and source (rows), sources with >= ``min_rows`` rows."""
    srcs = [s for s in sorted(set(source.tolist())) if int((source == s).sum()) >= min_rows]
    data = {s: np.isnan(X[source == s]).mean(axis=0) for s in srcs}
    return pd.DataFrame(data, index=list(FEATURE_NAMES)).T


MISSING_TOL = 0.05  # build_dataset's missing_rate_tol default
MISSING_MIN_ROWS = 50  # build_dataset's min_source_rows default


def masked_features(shares: pd.DataFrame, tol: float = MISSING_TOL) -> tuple[str, ...]:
    """Features (columns of ``shares``: missing share per source and feature) whose missing share
    differs between sources by more than ``tol``."""
    if len(shares) < 2:
        return ()
    spread = shares.max(axis=0) - shares.min(axis=0)
    return tuple(n for n in FEATURE_NAMES if spread[n] > tol)


def missingness_masked(
    X: np.ndarray, source: np.ndarray, tol: float = MISSING_TOL, min_rows: int = MISSING_MIN_ROWS
) -> tuple[str, ...]:
    """Features whose missing share differs between sources by more than ``tol``."""
    return masked_features(source_missing_shares(X, source, min_rows), tol)


def _cap_synthetic_labels(
    y: np.ndarray, src: np.ndarray, run_ids: np.ndarray, synthetic_sources: tuple[str, ...], share: float
) -> None:
    """Keep synthetic labels (in place) for whole runs, lowest crc32 first, up to ``share`` x the
    real labelled steps; all of them when no real label exists."""
    synthetic = np.isin(src, list(synthetic_sources))
    n_real = int((~np.isnan(y) & ~synthetic).sum())
    lab = synthetic & ~np.isnan(y)
    if n_real == 0 or not lab.any():
        return
    per_run = pd.Series(np.ones(int(lab.sum()))).groupby(run_ids[lab]).sum()
    drop = lab & np.isin(run_ids, list(capped_synthetic_runs(per_run, n_real, share)))
    y[drop] = np.nan


def capped_synthetic_runs(per_run: pd.Series, n_real: int, share: float) -> set[Any]:
    """The runs (index of ``per_run``: labelled synthetic steps per run) whose synthetic labels
    :func:`_cap_synthetic_labels` drops: runs are kept lowest crc32 first while the kept steps stay
    within ``share`` x ``n_real``; none is dropped when no real label exists."""
    if n_real == 0 or not len(per_run):
        return set()
    order = sorted(per_run.index, key=lambda r: (zlib.crc32(str(r).encode()), str(r)))
    keep, total = set(), 0
    for r in order:
        n = int(per_run[r])
        if total + n > share * n_real:
            break
        keep.add(r)
        total += n
    return set(order) - keep


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
    cache_capacity_blocks: int | None = None,
    block_tokens: int = 512,
    outcome_fallback: bool = True,
    replicas: int = 1,
    node_gpu: str = "a100",
    node_profile: str | None = None,
    kv_cache_gb: float = KV_CACHE_GB,
    synthetic_sources: tuple[str, ...] = SYNTHETIC_SOURCES,
    synthetic_cache_share: float = 1.0,
    missing_rate_tol: float = MISSING_TOL,
    min_source_rows: int = MISSING_MIN_ROWS,
    cache_labels: tuple[np.ndarray, np.ndarray] | None = None,
) -> Dataset:
    """Rows and labels from a :class:`~features.runlog.RunLog`; see the module docstring.

    ``cache_labels``: (y_cache, pressure) per step in (run, step) order, when the replay, which
    spans all runs of a source, ran elsewhere; else :func:`replay_cache_labels`."""
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

    # cache labels and pressure (given: computed elsewhere over all runs, e.g. a Dask task)
    y_cache, pressure = (
        cache_labels
        if cache_labels is not None
        else replay_cache_labels(
            steps,
            run_src,
            cache_capacity_blocks,
            block_tokens,
            replicas=replicas,
            node_gpu=node_gpu,
            node_profile=node_profile,
            kv_cache_gb=kv_cache_gb,
            synthetic_sources=synthetic_sources,
            synthetic_cache_share=synthetic_cache_share,
        )
    )

    # request-only fields from router-logged feature vectors of this spec
    logged, logged_x = logged_feature_rows(steps)

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
    lab = meta["y_frontier"].notna().to_numpy()
    masked = missingness_masked(
        X[lab], meta["source"].to_numpy(dtype=object)[lab], missing_rate_tol, min_source_rows
    )
    return Dataset(X=X, meta=meta, escalation_masked=masked)


def logged_feature_rows(steps: pd.DataFrame) -> tuple[np.ndarray, list[Any]]:
    """(which rows carry a router-logged feature vector of the current spec, those vectors: None
    elsewhere). Their request-only fields replace the rebuilt ones, and their logged
    ``local_cache_pressure`` the replay's."""
    n = len(steps)
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
    return logged, logged_x


def replay_cache_labels(
    steps: pd.DataFrame,
    run_src: dict[str, str],
    cache_capacity_blocks: int | None,
    block_tokens: int,
    *,
    replicas: int = 1,
    node_gpu: str = "a100",
    node_profile: str | None = None,
    kv_cache_gb: float = KV_CACHE_GB,
    synthetic_sources: tuple[str, ...] = SYNTHETIC_SOURCES,
    synthetic_cache_share: float = 1.0,
    hash_chains: PackedChains | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(y_cache, local_cache_pressure)`` per row of ``steps`` (sorted by run, then step): the
    logged ``cached_tokens`` where present, else the per-source, per-replica LRU replay through the
    deployment's cache; synthetic labels capped (the module docstring).

    ``hash_chains``: the rows' block hashes in a compact form instead of ``steps["hash_ids"]`` (a
    sequence of arrays with a boolean ``present`` mask; ``training.dask_train`` packs millions)."""
    n = len(steps)
    # run ids once per run (codes + the distinct ids): at millions of steps a string per step held
    # hundreds of MB in the one replay task of a Dask job
    codes, uniq = pd.factorize(steps["run_id"])
    uniq_ids = np.asarray([str(r) for r in uniq], dtype=object)
    run_ids = uniq_ids[codes]
    pos = pd.Series(codes).groupby(codes, sort=False).cumcount().to_numpy()
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
    src = np.array([run_src.get(r, "") for r in uniq_ids], dtype=object)[codes]
    if has_hash.any():
        if cache_capacity_blocks is None:
            cache_capacity_blocks = node_cache_blocks(node_gpu, node_profile, kv_cache_gb, block_tokens)
        replica = _replica_of(uniq_ids.tolist(), replicas)[codes]
        arrival = pd.to_numeric(steps["arrival_s"], errors="coerce").to_numpy(dtype=np.float64)
        prompt = steps["prompt_tokens"].to_numpy(dtype=np.float64)
        completion = np.nan_to_num(steps["completion_tokens"].to_numpy(dtype=np.float64), nan=0.0)
        hash_vals = hl.tolist() if hash_chains is None else hash_chains
        for s, r in sorted({(str(a), int(b)) for a, b in zip(src[has_hash], replica[has_hash], strict=True)}):
            idx = np.flatnonzero(has_hash & (src == s) & (replica == r))
            order = idx[np.lexsort((pos[idx], np.nan_to_num(arrival[idx], nan=np.inf)))]
            hits, pr = lru_replay(
                _Take(hash_vals, order),
                codes[order],
                prompt[order],
                cache_capacity_blocks,
                block_tokens,
                completion[order],
            )
            y_cache[order] = hits
            pressure[order] = pr
    _cap_synthetic_labels(y_cache, src, run_ids, synthetic_sources, synthetic_cache_share)
    return y_cache, pressure
