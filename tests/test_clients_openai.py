"""OpenAI-shaped clients through the sidecar, offline against the fakes: the ``openai`` SDK (chat and
Responses, stream and not, tools, structured ``parse``), ``openai-agents`` with its default
Responses model, ``langchain-openai`` and ``litellm`` as a client.

Each is a multi-step tool-calling run that must stay on one tier and replica (the learned policy
with a low-P bundle), with usage and cached tokens in the run log under its protocol.
"""

from __future__ import annotations

import os

import httpx
import pytest
from openai import OpenAI
from protocol_support import TOOL_SCHEMA, read_steps
from pydantic import BaseModel

SYSTEM = "You are a careful research agent. " + " ".join(f"rule{i}" for i in range(300))
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "search", "parameters": TOOL_SCHEMA}}
]
RESP_TOOLS = [{"type": "function", "name": "search", "description": "search", "parameters": TOOL_SCHEMA}]


def assert_pinned(headers: list) -> None:
    assert {h["x-runroute-tier"] for h in headers} == {"local"}
    assert len({h["x-runroute-replica"] for h in headers}) == 1
    assert len({h["x-runroute-run-id"] for h in headers}) == 1


def assert_logged(tmp_path, protocol: str, n: int) -> None:
    steps = read_steps(tmp_path).steps
    steps = steps[steps["protocol"] == protocol]
    steps = steps[steps["run_id"] == steps["run_id"].value_counts().index[0]]  # the tool run
    assert len(steps) >= n
    assert (steps["prompt_tokens"] > 0).all() and steps["cached_tokens"].notna().all()
    assert (steps.sort_values("step")["cached_tokens"].iloc[1:] > 0).all()


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_tool_run_chains_previous_response_id(tmp_path, sidecar, stream):
    with sidecar() as (url, app):
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        prev, items, headers, outputs = None, [{"role": "user", "content": "find the policy"}], [], []
        for _ in range(6):
            kw = dict(
                model="auto", instructions=SYSTEM, input=items, tools=RESP_TOOLS, previous_response_id=prev
            )
            if stream:
                with client.responses.stream(**kw) as st:  # type: ignore[arg-type]
                    kinds = {ev.type for ev in st}
                    r = st.get_final_response()
                    headers.append(dict(st.response.headers) if hasattr(st, "response") else {})
                assert "response.completed" in kinds
            else:
                raw = client.responses.with_raw_response.create(**kw)  # type: ignore[arg-type]
                r = raw.parse()
                headers.append(dict(raw.headers))
            outputs.append(r)
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:
                break
            prev = r.id
            items = [
                {"type": "function_call_output", "call_id": c.call_id, "output": "found it"} for c in calls
            ]
        assert len(outputs) == 4 and outputs[-1].output_text
        assert all(r.usage.input_tokens_details.cached_tokens > 0 for r in outputs[1:])
        runs = app.state.proxy.runs
        assert len(runs) == 1  # previous_response_id kept every step in one run
        (hist,) = runs.values()
        assert {e["tier"] for e in hist.entries} == {"local"} and len(
            {e["replica"] for e in hist.entries}
        ) == 1
        if not stream:
            assert_pinned(headers)
    assert_logged(tmp_path, "responses", 4)


def test_openai_chat_stream_tools_and_parse(tmp_path, sidecar):
    class Answer(BaseModel):
        policy: str
        days: int

    with sidecar() as (url, app):
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msgs: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "find it"}]
        headers = []
        for _ in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model="auto",
                messages=msgs,
                tools=CHAT_TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
            headers.append(dict(raw.headers))
            calls: dict[int, dict] = {}
            text, usage = "", None
            for ch in raw.parse():
                usage = ch.usage or usage
                for c in ch.choices:
                    text += c.delta.content or ""
                    for tc in c.delta.tool_calls or ():
                        d = calls.setdefault(tc.index, {"id": tc.id, "name": "", "args": ""})
                        d["name"] += (tc.function.name or "") if tc.function else ""
                        d["args"] += (tc.function.arguments or "") if tc.function else ""
            assert usage is not None and usage.prompt_tokens > 0
            if not calls:
                break
            tcs = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in calls.values()
            ]
            msgs.append({"role": "assistant", "content": None, "tool_calls": tcs})
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls.values()]
        assert len(headers) == 4 and text
        ask = [{"role": "user", "content": "which policy, how many days?"}]
        parsed = client.chat.completions.parse(model="auto", messages=ask, response_format=Answer)
        assert isinstance(parsed.choices[0].message.parsed, Answer)
        rparsed = client.responses.parse(model="auto", input="policy?", text_format=Answer)
        assert isinstance(rparsed.output_parsed, Answer)
        assert_pinned(headers)
    assert_logged(tmp_path, "chat", 4)


def test_openai_agents_default_responses_model(tmp_path, sidecar):
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    seen: list[str] = []

    @function_tool
    def search(q: str) -> str:
        """Search the docs."""
        seen.append(q)
        return f"result for {q}"

    with sidecar() as (url, app):
        set_tracing_disabled(True)
        set_default_openai_client(
            AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0), use_for_tracing=False
        )
        agent = Agent(name="support", instructions=SYSTEM, tools=[search], model="auto")
        result = Runner.run_sync(agent, "find the refund policy", max_turns=8)
        assert result.final_output and len(seen) == 3  # three tool turns, then the answer
        runs = app.state.proxy.runs
        assert len(runs) == 1
        (hist,) = runs.values()
        entries = list(hist.entries)
        assert len(entries) == 4 and {e["tier"] for e in entries} == {"local"}
        assert len({e["replica"] for e in entries}) == 1
    assert_logged(tmp_path, "responses", 4)


def test_langchain_openai_tool_loop(tmp_path, sidecar):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def search(q: str) -> str:
        """Search the docs."""
        return f"result for {q}"

    with sidecar() as (url, app):
        llm = ChatOpenAI(base_url=url + "/v1", api_key="x", model="auto", max_retries=0).bind_tools([search])
        msgs: list = [SystemMessage(SYSTEM), HumanMessage("find the refund policy")]
        for _ in range(6):
            ai = llm.invoke(msgs)
            msgs.append(ai)
            if not ai.tool_calls:
                break
            for tc in ai.tool_calls:
                msgs.append(ToolMessage(search.invoke(tc["args"]), tool_call_id=tc["id"]))
        assert sum(1 for m in msgs if isinstance(m, ToolMessage)) == 3 and msgs[-1].content
        (hist,) = app.state.proxy.runs.values()  # one run, identified by its opening
        assert hist.id_source == "hash" and {e["tier"] for e in hist.entries} == {"local"}
        assert len({e["replica"] for e in hist.entries}) == 1
    assert_logged(tmp_path, "chat", 4)


def test_litellm_as_a_client(tmp_path, sidecar, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
    import litellm

    with sidecar() as (url, app):
        msgs: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "find it"}]
        for _ in range(6):
            r = litellm.completion(
                model="openai/auto",
                api_base=url + "/v1",
                api_key="x",
                messages=msgs,
                tools=CHAT_TOOLS,
                num_retries=0,
            )
            m = r.choices[0].message
            if not m.tool_calls:
                break
            msgs.append(m.model_dump(exclude_none=True))
            msgs += [{"role": "tool", "tool_call_id": tc.id, "content": "ok"} for tc in m.tool_calls]
        assert sum(1 for m in msgs if m.get("role") == "tool") == 3
        (hist,) = app.state.proxy.runs.values()  # litellm sends no run id: the opening names the run
        assert hist.id_source == "hash" and len(hist.entries) == 4
        assert {e["tier"] for e in hist.entries} == {"local"} and len(
            {e["replica"] for e in hist.entries}
        ) == 1
    assert_logged(tmp_path, "chat", 4)


@pytest.mark.parametrize(
    "body,status,code",
    [
        (b"[1]", 422, "body_not_object"),
        (b'{"model": "auto", "input": 7}', 400, "invalid_input"),
        (b'{"model": "auto", "input": [{"type": "teleport"}]}', 400, "invalid_input_item"),
        (b'{"model": "auto", "input": [{"role": "robot", "content": "x"}]}', 400, "invalid_role"),
        (b'{"model": "auto", "input": [{"type": "function_call", "name": "x"}]}', 400, "invalid_input_item"),
        (b'{"model": "auto", "input": [{"role": "user", "content": [3]}]}', 400, "invalid_content"),
        (b'{"model": "auto", "input": "x", "tools": "all"}', 400, "invalid_tools"),
        (b'{"model": "gpt-nope-x", "input": "x", "tools": 1}', 400, "invalid_tools"),
        (b'{"model": "nope", "input": "x"}', 404, "model_not_found"),
    ],
)
def test_bad_responses_get_openai_errors(sidecar, body, status, code):
    with sidecar() as (url, app):
        r = httpx.post(url + "/v1/responses", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code and r.json()["error"]["type"]


def test_client_keys_accept_each_clients_header(tmp_path, sidecar):
    os.environ["RR_TEST_CLIENT_KEYS"] = "ck-1"
    with sidecar(server={"api_keys_env": "RR_TEST_CLIENT_KEYS"}) as (url, app):
        body = {"model": "auto", "input": "hi"}
        assert httpx.post(url + "/v1/responses", json=body).status_code == 401
        assert (
            httpx.post(url + "/v1/responses", json=body, headers={"authorization": "Bearer ck-1"}).status_code
            == 200
        )
        m = {"model": "claude-x", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(url + "/v1/messages", json=m)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.post(url + "/v1/messages", json=m, headers={"x-api-key": "ck-1"}).status_code == 200
