"""A newcomer's first hour on the embedded defaults: ``runroute serve`` with NO config, driven by
unmodified agents (openai-agents with its default model, the anthropic SDK's tool loop with a
Claude model name, the real Claude Code CLI), each finishing a multi-step tool run that then shows
up once in ``GET /v1/runs``; ``count_tokens`` equal to the next step's prompt; ``HEAD /``
answered; Anthropic paths answering in Anthropic's shape.

The server is a real ``runroute serve`` subprocess in a fresh working directory. One thing is
given to it: ``./runroute-bundle`` (the small test bundle of conftest.py), which ``serve`` would
otherwise train from the shipped logs at its first start (~40 s on this machine; that path is
what ``runroute serve`` prints and is exercised by the demo). The fakes, the aliases, the
exploration setting and everything else are the embedded defaults.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from test_clients_anthropic import claude_binary

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "name": "search",
        "description": "search the docs",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    }
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory, small_bundle) -> Iterator[str]:
    """``runroute serve`` (no config) in a fresh directory; yields its base URL."""
    work = tmp_path_factory.mktemp("newcomer")
    shutil.copytree(small_bundle, work / "runroute-bundle")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runroute", "serve", "--port", str(port)],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"runroute serve exited {proc.returncode}: {(work / 'serve.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("runroute serve did not answer /health within 60 s")
            time.sleep(0.2)
        banner = (work / "serve.log").read_text()
        assert "exploration     : off" in banner and "--max-tool-turns" in banner, banner
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _runs(url: str) -> list[dict]:
    page = httpx.get(url + "/v1/runs", params={"limit": 100}).json()
    return page["data"]


def _new_run(url: str, before: set[str]) -> dict:
    new = [r for r in _runs(url) if r["run_id"] not in before]
    assert len(new) == 1, new  # one agent run = one router run
    return new[0]


def _unmatched(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for smp in fam.samples:
            if smp.name == "runroute_requests_total" and smp.labels.get("handler") == "unmatched":
                total += smp.value
    return total


def test_openai_agents_with_its_default_model_finishes_a_tool_run(served):
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from agents.models import get_default_model
    from openai import AsyncOpenAI

    calls: list[str] = []

    @function_tool
    def search(q: str) -> str:
        """Search the docs."""
        calls.append(q)
        return "refund policy: 30 days"

    before = {r["run_id"] for r in _runs(served)}
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=served + "/v1", api_key="sk-x"), use_for_tracing=False)
    agent = Agent(name="support", instructions="Answer from the docs.", tools=[search])  # default model
    result = asyncio.run(Runner.run(agent, "what is the refund policy?", max_turns=8))
    assert isinstance(result.final_output, str) and result.final_output
    assert len(calls) >= 2  # a multi-step tool run, then a final answer
    run = _new_run(served, before)
    assert get_default_model().startswith("gpt-")  # mapped by the embedded gpt-* alias
    assert run["protocols"] == ["responses"] and run["n_steps"] == len(calls) + 1


def test_anthropic_sdk_tool_loop_with_a_claude_model_finishes(served):
    client = anthropic.Anthropic(base_url=served, api_key="sk-x", max_retries=0)
    before = {r["run_id"] for r in _runs(served)}
    msgs: list[dict] = [{"role": "user", "content": "find the refund policy"}]
    stops = []
    for _ in range(8):
        m = client.messages.create(model="claude-haiku-4-5", max_tokens=1024, messages=msgs, tools=TOOLS)
        stops.append(m.stop_reason)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses],
            }
        )
    assert stops[-1] == "end_turn" and stops.count("tool_use") >= 2, stops
    run = _new_run(served, before)
    assert run["n_steps"] == len(stops) and run["protocols"] == ["messages"]


def test_claude_code_cli_finishes_on_the_embedded_defaults(served, tmp_path):
    claude = claude_binary()
    if claude is None:
        pytest.skip(
            "Claude Code CLI not installed: .ci/run installs @anthropic-ai/claude-code into .clients/"
        )
    (tmp_path / "notes.txt").write_text("refund policy: 30 days\n")
    sid = str(uuid.uuid4())
    unmatched_before = _unmatched(served)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": served,
        "ANTHROPIC_API_KEY": "sk-x",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    p = subprocess.run(
        [claude, "-p", "read notes.txt and summarise it", "--tools", "Read,Glob", "--output-format", "json"]
        + ["--session-id", sid, "--no-session-persistence"],  # its default model and max turns
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, (p.stdout[-800:], p.stderr[-800:])
    import json

    result = json.loads(p.stdout)
    assert result["is_error"] is False and result["subtype"] == "success" and result["num_turns"] >= 3
    runs = [r for r in _runs(served) if r["run_id"] == f"cc-{sid}"]
    assert len(runs) == 1 and runs[0]["n_steps"] >= 3 and runs[0]["id_source"] == "session"
    # Claude Code's requests besides its steps (e.g. its HEAD / probe) all hit routes
    assert _unmatched(served) == unmatched_before


def test_count_tokens_equals_the_next_steps_prompt(served):
    client = anthropic.Anthropic(base_url=served, api_key="sk-x", max_retries=0)
    rid = f"count-{uuid.uuid4().hex[:8]}"
    hdr = {"X-Run-Id": rid}
    system = "You are a careful support agent. " + " ".join(f"rule{i}" for i in range(200))
    msgs: list[dict] = [{"role": "user", "content": "find the refund policy"}]
    for _ in range(3):
        counted = client.messages.count_tokens(
            model="claude-haiku-4-5", system=system, messages=msgs, tools=TOOLS, extra_headers=hdr
        ).input_tokens
        m = client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=1024,
            system=system,
            messages=msgs,
            tools=TOOLS,
            extra_headers=hdr,
        )
        u = m.usage
        prompt = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        assert counted == prompt, (counted, u)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": x.id, "content": "ok"} for x in uses],
            }
        )
    assert len(msgs) >= 4  # the equality held on a later step too (with cache reads)
    # a model /v1/messages answers 404 is a 404 here too, in Anthropic's shape
    r = httpx.post(
        served + "/v1/messages/count_tokens",
        json={"model": "llama-nope", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 404 and r.json()["type"] == "error"
    assert r.json()["error"]["code"] == "model_not_found"


def test_head_root_and_anthropic_paths_answer_in_their_shapes(served):
    r = httpx.head(served + "/")
    assert r.status_code == 200
    r = httpx.get(served + "/")
    assert r.status_code == 200 and r.json()["ui"] == "/ui"
    r = httpx.post(served + "/v1/messages/batches", json={})
    assert r.status_code in (404, 405) and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "not_found_error" or r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.get(served + "/v1/nope")  # OpenAI-style paths keep OpenAI's shape
    assert r.status_code == 404 and "type" not in r.json() and r.json()["error"]["code"] == "not_found"
