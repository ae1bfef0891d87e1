"""Conformance of the fake vLLM (router.fakes.vllm) with a real vLLM (CPU) server.

The same requests go to both; responses must carry the same fields (compared as sets of key
paths, so values that differ by nature, such as generated text, ids and token counts, are free),
``usage.prompt_tokens_details.cached_tokens`` must follow the same block arithmetic, and
``/metrics`` must expose every metric name the router reads, parsable by the router's scraper.
Each failure message lists the key paths only the real server has and only the fake has.
Marked ``vllm``; run with ``make test-vllm``.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.localnode.launch import LocalNode, LocalNodeConfig, LocalNodeError, find_vllm_python, project_root
from router.server.metrics.parse import VLLM_METRIC_NAMES, parse_prometheus_text, read_vllm_metrics

pytestmark = pytest.mark.vllm

MODEL = "local"
BLOCK = 32
MAX_LEN = 8192


def _unavailable(reason: str) -> None:
    if os.environ.get("RUNROUTE_VLLM_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"real": url, "fake": url}: one vLLM replica and one fake with the same model name and sizes."""
    try:
        python = find_vllm_python()
    except LocalNodeError as e:
        _unavailable(f"vllm not importable: {e}")
    model = Path(os.environ.get("RUNROUTE_VLLM_TEST_MODEL") or project_root() / ".runroute" / "test-model")
    if not (model / "config.json").is_file():
        _unavailable(
            f"test model absent at {model}: run `make test-vllm` (or runroute make-test-model {model})"
        )
    from router.fakes.launch import fake_in_thread

    cfg = LocalNodeConfig(
        model=str(model),
        port=_free_port(),
        served_model_name=MODEL,
        python=python,
        block_size=BLOCK,
        max_model_len=MAX_LEN,
        state_dir=str(tmp_path_factory.mktemp("vllm-conf")),
        health_timeout_s=240,
    )
    knobs = {"model": MODEL, "zero_latency": True, "block_size": BLOCK, "max_model_len": MAX_LEN}
    with LocalNode(cfg) as node, fake_in_thread("vllm", **knobs) as fake:
        yield {"real": node.base_url, "fake": fake.url}


def paths(obj: Any, prefix: str = "") -> set[str]:
    """Key paths of a JSON value: ``a.b``; list elements merge under ``a[]``."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= paths(v, p)
    elif isinstance(obj, list):
        for v in obj:
            out |= paths(v, prefix + "[]")
    return out


def same_fields(real: Any, fake: Any, what: str) -> None:
    r, f = paths(real), paths(fake)
    assert r == f, f"{what}: only real vLLM has {sorted(r - f)}; only the fake has {sorted(f - r)}"


def messages(tag: str, words: int = 300) -> list[dict[str, Any]]:
    body = " ".join(f"conformance{i % 53} probe" for i in range(words))
    return [
        {"role": "system", "content": f"{tag} {body}"},
        {"role": "user", "content": "Summarise the task."},
    ]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def stream(url: str, body: dict[str, Any]) -> list[Any]:
    """The SSE data payloads of a streamed completion, JSON-decoded ("[DONE]" kept as a string)."""
    out: list[Any] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()[:300]
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def both(servers: dict[str, str], fn: Any, *args: Any) -> dict[str, Any]:
    return {name: fn(url, *args) for name, url in servers.items()}


def test_chat_completion_fields_match(servers: dict[str, str]) -> None:
    body = {"model": MODEL, "messages": messages(uuid.uuid4().hex), "max_tokens": 8, "temperature": 0}
    got = both(servers, post, body)
    assert {k: r.status_code for k, r in got.items()} == {"real": 200, "fake": 200}
    real, fake = got["real"].json(), got["fake"].json()
    for resp in (real, fake):
        usage = resp["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
        assert resp["choices"][0]["message"]["role"] == "assistant"
    same_fields(real["usage"], fake["usage"], "usage")
    same_fields(real["choices"][0]["message"], fake["choices"][0]["message"], "choices[0].message")
    same_fields(real, fake, "chat.completion")


def test_streaming_chunks_and_usage_match(servers: dict[str, str]) -> None:
    body = {
        "model": MODEL,
        "messages": messages(uuid.uuid4().hex),
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = both(servers, stream, body)
    for name, events in got.items():
        assert events[-1] == "[DONE]", name
        usage_chunk = events[-2]
        assert usage_chunk["choices"] == [], name
        assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, name
        assert all(e["object"] == "chat.completion.chunk" for e in events[:-1]), name
    real, fake = got["real"], got["fake"]
    same_fields(real[0], fake[0], "first chunk")
    same_fields(real[-2], fake[-2], "usage chunk")
    same_fields(real[-3], fake[-3], "finishing chunk")
    mids_r = set().union(*(paths(e) for e in real[1:-3]))
    mids_f = set().union(*(paths(e) for e in fake[1:-3]))
    assert mids_r == mids_f, (
        f"content chunks: only real {sorted(mids_r - mids_f)}; only fake {sorted(mids_f - mids_r)}"
    )


def test_tool_call_stream_structure_matches(servers: dict[str, str]) -> None:
    """tool_choice=required: the first tool-call delta names the function the same way on both."""
    body = {
        "model": MODEL,
        "messages": messages(uuid.uuid4().hex, 100),
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = both(servers, stream, body)
    first_call = {}
    for name, events in got.items():
        deltas = [e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("tool_calls")]
        assert deltas, f"{name}: no tool_calls delta"
        call = deltas[0]["choices"][0]["delta"]["tool_calls"][0]
        assert call["index"] == 0 and call["type"] == "function" and isinstance(call["id"], str), name
        assert call["function"]["name"] == "read_file", name
        first_call[name] = deltas[0]
    same_fields(first_call["real"], first_call["fake"], "first tool-call delta")


def test_logprobs_fields_match(servers: dict[str, str]) -> None:
    """``logprobs: true``: the JSON answer's ``choices[0].logprobs`` and each streamed content
    chunk's carry the same fields (content[].token/logprob/bytes/top_logprobs[]); the role chunk's is
    null on both (the sidecar's local.request_logprobs reads and strips these)."""
    body = {
        "model": MODEL,
        "messages": messages(uuid.uuid4().hex),
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    got = both(servers, post, body)
    lp = {k: r.json()["choices"][0]["logprobs"] for k, r in got.items()}
    assert all(v["content"] for v in lp.values()), lp
    same_fields(lp["real"], lp["fake"], "choices[0].logprobs")
    events = both(servers, stream, {**body, "stream": True, "stream_options": {"include_usage": True}})
    mids: dict[str, set[str]] = {}
    for name, evs in events.items():
        assert evs[0]["choices"][0]["logprobs"] is None, name
        content = [e for e in evs[1:-2] if e["choices"] and e["choices"][0]["delta"].get("content")]
        assert content and all(e["choices"][0]["logprobs"]["content"] for e in content), name
        mids[name] = set().union(*(paths(e["choices"][0]["logprobs"]) for e in content))
    assert mids["real"] == mids["fake"], mids


def test_cached_tokens_block_granularity_matches(servers: dict[str, str]) -> None:
    tag = uuid.uuid4().hex
    for name, url in servers.items():
        before = read_vllm_metrics(httpx.get(url + "/metrics", timeout=10).text, MODEL)
        msgs = messages(f"{name}-{tag}", 400)
        usages = []
        for k in range(3):
            body = {"model": MODEL, "messages": msgs, "max_tokens": 4, "temperature": 0}
            r = post(url, body)
            assert r.status_code == 200, r.text[:300]
            usages.append(r.json()["usage"])
            msgs = msgs + [
                {"role": "assistant", "content": f"step {k} done"},
                {"role": "user", "content": f"Now step {k + 1}: " + "continue the work " * 20},
            ]
        repeat = post(url, body).json()["usage"]  # step 3's request again, unchanged
        after = read_vllm_metrics(httpx.get(url + "/metrics", timeout=10).text, MODEL)
        prompts = [u["prompt_tokens"] for u in usages + [repeat]]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages + [repeat]]
        created = usages[0]["prompt_tokens_details"]["created_cache_tokens"]
        assert cached[0] == 0, name
        assert created == prompts[0] // BLOCK * BLOCK, (
            f"{name}: created_cache_tokens {created} for {prompts[0]}"
        )
        for k in (1, 2):
            assert cached[k] % BLOCK == 0 and 0 < cached[k] < prompts[k], f"{name}: {cached} of {prompts}"
            assert cached[k] >= prompts[k - 1] // BLOCK * BLOCK, f"{name}: {cached} of {prompts}"
        # a prompt seen in full: every block but the one holding the last token (vLLM recomputes it)
        assert cached[3] == (prompts[3] - 1) // BLOCK * BLOCK, (
            f"{name}: repeat cached {cached[3]} of {prompts[3]}"
        )
        assert after.prompt_tokens_cached_total - before.prompt_tokens_cached_total == sum(cached), name
        assert after.prefix_cache_queries_total - before.prefix_cache_queries_total == sum(prompts), name


def test_metrics_carry_every_name_the_router_reads(servers: dict[str, str]) -> None:
    # router.server.metrics.scrape parses /metrics with read_vllm_metrics: what passes here is what the sidecar reads
    for name, url in servers.items():
        text = httpx.get(url + "/metrics", timeout=10).text
        m = read_vllm_metrics(text, MODEL)
        missing = sorted(set(VLLM_METRIC_NAMES) - m.present)
        assert not missing, f"{name} /metrics lacks {missing}"
        assert 0.0 <= m.kv_cache_usage_perc <= 1.0
        # the KV cache size the proxy divides by for local_cache_pressure
        assert m.cache_capacity_tokens is not None and m.cache_capacity_tokens > 0, name
        labels = {
            s.name: set(s.labels)
            for s in parse_prometheus_text(text)
            if s.name == "vllm:prompt_tokens_cached_total"
        }
        assert labels == {"vllm:prompt_tokens_cached_total": {"engine", "model_name"}}, f"{name}: {labels}"
        load = httpx.get(url + "/load", timeout=10).json()
        assert set(load) == {"server_load"} and isinstance(load["server_load"], int), name
        assert httpx.get(url + "/health", timeout=10).status_code == 200, name


ERROR_CASES = {
    "unknown model": ({"model": "no-such-model", "messages": messages("x", 5), "max_tokens": 4}, 404),
    "prompt over max_model_len": (
        {"model": MODEL, "messages": [{"role": "user", "content": "x " * (MAX_LEN + 100)}], "max_tokens": 4},
        400,
    ),
    "max_tokens over max_model_len": (
        {"model": MODEL, "messages": messages("x", 5), "max_tokens": MAX_LEN + 1},
        400,
    ),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_errors_match(servers: dict[str, str], case: str) -> None:
    body, status = ERROR_CASES[case]
    got = both(servers, post, body)
    assert {k: r.status_code for k, r in got.items()} == {"real": status, "fake": status}, case
    real, fake = got["real"].json()["error"], got["fake"].json()["error"]
    same_fields(real, fake, f"{case} error")
    assert (real["type"], real["param"], real["code"]) == (fake["type"], fake["param"], fake["code"]), case


def test_prompt_that_fits_but_not_with_max_tokens_is_served_shortened(servers: dict[str, str]) -> None:
    """vLLM 0.32 does not refuse prompt + max_tokens > max_model_len: it generates until the context is full."""
    words = MAX_LEN - 300
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x " * words}],
        "max_tokens": 400,
    }
    got = both(servers, post, body)
    for name, r in got.items():
        assert r.status_code == 200, f"{name}: {r.status_code} {r.text[:200]}"
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= MAX_LEN, name


def test_models_card_matches(servers: dict[str, str]) -> None:
    got = {k: httpx.get(u + "/v1/models", timeout=10).json() for k, u in servers.items()}
    assert [m["id"] for m in got["real"]["data"]] == [m["id"] for m in got["fake"]["data"]] == [MODEL]
    assert got["real"]["data"][0]["max_model_len"] == got["fake"]["data"][0]["max_model_len"] == MAX_LEN
    same_fields(got["real"], got["fake"], "/v1/models")
