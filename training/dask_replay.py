"""The prefix-cache replay of a Dask training job (:mod:`training.dask_train`, step 3), compact.

The replay behind the cache-reuse labels and the ``local_cache_pressure`` feature runs the steps of
one source on one replica (a run's replica is a hash of its id) through one cache in arrival order,
so each (source, replica) cache is one task over the whole log's steps of that pair; the pairs are
independent and run side by side on the workers. To keep each task's memory near the size of its
data, every partition packs its replay columns where its steps are and splits them by pair
(:func:`pack_replay_groups`: the scalar columns, and the block-hash chains as one int64 array +
offsets, :class:`FlatChains`, instead of a Python object per step); a pair's task
(:func:`replay_group`) joins its packs in the serial row order (every step by run, then step) and
calls the serial :func:`training.dataset.replay_cache_labels` with the packed chains. The
synthetic-label cap spans all pairs: each task counts what the cap reads
(:func:`training.dataset.synthetic_label_counts`), the client turns the counts into one cutoff
(:func:`cap_cutoff`), and each partition's labels are put together and capped where they are
(:func:`assemble`). The result equals the serial replay row for row. No knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "FlatChains",
    "REPLAY_COLS",
    "pack_replay_input",
    "replay_packed",
    "replay_keys",
    "pack_replay_groups",
    "replay_group",
    "cap_cutoff",
    "assemble",
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

    def take(self, idx: np.ndarray) -> FlatChains:
        """The chains of rows ``idx``, in that order."""
        return FlatChains.join([self], idx)

    @classmethod
    def join(cls, parts: list[FlatChains], order: np.ndarray) -> FlatChains:
        """The chains of ``parts`` end to end, then rows taken in ``order``."""
        flat = np.concatenate([p.flat for p in parts])
        shift = np.cumsum([0, *[len(p.flat) for p in parts[:-1]]])
        lo = np.concatenate([p.offsets[:-1] + s for p, s in zip(parts, shift, strict=True)])[order]
        hi = np.concatenate([p.offsets[1:] + s for p, s in zip(parts, shift, strict=True)])[order]
        lens = hi - lo
        idx = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(lens.sum())
        present = np.concatenate([p.present for p in parts])[order]
        return cls(flat[idx], np.concatenate([[0], np.cumsum(lens)]), present)


def pack_replay_input(steps: pd.DataFrame) -> tuple[pd.DataFrame, FlatChains]:
    """One partition's replay input, compact: the scalar columns and the packed hash chains."""
    cols = [c for c in REPLAY_COLS if c != "hash_ids"]
    chains = FlatChains.pack(steps["hash_ids"] if "hash_ids" in steps else pd.Series([None] * len(steps)))
    return steps[cols].reset_index(drop=True), chains


def replay_packed(
    packs: list[tuple[pd.DataFrame, FlatChains]],
    run_src: dict[str, str],
    capacity: int | None,
    block: int,
    cap_synthetic: bool = True,
    **deployment: Any,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cache replay over all partitions' steps at once (step 3), in the serial row order (all
    steps by run, then step: each partition already is, and runs never straddle partitions);
    returns each partition's slice. ``deployment``: the serial replay's node knobs (replicas,
    node_gpu, kv_cache_gb)."""
    from training.dataset import replay_cache_labels

    sizes = [len(f) for f, _ in packs]
    allsteps = pd.concat([f for f, _ in packs], ignore_index=True)
    order = np.argsort(allsteps["run_id"].astype(str).to_numpy(), kind="stable")
    chains = FlatChains.join([c for _, c in packs], order)
    y_o, pr_o = replay_cache_labels(
        allsteps.iloc[order].reset_index(drop=True),
        run_src,
        capacity,
        block,
        hash_chains=chains,
        cap_synthetic=cap_synthetic,
        **deployment,
    )
    y, pr = np.empty_like(y_o), np.empty_like(pr_o)
    y[order], pr[order] = y_o, pr_o
    out, lo = [], 0
    for n in sizes:
        out.append((y[lo : lo + n], pr[lo : lo + n]))
        lo += n
    return out


Key = tuple[str, int]  # (source, replica)
Piece = tuple[np.ndarray, pd.DataFrame, FlatChains]  # rows of one partition: positions, columns, chains


def _keys_of(frame: pd.DataFrame, run_src: dict[str, str], replicas: int) -> tuple[np.ndarray, np.ndarray]:
    from training.dataset import replica_of

    run_ids = frame["run_id"].astype(str).tolist()
    return np.array([run_src.get(r, "") for r in run_ids], dtype=object), replica_of(run_ids, replicas)


def replay_keys(run_src: dict[str, str], replicas: int) -> list[Key]:
    """Every (source, replica) cache a log's steps can replay through ("" = a run without a record)."""
    return [(s, r) for s in sorted({*run_src.values(), ""}) for r in range(max(1, replicas))]


def pack_replay_groups(steps: pd.DataFrame, run_src: dict[str, str], replicas: int) -> dict[Key, Piece]:
    """One partition's replay input, compact and split by (source, replica)."""
    frame, chains = pack_replay_input(steps)
    src, rep = _keys_of(frame, run_src, replicas)
    out: dict[Key, Piece] = {}
    for key in sorted({(str(a), int(b)) for a, b in zip(src, rep, strict=True)}):
        idx = np.flatnonzero((src == key[0]) & (rep == key[1]))
        out[key] = (idx, frame.iloc[idx].reset_index(drop=True), chains.take(idx))
    return out


def replay_group(
    packs: list[dict[Key, Piece]],
    key: Key,
    run_src: dict[str, str],
    capacity: int | None,
    block: int,
    **deployment: Any,
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray] | None], int, pd.Series]:
    """The replay of one (source, replica) cache over every partition's rows of it: per partition
    (positions, cached-token labels, pressure) or None, and what the synthetic-label cap counts."""
    from training.dataset import SYNTHETIC_SOURCES, synthetic_label_counts

    have = [i for i, p in enumerate(packs) if key in p]
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * len(packs)
    if not have:  # no step of the log replays through this cache
        return out, 0, pd.Series(dtype=np.int64)
    res = replay_packed(
        [(packs[i][key][1], packs[i][key][2]) for i in have],
        run_src,
        capacity,
        block,
        cap_synthetic=False,
        **deployment,
    )
    ys, rids = [], []
    for i, (y, pr) in zip(have, res, strict=True):
        out[i] = (packs[i][key][0], y, pr)
        ys.append(y)
        rids.append(packs[i][key][1]["run_id"].astype(str).to_numpy())
    y_all, r_all = np.concatenate(ys), np.concatenate(rids)
    n_real, per_run = synthetic_label_counts(
        y_all, np.full(len(y_all), key[0], dtype=object), r_all, SYNTHETIC_SOURCES
    )
    return out, n_real, per_run


def cap_cutoff(groups: list[tuple[int, pd.Series]], share: float = 1.0) -> tuple[int, str] | None:
    """The synthetic-label cap's cutoff over every (source, replica) task's counts."""
    from training.dataset import synthetic_cap_cutoff

    per_run = [p for _, p in groups if len(p)]
    merged = pd.concat(per_run).groupby(level=0).sum() if per_run else pd.Series(dtype=np.int64)
    return synthetic_cap_cutoff(sum(n for n, _ in groups), merged, share)


def assemble(
    n: int,
    run_ids: np.ndarray,
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None],
    sources: list[str],
    cutoff: tuple[int, str] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One partition's ``(y_cache, local_cache_pressure)`` from its pieces of every task (``sources``:
    each piece's source), capped like the serial replay."""
    from training.dataset import SYNTHETIC_SOURCES, apply_synthetic_cap

    y, pr = np.full(n, np.nan), np.full(n, np.nan)
    src = np.full(n, "", dtype=object)
    for piece, s in zip(pieces, sources, strict=True):
        if piece is not None:
            idx, yy, pp = piece
            y[idx], pr[idx], src[idx] = yy, pp, s
    apply_synthetic_cap(y, src, np.asarray(run_ids, dtype=object), SYNTHETIC_SOURCES, cutoff)
    return y, pr
