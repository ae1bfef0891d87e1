"""The prefix-cache replay of a Dask training job (:mod:`training.dask_train`, step 3), compact.

The replay behind the cache-reuse labels and the ``local_cache_pressure`` feature runs every step of
a source through one cache in arrival order, so it is one task over the whole log. To keep that
task's memory near the size of the data, each partition packs its replay columns where its steps
are (:func:`pack_replay_input`: the scalar columns, and the block-hash chains as one int64 array + offsets,
:class:`FlatChains`, instead of a Python object per step); the task joins the packs in the serial
row order (every step by run, then step) and calls the serial
:func:`training.dataset.replay_cache_labels` with the packed chains. No knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["FlatChains", "REPLAY_COLS", "pack_replay_input", "replay_packed"]

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
    **deployment: Any,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cache replay over all partitions' steps at once (step 3), in the serial row order (all
    steps by run, then step: each partition already is, and runs never straddle partitions);
    returns each partition's slice. ``deployment``: the serial replay's node knobs (replicas,
    node_gpu, kv_cache_gb)."""
    from training.dataset import replay_cache_labels

    sizes = [len(f) for f, _ in packs]
    allsteps = pd.concat([f for f, _ in packs], ignore_index=True)
    # the serial order (by run id, stable) from sorted codes: no string per step is made
    codes, _ = pd.factorize(allsteps["run_id"].astype(str), sort=True)
    order = np.argsort(codes, kind="stable")
    del codes
    chains = FlatChains.join([c for _, c in packs], order)
    y_o, pr_o = replay_cache_labels(
        allsteps.iloc[order].reset_index(drop=True),
        run_src,
        capacity,
        block,
        hash_chains=chains,
        **deployment,
    )
    y, pr = np.empty_like(y_o), np.empty_like(pr_o)
    y[order], pr[order] = y_o, pr_o
    out, lo = [], 0
    for n in sizes:
        out.append((y[lo : lo + n], pr[lo : lo + n]))
        lo += n
    return out
