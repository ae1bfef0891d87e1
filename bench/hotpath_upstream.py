"""The upstream call alone: CPU per request of the lean plain-http client (``h1client``) against
aiohttp's, the sidecar's two ``server.upstream_client`` settings.

Algorithm: one process, one uvloop loop; a raw asyncio server in the same loop answers every
``POST`` with a fixed JSON body (``--answer-kb``) or ``--chunks`` SSE pieces, kept alive.
:class:`router.server.hotpath.upstream.AiohttpUpstream` with ``lean=False`` (aiohttp) and
``lean=True`` (the lean client) each send ``--requests`` POSTs of a ``--body-kb`` body one after
another, after ``--warmup`` unmeasured ones; the process's CPU time (``time.process_time``) over
the measured requests, divided by their number, is printed per client, the two alternated
``--repeat`` times (so a load change on a shared machine hits both). The server's work is in both
figures (the same bytes answered); their difference is the clients'.

Usage: ``.venv/bin/python bench/hotpath_upstream.py [--requests 3000] [--repeat 3] [--stream]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from router.server.hotpath.upstream import AiohttpUpstream  # noqa: E402


def _server(answer: bytes, chunks: int) -> type[asyncio.Protocol]:
    if chunks:
        piece = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
        pieces = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(chunks)) + b"0\r\n\r\n"
        reply = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + pieces
        )
    else:
        reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
            answer
        )
        reply += answer

    class Srv(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t = t
            self.buf = b""

        def data_received(self, d: bytes) -> None:
            self.buf += d
            while True:
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    return
                head = self.buf[:i].lower()
                n = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(self.buf) < i + 4 + n:
                    return
                self.buf = self.buf[i + 4 + n :]
                self.t.write(reply)  # type: ignore[attr-defined]

    return Srv


async def _phase(lean: bool, a: argparse.Namespace) -> float:
    loop = asyncio.get_running_loop()
    answer = b'{"choices":[{"message":{"content":"' + b"x" * (a.answer_kb * 1024) + b'"}}]}'
    srv = await loop.create_server(_server(answer, a.chunks if a.stream else 0), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    up = AiohttpUpstream(lean=lean)
    await up.start()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = b'{"messages":"' + b"a" * (a.body_kb * 1024) + b'"}'
    hdrs = {"content-type": "application/json", "authorization": "Bearer k"}

    async def one() -> None:
        r = await up.post("local", url, body, hdrs)
        if a.stream:
            async for _ in r.iter_chunks():
                pass
            r.close()
        else:
            await r.read()

    try:
        for _ in range(a.warmup):
            await one()
        c0 = time.process_time()
        for _ in range(a.requests):
            await one()
        return (time.process_time() - c0) / a.requests * 1e6
    finally:
        await up.close()
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--body-kb", type=int, default=100)
    ap.add_argument("--answer-kb", type=int, default=1)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--chunks", type=int, default=16)
    a = ap.parse_args()
    import uvloop

    got: dict[str, list[float]] = {"aiohttp": [], "lean": []}
    for _ in range(a.repeat):
        for lean in (False, True):
            got["lean" if lean else "aiohttp"].append(uvloop.run(_phase(lean, a)))
    mode = "stream" if a.stream else "plain"
    for k, v in got.items():
        print(f"{mode} {k}: CPU {min(v):.1f} us/req best of {len(v)} ({', '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
