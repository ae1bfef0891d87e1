"""Start fake backends: in-process (async), in a background thread (sync callers), or as a subprocess.

- ``await start_fake(kind, host="127.0.0.1", port=0, **knobs) -> RunningFake``: serve on the running
  event loop; ``port=0`` picks a free port. ``RunningFake`` has ``.url``, ``.base_url`` (``.url +
  "/v1"``), ``.port``, ``.server`` (the FakeVllm / FakeFrontier, to inspect or ``update()`` knobs),
  ``await .pause()`` (stop listening and drop open connections: clients get connection refused, the
  fake keeps its state), ``await .resume()`` (listen again on the same port), ``await .stop()``.
- ``with fake_in_thread(kind, **knobs) as fake:`` the same in a daemon thread with its own event
  loop; ``fake.call(coro_fn)`` runs a coroutine function on that loop; ``pause``/``resume``/
  ``update``/``stop`` are sync.
- ``with start_fake_process(kind, port=0, **knobs) as proc:`` runs ``python -m router.fakes.launch``
  and waits for its ready line (one JSON object with ``url`` and ``port`` on stdout); ``.stop()``
  sends SIGTERM, then SIGKILL after a timeout.

Command line (also ``runroute fake-backend``): ``python -m router.fakes.launch --kind vllm
--port 8001 --model my-model --decode-ms-per-token=2 --zero-latency``; knob names take dashes or
underscores; a bare ``--flag`` means true.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson
from aiohttp import web

from router.fakes.anthropic import FakeAnthropic
from router.fakes.frontier import FakeFrontier
from router.fakes.server import FakeServer, KnobError
from router.fakes.vllm import FakeVllm

__all__ = [
    "FAKE_KINDS",
    "make_fake",
    "RunningFake",
    "start_fake",
    "FakeThread",
    "fake_in_thread",
    "FakeProcess",
    "start_fake_process",
    "parse_knob_args",
    "serve_forever",
    "main",
]

FAKE_KINDS: dict[str, type[FakeServer]] = {
    "vllm": FakeVllm,
    "frontier": FakeFrontier,
    "anthropic": FakeAnthropic,
}
T = TypeVar("T")


def make_fake(kind: str, **knobs: object) -> FakeServer:
    """Build a fake server object (not yet listening); KnobError on a bad kind or knob."""
    cls = FAKE_KINDS.get(kind)
    if cls is None:
        raise KnobError(f"unknown fake kind {kind!r}; expected one of {sorted(FAKE_KINDS)}")
    return cls(**knobs)


class RunningFake:
    """A fake listening on the current event loop."""

    def __init__(self, server: FakeServer, runner: web.AppRunner, host: str, port: int):
        self.server = server
        self.host = host
        self.port = port
        self._runner = runner
        self._site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    async def _listen(self, port: int) -> int:
        site = web.TCPSite(self._runner, self.host, port, reuse_address=True, backlog=1024)
        await site.start()
        self._site = site
        return int(self._runner.addresses[0][1])

    async def pause(self) -> None:
        """Stop listening and drop every open connection (simulates a dead server)."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        srv = self._runner.server
        if srv is not None:
            for conn in srv.connections:
                conn.force_close()

    async def resume(self) -> None:
        if self._site is None:
            await self._listen(self.port)

    async def stop(self) -> None:
        await self.pause()
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningFake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_fake(kind: str, host: str = "127.0.0.1", port: int = 0, **knobs: object) -> RunningFake:
    """Start a fake on this event loop; see the module docstring."""
    server = make_fake(kind, **knobs)
    runner = web.AppRunner(server.make_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    fake = RunningFake(server, runner, host, port)
    try:
        fake.port = await fake._listen(port)
    except BaseException:
        await runner.cleanup()
        raise
    server.bind_port(fake.port)
    return fake


class FakeThread:
    """A fake served by a background thread's event loop, for sync code and tests."""

    def __init__(
        self, kind: str, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 10.0, **knobs: object
    ):
        self._args = (kind, host, port, knobs)
        self._timeout = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._fake: RunningFake | None = None

    def start(self) -> FakeThread:
        make_fake(self._args[0], **self._args[3])  # validate knobs here, in the caller's thread
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready: asyncio.Future[RunningFake] | None = None
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            nonlocal ready
            asyncio.set_event_loop(loop)
            kind, host, port, knobs = self._args
            try:
                self._fake = loop.run_until_complete(start_fake(kind, host, port, **knobs))
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                failure.append(e)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"fake-{self._args[0]}", daemon=True)
        self._thread.start()
        if not started.wait(self._timeout):
            raise TimeoutError(f"fake {self._args[0]} did not start within {self._timeout} s")
        if failure:
            raise failure[0]
        return self

    @property
    def fake(self) -> RunningFake:
        if self._fake is None:
            raise RuntimeError("fake not started")
        return self._fake

    @property
    def url(self) -> str:
        return self.fake.url

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    @property
    def port(self) -> int:
        return self.fake.port

    @property
    def server(self) -> FakeServer:
        return self.fake.server

    def call(self, fn: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """Run ``fn()`` (a coroutine function) on the fake's loop and return its result."""
        assert self._loop is not None

        async def wrapped() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(timeout_s or self._timeout)

    def update(self, **knobs: object) -> None:
        async def go() -> None:
            self.server.update(**knobs)

        self.call(go)

    def pause(self) -> None:
        self.call(self.fake.pause)

    def resume(self) -> None:
        self.call(self.fake.resume)

    def stop(self) -> None:
        if self._fake is None or self._loop is None or self._thread is None:
            return
        try:
            self.call(self._fake.stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self._timeout)
            self._fake = None

    def __enter__(self) -> FakeThread:
        return self.start() if self._fake is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fake_in_thread(
    kind: str, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 10.0, **knobs: object
) -> FakeThread:
    """``with fake_in_thread("vllm", zero_latency=True) as f: ... f.url ...``"""
    return FakeThread(kind, host, port, timeout_s=timeout_s, **knobs)


def _knob_arg(name: str, value: object) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"--{name.replace('_', '-')}={value}"


class FakeProcess:
    """A fake in its own Python process (``python -m router.fakes.launch``)."""

    def __init__(
        self,
        kind: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        startup_timeout_s: float = 20.0,
        **knobs: object,
    ):
        make_fake(kind, **knobs)  # fail fast on bad knobs
        self.kind, self.host, self.requested_port = kind, host, port
        self.knobs = knobs
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0
        self.base_url = ""

    def start(self) -> FakeProcess:
        args = [sys.executable, "-m", "router.fakes.launch", "--kind", self.kind, "--host", self.host]
        args += ["--port", str(self.requested_port)]
        args += [_knob_arg(k, v) for k, v in self.knobs.items() if v is not None]
        err = tempfile.TemporaryFile()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
        line = _read_line(self.proc, self.startup_timeout_s)
        if not line:
            self.stop()
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"fake {self.kind} process did not start: {' | '.join(tail) or 'no output'}")
        err.close()
        info = orjson.loads(line)
        self.url, self.port, self.base_url = info["url"], int(info["port"]), info["url"] + "/v1"
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout_s)
        if p.stdout is not None:
            p.stdout.close()
        return p.returncode

    def __enter__(self) -> FakeProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """First stdout line of ``proc`` within ``timeout_s`` (b"" on timeout or exit)."""
    out: list[bytes] = []

    def reader() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.readline())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0].strip() if out else b""


def start_fake_process(
    kind: str, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 20.0, **knobs: object
) -> FakeProcess:
    """Start a fake subprocess and wait until it listens; use as a context manager to stop it."""
    return FakeProcess(kind, host, port, startup_timeout_s=startup_timeout_s, **knobs).start()


# --- command line --------------------------------------------------------------------------------


def parse_knob_args(args: Sequence[str]) -> dict[str, str]:
    """``["--a-b=1", "--c", "2", "--flag"]`` -> ``{"a_b": "1", "c": "2", "flag": "true"}``."""
    knobs: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or len(a) < 3:
            raise KnobError(f"expected --knob=value, got {a!r}")
        if "=" in a:
            name, value = a[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            name, value = a[2:], args[i + 1]
            i += 1
        else:
            name, value = a[2:], "true"
        knobs[name.replace("-", "_")] = value
        i += 1
    return knobs


async def _serve(
    kind: str, host: str, port: int, knobs: dict[str, object], on_ready: Callable[[RunningFake], None]
) -> None:
    fake = await start_fake(kind, host, port, **knobs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        on_ready(fake)
        await stop.wait()
    finally:
        await fake.stop()


def serve_forever(
    kind: str,
    host: str,
    port: int,
    knobs: dict[str, object],
    on_ready: Callable[[RunningFake], None] | None = None,
) -> None:
    """Serve a fake until SIGINT/SIGTERM; print one JSON ready line (url, port, kind, model) by default."""
    make_fake(kind, **knobs)  # validate before binding

    def ready(f: RunningFake) -> None:
        info = {"ready": True, "kind": kind, "url": f.url, "port": f.port, "model": f.server.knobs.model}
        info["header"] = f.server._header_value
        sys.stdout.write(orjson.dumps(info).decode() + "\n")
        sys.stdout.flush()

    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    runner(_serve(kind, host, port, knobs, on_ready or ready))


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m router.fakes.launch", description="Run a fake backend.")
    ap.add_argument("--kind", required=True, choices=sorted(FAKE_KINDS))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ns, rest = ap.parse_known_args(argv)
    try:
        serve_forever(ns.kind, ns.host, ns.port, dict(parse_knob_args(rest)))
    except (KnobError, OSError) as e:
        print(f"fake-backend: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
