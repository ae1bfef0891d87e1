"""Issue 17's findings F1-F3 replayed against any checkout (before or after the fix), in-process.

Usage: ``PYTHONPATH=<checkout> .venv/bin/python scripts/regress_oldmain.py`` -- prints, per finding,
the statuses the sidecar answered and the active local runs ``/v1/capacity`` reports afterwards.
On commit 1523f92 (before issue 17) F1-F3 answer 500 and F1 leaves phantom active runs; after the
fix they answer 422 / 200 and leave none. (F4, Redis, is replayed by tests/test_redis_chaos.py.)
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import tempfile

import httpx
import orjson

import router

# the checkout on PYTHONPATH decides (an editable install would otherwise supply router.server)
if os.path.isdir(os.path.join(os.path.dirname(router.__file__), "server")):  # after the refactor
    from router.server.app import create_app
    from router.server.hotpath.upstream import FakeReply, FakeUpstream
    from router.server.settings import RouterSettings
else:  # before it (commit 1523f92)
    from router.app import create_app  # type: ignore[no-redef]
    from router.settings import RouterSettings  # type: ignore[no-redef]
    from router.upstream import FakeReply, FakeUpstream  # type: ignore[no-redef]
from models.predictor import ConstantPredictor

USAGE = {"prompt_tokens": 12, "completion_tokens": 3}
MSGS = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]


def reply(call) -> FakeReply:
    if orjson.loads(call.body).get("stream"):
        ch = [b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', b"data: [DONE]\n\n"]
        return FakeReply(chunks=ch, headers={"content-type": "text/event-stream"})
    return FakeReply(
        body=orjson.dumps({"choices": [{"index": 0, "message": {"content": "x"}}], "usage": USAGE})
    )


def deep(depth: int) -> bytes:
    part = b'{"type":"text","text":"hi","meta":' + b'{"a":' * depth + b'"x"' + b"}" * depth + b"}"
    return b'{"messages":[{"role":"system","content":"s"},{"role":"user","content":[' + part + b"]}]}"


async def main() -> int:
    tmp = tempfile.mkdtemp()
    s = RouterSettings.load(
        None,
        local={"urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"]},
        frontier={"url": "http://127.0.0.1:11", "allow_no_key": True},
        policy={"kind": "always-local"},
        scrape={"interval_s": 0},
        bundle={"watch_s": 0},
        runlog={"dir": tmp},
    )
    app = create_app(s, upstream=FakeUpstream(reply), bundle=ConstantPredictor())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:

            async def run(name: str, bodies: list[bytes]) -> None:
                codes: collections.Counter[int] = collections.Counter()
                for raw in bodies:
                    try:
                        r = await c.post(
                            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
                        )
                        codes[r.status_code] += 1
                    except Exception as e:  # noqa: BLE001 - an exception out of the app is a finding too
                        codes[-1] += 1
                        print(f"  {name}: exception {type(e).__name__}: {e}", file=sys.stderr)
                cap = (await c.get("/v1/capacity")).json()["local"]["active_runs"]
                print(f"{name}: statuses {dict(codes)}; active local runs afterwards: {cap}")

            await run(
                "F1 stream_options not an object",
                [
                    orjson.dumps(
                        {
                            "messages": [{"role": "user", "content": f"run {i}"}],
                            "stream": True,
                            "stream_options": "x",
                        }
                    )
                    for i in range(50)
                ],
            )
            await run(
                "F2 non-Latin-1 run id (user), non-streaming",
                [orjson.dumps({"messages": MSGS, "user": f"中文-run-{i}"}) for i in range(5)],
            )
            await run(
                "F2 non-Latin-1 run id (metadata), streaming",
                [
                    orjson.dumps({"messages": MSGS, "stream": True, "metadata": {"run_id": f"🚀-{i}"}})
                    for i in range(5)
                ],
            )
            await run("F3 content nested 900-1015 deep", [deep(d) for d in (900, 950, 1015)])
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
