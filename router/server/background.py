"""One background asyncio task per object: started once, cancelled and awaited on stop.

Shared by the metrics scraper, the bundle file watcher and the admission and idle-run sweepers
(``_start_periodic``), each of which has a knob that turns its loop off (interval 0) for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["BackgroundTask"]


class BackgroundTask:
    _task: asyncio.Task[None] | None = None

    def _start_task(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``loop_fn()`` on the running event loop unless it already runs."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(loop_fn())

    def _start_periodic(
        self, every_s: float, once: Callable[[], Awaitable[object]], log: logging.Logger, what: str
    ) -> None:
        """Await ``once()`` every ``every_s`` seconds (0 = off); a failure is logged as ``what``
        and the loop goes on (a store hiccup must not kill a sweeper)."""
        if every_s <= 0:
            return

        async def loop() -> None:
            while True:
                await asyncio.sleep(every_s)
                try:
                    await once()
                except Exception:  # noqa: BLE001
                    log.exception("%s failed", what)

        self._start_task(loop)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
