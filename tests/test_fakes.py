"""Fake backends: prefix cache, usage, metrics, streaming, tools, rate limits, failures, launchers."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.fakes import start_fake
from router.fakes.protocol import prompt_tokens, render_prompt, render_segments, tokenize
from router.fakes.server import Ticket

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "parameters": {
                "type": "object",
                "properties": {"verbose": {"type": "boolean"}},
                "required": ["verbose"],
            },
        },
    },
]
SYSTEM = "You are a careful coding agent. Use the tools to inspect and fix the repository. " * 6


async def post(session: aiohttp.ClientSession, url: str, body: dict, **kw) -> tuple[int, dict, dict]:
    async with session.post(url + "/v1/chat/completions", json=body, **kw) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


async def read_sse(session: aiohttp.ClientSession, url: str, body: dict) -> list:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.fixture
async def vllm():
    fake = await start_fake("vllm", zero_latency=True, model="m-local", name="local-0")
    yield fake
    await fake.stop()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


# --- tokeniser and template ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=" \n\tab<|>{}", max_size=80), st.text(alphabet=" \nab<|>", max_size=40))
def test_tokenizer_is_prefix_stable(a: str, b: str) -> None:
    ta, tb = tokenize(a), tokenize(a + b)
    assert "".join(ta) == a  # lossless
    assert tb[: max(0, len(ta) - 1)] == ta[: max(0, len(ta) - 1)]


def test_later_step_prompt_extends_earlier_prompt() -> None:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix foo"}]
    p1 = render_prompt(msgs, TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a.py"}'}}
    msgs2 = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "print('x')"},
    ]
    p2 = render_prompt(msgs2, TOOLS)
    assert p2.startswith(p1) and len(tokenize(p2)) > len(tokenize(p1))
    t1, t2 = prompt_tokens(render_segments(msgs, TOOLS)), prompt_tokens(render_segments(msgs2, TOOLS))
    assert t2[: len(t1) - 1] == t1[:-1]  # all but the generation prompt's last token carry over
    assert '"arguments":"{\\"path\\":\\"a.py\\"}"' in p2


# --- vLLM fake over HTTP ------------------------------------------------------------------------


async def test_cache_hits_grow_over_a_multi_turn_run_in_whole_blocks(vllm, session) -> None:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the tests fail, fix them"}]
    seen: list[list[str]] = []
    cached_seq = []
    for step in range(6):
        body = {"model": "m-local", "messages": msgs, "tools": TOOLS, "max_tokens": 64}
        status, resp, headers = await post(session, vllm.url, body)
        assert status == 200 and headers["x-fake-backend"] == "vllm-fake/local-0"
        assert resp["model"] == "m-local"
        u = resp["usage"]
        toks = prompt_tokens(render_segments(msgs, TOOLS))
        n = len(toks)
        assert u["prompt_tokens"] == n and u["total_tokens"] == n + u["completion_tokens"]
        # expected hit: longest common full-block prefix with any earlier prompt, last token recomputed
        best = 0
        for prev in seen:
            common = 0
            for x, y in zip(prev, toks, strict=False):
                if x != y:
                    break
                common += 1
            best = max(best, common // 32)
        expected = min(best, (n - 1) // 32) * 32
        details = u["prompt_tokens_details"]
        assert details["cached_tokens"] == expected
        assert details["created_cache_tokens"] == (n // 32) * 32 - expected
        cached_seq.append(expected)
        seen.append(toks)
        msg = resp["choices"][0]["message"]
        assert resp["choices"][0]["finish_reason"] == "tool_calls"
        msgs = msgs + [
            {"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]},
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"result {step} " * 40},
        ]
    assert cached_seq[0] == 0 and all(b > a for a, b in zip(cached_seq[1:], cached_seq[2:], strict=False))
    assert cached_seq[-1] > 0 and all(c % 32 == 0 for c in cached_seq)


async def test_identical_prompt_reports_all_but_last_block(session) -> None:
    fake = await start_fake("vllm", zero_latency=True, block_size=16)
    try:
        content = "w"
        while len(prompt_tokens(render_segments([{"role": "user", "content": content}]))) % 16:
            content += " ab"
        body = {"messages": [{"role": "user", "content": content}]}
        n = len(prompt_tokens(render_segments(body["messages"])))
        _, first, _ = await post(session, fake.url, body)
        _, second, _ = await post(session, fake.url, body)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == ((n - 1) // 16) * 16 == n - 16
    finally:
        await fake.stop()


async def test_lru_eviction_under_small_capacity(session) -> None:
    # prompts of 8 full blocks (+1 for the partial block and output); room for two runs' blocks only
    fake = await start_fake("vllm", zero_latency=True, capacity_blocks=20, block_size=32, max_tokens_cap=4)

    def body(tag: str) -> dict:
        text = " ".join(f"{tag}{i}" for i in range(250))
        return {"messages": [{"role": "user", "content": text}], "max_tokens": 2}

    async def cached(tag: str) -> int:
        status, r, _ = await post(session, fake.url, body(tag))
        assert status == 200
        return r["usage"]["prompt_tokens_details"]["cached_tokens"]

    try:
        full = await cached("a")
        assert full == 0
        assert await cached("b") == 0
        hit_a = await cached("a")  # refreshes a; b is now the least recently used
        assert hit_a == 8 * 32
        assert await cached("c") == 0  # needs 9 blocks: evicts 5 of b's, tail blocks first
        assert fake.server.cache.evictions == 5
        assert await cached("a") == hit_a  # a survived
        assert await cached("b") == 3 * 32  # b kept only its first 3 blocks
    finally:
        await fake.stop()


async def test_metrics_names_and_consistency_with_usage(vllm, session) -> None:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
    total_prompt = total_cached = total_out = 0
    for _ in range(3):
        _, r, _ = await post(session, vllm.url, {"messages": msgs})
        total_prompt += r["usage"]["prompt_tokens"]
        total_cached += r["usage"]["prompt_tokens_details"]["cached_tokens"]
        total_out += r["usage"]["completion_tokens"]
        msgs = msgs + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
        msgs.append({"role": "user", "content": "continue"})
    async with session.get(vllm.url + "/metrics") as resp:
        assert resp.status == 200 and resp.headers["x-fake-backend"] == "vllm-fake/local-0"
        text = await resp.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'^(vllm:[a-z0-9_]+)\{engine="0",model_name="m-local"\} (\S+)$', line)
        if m:
            values[m.group(1)] = float(m.group(2))
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_cached_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ):
        assert name in values, name
    assert total_cached > 0
    assert values["vllm:prompt_tokens_cached_total"] == total_cached == values["vllm:prefix_cache_hits_total"]
    assert values["vllm:prefix_cache_queries_total"] == total_prompt
    assert values["vllm:generation_tokens_total"] == total_out
    assert values["vllm:time_to_first_token_seconds_count"] == 3
    assert values["vllm:num_requests_running"] == 0 and 0.0 <= values["vllm:kv_cache_usage_perc"] <= 1.0
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    async with session.get(vllm.url + "/load") as resp:
        assert await resp.json() == {"server_load": 0}
    async with session.get(vllm.url + "/v1/models") as resp:
        card = (await resp.json())["data"][0]
        assert card["id"] == "m-local" and card["max_model_len"] == 32768
    async with session.get(vllm.url + "/health") as resp:
        assert resp.status == 200


async def test_streaming_usage_chunk_matches_non_streaming(vllm, session) -> None:
    body = {"messages": [{"role": "user", "content": "stream please"}], "max_tokens": 12, "seed": 7}
    _, plain, _ = await post(session, vllm.url, body)
    chunks = await read_sse(
        session, vllm.url, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-1]["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["model"] == "m-local" and c["object"] == "chat.completion.chunk" for c in chunks)
    no_usage = await read_sse(session, vllm.url, {**body, "stream": True})
    assert all("usage" not in c or c["usage"] is None for c in no_usage) and no_usage[-1]["choices"]


async def test_tools_and_json_mode_with_the_openai_sdk(vllm) -> None:
    import openai  # a dev dependency: a missing one is a failure, not a skip

    client = openai.AsyncOpenAI(base_url=vllm.base_url, api_key="unused", max_retries=0)
    try:
        msgs = [{"role": "user", "content": "read a.py"}]
        r = await client.chat.completions.create(model="m-local", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name in ("read_file", "run_tests")
        args = json.loads(call.function.arguments)
        required = next(t for t in TOOLS if t["function"]["name"] == call.function.name)["function"][
            "parameters"
        ]
        assert set(required["required"]) <= set(args)
        named = {"type": "function", "function": {"name": "run_tests"}}
        r = await client.chat.completions.create(
            model="m-local", messages=msgs, tools=TOOLS, tool_choice=named
        )
        assert r.choices[0].message.tool_calls[0].function.name == "run_tests"
        assert isinstance(json.loads(r.choices[0].message.tool_calls[0].function.arguments)["verbose"], bool)
        r = await client.chat.completions.create(
            model="m-local", messages=msgs, tools=TOOLS, tool_choice="none"
        )
        assert not r.choices[0].message.tool_calls and r.choices[0].message.content
        # streamed tool call: header then argument pieces that concatenate to valid JSON
        stream = await client.chat.completions.create(
            model="m-local", messages=msgs, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        name, arg_text, usage = None, "", None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    name = tc.function.name or name
                    arg_text += tc.function.arguments or ""
        assert name in ("read_file", "run_tests") and isinstance(json.loads(arg_text), dict)
        assert usage is not None and usage.prompt_tokens_details.cached_tokens >= 0
        r = await client.chat.completions.create(
            model="m-local", messages=msgs, response_format={"type": "json_object"}
        )
        assert isinstance(json.loads(r.choices[0].message.content), dict)
        schema = {
            "type": "object",
            "properties": {"verdict": {"enum": ["pass", "fail"]}},
            "required": ["verdict"],
        }
        r = await client.chat.completions.create(
            model="m-local",
            messages=msgs,
            response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
        )
        assert json.loads(r.choices[0].message.content)["verdict"] in ("pass", "fail")
    finally:
        await client.close()


async def test_bad_requests_get_openai_errors(vllm, session) -> None:
    async with session.post(vllm.url + "/v1/chat/completions", data=b"{nope") as r:
        assert r.status == 400 and "error" in await r.json()
    status, body, _ = await post(session, vllm.url, {"messages": []})
    assert status == 400 and body["error"]["code"] == 400
    status, body, headers = await post(
        session, vllm.url, {"model": "other", "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 404 and "does not exist" in body["error"]["message"] and headers["x-fake-backend"]
    big = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 40000}
    status, body, _ = await post(session, vllm.url, big)
    assert status == 400 and body["error"]["param"] == "max_tokens"  # vLLM 0.32's check and wording
    assert "cannot be greater than max_model_len=32768" in body["error"]["message"]
    status, body, _ = await post(session, vllm.url, {"messages": [{"role": "robot", "content": "x"}]})
    assert status == 400
    assert vllm.server.stats.bad_requests == 5


async def test_queue_and_latency_model(session) -> None:
    fake = await start_fake(
        "vllm",
        max_concurrency=1,
        base_ms=0,
        prefill_ms_per_token=0.3,
        decode_ms_per_token=15,
        default_tokens=4,
    )
    try:
        body = {"messages": [{"role": "user", "content": "tell me more " * 60}]}
        tasks = [asyncio.ensure_future(post(session, fake.url, body)) for _ in range(3)]
        waited = 0
        for _ in range(100):
            await asyncio.sleep(0.01)
            async with session.get(fake.url + "/metrics") as r:
                text = await r.text()
            if 'vllm:num_requests_waiting{engine="0",model_name="fake-vllm-model"} 2.0' in text:
                waited += 1
                break
        results = await asyncio.gather(*tasks)
        assert waited and all(s == 200 for s, _, _ in results)
        assert fake.server.h_queue.count == 3 and fake.server.h_queue.sum > 0.05
        # prefill is charged on uncached tokens only: the latency model gives a warm prompt (its
        # prefix cached by the first request) a shorter time to first token than a cold one
        fake.server.update(max_concurrency=4, decode_ms_per_token=0)
        cold_body = {"messages": [{"role": "user", "content": "another long prompt " * 80}]}
        _, first, _ = await post(session, fake.url, cold_body)
        _, second, _ = await post(session, fake.url, cold_body)
        n = first["usage"]["prompt_tokens"]
        hit = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and hit > n // 2
        cold = fake.server.ttft_s(Ticket(arrived=0.0, prompt_tokens=n, cached_tokens=0))
        warm = fake.server.ttft_s(Ticket(arrived=0.0, prompt_tokens=n, cached_tokens=hit))
        assert cold == pytest.approx(0.3e-3 * n) and warm == pytest.approx(0.3e-3 * (n - hit))
    finally:
        await fake.stop()


async def test_client_disconnect_cancels_and_frees_blocks(session) -> None:
    fake = await start_fake(
        "vllm", base_ms=0, prefill_ms_per_token=0, decode_ms_per_token=50, default_tokens=40
    )
    try:
        body = {"messages": [{"role": "user", "content": "long answer " * 50}], "stream": True}
        async with session.post(fake.url + "/v1/chat/completions", json=body) as r:
            await r.content.readuntil(b"\n\n")
            assert fake.server.running == 1 and fake.server.cache.pinned > 0
        for _ in range(100):
            if fake.server.running == 0:
                break
            await asyncio.sleep(0.01)
        assert fake.server.stats.cancelled == 1 and fake.server.cache.pinned == 0
    finally:
        await fake.stop()


# --- failure injection and frontier --------------------------------------------------------------
