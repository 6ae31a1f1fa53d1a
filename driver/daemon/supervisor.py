"""The daemon's background tasks, each under a guard that restarts it after a crash.

A background component (publisher, rescans, link watch, NRI, ...) that raises is logged and
started again with backoff instead of ending the process: the kubelet's DRA socket, served by
the same process, must not go down with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def guard(name: str, coro_fn: Callable[[], Awaitable[object]]) -> None:
    """Run a background component; restart it after a crash (backoff 1 s .. 30 s) instead of
    taking the daemon, and with it the kubelet's DRA socket, down."""
    delay = 1.0
    while True:
        try:
            await coro_fn()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("component crashed, restarting", extra={"kv": {"component": name, "in_s": delay}})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


class Supervisor:
    """The guarded background tasks of one daemon: started by name, all cancelled at shutdown."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, name: str, fn: Callable[[], Awaitable[object]]) -> None:
        """Start ``fn()`` as a task under :func:`guard` (from the event loop)."""
        self._tasks.append(asyncio.create_task(guard(name, fn), name=name))

    async def stop(self) -> None:
        """Cancel every task and wait until they have ended."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
