"""What a host NIC has before it moves into a pod: the record a return restores (raw rtnetlink).

:func:`record_host` snapshots name, MTU, MAC, addresses, routes, policy rules and permanent
neighbors of the NICs a pod gets, with few round trips; :mod:`driver.netlink.nic_moves` moves
them and gives them back from this record.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from driver.netlink import pod_rules
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.namespaces import Namespaces
from driver.netlink.pod_rules import Neighbor, Rule
from driver.netlink.rtnl import RT_SCOPE_UNIVERSE, Route, dumped_address, restorable_route
from driver.netlink_channel import IFADDRMSG, RTA_OIF, RTM_GETADDR, RTM_GETROUTE, RTMSG, attr


@dataclass
class LinkState:
    """A NIC exactly as the host had it: what a return must restore."""

    ifname: str
    mtu: int
    mac: str
    addresses: list[str] = field(default_factory=list)  # CIDRs, global scope only
    routes: list[Route] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)  # its host rules (source in its networks, iif/oif it)
    neighbors: list[Neighbor] = field(default_factory=list)  # its permanent neighbor entries
    permanent_mac: str | None = None
    pci_address: str | None = None
    index: int | None = None  # host ifindex when recorded
    identity: LinkIdentity | None = None  # what tells it from other links (from netlink, when recorded)
    max_mtu: int | None = None  # the MTU limits its driver reports (None: not reported)
    min_mtu: int | None = None


def pci_address(ifname: str, sysfs_root: str = "/sys") -> str | None:
    """The PCI address of ``ifname`` from sysfs (``device`` link), or None for a virtual NIC."""
    try:
        target = os.readlink(f"{sysfs_root}/class/net/{ifname}/device")
    except OSError:
        return None
    return Path(target).name


def record_host(ns: Namespaces, ifnames: list[str], sysfs_root: str = "/sys") -> dict[str, LinkState]:
    """Snapshot name, MTU, MAC, global addresses, routes, rules and permanent neighbors of ``ifnames``.

    One pipelined RTM_GETLINK for all NICs, one address dump, then per NIC one route dump that
    the kernel filters to that NIC (strict checking), so the cost does not grow with the host's
    routing table; without strict checking (kernels < 4.20), one full route dump. Routes
    from every table are kept except what the kernel recreates by itself (``proto
    kernel``, the local table), non-unicast ones and multipath ones. One rule dump for all NICs
    (:func:`~driver.netlink.pod_rules.rules_of` picks each NIC's) and per NIC one neighbor dump
    the kernel filters to it. Raises ``KeyError`` naming a missing link.
    """
    rtnl = ns.host_rtnl()
    by_index: dict[int, LinkState] = {}
    states: dict[str, LinkState] = {}
    for ifname, link in zip(ifnames, rtnl.links_by_name(ifnames), strict=True):
        if link is None:
            raise KeyError(f"link {ifname} not found in the host namespace")
        state = LinkState(
            ifname=ifname,
            mtu=link.mtu,
            mac=link.mac,
            permanent_mac=link.permanent_mac,
            pci_address=pci_address(ifname, sysfs_root),
            index=link.index,
            identity=LinkIdentity.of(link),
            max_mtu=link.max_mtu,
            min_mtu=link.min_mtu,
        )
        by_index[link.index] = state
        states[ifname] = state
    # Addresses: one dump of all (a few per link). Routes: the kernel filters by interface, so
    # a host with a large routing table (BGP) costs no more than one with ten routes.
    for payload in rtnl.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        address = dumped_address(payload, RT_SCOPE_UNIVERSE)
        if address is not None and address[0] in by_index:
            by_index[address[0]].addresses.append(address[1])
    for index in list(by_index) if rtnl.strict() else [0]:
        oif = attr(RTA_OIF, struct.pack("=i", index)) if index else b""
        for payload in rtnl.dump(RTM_GETROUTE, RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0) + oif):
            found = restorable_route(payload, by_index)
            if found is not None:
                by_index[found[0]].routes.append(found[1])
    rules = pod_rules.host_rules(rtnl)
    for index, state in by_index.items():
        state.rules = pod_rules.rules_of(rules, state.ifname, state.addresses)
        state.neighbors = pod_rules.permanent_neighbors(rtnl, index)
    return states
