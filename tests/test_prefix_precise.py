"""Precise mode of the prefix index (router.core.prefix_precise, router.server.state.kv_events): token
chains, applying vLLM KV events, sequence gaps / replay / restart, the fallback to approximate,
and a real ZMQ publisher emitting vLLM's wire format (multipart [topic, seq, msgpack batch])."""

from __future__ import annotations

import asyncio
import hashlib

import msgpack
import pytest

from router.core.prefix_index import PrefixIndex, ReplicaIndex
from router.core.prefix_precise import PreciseReplicaIndex, TokenChainer, TokenRunChain, token_block_ids
from router.server.state.kv_events import (
    KvEventFeed,
    KvEventsConfig,
    KvEventSubscriber,
    ReplicaEvents,
    decode_batch,
)

BS = 4


def vhash(parent: bytes | None, toks: list[int]) -> bytes:
    """A stand-in for vLLM's block hash (sha256 of parent + tokens): opaque to the index."""
    return hashlib.sha256((parent or b"") + bytes(str(toks), "ascii")).digest()


def stored(
    tokens: list[int], parent: bytes | None = None, bs: int = BS, **kw: object
) -> tuple[list, list[bytes]]:
    """A BlockStored event, array-encoded in vLLM's field order, for the full blocks of ``tokens``."""
    hashes, p = [], parent
    for i in range(0, len(tokens) - len(tokens) % bs, bs):
        p = vhash(p, tokens[i : i + bs])
        hashes.append(p)
    nb = len(hashes)
    ev = [
        "BlockStored",
        hashes,
        parent,
        tokens[: nb * bs],
        bs,
        None,
        kw.get("medium", "GPU"),
        kw.get("lora_name"),
    ]
    if "extra_keys" in kw:
        ev.append(kw["extra_keys"])
    return ev, hashes


_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def batch(*events: list, array_events: bool = False) -> bytes:
    """vLLM 0.32's layout: the batch array-like [ts, events, dp_rank], each event a tagged map
    ({"type": tag, field: value}, defaults omitted); ``array_events``: events as arrays too (the
    other msgspec encoding, also read)."""
    if array_events:
        return msgpack.packb([1.0, list(events), 0])
    evs = [{"type": e[0], **dict(zip(_FIELDS[e[0]], e[1:], strict=False))} for e in events]
    return msgpack.packb([1.0, evs, 0])


def removed(hashes: list[bytes]) -> list:
    return ["BlockRemoved", hashes, "GPU"]


CLEARED = ["AllBlocksCleared"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def precise_index() -> tuple[PrefixIndex, KvEventFeed, Clock]:
    idx = PrefixIndex(BS, [("r0", 100), ("r1", 100)])
    clock = Clock()
    return idx, KvEventFeed(idx, "r0", clock=clock), clock


def test_token_chainer_incremental_matches_full_and_resets_on_edit() -> None:
    tc = TokenChainer(BS)
    rc = TokenRunChain()
    toks = list(range(1, 11))  # 2 full blocks + 2
    assert tc.extend(rc, toks) == token_block_ids(toks, BS)
    assert len(rc.chain) == 2
    grown = toks + [50, 51, 52, 53, 54]
    assert tc.extend(rc, grown) == token_block_ids(grown, BS)
    assert len(rc.chain) == 3
    edited = [9] + grown[1:]
    chain = list(tc.extend(rc, edited))
    assert chain == token_block_ids(edited, BS)
    assert chain[0] != token_block_ids(grown, BS)[0]


def test_stored_removed_cleared_change_the_match() -> None:
    idx, feed, _ = precise_index()
    toks = list(range(100, 112))  # 3 blocks
    chain = token_block_ids(toks, BS)
    assert idx.match("r0", chain, 3) == 0
    ev, hashes = stored(toks)
    assert feed.on_message(0, batch(ev)) == "applied"
    assert idx.modes() == {"r0": "precise", "r1": "approximate"}
    assert idx.match("r0", chain, 3) == 3
    # a second event chains on the first's last vLLM hash (parent_block_hash)
    more = list(range(200, 204))
    ev2, h2 = stored(more, parent=hashes[-1])
    feed.on_message(1, batch(ev2))
    chain2 = token_block_ids(toks + more, BS)
    assert idx.match("r0", chain2, 4) == 4
    # removal of a middle block: the match stops there (not prefix-closed, no LRU guess)
    feed.on_message(2, batch(removed([hashes[1]])))
    assert idx.match("r0", chain2, 4) == 1
    feed.on_message(3, batch(CLEARED))
    assert idx.match("r0", chain2, 4) == 0
    assert len(idx.replicas["r0"]) == 0


def test_records_do_not_fill_a_precise_replica_and_array_events_read() -> None:
    idx, feed, _ = precise_index()
    toks = list(range(8))
    feed.on_message(0, batch(stored(toks)[0], array_events=True))
    chain = token_block_ids(toks + [8, 9, 10, 11], BS)
    assert idx.match("r0", chain, 3) == 2
    idx.record("r0", chain)  # sent there: the events, not the router, say what it holds
    assert idx.match("r0", chain, 3) == 2
    idx.record("r1", chain)  # the approximate replica assumes it holds it
    assert idx.match("r1", chain, 3) == 3


def test_unknown_parent_lora_and_extra_keys_are_not_keyed_and_refcounts() -> None:
    idx, feed, _ = precise_index()
    r = idx.set_precise("r0")
    toks = list(range(8))
    ev, _ = stored(toks, parent=b"never-seen")
    feed.on_message(0, batch(ev))
    assert len(r) == 0 and r.unkeyed == 2
    feed.on_message(1, batch(stored(toks, lora_name="adapter")[0]))
    assert len(r) == 0
    feed.on_message(2, batch(stored(toks, extra_keys=[None, ("salt",)])[0]))
    assert len(r) == 1  # the first block is plain, the second carries a cache salt
    feed.on_message(3, batch(CLEARED))
    ev, hashes = stored(toks)
    feed.on_message(4, batch(ev, ev))  # the same blocks stored twice (two requests at once)
    feed.on_message(5, batch(removed(hashes)))
    assert idx.match("r0", token_block_ids(toks, BS), 2) == 2
    feed.on_message(6, batch(removed(hashes)))
    assert idx.match("r0", token_block_ids(toks, BS), 2) == 0


def test_gap_without_replay_clears_and_restart_clears() -> None:
    idx, feed, _ = precise_index()
    a, b = list(range(8)), list(range(50, 58))
    feed.on_message(0, batch(stored(a)[0]))
    assert feed.on_message(5, batch(stored(b)[0])) == "resync"  # seq 1-4 lost
    assert feed.gaps == 1 and feed.resyncs == 1
    assert idx.match("r0", token_block_ids(a, BS), 2) == 0  # cleared: a's blocks unknown now
    assert idx.match("r0", token_block_ids(b, BS), 2) == 2  # the batch that revealed the gap
    assert feed.on_message(0, batch(stored(a)[0])) == "restart"
    assert idx.match("r0", token_block_ids(b, BS), 2) == 0
    assert idx.match("r0", token_block_ids(a, BS), 2) == 2


def test_gap_with_replay_recovers_the_missed_batches() -> None:
    idx, feed, _ = precise_index()
    a, b, c = list(range(8)), list(range(50, 58)), list(range(90, 94))
    buf = {0: batch(stored(a)[0]), 1: batch(stored(b)[0]), 2: batch(stored(c)[0])}
    feed.replay = lambda start: [(s, p) for s, p in buf.items() if s >= start]
    feed.on_message(0, buf[0])
    assert feed.on_message(2, buf[2]) == "replayed"
    assert feed.replayed == 1 and feed.resyncs == 0
    for toks in (a, b, c):
        assert idx.match("r0", token_block_ids(toks, BS), 2) == len(toks) // BS
    # the first batch after a start takes the buffer's contiguous tail
    idx2 = PrefixIndex(BS, [("r0", 100)])
    late = KvEventFeed(idx2, "r0", replay=lambda start: [(s, p) for s, p in buf.items() if s >= 1])
    assert late.on_message(3, batch(stored(list(range(30, 34)))[0])) == "replayed"
    assert idx2.match("r0", token_block_ids(b, BS), 2) == 2 and late.replayed == 2
    # a buffer that no longer reaches back: cleared
    feed.replay = lambda start: [(9, buf[2])]
    assert feed.on_message(8, buf[1]) == "resync"
    assert idx.match("r0", token_block_ids(a, BS), 2) == 0


def test_silence_with_traffic_falls_back_and_events_bring_precise_back() -> None:
    idx, feed, clock = precise_index()
    toks = list(range(8))
    chain = token_block_ids(toks, BS)
    feed.on_message(0, batch(stored(toks)[0]))
    feed.check(5.0)
    clock.t += 60  # idle without traffic: stays precise
    feed.check(5.0)
    assert feed.mode == "precise"
    idx.record("r0", chain)
    feed.check(5.0)
    clock.t += 6
    feed.check(5.0)
    assert feed.mode == "approximate" and feed.reason == "silent" and feed.fallbacks == 1
    assert isinstance(idx.replicas["r0"], ReplicaIndex)
    feed.on_message(1, batch(stored(toks)[0]))
    assert feed.mode == "precise"
    assert idx.match("r0", chain, 2) == 2


def test_block_size_mismatch_is_not_keyed() -> None:
    idx, feed, _ = precise_index()
    feed.on_message(0, batch(stored(list(range(16)), bs=8)[0]))
    r = idx.replicas["r0"]
    assert isinstance(r, PreciseReplicaIndex) and len(r) == 0 and r.unkeyed == 2


def test_decode_batch_reads_int_hashes() -> None:
    payload = msgpack.packb(
        [2.5, [["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU"], ["BlockRemoved", [11]]], None]
    )
    ts, events, rank = decode_batch(payload)
    assert ts == 2.5 and rank is None
    assert events[0][0] == "BlockStored" and events[0][1][:4] == [[11, 12], None, list(range(8)), 4]
    assert events[1] == ("BlockRemoved", [[11], None, None])


def test_real_zmq_publisher_store_gap_replay_and_subscriber_state() -> None:
    zmq = pytest.importorskip("zmq")

    async def main() -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        router = ctx.socket(zmq.ROUTER)
        rport = router.bind_to_random_port("tcp://127.0.0.1")
        buf: list[tuple[int, bytes]] = []
        idx = PrefixIndex(BS, [("r0", 100), ("r1", 100)])
        cfg = KvEventsConfig(
            {"r0": ReplicaEvents(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv")}, silence_s=30
        )
        sub = KvEventSubscriber(idx, cfg)
        sub.start()

        def publish(seq: int, payload: bytes, send: bool = True) -> None:
            buf.append((seq, payload))
            if send:
                pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

        async def serve_replay() -> None:  # vLLM 0.32's ROUTER replay: batches from seq on, then -1
            while True:
                if router.poll(0):
                    ident, _, start = router.recv_multipart()
                    s0 = int.from_bytes(start, "big")
                    for s, p in buf:
                        if s >= s0:
                            router.send_multipart([ident, b"", b"kv", s.to_bytes(8, "big"), p])
                    router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
                await asyncio.sleep(0.005)

        rt = asyncio.get_running_loop().create_task(serve_replay())
        a, b, c = list(range(8)), list(range(40, 48)), list(range(70, 74))
        try:
            # the slow-joiner: publish until the subscriber has the first batch
            for _ in range(200):
                pub.send_multipart([b"kv", (0).to_bytes(8, "big"), batch(stored(a)[0])])
                await asyncio.sleep(0.02)
                if idx.match("r0", token_block_ids(a, BS), 2) == 2:
                    break
            buf.append((0, batch(stored(a)[0])))
            assert idx.modes()["r0"] == "precise"
            resyncs = sub.feeds["r0"].resyncs  # a repeated seq 0 reads as a restart
            publish(1, batch(stored(b)[0]), send=False)  # dropped on the way: a gap
            publish(2, batch(stored(c)[0]))
            for _ in range(200):
                await asyncio.sleep(0.02)
                if idx.match("r0", token_block_ids(c, BS), 1) == 1:
                    break
            assert idx.match("r0", token_block_ids(b, BS), 2) == 2  # recovered by the replay socket
            st = sub.state()
            assert st["r0"]["gaps"] == 1 and st["r0"]["replayed"] == 1 and st["r0"]["resyncs"] == resyncs
            assert st["r1"] == {"mode": "approximate", "reason": "no kv_events_endpoint"}
        finally:
            rt.cancel()
            await sub.stop()
            pub.close(0)
            router.close(0)
            ctx.term()

    asyncio.run(asyncio.wait_for(main(), 30))


def _tokenizer_dir(tmp_path):  # type: ignore[no-untyped-def]
    """A tiny byte-level BPE tokenizer and the test model's chat template (tokenizer.json +
    tokenizer_config.json, the files the sidecar reads)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from router.localnode.testmodel import BOS, CHAT_TEMPLATE, EOS, SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["You are a helpful agent. Read the file and fix the bug."] * 50, trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": {"content": EOS}, "chat_template": CHAT_TEMPLATE})
    )
    return tmp_path


def test_chat_tokenizer_renders_the_template_and_chains_share_a_system_prompt(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from router.core.prefix_index import RunChain
    from router.server.protocols.chat import MessageSegments
    from router.server.protocols.chat_tokens import ChatTokenChainer, ChatTokenizer

    ct = ChatTokenizer(_tokenizer_dir(tmp_path))
    sys_msg = {"role": "system", "content": "You are a helpful agent. " * 20}
    msgs = [sys_msg, {"role": "user", "content": [{"type": "text", "text": "Read the file."}]}]
    text = ct.render(msgs)
    assert text == (
        "<|begin_of_text|><|im_start|>system\n" + sys_msg["content"] + "<|im_end|>\n"
        "<|im_start|>user\nRead the file.<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = ct.encode(msgs)
    assert ids[0] == ct.tokenizer.token_to_id("<|begin_of_text|>")  # the template's, none added
    assert ids.count(ids[0]) == 1
    tc = ChatTokenChainer(ct, BS)
    a, b = RunChain(), RunChain()
    ca = list(tc.extend(a, MessageSegments({"messages": msgs})))
    assert ca == token_block_ids(ids[:-1], BS)  # the prompt but its last token (vLLM recomputes it)
    other = [sys_msg, {"role": "user", "content": "Fix the bug."}]
    cb = list(tc.extend(b, MessageSegments({"messages": other})))
    shared = len(ct.encode([sys_msg])) // BS - 2  # the system prompt's blocks, less the generation prompt's
    assert shared > 5 and ca[:shared] == cb[:shared] and ca != cb
    grown = msgs + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Next."}]
    cg = tc.extend(a, MessageSegments({"messages": grown}))
    assert cg[: len(ca)] == ca and len(cg) > len(ca)
    assert cg == token_block_ids(ct.encode(grown)[:-1], BS)


def test_sidecar_precise_mode_ready_metric_and_placement(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sidecar in precise mode: replica 1 publishes KV events (a real ZMQ PUB here), replica 0
    has no endpoint (a tie would go to it); /ready and /metrics say which mode each is in, and a step whose prompt blocks
    replica 1 reported stored is placed there by the prefix-aware policy."""
    import os
    import time

    import httpx
    import zmq

    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread
    from router.server.protocols.chat import prompt_tokens
    from router.server.protocols.chat_tokens import ChatTokenizer
    from router.server.settings import RouterSettings

    tok_dir = _tokenizer_dir(tmp_path)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.2)
    # words the tokenizer never saw: more tokens than the sidecar's characters / 4 estimate, so a
    # cap from the estimate would cut the prediction
    system = "You are a helpful agent. " + " ".join(f"zq{i}x{i * 7 % 13}" for i in range(300))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Read the file."}]
    ids = ChatTokenizer(tok_dir).encode(msgs)
    try:
        with (
            fake_in_thread("vllm", name="v0", **knobs) as v0,
            fake_in_thread("vllm", name="v1", **knobs) as v1,
            fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-f") as fr,
        ):
            os.environ["RR_TEST_PRECISE_KEY"] = "sk-f"
            s = RouterSettings.load(
                None,
                local={
                    "urls": [v0.url, v1.url],
                    "model": "local-model",
                    "prefix_index_mode": "precise",
                    "prefix_tokenizer": str(tok_dir),
                    "prefix_block_tokens": BS,
                    "kv_events_endpoints": [None, f"tcp://127.0.0.1:{port}"],
                },
                frontier={
                    "url": fr.base_url,
                    "model": "frontier-model",
                    "api_key_env": "RR_TEST_PRECISE_KEY",
                },
                policy={"kind": "prefix-aware"},
                scrape={"interval_s": 0.2},
                runlog={"dir": str(tmp_path / "logs")},
            )
            with serve_in_thread(create_app(s)) as url, httpx.Client(timeout=30) as c:
                ready = c.get(url + "/ready").json()["prefix_index"]["replicas"]
                assert (
                    ready["local-1"]["mode"] == "approximate"
                    and ready["local-1"]["reason"] == "no events yet"
                )
                assert ready["local-0"]["reason"] == "no kv_events_endpoint"
                ev, _ = stored(ids[:-1])
                for _ in range(250):  # the slow joiner: until the subscriber has it
                    pub.send_multipart([b"", (0).to_bytes(8, "big"), batch(ev)])
                    time.sleep(0.02)
                    ready = c.get(url + "/ready").json()["prefix_index"]["replicas"]
                    if ready["local-1"]["blocks"] > 0:
                        break
                assert ready["local-1"]["mode"] == "precise" and ready["local-1"]["reason"] == "kv events"
                assert ready["local-1"]["blocks"] == (len(ids) - 1) // BS
                assert ready["local-0"]["mode"] == "approximate"
                metrics = c.get(url + "/metrics").text
                assert 'runroute_prefix_index_mode{mode="precise",replica="local-1"} 1.0' in metrics
                assert 'runroute_prefix_index_mode{mode="approximate",replica="local-0"} 1.0' in metrics
                body = {"model": "auto", "messages": msgs, "max_tokens": 4}
                r = c.post(url + "/v1/chat/completions", json=body, headers={"X-Run-Id": "precise-0"})
                assert r.status_code == 200, r.text
                assert r.headers["x-runroute-replica"] == "local-1"
            blocks = (len(ids) - 1) // BS
            assert (prompt_tokens(msgs, previous_total=None, tools_chars=0) - 1) // BS < blocks
            import pandas as pd

            df = pd.concat(pd.read_parquet(f) for f in (tmp_path / "logs").glob("runlog-*.parquet"))
            rec = df[df["run_id"] == "precise-0"].iloc[0]
            # the index's reading on the chosen replica: every block the events stored
            assert dict(rec["predictions"])["cache_index_tokens"] == blocks * BS
    finally:
        pub.close(0)
        ctx.term()


def test_incremental_encoding_equals_a_full_encode_as_a_run_grows_or_is_edited(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from router.server.protocols.chat_tokens import ChatTokenizer

    ct = ChatTokenizer(_tokenizer_dir(tmp_path))
    assert ct.split_safe
    msgs: list[dict[str, object]] = [{"role": "system", "content": "You are a helpful agent. " * 5}]
    state = None
    reused = 0
    for k in range(6):
        msgs.append({"role": "user", "content": f"Read the file {k} and fix the bug  {k * 37}."})
        ids, new_state = ct.encode_run(state, msgs)
        assert ids == ct.encode(msgs), k
        if state is not None:
            reused += 1
            assert new_state is not None and new_state[0] > state[0]  # the cut moved forward
        state = new_state
        msgs.append({"role": "assistant", "content": f"Done {k}. "})
    assert reused == 5
    edited = [{"role": "system", "content": "Another system prompt."}] + msgs[1:]
    ids, _ = ct.encode_run(state, edited)  # the text no longer starts with the kept one: full encode
    assert ids == ct.encode(edited)
