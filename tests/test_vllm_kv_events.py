"""The prefix index's precise mode against a real vLLM (CPU) with KV events on (``make test-vllm``).

One vLLM replica (the tiny test model, block 32, a small KV cache: ``--num-gpu-blocks-override``)
publishes KV events over ZMQ; the router's subscriber (router.server.state.kv_events) fills a precise
index, and before every step the index predicts the cached tokens from the step's token chain
(router.server.protocols.chat_tokens: the model's chat template and tokenizer). A scripted sequence: a system
prompt shared by several runs, a run whose context grows, an eviction forced by the small cache, a
prefix-cache reset. The prediction must be within one block of vLLM's
``usage.prompt_tokens_details.cached_tokens`` on >= 95% of the steps (the figure is printed). The
approximate mode's figure on the same sequence is printed beside it (no assertion: it is what a
deployment without KV events gets): the sidecar's default character blocks (1,024 characters, 256
tokens at 4 characters per token), recorded as sent, its match capped as the engine caps it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.core.prefix_index import CHARS_PER_TOKEN, PrefixIndex, RunChain, TextChainer
from router.localnode.launch import LocalNode, LocalNodeConfig, LocalNodeError, find_vllm_python, project_root
from router.server.protocols.chat import MessageSegments
from router.server.protocols.chat_tokens import ChatTokenChainer, ChatTokenizer
from router.server.state.kv_events import KvEventsConfig, KvEventSubscriber, ReplicaEvents

MODEL = "local"
BLOCK = 32
KV_BLOCKS = 220  # 7,040 tokens: a few runs fill it (the forced eviction)
APPROX_BLOCK = 1024 // CHARS_PER_TOKEN  # the approximate mode's default block (local.prefix_block_chars)


def _unavailable(reason: str) -> None:
    if os.environ.get("RUNROUTE_VLLM_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def words(tag: str, n: int) -> str:
    w = ("route", "replica", "prefix", "cache", "token", "policy", "frontier", "local", "step", "tool")
    return f"Task {tag}. " + " ".join(f"{w[i % len(w)]}{i % 97}" for i in range(n))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        python = find_vllm_python()
    except LocalNodeError as e:
        _unavailable(f"vllm not importable: {e}")
    model = Path(os.environ.get("RUNROUTE_VLLM_TEST_MODEL") or project_root() / ".runroute" / "test-model")
    if not (model / "config.json").is_file():
        _unavailable(f"test model absent at {model}: run `make test-vllm`")
    pub, rep = _free_port(), _free_port()
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{rep}",
        "topic": "kv-events",
    }
    dev = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache (read at start, then restored)
    n = LocalNode(
        LocalNodeConfig(
            model=str(model),
            port=_free_port(),
            served_model_name=MODEL,
            python=python,
            state_dir=str(tmp_path_factory.mktemp("vllm-kv-state")),
            block_size=BLOCK,
            max_model_len=4096,
            health_timeout_s=300,
            extra_args=["--kv-events-config", json.dumps(cfg), "--num-gpu-blocks-override", str(KV_BLOCKS)],
        )
    )
    try:
        n.start()
        if dev is None:
            os.environ.pop("VLLM_SERVER_DEV_MODE", None)
        else:
            os.environ["VLLM_SERVER_DEV_MODE"] = dev
        n.wait_healthy()
        yield n, model, ReplicaEvents(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}", "kv-events")
    finally:
        n.stop()


@pytest.mark.vllm
def test_precise_index_predicts_vllm_cached_tokens(node: Any) -> None:
    n, model, ev = node
    url = n.cfg.base_url
    rows: list[tuple[str, int, int]] = []
    approx: list[int] = []  # the approximate mode's prediction per step

    async def main() -> None:
        idx = PrefixIndex(BLOCK, [("r0", KV_BLOCKS)])
        aidx = PrefixIndex(APPROX_BLOCK, [("r0", KV_BLOCKS * BLOCK // APPROX_BLOCK)])
        achainer = TextChainer(APPROX_BLOCK * CHARS_PER_TOKEN)
        sub = KvEventSubscriber(idx, KvEventsConfig({"r0": ev}, silence_s=600))
        sub.start()
        chainer = ChatTokenChainer(ChatTokenizer(model), BLOCK)
        async with httpx.AsyncClient(timeout=300) as c:

            async def step(label: str, messages: list[dict[str, Any]]) -> None:
                chain = chainer.extend(RunChain(), MessageSegments({"messages": messages}))
                predicted = idx.match("r0", chain, len(chain)) * BLOCK
                achain = achainer.extend(RunChain(), MessageSegments({"messages": messages}))
                est = sum(len(str(m["content"])) for m in messages) // CHARS_PER_TOKEN  # the estimate
                a_blocks = min(aidx.match("r0", achain, len(achain)), max(0, est - 1) // APPROX_BLOCK)
                aidx.record("r0", achain, len(achain))
                r = await c.post(
                    url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0},
                )
                assert r.status_code == 200, r.text[:300]
                actual = int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)
                rows.append((label, predicted, actual))
                approx.append(a_blocks * APPROX_BLOCK)
                await asyncio.sleep(0.5)  # the step's events reach the index before the next prediction

            await asyncio.sleep(1.0)  # the SUB connects (ZMQ's slow joiner)
            shared = {"role": "system", "content": words("shared", 500)}
            # 1. a system prompt shared by several runs, each two steps
            for i in range(4):
                msgs = [shared, {"role": "user", "content": f"Question {i}: " + words(f"q{i}", 30)}]
                await step(f"shared-{i}-0", msgs)
                msgs += [
                    {"role": "assistant", "content": f"Answer {i}."},
                    {"role": "user", "content": "More."},
                ]
                await step(f"shared-{i}-1", msgs)
            # 2. a run whose context grows
            grow = [{"role": "system", "content": words("grow", 200)}, {"role": "user", "content": "Start."}]
            for k in range(6):
                await step(f"grow-{k}", grow)
                grow += [
                    {"role": "assistant", "content": f"Step {k} done."},
                    {"role": "user", "content": words(f"g{k}", 60)},
                ]
            # 3. an eviction forced by the small cache: unique long prompts, then the shared one again
            for j in range(4):
                await step(f"evict-{j}", [{"role": "user", "content": words(f"unique{j}", 1200)}])
            await step("shared-after-evict", [shared, {"role": "user", "content": "Again."}])
            await step("shared-after-evict-2", [shared, {"role": "user", "content": "Once more."}])
            # 4. a prefix-cache reset
            r = await c.post(url + "/reset_prefix_cache")
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.5)
            await step("after-reset", [shared, {"role": "user", "content": "After reset."}])
            await step("after-reset-2", [shared, {"role": "user", "content": "After reset, again."}])
        st = sub.state()["r0"]
        await sub.stop()
        print("subscriber:", st)

    asyncio.run(main())
    ok = [abs(p - a) <= BLOCK for _, p, a in rows]
    a_ok = [abs(q - a) <= BLOCK for q, (_, _, a) in zip(approx, rows, strict=True)]
    for (label, p, a), good, q in zip(rows, ok, approx, strict=True):
        print(f"{label:22s} predicted {p:5d} approximate {q:5d} vllm {a:5d} {'ok' if good else 'MISS'}")
    share = sum(ok) / len(ok)
    mae = sum(abs(p - a) for _, p, a in rows) / len(rows)
    a_mae = sum(abs(q - a) for q, (_, _, a) in zip(approx, rows, strict=True)) / len(rows)
    print(
        f"precise: within one block ({BLOCK} tokens): {sum(ok)}/{len(ok)} = {share:.1%}; MAE {mae:.0f} tokens"
    )
    print(
        f"approximate ({APPROX_BLOCK * CHARS_PER_TOKEN}-character blocks), same sequence: within one block:"
        f" {sum(a_ok)}/{len(a_ok)} = {sum(a_ok) / len(a_ok):.1%}; MAE {a_mae:.0f} tokens"
    )
    assert any(a > 0 for _, _, a in rows) and any(p > 0 for _, p, _ in rows)
    assert share >= 0.95


@pytest.mark.vllm
def test_sidecar_in_precise_mode_logs_the_cached_tokens_vllm_reports(node: Any, tmp_path: Path) -> None:
    """The same through the sidecar (settings, subscriber, chat tokenizer, engine): the logged
    ``cache_index_tokens`` of each step (the index's reading on the chosen replica) against the
    ``cached_tokens`` vLLM answered. The subscriber starts after the first test's traffic, so its
    first batch replays vLLM's buffer from seq 0 (the reset included)."""
    import pandas as pd

    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    n, model, ev = node
    with fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-f") as fr:
        os.environ["RR_TEST_KV_KEY"] = "sk-f"
        s = RouterSettings.load(
            None,
            local={
                "urls": [n.cfg.base_url],
                "model": MODEL,
                "prefix_index_mode": "precise",
                "prefix_tokenizer": str(model),
                "prefix_block_tokens": BLOCK,
                "kv_events_endpoints": [ev.endpoint],
                "kv_events_replay_endpoints": [ev.replay_endpoint],
                "kv_events_topic": ev.topic,
            },
            frontier={"url": fr.base_url, "model": "frontier-model", "api_key_env": "RR_TEST_KV_KEY"},
            policy={"kind": "always-local"},
            runlog={"dir": str(tmp_path / "logs")},
        )
        answered: dict[tuple[str, int], int] = {}
        with serve_in_thread(create_app(s)) as url, httpx.Client(timeout=300) as c:
            time.sleep(1.0)  # the SUB connects

            def step(run: str, messages: list[dict[str, Any]]) -> None:
                r = c.post(
                    url + "/v1/chat/completions",
                    json={"model": "auto", "messages": messages, "max_tokens": 4, "temperature": 0},
                    headers={"X-Run-Id": run},
                )
                assert r.status_code == 200, r.text[:300]
                assert r.headers["x-runroute-tier"] == "local"
                cached_tokens = int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)
                answered[(run, int(r.headers["x-runroute-step"]))] = cached_tokens
                time.sleep(0.5)

            shared = {"role": "system", "content": words("sidecar-shared", 400)}
            for i in range(3):
                msgs = [shared, {"role": "user", "content": f"Ticket {i}: " + words(f"t{i}", 20)}]
                for k in range(3):
                    step(f"sc-{i}", msgs)
                    msgs = msgs + [
                        {"role": "assistant", "content": f"Noted {k}."},
                        {"role": "user", "content": words(f"t{i}-{k}", 30)},
                    ]
            ready = c.get(url + "/ready").json()["prefix_index"]["replicas"]
            print("ready:", ready)
            assert ready["local-0"]["mode"] == "precise"
            assert ready["local-0"]["kv_events"]["replayed"] > 0  # vLLM's buffer before the router started
    df = pd.concat(pd.read_parquet(f) for f in (tmp_path / "logs").glob("runlog-*.parquet"))
    rows = []
    for _, rec in df[df["record"] == "step"].iterrows() if "record" in df else df.iterrows():
        key = (rec["run_id"], int(rec["step"]))
        if key in answered:
            rows.append((key, int(dict(rec["predictions"])["cache_index_tokens"] or 0), answered[key]))
    assert len(rows) == len(answered), (len(rows), len(answered))
    ok = [abs(p - a) <= BLOCK for _, p, a in rows]
    for (key, p, a), good in zip(rows, ok, strict=True):
        print(f"{key[0]}/{key[1]}  index {p:5d}  vllm {a:5d} {'ok' if good else 'MISS'}")
    print(f"sidecar: within one block ({BLOCK} tokens): {sum(ok)}/{len(ok)} = {sum(ok) / len(ok):.1%}")
    assert any(a > 0 for _, _, a in rows)
    assert sum(ok) / len(ok) >= 0.95
