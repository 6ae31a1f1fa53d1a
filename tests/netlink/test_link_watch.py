"""LinkWatcher against real netlink events in a throwaway network namespace."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from driver.netlink.link_watch import LinkEvent, LinkWatcher

pytestmark = pytest.mark.root


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


async def _wait_events(events: list[str], count: int, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while len(events) < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


async def test_link_watcher_fires_on_link_changes(netns_factory) -> None:
    ns = netns_factory.netns()
    events: list[LinkEvent] = []
    watcher = LinkWatcher(events.extend, netns=ns)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.subscribed.wait(), 10)
        a, b = netns_factory.veth(netns=ns, peer_netns=ns)  # add
        await _wait_events(events, 1)
        assert events, "no event for link add"
        assert {(e.kind, e.ifname) for e in events} >= {("new", a), ("new", b)}
        assert all(e.index > 0 for e in events)
        n = len(events)
        ip("-n", ns, "link", "set", a, "up")  # up
        await _wait_events(events, n + 1)
        assert len(events) > n, "no event for link up"
        n = len(events)
        ip("-n", ns, "link", "set", a, "down")  # down
        await _wait_events(events, n + 1)
        assert len(events) > n, "no event for link down"
        n = len(events)
        ip("-n", ns, "link", "del", a)  # delete (both ends)
        await _wait_events(events, n + 1)
        assert len(events) > n, "no event for link delete"
        await asyncio.sleep(0.1)
        assert ("del", a) in {(e.kind, e.ifname) for e in events[n:]}
        n = len(events)
        ip("-n", ns, "addr", "add", "10.1.0.1/24", "dev", "lo")  # address changes do not trigger
        await asyncio.sleep(0.3)
        assert len(events) == n
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_callback_errors_do_not_stop_the_watcher(netns_factory) -> None:
    ns = netns_factory.netns()
    calls: list[int] = []

    def flaky(_events: list[LinkEvent]) -> None:
        calls.append(1)
        raise RuntimeError("callback bug")

    watcher = LinkWatcher(flaky, netns=ns)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.subscribed.wait(), 10)
        a, _ = netns_factory.veth(netns=ns, peer_netns=ns)
        await _wait_events(calls, 1)
        n = len(calls)
        ip("-n", ns, "link", "set", a, "up")
        await _wait_events(calls, n + 1)
        assert len(calls) > n and not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_parse_events_reads_kind_index_and_name_only() -> None:
    import struct

    from driver.netlink.channel import IFINFOMSG, IFLA_IFNAME, IFLA_MTU, NLMSGHDR, RTM_DELLINK, RTM_NEWLINK, attr
    from driver.netlink.link_watch import parse_events

    def msg(kind: int, index: int, name: str) -> bytes:
        body = IFINFOMSG.pack(0, 1, index, 0, 0) + attr(IFLA_MTU, struct.pack("=I", 1500))
        body += attr(IFLA_IFNAME, name.encode() + b"\0")
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, 0, 0, 0) + body

    other = NLMSGHDR.pack(NLMSGHDR.size + 4, 20, 0, 0, 0) + b"\0" * 4  # RTM_NEWADDR: skipped
    data = msg(RTM_NEWLINK, 5, "eth1") + other + msg(RTM_DELLINK, 9, "net1")
    assert parse_events(data) == [LinkEvent("new", 5, "eth1"), LinkEvent("del", 9, "net1")]
    assert parse_events(b"") == [] and parse_events(b"\x01\x00") == []
