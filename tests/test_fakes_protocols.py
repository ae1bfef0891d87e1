"""The fakes' Responses and Messages endpoints against the real SDKs (field by field through their
types), the fake Anthropic's auth, prompt caching and errors, and the Azure / OpenAI-compatible
styles of the frontier fake."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from router.fakes import fake_in_thread

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
LONG = "You are a careful agent. " * 300


@pytest.fixture(scope="module")
def vllm():
    with fake_in_thread("vllm", model="m", zero_latency=True, strict_model=False) as f:
        yield f


def test_vllm_fake_responses_chain_and_stream(vllm):
    c = OpenAI(base_url=vllm.base_url, api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "search", "parameters": SCHEMA}]
    r1 = c.responses.create(model="m", instructions=LONG, input="find q", tools=tools)  # type: ignore[arg-type]
    call = r1.output[0]
    assert call.type == "function_call" and call.name == "search" and call.call_id.startswith("call_")
    assert r1.usage.input_tokens > 1000 and r1.usage.input_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    # as in OpenAI's API, instructions and tools are not carried over by previous_response_id
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
    bare = c.responses.create(model="m", previous_response_id=r1.id, input=out)  # type: ignore[arg-type]
    assert bare.usage.input_tokens < 100  # type: ignore[union-attr]
    r2 = c.responses.create(model="m", instructions=LONG, tools=tools, previous_response_id=r1.id, input=out)  # type: ignore[arg-type]
    assert r2.usage.input_tokens > r1.usage.input_tokens  # type: ignore[union-attr]
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 32  # type: ignore[union-attr]
    with c.responses.stream(model="m", input="hello") as st:
        kinds = [ev.type for ev in st]
        final = st.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and final.output_text
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", previous_response_id="resp_nope", input="x")
    assert "not found" in str(e.value)


def test_vllm_fake_messages_report_the_prefix_cache_as_cache_reads(vllm):
    a = anthropic.Anthropic(base_url=vllm.url, api_key="x", max_retries=0)
    m1 = a.messages.create(
        model="m", max_tokens=200, system=LONG, messages=[{"role": "user", "content": "hi"}]
    )
    m2 = a.messages.create(
        model="m", max_tokens=200, system=LONG, messages=[{"role": "user", "content": "hi"}]
    )
    total = m1.usage.input_tokens + m1.usage.cache_read_input_tokens  # type: ignore[operator]
    assert (
        m2.usage.cache_read_input_tokens > 1000
        and m2.usage.input_tokens + m2.usage.cache_read_input_tokens == total
    )  # type: ignore[operator]
    with a.messages.stream(
        model="m",
        max_tokens=200,
        messages=[{"role": "user", "content": "x"}],
        tools=[{"name": "t", "input_schema": SCHEMA}],
    ) as st:
        fm = st.get_final_message()
    assert fm.stop_reason == "tool_use" and fm.content[0].type == "tool_use" and "q" in fm.content[0].input  # type: ignore[union-attr, operator]
    assert (
        a.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x " * 100}]).input_tokens
        > 50
    )
    r = httpx.post(
        vllm.url + "/v1/messages",
        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "warp"}]}]},
    )
    assert (
        r.status_code == 400
        and r.json()["type"] == "error"
        and r.json()["error"]["type"] == "invalid_request_error"
    )


def test_fake_anthropic_auth_version_and_breakpoint_caching():
    with fake_in_thread("anthropic", zero_latency=True, api_key="sk-an", strict_model=False) as an:
        bad = anthropic.Anthropic(base_url=an.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        r = httpx.post(
            an.url + "/v1/messages",
            headers={"x-api-key": "sk-an"},
            json={"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]
        a = anthropic.Anthropic(base_url=an.url, api_key="sk-an", max_retries=0)
        system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
        m1 = a.messages.create(
            model="c", max_tokens=9, system=system, messages=[{"role": "user", "content": "a"}]
        )
        assert m1.usage.cache_creation_input_tokens > 1000 and m1.usage.cache_read_input_tokens == 0
        m2 = a.messages.create(
            model="c", max_tokens=9, system=system, messages=[{"role": "user", "content": "b"}]
        )
        assert m2.usage.cache_read_input_tokens == m1.usage.cache_creation_input_tokens
        assert m2.usage.cache_creation_input_tokens == 0 and m2.usage.input_tokens < 50
        plain = a.messages.create(
            model="c", max_tokens=9, system=LONG, messages=[{"role": "user", "content": "b"}]
        )
        assert (
            plain.usage.cache_read_input_tokens == 0 and plain.usage.cache_creation_input_tokens == 0
        )  # no breakpoint
        k = an.server.knobs  # writes cost more than input, reads less: the cost counter follows
        assert an.server.cost_usd == pytest.approx(
            (
                (m1.usage.input_tokens + m2.usage.input_tokens + plain.usage.input_tokens) * k.price_in_per_m
                + m1.usage.cache_creation_input_tokens * k.price_cache_write_per_m  # type: ignore[operator]
                + m2.usage.cache_read_input_tokens * k.price_cached_in_per_m  # type: ignore[operator]
                + (m1.usage.output_tokens + m2.usage.output_tokens + plain.usage.output_tokens)
                * k.price_out_per_m
            )
            / 1e6
        )


def test_frontier_fake_azure_and_compatible_styles():
    with fake_in_thread(
        "frontier", model="g", zero_latency=True, api_key="k1", api_style="azure", azure_deployment="d1"
    ) as az:
        url = az.url + "/openai/deployments/d1/chat/completions"
        body = {"messages": [{"role": "user", "content": "x"}]}
        assert httpx.post(url, json=body, headers={"api-key": "k1"}).status_code == 404  # no api-version
        assert (
            httpx.post(url + "?api-version=2024-10-21", json=body, headers={"api-key": "bad"}).status_code
            == 401
        )
        assert (
            httpx.post(url + "?api-version=2024-10-21", json=body, headers={"api-key": "k1"}).status_code
            == 200
        )
        assert (
            httpx.post(az.url + "/v1/chat/completions", json=body, headers={"api-key": "k1"}).status_code
            == 404
        )
    with fake_in_thread(
        "frontier",
        model="g",
        zero_latency=True,
        api_key="k2",
        api_style="compatible",
        auth_header="x-goog-api-key",
        auth_scheme="",
    ) as gm:
        url = gm.url + "/v1beta/openai/chat/completions"
        assert httpx.post(url, json=body, headers={"x-goog-api-key": "k2"}).status_code == 200
        assert httpx.post(url, json=body, headers={"authorization": "Bearer k2"}).status_code == 401
