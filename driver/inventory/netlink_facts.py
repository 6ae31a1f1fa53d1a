"""Netlink facts for discovery: links, addresses and the default-route (uplink) interfaces.

A full scan makes one dump each of links, addresses and main-table routes (never one request
per device); the incremental update of one link asks for that link and its addresses only
(:meth:`LinkQuery.link`). The uplink is recomputed on every full scan (the Go driver computes it
once at start: a known bug).

Hand-written rtnetlink through :mod:`driver.netlink.channel`, only the attributes discovery reads:
pyroute2 decodes every attribute of every link into objects, and the same dumps through its
``IPRoute`` take about eleven times as long (``bench.bench_discovery`` with 520 links, dated in
docs/performance.md, "pyroute2 or hand-packed netlink"), on every full scan (the replay compares
these facts first) and in ``dranet discover``; loading pyroute2 would also add ~8 MB to the
daemon's idle memory.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from driver.netlink import bpf_attachments
from driver.netlink.channel import (
    IFA_ADDRESS,
    IFA_LOCAL,
    IFADDRMSG,
    IFINFOMSG,
    NETLINK_GET_STRICT_CHK,
    NLM_F_REQUEST,
    RT_TABLE_MAIN,
    RTA_MULTIPATH,
    RTA_OIF,
    RTA_PRIORITY,
    RTA_TABLE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTMSG,
    RTN_UNICAST,
    RTNEXTHOP,
    SOL_NETLINK,
    NetlinkChannel,
    netlink_socket,
    open_netns,
    parse_attrs,
)
from driver.netlink.link_info import link_info

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


@dataclass(slots=True)
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
    tc_filters: tuple[str, ...] = ()  # names of the TC `bpf` filters of its clsact qdisc
    tcx_programs: tuple[str, ...] = ()  # names of its tcx programs


@dataclass
class NetlinkFacts:
    """All links (by name) and the names of the default-route interfaces."""

    links: dict[str, LinkFacts] = field(default_factory=dict)
    default_route_ifnames: set[str] = field(default_factory=set)

    def names_by_index(self) -> dict[int, str]:
        """Link names keyed by ifindex."""
        return {link.index: name for name, link in self.links.items()}


def is_global_unicast(address: str) -> bool:
    """Go's ``net.IP.IsGlobalUnicast``: not unspecified, loopback, multicast, link-local or broadcast."""
    ip = ipaddress.ip_address(address)
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local:
        return False
    return not (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"))


OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
"""IF_OPER_* (RFC 2863) as sysfs ``operstate`` spells them."""


def parse_link(payload: bytes) -> LinkFacts:
    """One RTM_NEWLINK payload (a dump entry, a GET answer or an event) as :class:`LinkFacts`, read
    by netlink's one link parser (:func:`driver.netlink.link_info.link_info`)."""
    link = link_info(payload)
    oper = link.operstate
    return LinkFacts(
        # Any byte but NUL, '/' and whitespace is a valid name: decoded as os.listdir decodes it
        # (surrogate escapes), so a name that is not UTF-8 is the same str from netlink and sysfs.
        ifname=link.ifname,
        index=link.index,
        arphrd=link.arphrd,
        kind=link.kind,
        mac=link.mac or None,
        permanent_mac=link.permanent_mac,  # None for none, and for an all-zero one
        mtu=link.mtu,
        operstate=OPERSTATES[oper] if oper is not None and oper < len(OPERSTATES) else None,
        alias=link.alias,
        master=link.master,
        loopback=bool(link.flags & IFF_LOOPBACK) or link.arphrd == ARPHRD_LOOPBACK,
    )


def _global_address(payload: bytes) -> tuple[int, int, str] | None:
    """(ifindex, family, CIDR) of an RTM_NEWADDR payload when the address is global unicast."""
    family, prefixlen, _flags, _scope, index = IFADDRMSG.unpack_from(payload)
    attrs = parse_attrs(payload, IFADDRMSG.size)
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)  # IFA_LOCAL: ours on point-to-point links
    if not raw:
        return None
    address = str(ipaddress.ip_address(raw))
    if not is_global_unicast(address):
        return None
    return index, family, f"{address}/{prefixlen}"


def _add_address(link: LinkFacts, family: int, cidr: str) -> None:
    (link.ipv4 if family == socket.AF_INET else link.ipv6).append(cidr)


@dataclass
class RouteFacts:
    """What :func:`default_route_oifs` needs of one route."""

    family: int
    dst_len: int
    rtype: int
    table: int
    metric: int
    oifs: set[int]


def parse_route(payload: bytes) -> RouteFacts:
    """One RTM_NEWROUTE payload; ``oifs`` holds RTA_OIF or every hop of RTA_MULTIPATH."""
    family, dst_len, _src, _tos, table, _proto, _scope, rtype, _flags = RTMSG.unpack_from(payload)
    attrs = parse_attrs(payload, RTMSG.size)
    if RTA_TABLE in attrs:
        table = struct.unpack("=I", attrs[RTA_TABLE])[0]
    oifs: set[int] = set()
    if RTA_OIF in attrs:
        oifs.add(struct.unpack("=i", attrs[RTA_OIF])[0])
    raw, off = attrs.get(RTA_MULTIPATH, b""), 0
    while off + RTNEXTHOP.size <= len(raw):
        length, _hflags, _hops, oif = RTNEXTHOP.unpack_from(raw, off)
        if length < RTNEXTHOP.size:
            break
        if oif:
            oifs.add(oif)
        off += (length + 3) & ~3
    metric = struct.unpack("=I", attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else 0
    return RouteFacts(family, dst_len, rtype, table, metric, oifs)


def default_route_oifs(routes: Iterable[RouteFacts]) -> set[int]:
    """ifindexes of the lowest-metric default routes per family (ECMP ties and multipath hops kept)."""
    best: dict[int, tuple[int, set[int]]] = {}
    for r in routes:
        if r.dst_len != 0 or r.rtype != RTN_UNICAST or r.table != RT_TABLE_MAIN or not r.oifs:
            continue
        current = best.get(r.family)
        if current is None or r.metric < current[0]:
            best[r.family] = (r.metric, set(r.oifs))
        elif r.metric == current[0]:
            current[1].update(r.oifs)
    return {oif for _, oifs in best.values() for oif in oifs}


class LinkQuery:
    """A raw rtnetlink socket for discovery (in ``netns`` when given: a name or a path).

    Per-link questions (one link and its own addresses) use the kernel's strict dump filtering,
    so they cost the same on a node with hundreds of links as on one with two.
    """

    def __init__(self, netns: str | None = None) -> None:
        fd = open_netns(netns) if netns else None
        try:
            sock = netlink_socket(socket.NETLINK_ROUTE, fd)
        finally:
            if fd is not None:
                os.close(fd)
        try:
            sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self.strict = True
        except OSError:  # kernels before 4.20: filter the full dump ourselves
            self.strict = False
        self.chan = NetlinkChannel(sock)
        self.netns = netns
        self._bpf = True  # the bpf system call answers (not: no CAP_BPF/SYS_ADMIN, no tcx, seccomp)

    def close(self) -> None:
        """Close the socket."""
        self.chan.close()

    def __enter__(self) -> LinkQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def collect(self) -> NetlinkFacts:
        """Links, their global addresses and the default-route interfaces (one dump each)."""
        facts = NetlinkFacts()
        index: dict[int, LinkFacts] = {}
        for payload in self.chan.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
            link = parse_link(payload)
            facts.links[link.ifname] = link
            index[link.index] = link
        for payload in self.chan.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
            found = _global_address(payload)
            if found and found[0] in index:
                _add_address(index[found[0]], found[1], found[2])
        for link in facts.links.values():
            link.ipv4.sort()
            link.ipv6.sort()
        self._add_programs(index.values())
        body = RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, RT_TABLE_MAIN if self.strict else 0, 0, 0, 0, 0)
        routes = [parse_route(p) for p in self.chan.dump(RTM_GETROUTE, body)]
        facts.default_route_ifnames = {index[i].ifname for i in default_route_oifs(routes) if i in index}
        return facts

    def link(self, index: int) -> LinkFacts | None:
        """One link by ifindex with its global addresses; None when it does not exist (any more)."""
        reply = self.chan.exchange([(RTM_GETLINK, NLM_F_REQUEST, IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0))])[0]
        if reply.error == errno.ENODEV or (not reply.error and not reply.payloads):
            return None
        if reply.error:
            raise OSError(reply.error, f"RTM_GETLINK {index}: {os.strerror(reply.error)}")
        link = parse_link(reply.payloads[0])
        # Strict checking: the kernel sends this link's addresses only.
        for payload in self.chan.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index)):
            found = _global_address(payload)
            if found and found[0] == index:
                _add_address(link, found[1], found[2])
        link.ipv4.sort()
        link.ipv6.sort()
        self._add_programs([link])
        return link

    def _add_programs(self, links: Iterable[LinkFacts]) -> None:
        """The eBPF programs' names of ``links`` (dranet's ``tcFilterNames``/``tcxProgramNames``): TC
        filters only where a clsact qdisc is (one qdisc dump), tcx on every link (two ``bpf``
        queries each). A link whose programs cannot be listed gets none, with a log line; a
        ``bpf`` call refused (no privileges, no tcx) is not asked again."""
        try:
            with_qdisc = bpf_attachments.qdisc_links(self.chan)
        except OSError as exc:
            log.debug("qdiscs not listed", extra={"kv": {"error": str(exc)}})
            with_qdisc = set()
        fd = open_netns(self.netns) if self.netns and self._bpf else None
        try:
            for link in links:
                if link.loopback or (not self._bpf and link.index not in with_qdisc):
                    continue
                found = self._programs(link, fd, link.index in with_qdisc)
                if found is None:
                    continue
                link.tc_filters, link.tcx_programs = found.tc_filters, found.tcx_programs
        finally:
            if fd is not None:
                os.close(fd)

    def _programs(self, link: LinkFacts, fd: int | None, tc: bool) -> bpf_attachments.AttachedNames | None:
        try:
            return bpf_attachments.attached_names(self.chan, fd, link.index, tc=tc, tcx=self._bpf)
        except (OSError, bpf_attachments.EbpfError) as exc:
            if self._bpf and isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES, errno.ENOSYS):
                self._bpf = False
                log.info("tcx programs of links not listed: bpf refused", extra={"kv": {"error": str(exc)}})
                return self._programs(link, fd, tc)
            log.debug("eBPF programs not listed", extra={"kv": {"link": link.ifname, "error": str(exc)}})
            return None


def collect(netns: str | None = None) -> NetlinkFacts:
    """Dump links, addresses and routes once (in ``netns`` when given) and digest them."""
    with LinkQuery(netns) as query:
        return query.collect()


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
