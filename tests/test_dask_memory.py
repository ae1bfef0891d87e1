"""The memory-saving forms of the Dask training job give the serial values (issue 26, 10M steps).

No cluster here: the pieces each Dask task runs, on one generated run log.
- ``clean_partition`` keeps a partition's list columns as one Arrow table between tasks;
  ``steps_of`` gives back the same cells (numpy arrays, None) in the same rows.
- the cache replay reads token counts a chunk at a time and the chains through a reordered view:
  the labels do not depend on the chunk size.
- the replay split into one task per (source, replica) pair, over partitions, with the synthetic
  cap decided from every task's counts, gives the serial replay's labels and pressure (cap biting).
- a partition's rows (``_rows``: features with the replay's columns, narrowed training rows) are
  ``build_dataset``'s rows with the replay's labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from test_dask_sweeps import _cli

from features.extract import FEATURE_NAMES


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> pd.DataFrame:
    out: Path = tmp_path_factory.mktemp("dask-mem") / "runs.parquet"
    r = _cli("generate", "-o", str(out), "--runs", "150", "--seed", "7")
    assert r.returncode == 0, r.stderr
    return pq.read_table(out).to_pandas()


def _same_cells(a: pd.Series, b: pd.Series) -> None:
    assert len(a) == len(b)
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert isinstance(y, np.ndarray) and isinstance(x, np.ndarray)
            assert x.dtype == y.dtype and x.tolist() == y.tolist()


def test_steps_of_gives_back_the_list_cells(raw):
    from features.runlog import conform
    from training import dask_io

    cleaned = dask_io.clean_partition(raw.copy())
    packed, table = cleaned[0]
    assert table is not None and "hash_ids" in table.column_names and "hash_ids" not in packed.columns
    steps = dask_io.steps_of(cleaned)
    # what the step frame held before the lists were packed
    good = conform(raw.copy().reset_index(drop=True), exact=False)
    ref = good[good["record"] == "step"].sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    assert len(steps) == len(ref) and set(table.column_names) <= set(steps.columns)
    for c in table.column_names:
        _same_cells(ref[c], steps[c])
    assert steps["run_id"].tolist() == ref["run_id"].tolist()


def test_replay_labels_do_not_depend_on_the_chunk(raw, monkeypatch):
    from training import dask_io, dataset

    steps = dask_io.steps_of(dask_io.clean_partition(raw.copy()))
    run_src = dict.fromkeys(steps["run_id"].astype(str), "synthetic")
    whole = dataset.replay_cache_labels(steps, run_src, 64, 512)
    monkeypatch.setattr(dataset, "_REPLAY_CHUNK", 7)
    chunked = dataset.replay_cache_labels(steps, run_src, 64, 512)
    assert np.isfinite(whole[0]).any() and np.isfinite(whole[1]).any()
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_array_equal(a, b)


def test_split_replay_is_the_serial_replay(raw):
    import zlib

    from training import dask_io, dataset
    from training.dask_replay import cache_columns, capped_runs, pack_replay_input, replay_keys, replay_packed

    steps = dask_io.steps_of(dask_io.clean_partition(raw.copy()))
    ids = sorted(set(steps["run_id"].astype(str)))
    # two of three runs synthetic: the cap (synthetic labels up to the real labelled steps) bites
    run_src = {r: ("synthetic" if i % 3 else "real") for i, r in enumerate(ids)}
    y_ser, pr_ser = dataset.replay_cache_labels(steps, run_src, 64, 512, replicas=2)
    assert np.isfinite(y_ser).any() and np.isfinite(pr_ser).any()
    keys = replay_keys(run_src, 2)
    assert len(keys) == 6  # sources "", real, synthetic x 2 replicas
    part_of = np.array([zlib.crc32(r.encode()) % 3 for r in steps["run_id"].astype(str)])
    parts = [steps[part_of == p].reset_index(drop=True) for p in range(3)]
    packs = [pack_replay_input(p, run_src, keys, 2) for p in parts]
    replays = [replay_packed([pk[k] for pk in packs], run_src, 64, 512, replicas=2) for k in range(len(keys))]
    drop = capped_runs(replays)
    assert drop and all(run_src[r] == "synthetic" for r in drop)
    for p, part in enumerate(parts):
        y, pr = cache_columns(part, [r[0][p] for r in replays], drop)
        np.testing.assert_array_equal(y, y_ser[part_of == p])
        np.testing.assert_array_equal(pr, pr_ser[part_of == p])


def test_partition_rows_are_the_serial_rows(raw):
    from features.runlog import RunLog
    from training import dask_io
    from training.config import TrainConfig
    from training.dask_replay import pack_replay_input, replay_keys, replay_packed
    from training.dask_train import META_COLS, _rows
    from training.dataset import build_dataset, replay_cache_labels
    from training.train import holdout_mask

    cleaned = dask_io.clean_partition(raw.copy())
    steps, runs = dask_io.steps_of(cleaned), cleaned[1]
    run_src = dict(zip(runs["run_id"].astype(str), runs["source"].astype(str), strict=True))
    cache = replay_cache_labels(steps, run_src, 64, 512)
    cfg = TrainConfig(runs=[Path("x")], out=Path("y"), cache_capacity_blocks=64)
    keys = replay_keys(run_src, 1)
    packs = pack_replay_input(steps, run_src, keys, 1)
    slices = [replay_packed([packs[k]], run_src, 64, 512)[0][0] for k in range(len(keys))]
    train, held, _ = _rows(cleaned, runs, cfg, slices, [])
    empty = steps.iloc[:0]
    ds = build_dataset(
        RunLog(runs=runs, steps=steps, arrivals=empty, rates=empty),
        cache_capacity_blocks=64,
        cache_labels=cache,
    )
    h = holdout_mask(ds.meta["group"].to_numpy(dtype=object), cfg.holdout_share)
    assert h.any() and (~h).any()
    np.testing.assert_array_equal(held[list(FEATURE_NAMES)].to_numpy(), ds.X[h])
    np.testing.assert_array_equal(train[list(FEATURE_NAMES)].to_numpy(), ds.X[~h].astype(np.float32))
    assert train[list(FEATURE_NAMES)].dtypes.eq(np.float32).all()
    for c in META_COLS:
        assert held[c].astype(str).tolist() == ds.meta.loc[h, c].astype(str).tolist(), c
    press = FEATURE_NAMES.index("local_cache_pressure")
    assert np.isfinite(ds.X[:, press]).any()  # the filled-in feature is exercised


def test_replay_input_packed_from_arrow_is_the_unpacked_one(raw):
    """The replay packs a validated partition's chains straight from its Arrow table: the same
    scalars, chains, presence and positions as packing the unpacked cells (a null and an empty
    chain included)."""
    import pyarrow as pa

    from training import dask_io
    from training.dask_replay import FlatChains, pack_replay_input, replay_keys

    cleaned = dask_io.clean_partition(raw.copy())
    steps = dask_io.steps_of(cleaned)
    run_src = dict.fromkeys(steps["run_id"].astype(str), "synthetic")
    keys = replay_keys(run_src, 2)
    a, b = pack_replay_input(cleaned[0], run_src, keys, 2), pack_replay_input(steps, run_src, keys, 2)
    assert len(a) == len(b) == len(keys) and sum(len(p[2]) for p in a) == len(steps)
    for (fa, ca, pa_), (fb, cb, pb) in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(fa, fb)
        np.testing.assert_array_equal(pa_, pb)
        for x, y in (
            (ca.flat, cb.flat),
            (ca.offsets, cb.offsets),
            (ca.present, cb.present),
        ):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    assert any(len(c.flat) for _, c, _ in a)
    cells = [np.array([3, 1], np.int64), None, np.zeros(0, np.int64), np.array([7], np.int64)]
    arr = pa.chunked_array([pa.array(cells[:2]), pa.array(cells[2:])])
    fa, fb = (
        FlatChains.from_arrow(arr.take(pa.array([3, 0, 1, 2]))),
        FlatChains.pack(pd.Series(cells).iloc[[3, 0, 1, 2]]),
    )
    for x, y in ((fa.flat, fb.flat), (fa.offsets, fb.offsets), (fa.present, fb.present)):
        np.testing.assert_array_equal(x, y)
    assert (
        fa.present.tolist() == [True, True, False, True] and fa[3].tolist() == [] and fa[1].tolist() == [3, 1]
    )
