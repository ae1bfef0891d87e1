"""The Dask path's split prefix-cache replay (one task per (source, replica) cache, the
synthetic-label cap over all of them; :mod:`training.dask_replay`) equals the serial replay row for
row, on a log that mixes synthetic runs, a real source with logged cached tokens (so the cap drops
synthetic labels) and a real source replayed from its hashes, cut into partitions by run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from features.generate import generate
from training.dask_replay import assemble, cap_cutoff, pack_replay_groups, replay_group, replay_keys
from training.dataset import replay_cache_labels


def _log() -> tuple[pd.DataFrame, dict[str, str]]:
    df = generate(240, seed=3)
    steps = df[df["record"] == "step"].copy()
    runs = df[df["record"] == "run"]
    run_ids = sorted(runs["run_id"].astype(str))
    src = {r: "synthetic" for r in run_ids}
    for r in run_ids[:40]:  # a real source whose steps logged their cached tokens
        src[r] = "real-logged"
    for r in run_ids[40:80]:  # a real source replayed from its block hashes
        src[r] = "real-hashed"
    logged = steps["run_id"].astype(str).isin(run_ids[:40])
    steps["cached_tokens"] = np.where(logged, steps["prompt_tokens"].to_numpy(dtype=float) // 3, np.nan)
    steps = steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    return steps, src


@pytest.mark.parametrize("replicas,parts", [(1, 1), (2, 3), (3, 5)])
def test_split_replay_equals_the_serial_replay_row_for_row(replicas: int, parts: int) -> None:
    steps, src = _log()
    y_s, pr_s = replay_cache_labels(steps, src, 64, 512, replicas=replicas)
    y_uncapped, _ = replay_cache_labels(steps, src, 64, 512, replicas=replicas, cap_synthetic=False)
    synthetic = steps["run_id"].map(src).eq("synthetic").to_numpy()
    assert (synthetic & ~np.isnan(y_s)).any()
    assert (synthetic & np.isnan(y_s) & ~np.isnan(y_uncapped)).any()  # the cap dropped some labels

    # partitions hold whole runs (as the Dask shuffle on run_id leaves them), in any order
    run_ids = steps["run_id"].astype(str).unique()
    rng = np.random.default_rng(parts)
    part_of = dict(zip(run_ids, rng.integers(0, parts, len(run_ids)), strict=True))
    cut = [steps[steps["run_id"].map(part_of) == p].reset_index(drop=True) for p in range(parts)]
    packs = [pack_replay_groups(p, src, replicas) for p in cut]
    keys = replay_keys(src, replicas)
    groups = [replay_group(packs, k, src, 64, 512, replicas=replicas) for k in keys]
    cutoff = cap_cutoff([(n, per_run) for _, n, per_run in groups])
    got = [
        assemble(
            len(p),
            p["run_id"].astype(str).to_numpy(),
            [g[0][i] for g in groups],
            [k[0] for k in keys],
            cutoff,
        )
        for i, p in enumerate(cut)
    ]
    y_d = pd.concat(
        [
            pd.Series(y, index=p["run_id"] + "/" + p["step"].astype(str))
            for p, (y, _) in zip(cut, got, strict=True)
        ]
    )
    pr_d = pd.concat(
        [
            pd.Series(r, index=p["run_id"] + "/" + p["step"].astype(str))
            for p, (_, r) in zip(cut, got, strict=True)
        ]
    )
    key = steps["run_id"] + "/" + steps["step"].astype(str)
    np.testing.assert_array_equal(y_d.loc[key].to_numpy(), y_s)
    np.testing.assert_array_equal(pr_d.loc[key].to_numpy(), pr_s)
