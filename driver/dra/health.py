"""Device health for the kubelet: the driver's checks, run periodically, and the gRPC stream that reports them.

:class:`HealthWatch` runs the driver's check (:meth:`DRADriver.health <driver.dra.protocol.DRADriver.health>`)
every interval and when poked, and reports each change; the change goes to a
:class:`DeviceHealthFeed`, which :class:`DeviceHealthService` (``v1alpha1.DRAResourceHealth``,
served on the DRA socket) streams: the complete list on every change and again every few seconds,
because the kubelet turns devices whose last update is older than its timeout into Unknown.
Not to be confused with a process's HTTP readiness probe.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc

from dranet_proto import dra_health_v1alpha1_pb2 as health_pb
from dranet_proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from driver.dra.protocol import DeviceHealthState

log = logging.getLogger(__name__)


class DeviceHealthFeed:
    """The current health of every published device; wakes the streams (their server's threads)
    when it changes."""

    def __init__(self) -> None:
        self._states: list[DeviceHealthState] = []
        self._version = 0
        self._closed = False
        self._changed = threading.Condition()

    async def set(self, states: list[DeviceHealthState]) -> None:
        """Replace the device list; wakes the streams only if something changed (never blocks)."""
        states = sorted(states, key=lambda s: (s.pool, s.device))
        with self._changed:
            if states == self._states and self._version:
                return
            self._states = states
            self._version += 1
            self._changed.notify_all()

    def snapshot(self) -> tuple[int, list[DeviceHealthState]]:
        """The version and the complete device list."""
        with self._changed:
            return self._version, list(self._states)

    def wait_change(self, seen: int, timeout: float | None = None) -> bool:
        """(a stream's thread) True once the version differs from ``seen``; False after ``timeout``
        seconds, or at once when the feed is closed or :meth:`wake` is called."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen or self._closed, timeout)
            return self._version != seen and not self._closed

    def wake(self) -> None:
        """Wake every waiting stream (a stream whose caller went away checks and ends)."""
        with self._changed:
            self._changed.notify_all()

    def open(self) -> None:
        """Streams may be served (again): the server starts."""
        with self._changed:
            self._closed = False

    def close(self) -> None:
        """No more updates: every stream ends (the server stops)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class DeviceHealthService(health_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: streams the feed's device health to the kubelet, from a
    thread of the DRA server (see :mod:`driver.dra.plugin`)."""

    def __init__(self, feed: DeviceHealthFeed, timeout_seconds: int, resend_seconds: float) -> None:
        self.feed = feed
        self.timeout_seconds = timeout_seconds
        self.resend_seconds = resend_seconds

    def NodeWatchResources(
        self, request: health_pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb.NodeWatchResourcesResponse]:
        # Send the complete list at once, on every change, and again every resend_seconds:
        # the kubelet turns devices whose last update is older than its timeout into Unknown.
        context.add_callback(self.feed.wake)  # the kubelet went away: end the stream now
        while context.is_active() and not self.feed.closed:
            version, states = self.feed.snapshot()
            now = int(time.time())
            yield health_pb.NodeWatchResourcesResponse(
                devices=[
                    health_pb.DeviceHealth(
                        device=health_pb.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                        health=health_pb.HEALTHY if s.healthy else health_pb.UNHEALTHY,
                        last_updated_time=now,
                        health_check_timeout_seconds=self.timeout_seconds,
                        message=s.message,
                    )
                    for s in states
                ]
            )
            self.feed.wait_change(version, self.resend_seconds)


class HealthWatch:
    """Runs a health check every ``interval`` seconds (and when poked); reports each change."""

    def __init__(
        self,
        check: Callable[[], Awaitable[list[DeviceHealthState]]],
        interval: float,
        on_change: Callable[[list[DeviceHealthState]], Awaitable[None]],
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.check = check
        self.interval = interval
        self.on_change = on_change
        self.quiet = quiet  # awaited before each round: the driver's own work may come first
        self.last: list[DeviceHealthState] | None = None
        self._poke: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def poke(self) -> None:
        """Check now (coalesced); safe from any thread."""
        loop, event = self._loop, self._poke
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def run(self) -> None:
        """Check until cancelled; report each change to ``on_change``."""
        self._loop = asyncio.get_running_loop()
        self._poke = asyncio.Event()
        try:
            while True:
                if self.quiet is not None:
                    await self.quiet()
                started = time.perf_counter()
                states = await self.check()
                if states != self.last:
                    changed = _changes(self.last or [], states)
                    self.last = states
                    if changed:
                        log.info("device health changed", extra={"kv": {"devices": changed}})
                    await self.on_change(states)
                log.debug("health checked", extra={"kv": {"ms": round((time.perf_counter() - started) * 1e3, 2)}})
                try:
                    await asyncio.wait_for(self._poke.wait(), timeout=self.interval)
                except TimeoutError:
                    pass
                self._poke.clear()
        finally:
            self._loop = None


def _changes(before: list[DeviceHealthState], after: list[DeviceHealthState]) -> dict[str, str]:
    old = {s.device: s.healthy for s in before}
    return {
        s.device: ("healthy" if s.healthy else f"unhealthy: {s.message}")
        for s in after
        if old.get(s.device, True) != s.healthy
    }
