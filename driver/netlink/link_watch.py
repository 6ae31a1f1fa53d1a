"""Netlink link events (RTM_NEWLINK / RTM_DELLINK) -> :class:`LinkEvent` batches.

A raw ``NETLINK_ROUTE`` socket joined to ``RTMGRP_LINK``, read by the event loop (one reader
callback drains what is queued); the link messages of one wakeup become one batch of (kind, ifindex, name),
parsed no further: the consumer decides what an event means (the driver's own change, an
excluded interface, or one link to update). Address and route changes do not trigger (as in
the Go driver); the periodic resync covers them. When the kernel drops events because the
socket's buffer overflowed (``ENOBUFS``: a flood outran us), ``on_overflow`` is called: the
events are lost, so only a full scan is right.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_IFNAME,
    NLMSGHDR,
    RTM_DELLINK,
    RTM_NEWLINK,
    RTMGRP_LINK,
    netlink_socket,
    open_netns,
)

log = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0  # seconds before re-subscribing after a socket error
RCVBUF = 4 << 20  # bytes: a few thousand events of headroom before ENOBUFS
_ATTR = struct.Struct("=HH")


@dataclass(frozen=True)
class LinkEvent:
    """One link message: ``new`` (added or changed) or ``del`` (deleted or moved to another netns)."""

    kind: str
    index: int
    ifname: str


def parse_events(data: bytes) -> list[LinkEvent]:
    """The link events in one datagram (other message types are skipped)."""
    out = []
    off = 0
    hdr, info = NLMSGHDR.size, IFINFOMSG.size
    while off + hdr <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < hdr:
            break
        if kind in (RTM_NEWLINK, RTM_DELLINK) and length >= hdr + info:
            index = IFINFOMSG.unpack_from(data, off + hdr)[2]
            ifname = ""
            a, end = off + hdr + info, off + length
            while a + 4 <= end:  # IFLA_IFNAME comes first in the kernel's messages: stop there
                alen, atype = _ATTR.unpack_from(data, a)
                if alen < 4:
                    break
                if atype & 0x3FFF == IFLA_IFNAME:
                    ifname = os.fsdecode(data[a + 4 : a + alen].split(b"\0", 1)[0])
                    break
                a += (alen + 3) & ~3
            out.append(LinkEvent("new" if kind == RTM_NEWLINK else "del", index, ifname))
        off += (length + 3) & ~3
    return out


class LinkWatcher:
    """Calls ``on_events(batch)`` for the link events of ``netns`` (a name or path; None: ours)."""

    def __init__(
        self,
        on_events: Callable[[list[LinkEvent]], None],
        netns: str | None = None,
        on_overflow: Callable[[], None] | None = None,
    ) -> None:
        self.on_events = on_events
        self.on_overflow = on_overflow
        self.netns = netns
        self.subscribed = asyncio.Event()  # set once the multicast subscription is active
        self.events = 0  # link events received (for tests and metrics)

    def _socket(self) -> socket.socket:
        fd = open_netns(self.netns) if self.netns else None
        try:
            sock = netlink_socket(socket.NETLINK_ROUTE, fd, groups=RTMGRP_LINK)
        finally:
            if fd is not None:
                os.close(fd)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        except OSError:
            pass  # the default buffer still works; overflows end in a full scan
        sock.setblocking(False)
        return sock

    async def _watch_once(self) -> None:
        loop = asyncio.get_running_loop()
        failed: asyncio.Future[None] = loop.create_future()
        with self._socket() as sock:
            # One reader callback for the socket's life, draining every queued datagram per
            # wakeup: no future and no epoll registration per event (a pod start brings ~20).
            loop.add_reader(sock.fileno(), self._drain, sock, failed)
            try:
                self.subscribed.set()
                log.info("watching link events", extra={"kv": {"netns": self.netns}})
                await failed
            finally:
                loop.remove_reader(sock.fileno())

    def _drain(self, sock: socket.socket, failed: asyncio.Future[None]) -> None:
        events: list[LinkEvent] = []
        while True:
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    if not failed.done():
                        failed.set_exception(err)
                    return
                log.warning("link events lost (socket buffer overflow): full scan")
                self._call(self.on_overflow)
                continue
            events += parse_events(data)
        if events:
            self.events += len(events)
            self._call(self.on_events, events)

    @staticmethod
    def _call(fn: Callable[..., None] | None, *args: object) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            log.exception("link event callback failed")

    async def run(self) -> None:
        """Watch until cancelled; re-subscribes after socket errors (events missed meanwhile: overflow)."""
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - keep watching; a missed event means a full scan
                self.subscribed.clear()
                log.warning("link watch failed, resubscribing", extra={"kv": {"error": str(err)}})
                self._call(self.on_overflow)
                await asyncio.sleep(RECONNECT_DELAY)
