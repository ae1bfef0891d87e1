"""Anthropic-native clients through the sidecar, offline against the fakes: the ``anthropic`` SDK
(messages, stream, tools, count_tokens) and the real Claude Code CLI (``claude -p``).

Each run is a multi-step tool-using run; it must stay on one tier and replica (the learned policy
with a low-P bundle does not escalate), and its steps must carry usage and cached tokens in the
run log with ``protocol == "messages"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import anthropic
import httpx
import pytest
from protocol_support import TOOL_SCHEMA, read_steps

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"name": "search", "description": "search the docs", "input_schema": TOOL_SCHEMA}]
SYSTEM = "You are a careful support agent. " + " ".join(f"rule{i}" for i in range(300))


def claude_binary() -> str | None:
    local = ROOT / ".clients" / "node_modules" / ".bin" / "claude"
    if local.exists():
        return str(local)
    return shutil.which("claude")


def _tool_loop(client: anthropic.Anthropic, run_tag: str, stream: bool) -> list[tuple[dict, object]]:
    msgs: list[dict] = [{"role": "user", "content": f"find the refund policy ({run_tag})"}]
    out = []
    for _ in range(6):
        if stream:
            with client.messages.stream(
                model="claude-test", max_tokens=1000, system=SYSTEM, messages=msgs, tools=TOOLS
            ) as st:
                for _ev in st:
                    pass
                m = st.get_final_message()
                headers = dict(st.response.headers)
        else:
            raw = client.messages.with_raw_response.create(
                model="claude-test", max_tokens=1000, system=SYSTEM, messages=msgs, tools=TOOLS
            )
            m, headers = raw.parse(), dict(raw.headers)
        out.append((headers, m))
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
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_tool_run_is_pinned_with_cached_tokens_logged(tmp_path, sidecar, stream):
    with sidecar() as (url, app):
        client = anthropic.Anthropic(base_url=url, api_key="sk-client", max_retries=0)
        res = _tool_loop(client, f"s{stream}", stream)
        assert len(res) == 4  # three tool turns, then the final text
        assert all(m.stop_reason == "tool_use" for _, m in res[:3]) and res[3][1].stop_reason == "end_turn"
        assert {h["x-runroute-tier"] for h, _ in res} == {"local"}
        assert len({h["x-runroute-replica"] for h, _ in res}) == 1
        assert len({h["x-runroute-run-id"] for h, _ in res}) == 1
        assert all(m.usage.cache_read_input_tokens > 0 for _, m in res[1:])
        count = client.messages.count_tokens(
            model="claude-test", system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
        )
        assert count.input_tokens > 100
    steps = read_steps(tmp_path).steps
    assert steps["protocol"].unique().tolist() == ["messages"]
    assert (steps["prompt_tokens"] > 0).all() and (steps["cached_tokens"].iloc[1:] > 0).all()
    assert steps["tool_calls"].map(len).tolist() == [1, 1, 1, 0]


def test_messages_client_on_the_anthropic_frontier_reads_its_prompt_cache(tmp_path, sidecar):
    """Pass-through to the Anthropic frontier: cache_control breakpoints are written, then read;
    the run log's cached tokens are Anthropic's cache_read_input_tokens."""
    with sidecar(policy={"kind": "always-frontier"}) as (url, app):
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        sysblk = [{"type": "text", "text": SYSTEM * 3, "cache_control": {"type": "ephemeral"}}]
        msgs = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}],
            }
        ]
        first = client.messages.with_raw_response.create(
            model="claude-test-opus", max_tokens=32, system=sysblk, messages=msgs, tools=TOOLS
        )
        m1 = first.parse()
        assert first.headers["x-runroute-replica"] == "claude"  # the alias maps to the Anthropic entry
        assert m1.usage.cache_creation_input_tokens > 1000 and m1.usage.cache_read_input_tokens == 0
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": m1.content[0].id,
                        "content": "ok",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ]
        m2 = client.messages.create(
            model="claude-test-opus", max_tokens=32, system=sysblk, messages=msgs, tools=TOOLS
        )
        assert m2.usage.cache_read_input_tokens >= m1.usage.cache_creation_input_tokens
    steps = read_steps(tmp_path).steps
    assert steps["cached_tokens"].tolist()[1] == m2.usage.cache_read_input_tokens
    total = m2.usage.input_tokens + m2.usage.cache_read_input_tokens + m2.usage.cache_creation_input_tokens
    assert steps["prompt_tokens"].tolist()[1] == total


@pytest.mark.parametrize(
    "body,code",
    [
        (b"{not json", "invalid_json"),
        (
            b'{"model": "claude-x", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}',
            "invalid_role",
        ),
        (
            b'{"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}',
            "invalid_block_type",
        ),
        (b'{"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}', "invalid_max_tokens"),
        (b'{"model": "claude-x", "max_tokens": 5, "messages": []}', "invalid_messages"),
        (
            b'{"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}',
            "invalid_content",
        ),
        (
            b'{"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}',
            "model_not_found",
        ),
    ],
)
def test_bad_messages_get_anthropic_errors(sidecar, body, code):
    with sidecar() as (url, app):
        r = httpx.post(url + "/v1/messages", content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["code"] == code
        assert err["error"]["type"] in ("invalid_request_error", "not_found_error")
        # the SDK raises its own typed error for it, not a connection or server error
        with pytest.raises(anthropic.APIStatusError) as ei:
            anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
                model="claude-x",
                max_tokens=5,
                messages=[{"role": "robot", "content": "x"}],  # type: ignore[typeddict-item]
            )
        assert ei.value.status_code == 400
        r = httpx.post(url + "/v1/messages/count_tokens", json={"messages": "x"})
        assert r.status_code == 400 and r.json()["type"] == "error"


def test_claude_code_cli_completes_a_pinned_tool_run(tmp_path, sidecar):
    claude = claude_binary()
    if claude is None:
        pytest.skip(
            "Claude Code CLI not installed: .ci/run installs @anthropic-ai/claude-code into .clients/"
        )
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("refund policy: 30 days\n")
    sid = str(uuid.uuid4())
    with sidecar() as (url, app):
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(work),
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "sk-client",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
        }
        p = subprocess.run(
            [
                claude,
                "-p",
                "read notes.txt and summarise it",
                "--tools",
                "Read,Glob",
                "--output-format",
                "json",
            ]
            + ["--session-id", sid, "--max-turns", "8", "--no-session-persistence"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert p.returncode == 0, (p.stdout[-800:], p.stderr[-800:])
        import json

        result = json.loads(p.stdout)
        assert result["is_error"] is False and result["num_turns"] >= 3
        run = httpx.get(f"{url}/v1/runs/cc-{sid}").json()  # the Claude Code session is the run
        assert run["id_source"] == "session"
        steps = run["steps"]
        assert len(steps) >= 4 and all(s["status"] == 200 for s in steps)
        assert sum(1 for s in steps if s["tool_calls"]) >= 3
        assert run["tiers"] == ["local"] and len(run["replicas"]) == 1 and run["switches"] == 0
        assert all(s["cached_tokens"] > 0 for s in steps[1:])
