"""Concurrent client disconnects free every admission slot (issue 25, N7): 100 streaming chats to a
backend whose first byte comes after 1.5 s, each client gone after 0.5 s; every step is logged 499
``client_cancelled`` and no run keeps its admission slot, whatever the timing of the disconnect
against the upstream's answer (a real uvicorn, real sockets)."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
from test_sidecar_errors import MSGS, USAGE, settings

from models.predictor import ConstantPredictor
from router.server.app import create_app, serve_in_thread
from router.server.hotpath.upstream import FakeCall, FakeReply, FakeUpstream

N_CLIENTS = 100
FIRST_BYTE_S = 1.5
ABORT_AFTER_S = 0.5


def streamed(call: FakeCall) -> FakeReply:
    chunk = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]}) + b"\n\n"
    usage = b"data: " + orjson.dumps({"choices": [], "usage": USAGE}) + b"\n\n"
    return FakeReply(
        chunks=[chunk] * 5 + [usage, b"data: [DONE]\n\n"], headers={"content-type": "text/event-stream"}
    )


class SlowFirstByte(FakeUpstream):
    """The fake upstream, answering only after ``FIRST_BYTE_S`` (then every chunk at once)."""

    async def post(self, tier, url, body, headers):
        await asyncio.sleep(FIRST_BYTE_S)
        return await super().post(tier, url, body, headers)


async def _abort(host: str, port: int, rid: str) -> None:
    body = orjson.dumps({"messages": MSGS, "stream": True})
    req = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"x-run-id: {rid}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    _, w = await asyncio.open_connection(host, port)
    w.write(req)
    await w.drain()
    await asyncio.sleep(ABORT_AFTER_S)
    w.transport.abort()


def test_concurrent_disconnects_are_499_and_free_their_slots(tmp_path):
    app = create_app(
        settings(tmp_path, admission={"enabled": True}),
        upstream=SlowFirstByte(streamed),
        bundle=ConstantPredictor(),
    )
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")

        async def storm() -> None:
            await asyncio.gather(*(_abort(host, int(port), f"dc-{i}") for i in range(N_CLIENTS)))

        asyncio.run(storm())
        statuses: dict[str, object] = {}
        with httpx.Client(base_url=url, timeout=10) as c:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                for i in range(N_CLIENTS):
                    rid = f"dc-{i}"
                    if rid not in statuses:
                        steps = c.get(f"/v1/runs/{rid}").json().get("steps") or []
                        if steps:
                            statuses[rid] = (steps[0]["status"], steps[0]["error_code"])
                if len(statuses) == N_CLIENTS:
                    break
                time.sleep(0.1)
            active = c.get("/v1/capacity").json()["local"]["active_runs"]
    wrong = {k: v for k, v in statuses.items() if v != (499, "client_cancelled")}
    print(f"disconnect storm: {len(statuses)} steps logged, {len(wrong)} not 499, active slots {active}")
    assert len(statuses) == N_CLIENTS and wrong == {}, wrong
    assert active == 0
