"""One background asyncio task per object: started once, cancelled and awaited on stop.

Shared by the metrics scraper, the bundle file watcher and the admission sweeper, each of which
has a knob that turns its loop off (interval 0) for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["BackgroundTask"]


class BackgroundTask:
    _task: asyncio.Task[None] | None = None

    def _start_task(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``loop_fn()`` on the running event loop unless it already runs."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(loop_fn())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
