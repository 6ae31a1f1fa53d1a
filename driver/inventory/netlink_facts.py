"""Netlink facts for one scan: links, addresses and the default-route (uplink) interfaces.

One dump each of links, addresses and main-table routes per scan (never per device). The
uplink is recomputed on every scan (the Go driver computes it once at start: a known bug).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ARPHRD_ENCAP: dict[int, str] = {
    1: "ether",
    32: "infiniband",
    512: "ppp",
    768: "ipip",
    769: "tunnel6",
    772: "loopback",
    776: "sit",
    778: "gre",
    823: "ip6gre",
    65534: "none",
    65535: "void",
}
"""ARPHRD_* link types as netlink spells the encapsulation (same strings as the Go driver)."""

ARPHRD_LOOPBACK = 772
IFF_LOOPBACK = 0x8
RT_TABLE_MAIN = 254
RTN_UNICAST = 1


@dataclass
class LinkFacts:
    """What netlink says about one link."""

    ifname: str
    index: int
    arphrd: int
    kind: str | None = None  # IFLA_INFO_KIND (veth, bond, bridge, ipoib, ...); None = plain device
    mac: str | None = None
    permanent_mac: str | None = None
    mtu: int | None = None
    operstate: str | None = None
    alias: str | None = None
    master: int | None = None
    loopback: bool = False
    ipv4: list[str] = field(default_factory=list)
    ipv6: list[str] = field(default_factory=list)


@dataclass
class NetlinkFacts:
    """All links (by name) and the names of the default-route interfaces."""

    links: dict[str, LinkFacts] = field(default_factory=dict)
    default_route_ifnames: set[str] = field(default_factory=set)

    def by_index(self) -> dict[int, LinkFacts]:
        """Links keyed by ifindex."""
        return {link.index: link for link in self.links.values()}


def is_global_unicast(address: str) -> bool:
    """Go's ``net.IP.IsGlobalUnicast``: not unspecified, loopback, multicast, link-local or broadcast."""
    ip = ipaddress.ip_address(address)
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local:
        return False
    return not (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"))


def _link(msg: object) -> LinkFacts:
    get = msg.get  # type: ignore[attr-defined]
    kind = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")  # type: ignore[attr-defined]
    operstate = get("IFLA_OPERSTATE")
    return LinkFacts(
        ifname=get("IFLA_IFNAME"),
        index=get("index"),
        arphrd=get("ifi_type"),
        kind=kind,
        mac=get("IFLA_ADDRESS"),
        permanent_mac=get("IFLA_PERM_ADDRESS"),
        mtu=get("IFLA_MTU"),
        operstate=operstate.lower() if isinstance(operstate, str) else None,
        alias=get("IFLA_IFALIAS") or None,
        master=get("IFLA_MASTER"),
        loopback=bool(get("flags", 0) & IFF_LOOPBACK) or get("ifi_type") == ARPHRD_LOOPBACK,
    )


def default_route_oifs(routes: Iterable[object]) -> set[int]:
    """ifindexes of the lowest-metric default routes per family (ECMP ties and multipath hops kept)."""
    best: dict[int, tuple[int, set[int]]] = {}
    for msg in routes:
        get = msg.get  # type: ignore[attr-defined]
        if get("dst_len") != 0 or get("type") != RTN_UNICAST:
            continue
        if (get("RTA_TABLE") or get("table")) != RT_TABLE_MAIN:
            continue
        oifs: set[int] = set()
        if get("RTA_OIF"):
            oifs.add(get("RTA_OIF"))
        for hop in get("RTA_MULTIPATH") or []:
            if hop.get("oif"):
                oifs.add(hop["oif"])
        if not oifs:
            continue
        metric = get("RTA_PRIORITY") or 0
        family = get("family")
        current = best.get(family)
        if current is None or metric < current[0]:
            best[family] = (metric, oifs)
        elif metric == current[0]:
            current[1].update(oifs)
    return {oif for _, oifs in best.values() for oif in oifs}


def collect(netns: str | None = None) -> NetlinkFacts:
    """Dump links, addresses and routes once (in ``netns`` when given) and digest them."""
    from pyroute2 import IPRoute  # imported here: sysfs-only scans never load pyroute2

    kwargs = {"netns": netns} if netns else {}
    with IPRoute(**kwargs) as ipr:
        link_msgs = list(ipr.get_links())
        addr_msgs = list(ipr.get_addr())
        route_msgs = list(ipr.get_routes(table=RT_TABLE_MAIN))
    facts = NetlinkFacts()
    index: dict[int, LinkFacts] = {}
    for msg in link_msgs:
        link = _link(msg)
        facts.links[link.ifname] = link
        index[link.index] = link
    for msg in addr_msgs:
        owner = index.get(msg["index"])
        address = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")
        if owner is None or not address or not is_global_unicast(address):
            continue
        cidr = f"{address}/{msg['prefixlen']}"
        (owner.ipv4 if msg["family"] == socket.AF_INET else owner.ipv6).append(cidr)
    for link in facts.links.values():
        link.ipv4.sort()
        link.ipv6.sort()
    facts.default_route_ifnames = {index[i].ifname for i in default_route_oifs(route_msgs) if i in index}
    return facts


def enslaved_closure(roots: set[str], masters: dict[str, str]) -> set[str]:
    """``roots`` plus every interface whose master chain reaches one of them.

    ``masters`` maps an interface to its master's name (bond/bridge/team member, a VF enslaved
    to Azure's synthetic uplink). Chains of any depth (bridge over bond over NIC) are followed.
    """
    excluded = set(roots)
    children: dict[str, list[str]] = {}
    for slave, master in masters.items():
        children.setdefault(master, []).append(slave)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in excluded:
                excluded.add(child)
                todo.append(child)
    return excluded
