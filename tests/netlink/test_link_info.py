"""The one RTM_NEWLINK parser: the hooks' :class:`LinkInfo` and discovery's :class:`LinkFacts` say
the same of a link, from a hand-built answer (a permanent address of all zeros is none) and from a
real veth in a throwaway namespace (a veth has no permanent address)."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from driver.inventory.netlink_facts import LinkFacts, parse_link
from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_IFALIAS,
    IFLA_IFNAME,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_OPERSTATE,
    IFLA_PERM_ADDRESS,
    NLM_F_REQUEST,
    RTM_GETLINK,
    NetlinkChannel,
    attr,
    netlink_socket,
    open_netns,
)
from driver.netlink.link_info import LinkInfo, link_info
from harness.netns import NetnsFactory
from tests.support.hook_node import ipj

ARPHRD_ETHER, IF_OPER_UP = 1, 6
MAC = bytes.fromhex("020000aabb01")


def _answer(perm: bytes | None, *, alias: bytes | None = None, master: int | None = None) -> bytes:
    """An RTM_NEWLINK payload as a kernel answers RTM_GETLINK for ifindex 7 named eth7."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, ARPHRD_ETHER, 7, 0x1, 0)
    body += attr(IFLA_IFNAME, b"eth7\0") + attr(IFLA_MTU, struct.pack("=I", 9000))
    body += attr(IFLA_ADDRESS, MAC) + attr(IFLA_OPERSTATE, bytes([IF_OPER_UP]))
    if perm is not None:
        body += attr(IFLA_PERM_ADDRESS, perm)
    if alias is not None:
        body += attr(IFLA_IFALIAS, alias)
    if master is not None:
        body += attr(IFLA_MASTER, struct.pack("=I", master))
    return body


def _agree(info: LinkInfo, facts: LinkFacts) -> None:
    assert (facts.ifname, facts.index, facts.mtu, facts.mac) == (info.ifname, info.index, info.mtu, info.mac)
    assert (facts.kind, facts.permanent_mac, facts.arphrd) == (info.kind, info.permanent_mac, info.arphrd)
    assert (facts.alias, facts.master) == (info.alias, info.master)


def test_an_all_zero_permanent_address_is_no_permanent_address() -> None:
    payload = _answer(bytes(6))
    info, facts = link_info(payload), parse_link(payload)
    assert info.permanent_mac is None and facts.permanent_mac is None
    _agree(info, facts)
    assert parse_link(_answer(None)).permanent_mac is None and link_info(_answer(None)).permanent_mac is None


def test_both_read_a_permanent_address_alias_and_master_alike() -> None:
    payload = _answer(bytes.fromhex("0c42a1000001"), alias=b"uplink\0", master=12)
    info, facts = link_info(payload), parse_link(payload)
    assert facts.permanent_mac == info.permanent_mac == "0c:42:a1:00:00:01"
    assert (facts.alias, facts.master, facts.arphrd) == ("uplink", 12, ARPHRD_ETHER)
    assert facts.operstate == "up" and info.operstate == IF_OPER_UP
    assert facts.mac == "02:00:00:aa:bb:01" and facts.mtu == 9000 and not facts.loopback
    _agree(info, facts)


@pytest.mark.root
def test_a_real_veth_has_no_permanent_address(netns_factory: NetnsFactory) -> None:
    ns = netns_factory.netns()
    name, _ = netns_factory.veth(netns=ns)
    index = ipj(ns, "link", "show", name)[0]["ifindex"]
    fd = open_netns(ns)
    try:
        chan = NetlinkChannel(netlink_socket(socket.NETLINK_ROUTE, fd))
    finally:
        os.close(fd)
    try:
        reply = chan.exchange([(RTM_GETLINK, NLM_F_REQUEST, IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0))])[0]
    finally:
        chan.close()
    assert not reply.error and reply.payloads
    info, facts = link_info(reply.payloads[0]), parse_link(reply.payloads[0])
    assert (info.ifname, info.index, info.kind) == (name, index, "veth")
    assert info.permanent_mac is None and facts.permanent_mac is None
    _agree(info, facts)
