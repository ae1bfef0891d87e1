"""Cache-reuse labels come from the deployment's cache (issue 14, item 6): the replay's capacity is the
node profile's (the simulator's own KV-block definition), one cache per replica; logged
``cached_tokens`` win; synthetic labels never outweigh real ones."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from features.runlog import RunLog, records_to_frame
from features.schema import Run, Step
from router.sim.profiles import load_profile
from router.sim.simconfig import SimConfig
from training.dataset import build_dataset, node_cache_blocks


def test_node_cache_blocks_is_the_simulators_kv_capacity():
    for gpu, gb in (("a100", 16.0), ("a100", 64.0), ("h100", 16.0)):
        sim = SimConfig(profile=load_profile(None, gpu), kv_cache_gb=gb, block_tokens=512)
        assert node_cache_blocks(gpu, kv_cache_gb=gb) == sim.kv_blocks()
    # a100-llama-3-8b: 131072 bytes per token -> 16 GB hold 122k tokens = 238 blocks of 512, not 8192
    assert node_cache_blocks() == 238
    assert node_cache_blocks(kv_cache_gb=32.0) == int(32e9 // 131072) // 512 == 476


def _two_runs(src_a: str = "mooncake", src_b: str = "mooncake", ids: tuple[str, str] = ("a", "b")) -> RunLog:
    """Run a: 100 blocks, then run b writes 200 blocks, then run a again (its 100 blocks + 1)."""
    a, b = ids
    recs: list = [Run(run_id=a, source=src_a), Run(run_id=b, source=src_b)]
    pa = list(range(1, 101))
    recs.append(
        Step(run_id=a, step=0, arrival_s=0.0, prompt_tokens=100 * 512, completion_tokens=0, hash_ids=pa)
    )
    recs.append(
        Step(
            run_id=b,
            step=0,
            arrival_s=1.0,
            prompt_tokens=200 * 512,
            completion_tokens=0,
            hash_ids=list(range(1000, 1200)),
        )
    )
    recs.append(
        Step(
            run_id=a,
            step=1,
            arrival_s=2.0,
            tool_pause_s=1.0,
            prompt_tokens=101 * 512,
            completion_tokens=0,
            hash_ids=[*pa, 5000],
        )
    )
    return RunLog.from_frame(records_to_frame(recs))


def _hit(ds, run: str, step: int) -> float:
    m = ds.meta
    return float(m.loc[(m["run_id"] == run) & (m["step"] == step), "y_cache"].iloc[0])


def test_default_replay_uses_the_node_profile_not_a_4m_token_cache():
    log = _two_runs()
    small = build_dataset(log)  # 238 blocks: b's 200 blocks evict a's tail, 38 leading blocks survive
    assert _hit(small, "a", 1) == 38 * 512
    assert _hit(build_dataset(log, cache_capacity_blocks=8192), "a", 1) == 100 * 512
    # the larger deployment of the same profile keeps everything
    assert _hit(build_dataset(log, kv_cache_gb=64.0), "a", 1) == 100 * 512


def test_each_replica_has_its_own_cache():
    # two run ids that crc32 pins to different replicas: b's blocks land in the other cache
    ids = next(
        (f"a{i}", f"b{j}")
        for i in range(50)
        for j in range(50)
        if zlib.crc32(f"a{i}".encode()) % 2 != zlib.crc32(f"b{j}".encode()) % 2
    )
    log = _two_runs(ids=ids)
    assert _hit(build_dataset(log, replicas=2), ids[0], 1) == 100 * 512
    assert _hit(build_dataset(log, replicas=1), ids[0], 1) == 38 * 512


def test_synthetic_cache_labels_never_outweigh_real_ones():
    only_syn = build_dataset(_two_runs("synthetic", "synthetic"))
    assert only_syn.meta["y_cache"].notna().all()  # no real label: synthetic ones are used
    dropped = build_dataset(_two_runs("mooncake", "synthetic"), synthetic_cache_share=0.0)
    m = dropped.meta
    assert m.loc[m["source"] == "synthetic", "y_cache"].isna().all()
    assert m.loc[m["source"] == "mooncake", "y_cache"].notna().all()
    # one real run of 3 steps, 20 synthetic runs of 1 step: at most 3 synthetic labels, whole runs
    recs: list = [Run(run_id="r", source="router")]
    recs += [
        Step(run_id="r", step=k, prompt_tokens=1000, completion_tokens=5, cached_tokens=512) for k in range(3)
    ]
    for i in range(20):
        recs.append(Run(run_id=f"s{i}", source="synthetic"))
        recs.append(Step(run_id=f"s{i}", step=0, prompt_tokens=1024, completion_tokens=5, hash_ids=[1, 2]))
    log = RunLog.from_frame(records_to_frame(recs))
    for share, most in ((1.0, 3), (0.5, 1)):
        m = build_dataset(log, synthetic_cache_share=share).meta
        syn = m.loc[m["source"] == "synthetic", "y_cache"]
        assert int(syn.notna().sum()) == most
        assert m.loc[m["source"] == "router", "y_cache"].tolist() == [512.0] * 3  # logged cached_tokens
    a = build_dataset(log).meta
    assert a["y_cache"].isna().tolist() == build_dataset(log).meta["y_cache"].isna().tolist()  # deterministic


def test_training_config_follows_the_deployment():
    from training.train import TrainConfig

    cfg = TrainConfig(runs=["x"], out="y")
    assert cfg.cache_capacity_blocks is None and cfg.kv_cache_gb == 16.0 and cfg.cache_replicas == 2
    with pytest.raises(ValueError):
        TrainConfig(runs=["x"], out="y", kv_cache_gb=0)


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(
    not (SHARED / "mooncake" / "conversation_trace.jsonl").exists(), reason="no ../shared/data"
)
def test_cache_bench_holds_out_the_last_fifth_by_time_and_never_the_training_sample():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import cache_mae
    finally:
        sys.path.pop(0)
    from features.importers.mooncake import import_mooncake
    from features.runlog import read_runlog
    from features.samples import sample_path
    from runroute.demo import DemoConfig

    log = RunLog.from_frame(import_mooncake(SHARED / "mooncake" / "conversation_trace.jsonl"))
    ds, hold, cut = cache_mae.heldout_rows(log, 0.2, DemoConfig().sim)
    st = log.steps.sort_values(["run_id", "step"], kind="stable")
    arrival = st["arrival_s"].to_numpy(dtype=np.float64)
    assert cut == pytest.approx(arrival.max() - 0.2 * (arrival.max() - arrival.min()))
    assert (arrival[hold] >= cut).all() and 0.15 < hold.mean() < 0.3
    # the demo trains on the shipped sample: the first 20 minutes, all before the cut
    sample = read_runlog([str(sample_path("mooncake_20min.parquet"))])
    assert float(sample.steps["arrival_s"].max()) < cut
    # held-out labels: the deployment's cache never reports more than the infinite-cache bound
    y = ds.meta["y_cache"].to_numpy()[hold]
    assert (y <= ds.meta["prefix_reuse_tokens"].to_numpy()[hold] + 1e-9).all()
    f = cache_mae.figures(y, ds.meta["prompt_tokens"].to_numpy()[hold], {"zero": np.zeros(len(y))})
    assert f["zero"]["mae_tokens"] == pytest.approx(float(y.mean())) and f["zero"]["hit_share"] == 0.0
