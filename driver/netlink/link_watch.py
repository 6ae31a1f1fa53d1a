"""Netlink link events (RTM_NEWLINK / RTM_DELLINK) -> rescan requests.

The watcher only signals; the caller coalesces (a burst of link flaps must become at most one
ResourceSlice write per interval). Address and route changes do not trigger (as in the Go
driver); the periodic resync covers them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

LINK_EVENTS = frozenset({"RTM_NEWLINK", "RTM_DELLINK"})
RECONNECT_DELAY = 1.0  # seconds before re-subscribing after a socket error


class LinkWatcher:
    """Calls ``on_change()`` for every link event in ``netns`` (the current one when None)."""

    def __init__(self, on_change: Callable[[], None], netns: str | None = None) -> None:
        self.on_change = on_change
        self.netns = netns
        self.subscribed = asyncio.Event()  # set once the multicast subscription is active

    async def _watch_once(self) -> None:
        from pyroute2 import AsyncIPRoute
        from pyroute2.netlink.rtnl import RTMGRP_LINK

        kwargs = {"netns": self.netns} if self.netns else {}
        async with AsyncIPRoute(**kwargs) as ipr:
            await ipr.bind(groups=RTMGRP_LINK)
            self.subscribed.set()
            log.info("watching link events", extra={"kv": {"netns": self.netns}})
            while True:
                async for msg in ipr.get():
                    if msg.get("event") in LINK_EVENTS:
                        self._notify(msg.get("event"), msg.get("IFLA_IFNAME"))

    def _notify(self, event: str, ifname: str | None) -> None:
        log.debug("link event", extra={"kv": {"event": event, "ifname": ifname}})
        try:
            self.on_change()
        except Exception:
            log.exception("link change callback failed")

    async def run(self) -> None:
        """Watch until cancelled; re-subscribes after socket errors (e.g. ENOBUFS on a flood)."""
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - keep watching; a missed event means rescan now
                self.subscribed.clear()
                log.warning("link watch failed, resubscribing", extra={"kv": {"error": str(err)}})
                self._notify("resubscribe", None)
                await asyncio.sleep(RECONNECT_DELAY)
