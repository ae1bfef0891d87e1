"""``local_cache_pressure`` is one quantity in training, the simulator and the live router.

Definition (features/prefix.py): prefix-cache turnover on the run's local replica since the run's
previous step = tokens newly written into the cache / cache capacity in tokens, clipped to [0, 1];
None (NaN feature) at a run's first step or when unknown.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from features.runlog import records_to_frame
from features.schema import Run, Step
from router.core.runs import CacheReading, RunTrack
from router.policy.types import Decision, Snapshot
from router.server.hotpath.backends import BackendPool
from router.server.metrics.parse import read_vllm_metrics
from router.server.metrics.scrape import ReplicaStats
from router.sim.arrivals import run_starts
from router.sim.frontier import FrontierConfig
from router.sim.profiles import NodeProfile
from router.sim.whatif import SimConfig, Simulator, Workload
from training.dataset import lru_replay

PROF = NodeProfile(
    name="t", a=0.01, b=1e-4, c=1e-8, d=1e-6, e=0.002, kv_bytes_per_token=1000, token_budget=8192
)
FRONT = FrontierConfig(ttft_sigma=0.0, tokens_per_s_sigma=0.0)


class To:
    """Stand-in policy: run r000 to ``a``, every other run to ``b``."""

    name = "to"

    def __init__(self, a: str, b: str):
        self.a, self.b = a, b

    def decide(self, snap: Snapshot) -> Decision:
        want = self.a if snap.run.run_id == "r000" else self.b
        be = next(x for x in snap.backends if x.name == want)
        return Decision(tier=be.tier, backend=be.name, model=be.model, reason="fixed")


def _workload(runs: list[tuple[float, list[tuple[int, int, float, list[int]]]]]) -> Workload:
    recs: list = []
    for i, (start, steps) in enumerate(runs):
        rid = f"r{i:03d}"
        recs.append(Run(run_id=rid, source="t", started_at=start))
        for k, (p, c, pause, hashes) in enumerate(steps):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    prompt_tokens=p,
                    completion_tokens=c,
                    tool_pause_s=pause if k else None,
                    hash_ids=hashes,
                )
            )
    df = records_to_frame(recs)
    return Workload.from_frames(df[df.record == "step"], df[df.record == "run"], block_tokens=512)


def _simulate(w: Workload, policy, replicas: int) -> tuple[dict[tuple[str, int], float | None], int]:  # type: ignore[no-untyped-def]
    """The ``local_cache_pressure`` every step saw, from the simulated run log the engine wrote."""
    from features.extract import FEATURE_NAMES

    cfg = SimConfig(profile=PROF, frontier=FRONT, replicas=replicas, kv_cache_gb=0.1, log_steps=True)
    starts = run_starts("trace", len(w.runs), logged_starts=w.logged_starts())
    res = Simulator(w, policy, cfg, starts).run()
    i = FEATURE_NAMES.index("local_cache_pressure")
    seen = {}
    for rec in res.records or []:
        v = rec.features[i]
        seen[(rec.run_id, rec.step)] = None if np.isnan(v) else v
    return seen, cfg.kv_blocks()


def test_simulator_pressure_is_blocks_newly_cached_on_the_runs_replica_over_capacity() -> None:
    # run A: two steps 100 s apart on local-0; run B (t=10 s) writes 5 new blocks on local-0 and
    # re-reads 2 of A's blocks (hits: not new); run C (t=20 s) writes 3 blocks, on local-0 in the
    # first replay and on local-1 (another replica: not A's) in the second; A's own blocks (its
    # first step's, and its second step's new block 3) do not count. By the definition A's second
    # step sees (5 [+ 3]) blocks / capacity.
    a = (0.0, [(1024, 1, 0.0, [1, 2]), (1536, 1, 100.0, [1, 2, 3])])
    b = (10.0, [(3584, 1, 0.0, [1, 2, 10, 11, 12, 13, 14])])
    c = (20.0, [(1536, 1, 0.0, [20, 21, 22])])
    probe, cap = _simulate(_workload([a, b, c]), To("local-0", "local-0"), replicas=2)
    assert probe[("r000", 0)] is None and probe[("r001", 0)] is None
    assert probe[("r000", 1)] == pytest.approx((5 + 3) / cap)  # here C ran on local-0 too
    probe2, cap2 = _simulate(_workload([a, b, c]), _Split(), replicas=2)
    assert probe2[("r000", 1)] == pytest.approx(5 / cap2)  # C's 3 blocks on local-1 do not count


class _Split(To):
    def __init__(self) -> None:
        super().__init__("local-0", "local-0")

    def decide(self, snap: Snapshot) -> Decision:
        want = "local-1" if snap.run.run_id == "r002" else "local-0"
        be = next(x for x in snap.backends if x.name == want)
        return Decision(tier=be.tier, backend=be.name, model=be.model, reason="fixed")


def test_simulator_pressure_matches_the_training_lru_replay_and_clips_at_one() -> None:
    # one replica, no eviction pressure beyond the cache: the simulator and training's LRU replay
    # (the same definition in blocks) agree step by step
    a = (0.0, [(1024, 1, 0.0, [1, 2]), (1536, 1, 50.0, [1, 2, 3]), (2048, 1, 50.0, [1, 2, 3, 4])])
    b = (10.0, [(2048, 1, 0.0, [10, 11, 12, 13]), (2560, 1, 50.0, [10, 11, 12, 13, 14])])
    w = _workload([a, b])
    probe, cap = _simulate(w, To("local-0", "local-0"), replicas=1)
    # arrival order: a0 (0), b0 (10), a1 (~50), b1 (~60), a2 (~100)
    order = [("r000", 0), ("r001", 0), ("r000", 1), ("r001", 1), ("r000", 2)]
    chains = {("r000", k): list(s.chain) for k, s in enumerate(w.runs[0].steps)}
    chains.update({("r001", k): list(s.chain) for k, s in enumerate(w.runs[1].steps)})
    _, pressure = lru_replay([chains[o] for o in order], [o[0] for o in order], np.full(5, 4096), cap, 512)
    for o, want in zip(order, pressure, strict=True):
        got = probe[o]
        assert (got is None and np.isnan(want)) or got == pytest.approx(want), o
    # a capacity smaller than the turnover clips at 1
    _, clipped = lru_replay([[1], [2, 3, 4, 5], [1]], ["a", "b", "a"], np.full(3, 4096), 2, 512)
    assert clipped[2] == 1.0


# ------------------------------------------------------------------------------ live router


def _reader(kv_cache_tokens: int | None, stats: dict[str, ReplicaStats]):  # type: ignore[no-untyped-def]
    """The sidecar's cache reader (:meth:`BackendPool.cache_reading`) over hand-set scrape figures."""
    return BackendPool([], SimpleNamespace(stats=stats), kv_cache_tokens).cache_reading


def _end_step(track: RunTrack, read, replica: str, tier: str, sent_at: float | None, own: int) -> None:  # type: ignore[no-untyped-def]
    """What ``StepEngine.finish`` does with the cache at a step's end."""
    local = tier == "local"
    start = CacheReading(sent_at, None) if sent_at is not None else None
    track.mark_cache(replica, local, read(replica if local else track.cache_replica or ""), start, own)


def test_router_sets_pressure_from_scraped_counters() -> None:
    st = ReplicaStats("local-0", "http://x", prefix_queries=1000.0, prefix_hits=200.0, scraped=True)
    other = ReplicaStats("local-1", "http://y", prefix_queries=0.0, prefix_hits=0.0, scraped=True)
    st.cache_tokens = 10_000.0  # as read from vllm:cache_config_info
    stats = {"local-0": st, "local-1": other}
    read = _reader(None, stats)
    track = RunTrack.new("run-1", 0.0)

    def pressure() -> float | None:
        return track.cache_pressure(read(track.cache_replica) if track.cache_replica else None)

    assert pressure() is None  # first step
    # step 0 served by local-0; the scrape before it showed 800 computed tokens, the step itself
    # computed 300 (prompt - cached) that no scrape has seen yet: the mark is 1100, not 800
    _end_step(track, read, "local-0", "local", 800.0, 300)
    assert track.cache_replica == "local-0" and track.cache_mark == 1100.0
    assert pressure() == 0.0  # the scrape has not seen the step's own tokens yet: not turnover
    st.prefix_queries, st.prefix_hits = 4000.0, 400.0  # 3600 computed: 2500 newly since the mark
    other.prefix_queries = 1e9  # another replica's turnover is not this run's
    assert pressure() == pytest.approx(2500 / 10_000)
    read = _reader(5000, stats)  # local.kv_cache_tokens wins over the scraped size
    assert pressure() == pytest.approx(0.5)
    st.prefix_queries = 1e7  # more than a whole cache turned over: clipped
    assert pressure() == 1.0
    st.prefix_queries, st.prefix_hits = 10.0, 0.0  # counters went backwards: vLLM restarted
    assert pressure() == 1.0
    # a frontier step keeps the run's local replica and moves the mark to "now"
    _end_step(track, read, "frontier", "frontier", None, 500)
    assert track.cache_replica == "local-0" and track.cache_mark == track.cache_seen == 10.0
    assert pressure() == 0.0
    st.cache_tokens = None  # capacity unknown: NaN feature
    read = _reader(None, stats)
    assert pressure() is None


def test_router_pressure_is_unknown_before_any_local_step_or_scrape() -> None:
    st = ReplicaStats("local-0", "http://x", scraped=False)
    read = _reader(4096, {"local-0": st})
    track = RunTrack.new("r", 0.0)
    _end_step(track, read, "frontier", "frontier", None, 100)  # only frontier so far
    assert track.cache_replica is None and track.cache_pressure(None) is None
    _end_step(track, read, "local-0", "local", None, 100)  # local, but never scraped
    assert track.cache_replica == "local-0" and track.cache_pressure(read("local-0")) is None


def test_simulator_readings_are_exact_and_epochs_mark_wipes() -> None:
    """The node model's counter has no scrape lag (the step's own blocks are in it), and a wipe
    (scale-to-zero) is a new epoch: pressure 1 at the run's next step."""
    track = RunTrack.new("r", 0.0)
    start = CacheReading(1000.0, 8192.0, 0, lags=False)
    track.mark_cache("local-0", True, CacheReading(1512.0, 8192.0, 0, lags=False), start, 2000)
    assert track.cache_mark == 1512.0  # not start + own tokens
    assert track.cache_pressure(CacheReading(1512.0 + 4096.0, 8192.0, 0, lags=False)) == 0.5
    assert track.cache_pressure(CacheReading(0.0, 8192.0, 1, lags=False)) == 1.0


def test_cache_config_info_gives_the_capacity_and_the_fake_exposes_it() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="661"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 500.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0\n'
    )
    m = read_vllm_metrics(text, "m")
    assert m.cache_capacity_tokens == 661 * 16  # engine 1 not sized yet: skipped
    assert m.prefix_cache_computed_total == 380.0
    assert "vllm:cache_config_info" in m.present
    assert read_vllm_metrics("vllm:num_requests_running 1\n").cache_capacity_tokens is None
    from router.fakes.vllm import FakeVllm

    fake = FakeVllm(model="m", block_size=32, capacity_blocks=1000)
    assert read_vllm_metrics(fake.metrics_text(), "m").cache_capacity_tokens == 32_000


# ------------------------------------------------------------------------------ end to end


def test_sidecar_logs_pressure_from_the_fake_vllm_counters_and_history_features_match_training(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    """A run through the real sidecar (fake vLLM, scraper on): at every later step the logged
    ``local_cache_pressure`` is the scraped turnover of its replica, > 0 when another run wrote into
    the cache in between; the history features the router computed incrementally equal training's
    extraction over the logged rows."""
    import os
    import time

    import httpx

    from features.extract import FEATURE_NAMES, extract, iter_prefixes
    from features.runlog import read_runlog
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier
    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, len(FEATURE_NAMES)))
    est = EscalationClassifier(n_estimators=5, calibration="sigmoid", cv=2, n_jobs=1).fit(
        X, (rng.random(200) < 0.2).astype(int)
    )
    bundle = tmp_path / "b"
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.95, "p_frontier_down": 0.9}).save(bundle)
    os.environ["RR_TEST_FRONTIER_KEY"] = "sk-front"
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    with (
        fake_in_thread("vllm", model="local-model", zero_latency=True, capacity_blocks=4096) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-front") as fr,
    ):
        s = RouterSettings.load(
            None,
            local={"urls": [v0.url], "model": "local-model"},
            frontier={"url": fr.base_url, "model": "frontier-model", "api_key_env": "RR_TEST_FRONTIER_KEY"},
            policy={"kind": "always-local"},
            bundle={"path": str(bundle), "watch_s": 0},
            scrape={"interval_s": 0.02},
            admission={"enabled": False},
            runlog={"dir": str(tmp_path / "logs")},
        )
        app = create_app(s)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
            msgs: list[dict] = [{"role": "user", "content": "task: " + " ".join(f"w{i}" for i in range(300))}]
            for k in range(6):
                r = c.post(
                    "/v1/chat/completions",
                    json={"model": "auto", "messages": msgs, "tools": tools, "max_tokens": 8},
                    headers={"X-Run-Id": "main"},
                )
                assert r.status_code == 200, r.text
                msgs.append(r.json()["choices"][0]["message"])
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": f"t{k}",
                        "content": "error: not found" if k % 2 else "ok",
                    }
                )
                if k % 2 == 0:  # another run writes fresh tokens into the same replica's cache
                    noise = " ".join(f"n{k}-{i}" for i in range(1500))
                    rn = c.post(
                        "/v1/chat/completions",
                        json={
                            "model": "auto",
                            "messages": [{"role": "user", "content": noise}],
                            "max_tokens": 2,
                        },
                        headers={"X-Run-Id": f"noise-{k}"},
                    )
                    assert rn.status_code == 200
                time.sleep(0.15)  # let the scraper see the counters
            hist = app.state.proxy.runs["main"]
    log = read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))
    steps = log.steps[log.steps["run_id"] == "main"].sort_values("step").reset_index(drop=True)
    logged = np.array(steps["features"].tolist(), dtype=float)
    press = logged[:, FEATURE_NAMES.index("local_cache_pressure")]
    assert np.isnan(press[0])
    assert np.all((press[1:] >= 0) & (press[1:] <= 1)), press
    assert np.all(press[1::2] > 0), press  # after each noise run (steps 1, 3, 5)
    # the history features (everything computed from earlier steps) equal training's
    history = [n for n in FEATURE_NAMES if n.startswith("verb_")] + [
        "step_index",
        "tokens_so_far",
        "tool_pause_mean_s",
        "n_tool_calls",
        "tool_calls_last",
        "tool_errors",
        "tool_error_streak",
        "repeated_tool_calls",
        "max_key_repeats",
        "last_call_repeated",
        "out_tokens_last",
        "out_tokens_mean",
        "out_tokens_max",
        "structured_share",
        "cache_hit_ratio",
        "tier_switches",
        "frontier_step_share",
    ]
    idx = [FEATURE_NAMES.index(n) for n in history]
    trained = np.array([extract(p) for p in iter_prefixes(steps)])
    np.testing.assert_array_equal(logged[:, idx], trained[:, idx])
    assert hist.base.aggregate is not None and hist.base.aggregate.n == 6  # kept current: no rescans
