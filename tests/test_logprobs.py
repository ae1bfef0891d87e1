"""Token uncertainty from local logprobs (router.server.hotpath.posthoc, router.server.protocols.chat):
the splice that strips them, the request rewrite that asks for them, the fake vLLM's logprobs, and
over real HTTP (uvicorn on loopback, the fake vLLM): with ``local.request_logprobs`` a local step's
record carries ``answer_uncertainty`` while the client's answer (chat JSON and SSE) is the answer
the sidecar gives with the setting off, byte for byte but the per-answer id and timestamp; a client
that asks keeps its logprobs; a Responses client translated to chat gets none; ``low_confidence``
is posted above ``local.low_confidence_nll``. The real vLLM: tests/test_vllm_logprobs.py.
"""

from __future__ import annotations

import re

import httpx
import orjson
import pytest
from signal_support import make_settings, read_log
from test_posthoc import _TOOLS
from test_signals import FlatPredictor

from router.fakes.launch import fake_in_thread
from router.server.app import create_app, serve_in_thread
from router.server.hotpath.posthoc import scan, uncertainty
from router.server.protocols.chat import ChatReader, add_logprobs, null_logprobs

_ENTRY = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -0.5}]}


def test_null_logprobs_splices_only_logprobs_values():
    lp = {"content": [_ENTRY, {**_ENTRY, "token": '"logprobs":{"x":1}}]', "logprob": -2.0}]}
    asked = {
        "id": "x",
        "choices": [{"index": 0, "message": {"content": 'say "logprobs":{ ok'}, "logprobs": lp}],
        "prompt_logprobs": None,
    }
    plain = {**asked, "choices": [{**asked["choices"][0], "logprobs": None}]}
    assert null_logprobs(orjson.dumps(asked)) == orjson.dumps(plain)
    assert null_logprobs(orjson.dumps(plain)) == orjson.dumps(plain)  # not asked: untouched
    two = b'data: {"choices":[{"index":0,"logprobs":{"content":[]}},{"index":1,"logprobs":[1,[2]]}]}'
    assert (
        null_logprobs(two) == b'data: {"choices":[{"index":0,"logprobs":null},{"index":1,"logprobs":null}]}'
    )
    cut = b'{"choices":[{"logprobs":{"content":[{"token":"a"'  # truncated: left as it came
    assert null_logprobs(cut) == cut


def test_add_logprobs_sets_the_member_once():
    out = add_logprobs(b'{"model":"m","messages":[]}', {"model": "m", "messages": []})
    assert orjson.loads(out) == {"logprobs": True, "model": "m", "messages": []}
    out = add_logprobs(b'{"model":"m","logprobs":false}', {"model": "m", "logprobs": False})
    assert out.count(b'"logprobs"') == 1 and orjson.loads(out)["logprobs"] is True


def test_reader_keeps_token_logprobs_and_strips_only_when_the_router_asked():
    body = orjson.dumps(
        {"choices": [{"index": 0, "message": {"content": "hi"}, "logprobs": {"content": [_ENTRY]}}]}
    )
    r = ChatReader(logprobs="router")
    assert b'"logprobs":null' in r.json(body) and r.token_logprobs() == [-0.5]
    c = ChatReader(logprobs="client")
    assert c.json(body) == body and c.token_logprobs() == [-0.5]
    ev = b"data: " + orjson.dumps(
        {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [_ENTRY]}}]}
    )
    assert any(m in ev for m in r.markers)  # the relay hands such an event to the reader
    assert r.event(ev) == ev.replace(orjson.dumps({"content": [_ENTRY]}), b"null")
    assert r.token_logprobs() == [-0.5, -0.5]
    assert ChatReader().markers == (b'"usage"', b'"tool_calls"')  # not asked: the fast path's markers


def test_uncertainty_and_the_low_confidence_kind():
    assert uncertainty([]) is None
    u = uncertainty([-0.5, -1.5, -0.1])
    assert u is not None and u["tokens"] == 3 and u["max_nll"] == 1.5
    assert u["mean_nll"] == pytest.approx(0.7)
    kw = dict(
        names=(),
        keys=(),
        args=(),
        prompt_tokens=3,
        completion_tokens=3,
        offered=None,
        cap=None,
        previous_keys=(),
    )
    assert scan(**kw, mean_nll=0.7, low_confidence_nll=0.5) == ("low_confidence",)
    assert scan(**kw, mean_nll=0.7, low_confidence_nll=0.8) == ()
    assert scan(**kw, mean_nll=0.7) == ()  # no threshold: logged, never a signal
    assert scan(**kw, low_confidence_nll=0.5) == ()  # no logprobs: not judged


@pytest.fixture(scope="module")
def fakes():
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.1)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True, api_key="sk-front") as fr,
    ):
        yield v0, fr


def test_fake_vllm_answers_logprobs_in_vllms_shape(fakes):
    v0, _ = fakes
    body = {"model": "local-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    with httpx.Client(base_url=v0.url, timeout=10) as c:
        plain = c.post("/v1/chat/completions", json=body).json()
        asked = c.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 1}).json()
        chunks = [
            orjson.loads(line[6:])
            for line in c.post(
                "/v1/chat/completions", json={**body, "stream": True, "logprobs": True}
            ).text.split("\n\n")
            if line.startswith("data: {")
        ]
    assert plain["choices"][0]["logprobs"] is None
    content = asked["choices"][0]["logprobs"]["content"]
    assert content and set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 1 for t in content)
    assert "".join(t["token"] for t in content) == asked["choices"][0]["message"]["content"]
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
    streamed = [t for ch in chunks[1:] for t in ch["choices"][0]["logprobs"]["content"]]
    assert [t["logprob"] for t in streamed] == [t["logprob"] for t in content]
    assert all(t["top_logprobs"] == [] for t in streamed)  # top_logprobs unset = 0


_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def _mask(data: bytes) -> bytes:
    """An answer without its per-answer id and creation time (they differ between any two answers)."""
    return _VOLATILE.sub(rb'"\1":_', data)


def _body(stream: bool, tools: bool, **extra) -> dict:
    body: dict = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Book me a flight to Las Vegas."}],
    }
    body |= {"stream": stream, **extra}
    if tools:
        body |= {"tools": _TOOLS, "tool_choice": "required"}
    return body


def _answers(tmp_path, fakes, local: dict, tag: str) -> dict[str, bytes]:
    v0, _ = fakes
    settings = make_settings(tmp_path, fakes, local={"urls": [v0.url], "model": "local-model", **local})
    app = create_app(settings, bundle=FlatPredictor())
    out = {}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        for stream in (False, True):
            for tools in (False, True):
                rid = f"{tag}-{'sse' if stream else 'json'}-{'tool' if tools else 'text'}"
                r = c.post("/v1/chat/completions", json=_body(stream, tools), headers={"x-run-id": rid})
                assert r.status_code == 200 and r.headers["x-runroute-tier"] == "local", r.text
                out[rid.removeprefix(f"{tag}-")] = r.content
        r = c.post(
            "/v1/chat/completions",
            json=_body(False, False, logprobs=True),
            headers={"x-run-id": f"{tag}-asked"},
        )
        out["asked"] = r.content
        signals = c.get(f"/v1/runs/{tag}-json-text").json()["signals"]
        out["signals"] = orjson.dumps(signals)
    return out


def test_router_logprobs_reach_the_record_and_not_the_client(tmp_path, fakes):
    _answers(tmp_path / "warm", fakes, {}, "warm")  # both runs below then meet the same prefix cache
    off = _answers(tmp_path / "off", fakes, {}, "off")
    on = _answers(tmp_path / "on", fakes, {"request_logprobs": True, "low_confidence_nll": 1e-6}, "on")
    for k in ("json-text", "json-tool", "sse-text", "sse-tool"):
        assert b'"logprobs":null' in off[k]
        assert _mask(on[k]) == _mask(off[k]), k
    assert b'"logprobs":{"content":[' in on["asked"] and b'"logprobs":{"content":[' in off["asked"]
    assert orjson.loads(off["signals"]) == [] and orjson.loads(on["signals"]) == ["low_confidence"]
    log_on, log_off = read_log(tmp_path / "on"), read_log(tmp_path / "off")
    by_run = {r["run_id"]: r["answer_uncertainty"] for _, r in log_on.steps.iterrows()}
    for k in ("json-text", "json-tool", "sse-text", "sse-tool", "asked"):
        u = by_run[f"on-{k}"]
        assert u is not None and u["tokens"] >= 1 and 0 < u["mean_nll"] <= u["max_nll"], k
    off_u = {r["run_id"]: r["answer_uncertainty"] for _, r in log_off.steps.iterrows()}
    assert off_u["off-asked"] is not None  # the client asked: read, and relayed (above)
    assert all(off_u[f"off-{k}"] is None for k in ("json-text", "json-tool", "sse-text", "sse-tool"))


def test_translated_responses_step_is_asked_and_answers_without_logprobs(tmp_path, fakes):
    v0, _ = fakes
    local = {"urls": [v0.url], "model": "local-model", "protocols": ["chat"], "request_logprobs": True}
    app = create_app(make_settings(tmp_path, fakes, local=local), bundle=FlatPredictor())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        for stream in (False, True):
            r = c.post(
                "/v1/responses",
                json={"model": "auto", "input": "Book me a flight.", "stream": stream},
                headers={"x-run-id": f"resp-{stream}"},
            )
            assert r.status_code == 200 and r.headers["x-runroute-tier"] == "local", r.text
            assert b'"logprob"' not in r.content  # the translation's parts keep "logprobs": []
            assert c.post(f"/v1/runs/resp-{stream}/end", json={"outcome": "success"}).status_code == 200
    log = read_log(tmp_path)
    for u in log.steps["answer_uncertainty"]:
        assert u is not None and u["tokens"] >= 1


def test_low_confidence_is_a_kind_trouble_boost_weighs():
    """Its weight is 0 unless configured; configured, it raises the score by the run's count."""
    from router.policy.trouble import TroubleTerm

    assert TroubleTerm({}).adjust(0.2, {"sig_low_confidence": 2.0}, 0.0) == 0.2
    assert TroubleTerm({"low_confidence": 0.1}).adjust(
        0.2, {"sig_low_confidence": 2.0}, 0.0
    ) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        TroubleTerm({"low_confidense": 0.1})
