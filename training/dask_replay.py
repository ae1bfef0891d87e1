"""The prefix-cache replay of a Dask training job (:mod:`training.dask_train`, step 3), compact and split.

The replay behind the cache-reuse labels and the ``local_cache_pressure`` feature runs the steps of
one (source, replica) pair through one cache in arrival order (:func:`training.dataset.replay_cache_labels`:
each run goes to one replica by a crc32 of its id, and the pairs never share a cache). So the job
runs one task per pair (:func:`replay_keys`), not one over the whole log: each holds only its pair's
steps, and the tasks run on different workers at once. Each partition packs its replay columns where
its steps are, already split by pair (:func:`pack_replay_input`: the scalar columns, the block-hash
chains as one int64 array + offsets, :class:`FlatChains`, instead of a Python object per step, and
each row's position in the partition); a task joins its pair's packs in the serial row order (by
run, then step) and calls the serial replay with the synthetic-label cap off. The cap (keep
synthetic labels for whole runs up to a share of the real labelled steps, lowest crc32 first) needs
every pair's counts, so each task returns its per-run counts and the client decides which runs lose
their labels (:func:`capped_runs`), as the serial ``_cap_synthetic_labels`` does. No knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "FlatChains",
    "JoinedChains",
    "REPLAY_COLS",
    "ReplayPart",
    "capped_runs",
    "pack_replay_input",
    "replay_keys",
    "replay_packed",
    "cache_columns",
]

REPLAY_COLS = (
    "run_id",
    "step",
    "arrival_s",
    "prompt_tokens",
    "completion_tokens",
    "hash_ids",
    "cached_tokens",
)


@dataclass
class FlatChains:
    """Block-hash chains of many steps as one int64 array + offsets (no Python object per step):
    ``chains[i]`` is step i's chain (a view), ``present`` says which steps have one."""

    flat: np.ndarray
    offsets: np.ndarray  # len n + 1
    present: np.ndarray

    def __len__(self) -> int:
        return len(self.present)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def pack(cls, col: pd.Series) -> FlatChains:
        vals = col.tolist()
        present = np.array([v is not None for v in vals], dtype=bool)
        lens = np.array([0 if v is None else len(v) for v in vals], dtype=np.int64)
        flat = np.concatenate(
            [np.asarray(v, dtype=np.int64) for v in vals if v is not None and len(v)]
            or [np.zeros(0, np.int64)]
        )
        return cls(flat, np.concatenate([[0], np.cumsum(lens)]), present)

    @classmethod
    def from_arrow(cls, arr: Any) -> FlatChains:
        """The chains of an Arrow list array (or chunked array) of integers, straight from its
        buffers: equal to :meth:`pack` of the same cells read into pandas, without a numpy object
        per cell (the validated partitions keep ``hash_ids`` so, :mod:`training.dask_io`)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks else pa.array([], type=arr.type)
        present = arr.is_valid().to_numpy(zero_copy_only=False).astype(bool, copy=False)
        lens = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return cls(flat, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), present)

    @classmethod
    def join(cls, parts: list[FlatChains], order: np.ndarray) -> JoinedChains:
        """The chains of ``parts`` end to end, then rows taken in ``order``: a view that copies no
        chain (a copy and its gather index held ~230 bytes per step, 1.1 GB in a 5M-step replay)."""
        sizes = [len(p) for p in parts]
        part = np.repeat(np.arange(len(parts), dtype=np.int32), sizes)[order]
        row = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes] or [np.zeros(0, np.int64)])[order]
        present = np.concatenate([p.present for p in parts] or [np.zeros(0, bool)])[order]
        return JoinedChains(parts, part, row, present)


@dataclass
class JoinedChains:
    """Rows of several :class:`FlatChains` in a new order, without copying them: row i is row
    ``row[i]`` of ``parts[part[i]]``."""

    parts: list[FlatChains]
    part: np.ndarray
    row: np.ndarray
    present: np.ndarray

    def __len__(self) -> int:
        return len(self.present)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.parts[int(self.part[i])][int(self.row[i])]


#: one partition's rows of one (source, replica) pair: scalar columns, chains, positions in the partition
_Pack = tuple[pd.DataFrame, FlatChains, np.ndarray]
#: one replay task's answer: per partition (positions, y_cache, pressure); the labelled synthetic
#: steps per run; the real labelled steps (the cap's inputs)
ReplayPart = tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], pd.Series, int]


def replay_keys(run_src: dict[str, str], replicas: int) -> list[tuple[str, int]]:
    """The replay's independent (source, replica) pairs, one task each (source "" holds steps whose
    run has no run record, as the serial replay reads them)."""
    return sorted({(s, r) for s in {"", *run_src.values()} for r in range(max(1, replicas))})


def _key_of_rows(
    run_ids: pd.Series, run_src: dict[str, str], keys: list[tuple[str, int]], replicas: int
) -> np.ndarray:
    from training.dataset import _replica_of

    codes, uniq = pd.factorize(run_ids.astype(str))
    ids = [str(u) for u in uniq]
    rep = _replica_of(ids, replicas)
    index = {k: i for i, k in enumerate(keys)}
    per_run = np.array(
        [index[(run_src.get(r, ""), int(p))] for r, p in zip(ids, rep, strict=True)], dtype=np.int64
    )
    return per_run[codes] if len(codes) else np.zeros(0, dtype=np.int64)


def pack_replay_input(
    steps: pd.DataFrame | tuple[pd.DataFrame, Any],
    run_src: dict[str, str],
    keys: list[tuple[str, int]],
    replicas: int,
) -> list[_Pack]:
    """One partition's replay input, compact, split by (source, replica) pair (``keys``): per pair
    the scalar columns, the packed hash chains and the rows' positions in ``steps``.

    ``steps``: a frame with ``hash_ids`` cells, or a validated partition's (scalar columns, Arrow
    table of its list columns) (:func:`training.dask_io.clean_partition`), whose chains are packed
    straight from the Arrow buffers: unpacking every list column to a numpy object per cell beside
    the validated partitions set the workers' peak (7.3 GB at 10M steps)."""
    table = None
    if isinstance(steps, tuple):
        steps, table = steps
    cols = [c for c in REPLAY_COLS if c != "hash_ids"]
    key = _key_of_rows(steps["run_id"], run_src, keys, replicas)
    if table is not None and "hash_ids" in table.column_names:
        arrow = table.column("hash_ids")

        def chains(pos: np.ndarray) -> FlatChains:
            return FlatChains.from_arrow(arrow.take(pos))
    else:
        hl = steps["hash_ids"] if "hash_ids" in steps else pd.Series([None] * len(steps))

        def chains(pos: np.ndarray) -> FlatChains:
            return FlatChains.pack(hl.iloc[pos])

    out = []
    for k in range(len(keys)):
        pos = np.flatnonzero(key == k)
        out.append((steps[cols].iloc[pos].reset_index(drop=True), chains(pos), pos))
    return out


def replay_packed(
    mine: list[_Pack],
    run_src: dict[str, str],
    capacity: int | None,
    block: int,
    **deployment: Any,
) -> ReplayPart:
    """The cache replay of one (source, replica) pair over every partition's steps of that pair
    (``mine``: each partition's part of :func:`pack_replay_input` for the pair), in the serial row order (by run, then step: each
    partition already is, and runs never straddle partitions), the synthetic cap off; returns each
    partition's slice (positions, labels, pressure) and the cap's inputs. ``deployment``: the
    serial replay's node knobs (replicas, node_gpu, kv_cache_gb)."""
    from training.dataset import SYNTHETIC_SOURCES, replay_cache_labels

    sizes = [len(f) for f, _, _ in mine]
    allsteps = pd.concat([f for f, _, _ in mine], ignore_index=True)
    # the serial order (by run id, stable) from sorted codes: no string per step is made
    codes, uniq = pd.factorize(allsteps["run_id"].astype(str), sort=True)
    order = np.argsort(codes, kind="stable")
    chains = FlatChains.join([c for _, c, _ in mine], order)
    y_o, pr_o = replay_cache_labels(
        allsteps.iloc[order].reset_index(drop=True),
        run_src,
        capacity,
        block,
        hash_chains=chains,
        synthetic_sources=(),
        **deployment,
    )
    del chains, allsteps
    y, pr = np.empty_like(y_o), np.empty_like(pr_o)
    y[order], pr[order] = y_o, pr_o
    del y_o, pr_o, order
    ids = np.asarray([str(u) for u in uniq], dtype=object)
    synthetic = np.isin(np.array([run_src.get(r, "") for r in ids], dtype=object), list(SYNTHETIC_SOURCES))[
        codes
    ]
    labelled = ~np.isnan(y)
    lab = synthetic & labelled
    per_run = pd.Series(np.ones(int(lab.sum()))).groupby(ids[codes[lab]]).sum()
    n_real = int((labelled & ~synthetic).sum())
    out, lo = [], 0
    for (_, _, pos), n in zip(mine, sizes, strict=True):
        out.append((pos, y[lo : lo + n], pr[lo : lo + n]))
        lo += n
    return out, per_run, n_real


def capped_runs(parts: list[ReplayPart], share: float = 1.0) -> list[str]:
    """Runs whose synthetic cache labels the cap drops, from every replay task's counts
    (:func:`training.dataset.capped_synthetic_runs`, the serial rule)."""
    from training.dataset import capped_synthetic_runs

    per_run = pd.concat([p[1] for p in parts]) if parts else pd.Series([], dtype=np.float64)
    return sorted(capped_synthetic_runs(per_run, sum(p[2] for p in parts), share))


def cache_columns(
    steps: pd.DataFrame, slices: list[tuple[np.ndarray, np.ndarray, np.ndarray]], drop: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """One partition's (y_cache, pressure) in its row order, from its slice of every replay task,
    with the cap's dropped runs' synthetic labels removed."""
    n = len(steps)
    y, pr = np.full(n, np.nan), np.full(n, np.nan)
    for pos, ys, ps in slices:
        y[pos], pr[pos] = ys, ps
    if drop:  # only labelled synthetic runs are counted, so these runs are synthetic
        y[steps["run_id"].astype(str).isin(drop).to_numpy()] = np.nan
    return y, pr
