"""Pipelined netlink batches larger than the socket's receive buffer: sent in windows, every
request answered, in order (a throwaway namespace and veth; nothing else is touched)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from driver.netlink.channel import (
    IFA_ADDRESS,
    IFA_LOCAL,
    IFADDRMSG,
    IFINFOMSG,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    RTM_GETLINK,
    RTM_NEWADDR,
    NetlinkChannel,
    attr,
    netlink_socket,
    open_netns,
)
from harness.netns import NetnsFactory
from tests.support.hook_node import ipj

pytestmark = pytest.mark.root


@pytest.fixture
def veth_ns(netns_factory: NetnsFactory) -> Iterator[tuple[str, str, int]]:
    """A namespace with one veth: (namespace, name, ifindex)."""
    ns = netns_factory.netns()
    name, _ = netns_factory.veth(netns=ns)
    yield ns, name, ipj(ns, "link", "show", name)[0]["ifindex"]


def _channel(ns: str, rcvbuf: int | None = None) -> NetlinkChannel:
    fd = open_netns(ns)
    try:
        sock = netlink_socket(socket.NETLINK_ROUTE, fd)
    finally:
        os.close(fd)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return NetlinkChannel(sock, ext_ack=True)


def _add_address(index: int, k: int) -> tuple[int, int, bytes]:
    ip = bytes([10, 77, k // 250, k % 250 + 1])
    body = IFADDRMSG.pack(socket.AF_INET, 32, 0, 0, index) + attr(IFA_LOCAL, ip) + attr(IFA_ADDRESS, ip)
    return RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body


@pytest.mark.parametrize("rcvbuf", [None, 4096])
def test_a_batch_of_acks_beyond_the_receive_buffer_is_answered_in_full(
    veth_ns: tuple[str, str, int], rcvbuf: int | None
) -> None:
    """1,000 acknowledged requests (about 830 KB of acks against a 212,992-byte buffer), and the same
    with the smallest buffer the kernel allows; then the same requests again, each refused alone."""
    ns, name, index = veth_ns
    chan = _channel(ns, rcvbuf)
    try:
        assert chan.window_bytes < 1000 * 832
        replies = chan.exchange([_add_address(index, k) for k in range(1000)])
        assert [r.error for r in replies] == [0] * 1000
        addrs = {a["local"] for e in ipj(ns, "addr", "show", "dev", name) for a in e["addr_info"]}
        assert {f"10.77.{k // 250}.{k % 250 + 1}" for k in range(1000)} <= addrs
        again = chan.exchange([_add_address(index, k) for k in range(1000)])
        assert {r.error for r in again} == {17}  # EEXIST, one answer per request
    finally:
        chan.close()


def test_a_batch_of_gets_beyond_the_receive_buffer_is_answered_in_order(veth_ns: tuple[str, str, int]) -> None:
    ns, _name, index = veth_ns
    chan = _channel(ns)
    try:
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        lo = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 1, 0, 0)
        replies = chan.exchange([(RTM_GETLINK, NLM_F_REQUEST, body if k % 2 else lo) for k in range(400)])
        indexes = [IFINFOMSG.unpack_from(r.payloads[0])[2] for r in replies]
        assert indexes == [index if k % 2 else 1 for k in range(400)]
    finally:
        chan.close()
