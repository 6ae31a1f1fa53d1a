"""Hand-packed rtnetlink: the hot path of NIC moves.

:class:`Rtnl` is a ``NETLINK_ROUTE`` :class:`~driver.netlink.channel.NetlinkChannel` bound to
one network namespace. Requests (:class:`Request`, built by :func:`newlink`, :func:`newaddr`,
:func:`newroute`) are pipelined: all of a pod's addresses, link-ups and routes go to the kernel
in one ``send`` and each one's ack or error is matched by sequence number; lookups of several
links are pipelined too, and the slow paths' dumps (every link) use the same socket. Only what
the driver needs is encoded here.

Why not pyroute2's message classes: ``bench.bench_hooks`` runs the floor's kernel work of a pod
start (4 moves and renames; addresses, link-ups, routes) through pyroute2 in the same cycles, and
its messages sent in one batch on its socket cost more per RunPodSandbox and per StopPodSandbox
than the project's 1 ms rule allows (its asyncio API more still); encoding one request costs
pyroute2 about fifteen times what it costs here, and the driver's path sends about three times the
floor's messages (the numbers, dated: docs/performance.md, "pyroute2 or hand-packed netlink").
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import random
import socket
import struct
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from driver.netlink.channel import (
    IFA_ADDRESS,
    IFA_LOCAL,
    IFADDRMSG,
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_IFNAME,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    NETLINK_GET_STRICT_CHK,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    RT_TABLE_MAIN,
    RTA_DST,
    RTA_GATEWAY,
    RTA_OIF,
    RTA_PREFSRC,
    RTA_PRIORITY,
    RTA_TABLE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RTMSG,
    RTN_UNICAST,
    SKIP_STATS,
    SOL_NETLINK,
    NetlinkChannel,
    Reply,
    attr,
    parse_attrs,
    pick_attrs,
)
from driver.netlink.link_info import IFLA_NEW_IFINDEX, LinkInfo, link_info

RT_TABLE_DEFAULT, RT_TABLE_LOCAL = 253, 255
RTPROT_KERNEL = 2
RT_SCOPE_UNIVERSE = 0
IFA_FLAGS = 8
# ifa_flags: no duplicate address detection; detection failed (the address is in use on the link);
# detection still running (the address cannot be bound yet).
IFA_F_NODAD, IFA_F_OPTIMISTIC, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x04, 0x08, 0x40


class NetnsOpError(Exception):
    """A netlink step failed for one device; the message names both."""

    def __init__(self, device: str, step: str, reason: str, errno: int = 0) -> None:
        super().__init__(f"device {device}: {step} failed: {reason}")
        self.device = device
        self.step = step
        self.reason = reason
        self.errno = errno  # the kernel's, when a request failed (0: not a request's failure)


@dataclass
class Route:
    """One route through a NIC, JSON-serializable (stored in the checkpoint as a dict)."""

    dst: str | None = None  # CIDR; None = default route
    gateway: str | None = None
    prefsrc: str | None = None
    table: int = RT_TABLE_MAIN
    priority: int | None = None
    scope: int = RT_SCOPE_UNIVERSE
    proto: int = 3  # RTPROT_BOOT, what `ip route add` uses
    family: int = socket.AF_INET

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form (``dataclasses.asdict`` deep-copies every field: 10x slower)."""
        return {f: getattr(self, f) for f in _ROUTE_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Route:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


IFF_UP = 0x1


_ROUTE_FIELDS = tuple(f.name for f in fields(Route))


def ip_attr(attrs: dict[int, bytes], kind: int) -> str | None:
    """The IP address in attribute ``kind`` as text, or None when absent."""
    return str(ipaddress.ip_address(attrs[kind])) if kind in attrs else None


def mac_bytes(mac: str) -> bytes:
    """``aa:bb:..`` as raw bytes."""
    return bytes(int(x, 16) for x in mac.split(":"))


@dataclass
class Request:
    """One rtnetlink request and how to name it in an error (device, step, what)."""

    kind: int
    flags: int
    body: bytes
    device: str
    step: str
    what: str
    ignore: tuple[int, ...] = ()


_IFNAME = frozenset({IFLA_IFNAME})


class Rtnl(NetlinkChannel):
    """A raw NETLINK_ROUTE socket bound to one netns; requests are pipelined in one send."""

    _strict: bool | None = None

    def strict(self) -> bool:
        """Turn on strict checking, so dumps honour their filters (one link's addresses, one
        interface's routes); False on kernels without it (< 4.20), whose dumps are unfiltered."""
        if self._strict is None:
            try:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                self._strict = True
            except OSError:
                self._strict = False
        return self._strict

    def link(self, ifname: str) -> LinkInfo | None:
        """RTM_GETLINK by name; None when there is no such link."""
        return self.links_by_name([ifname])[0]

    def links_by_name(self, ifnames: list[str]) -> list[LinkInfo | None]:
        """RTM_GETLINK for each name, pipelined in one send; None where there is no such link."""
        return self._links([(0, name) for name in ifnames])

    def links_by_index(self, indexes: list[int]) -> list[LinkInfo | None]:
        """RTM_GETLINK for each ifindex, pipelined in one send; None where there is no such link."""
        return self._links([(index, None) for index in indexes])

    def _links(self, keys: list[tuple[int, str | None]]) -> list[LinkInfo | None]:
        if not keys:
            return []
        return _looked_up(keys, self.exchange(_link_gets(keys)))

    def run_each_then_links(
        self, reqs: list[Request], indexes: list[int]
    ) -> tuple[list[NetnsOpError | None], list[LinkInfo | None]]:
        """:meth:`run_each` of ``reqs``, then :meth:`links_by_index` of ``indexes``, in one pipelined
        send (the kernel answers the lookups after the changes): one round trip for both."""
        keys: list[tuple[int, str | None]] = [(index, None) for index in indexes]
        answers = self.exchange(
            [(r.kind, r.flags | NLM_F_REQUEST | NLM_F_ACK, r.body) for r in reqs] + _link_gets(keys)
        )
        return _failures(reqs, answers[: len(reqs)]), _looked_up(keys, answers[len(reqs) :])

    def links(self) -> list[LinkInfo]:
        """Every link of this netns (one RTM_GETLINK dump)."""
        return [link_info(p) for p in self.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))]

    def link_names(self) -> dict[int, str]:
        """ifindex -> name of every link of this netns (one dump; only the name is read of each)."""
        out = {}
        for payload in self.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + SKIP_STATS):
            index = IFINFOMSG.unpack_from(payload)[2]
            name = pick_attrs(payload, IFINFOMSG.size, _IFNAME).get(IFLA_IFNAME, b"")
            out[index] = os.fsdecode(name.split(b"\0", 1)[0])
        return out

    def run(self, reqs: list[Request]) -> None:
        """Pipeline ``reqs`` (processed in order by the kernel); raise for the first failure."""
        for err in self.run_each(reqs):
            if err is not None:
                raise err

    def run_each(self, reqs: list[Request]) -> list[NetnsOpError | None]:
        """Pipeline ``reqs`` in one send; each one's failure (or None), in order.

        The kernel processes every request even after one fails, so requests of different
        devices can share a batch and each device gets its own answer.
        """
        if not reqs:
            return []
        return _failures(reqs, self.exchange([(r.kind, r.flags | NLM_F_REQUEST | NLM_F_ACK, r.body) for r in reqs]))


def _failures(reqs: list[Request], answers: list[Reply]) -> list[NetnsOpError | None]:
    """Each request's failure (or None), from its answer."""
    out: list[NetnsOpError | None] = []
    for req, answer in zip(reqs, answers, strict=True):
        err = answer.error
        failed = err and err not in req.ignore
        out.append(NetnsOpError(req.device, req.step, f"{req.what}: {os.strerror(err)}", err) if failed else None)
    return out


def _link_gets(keys: list[tuple[int, str | None]]) -> list[tuple[int, int, bytes]]:
    """An RTM_GETLINK per (ifindex, name) key (0 and a name: by name)."""
    reqs = []
    for index, ifname in keys:
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + SKIP_STATS
        if ifname is not None:
            body += attr(IFLA_IFNAME, ifname.encode() + b"\0")
        reqs.append((RTM_GETLINK, NLM_F_REQUEST, body))
    return reqs


def _looked_up(keys: list[tuple[int, str | None]], replies: list[Reply]) -> list[LinkInfo | None]:
    """The links the RTM_GETLINKs of ``keys`` found (None: no such link)."""
    out: list[LinkInfo | None] = []
    for (index, ifname), reply in zip(keys, replies, strict=True):
        err = reply.error
        if err == errno.ENODEV:
            out.append(None)
        elif err:
            raise OSError(err, f"RTM_GETLINK {ifname or index}: {os.strerror(err)}")
        else:
            out.append(link_info(reply.payloads[0]))
    return out


def newlink(
    device: str,
    index: int,
    *,
    ns_fd: int | None = None,
    ifname: str | None = None,
    mtu: int | None = None,
    mac: str | None = None,
    up: bool | None = None,
    master: int | None = None,
    new_index: int | None = None,
    extra: bytes = b"",
    step: str = "link",
) -> Request:
    """RTM_NEWLINK on ``index``: move (``ns_fd``, to ifindex ``new_index`` there), rename, MTU, MAC,
    master (0: none) and/or up/down in one request; ``extra``: more attributes, already encoded
    (offload sizes).

    With ``new_index`` the kernel refuses the move (EBUSY) before anything happens when the index
    is taken in the target, and otherwise the link is at that index there even when the rest of
    the request fails after the move (a rename to a name in use): it can always be found again."""
    flags = IFF_UP if up else 0
    change = IFF_UP if up is not None else 0
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change)
    if ns_fd is not None:
        body += attr(IFLA_NET_NS_FD, struct.pack("=I", ns_fd))
        if new_index is not None:
            body += attr(IFLA_NEW_IFINDEX, struct.pack("=i", new_index))
    if ifname is not None:
        body += attr(IFLA_IFNAME, ifname.encode() + b"\0")
    if mtu is not None:
        body += attr(IFLA_MTU, struct.pack("=I", mtu))
    if mac is not None:
        body += attr(IFLA_ADDRESS, mac_bytes(mac))
    if master is not None:
        body += attr(IFLA_MASTER, struct.pack("=I", master))
    body += extra
    what = ", ".join(
        f"{k}={v}"
        for k, v in (("netns", ns_fd), ("name", ifname), ("mtu", mtu), ("mac", mac), ("up", up), ("master", master))
        if v is not None
    )
    return Request(RTM_NEWLINK, 0, body, device, step, what)


@functools.lru_cache(maxsize=1024)
def _interface(cidr: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    # The same few CIDRs come back at every pod start and stop: parse each once.
    return ipaddress.ip_interface(cidr)


@functools.lru_cache(maxsize=1024)
def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(cidr, strict=False)


@functools.lru_cache(maxsize=1024)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def newaddr(device: str, index: int, cidr: str, step: str = "address", dad: bool = True) -> Request:
    """RTM_NEWADDR of ``cidr`` (global scope); an existing address is not an error. ``dad`` False:
    an IPv6 address usable at once, without duplicate address detection (one this link already
    held and checked); True: detected optimistically (RFC 4429), usable at once too where the
    link's ``optimistic_dad`` is set (the kernel drops the flag where it is not)."""
    iface = _interface(cidr)
    family = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
    flags = (IFA_F_OPTIMISTIC if dad else IFA_F_NODAD) if iface.version == 6 else 0
    body = IFADDRMSG.pack(family, iface.network.prefixlen, flags, RT_SCOPE_UNIVERSE, index)
    body += attr(IFA_LOCAL, iface.ip.packed) + attr(IFA_ADDRESS, iface.ip.packed)
    return Request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, device, step, cidr, (errno.EEXIST,))


RTM_DELADDR = 21


def canonical_cidr(cidr: str) -> str:
    """``cidr`` as the kernel's address dump gives it back (``fd00::1/64``, ``10.0.0.1/24``)."""
    return _interface(cidr).with_prefixlen


def dump_addresses(rtnl: Rtnl, scope: int | None = None) -> Iterator[tuple[int, str]]:
    """Every address of ``rtnl``'s netns as ``(ifindex, CIDR)``, from one dump (only ``scope``'s,
    when given)."""
    for payload in rtnl.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        found = dumped_address(payload, scope)
        if found is not None:
            yield found


def link_addresses(rtnl: Rtnl, indexes: Container[int]) -> dict[int, set[str]]:
    """The addresses (every scope) on the links ``indexes`` of ``rtnl``'s netns, from one dump."""
    out: dict[int, set[str]] = {}
    for index, cidr in dump_addresses(rtnl):
        if index in indexes:
            out.setdefault(index, set()).add(cidr)
    return out


def dumped_address(payload: bytes, scope: int | None = None) -> tuple[int, str] | None:
    """An address dump entry as ``(ifindex, CIDR)``; None for another ``scope`` (when given)."""
    _family, prefixlen, _flags, got_scope, index = IFADDRMSG.unpack_from(payload)
    if scope is not None and got_scope != scope:
        return None
    attrs = parse_attrs(payload, IFADDRMSG.size)
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)  # IFA_LOCAL: ours on point-to-point links
    return (index, f"{ipaddress.ip_address(raw)}/{prefixlen}") if raw else None


def ipv6_address_states(rtnl: Rtnl, indexes: Container[int]) -> dict[tuple[int, str], int]:
    """``(ifindex, CIDR) -> flags`` of every IPv6 address on the links ``indexes``, from one dump
    (the 32-bit ``IFA_FLAGS`` where the kernel sends it: ``IFA_F_TENTATIVE``, ``IFA_F_DADFAILED``)."""
    out: dict[tuple[int, str], int] = {}
    for payload in rtnl.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_INET6, 0, 0, 0, 0)):
        found = dumped_address(payload)
        if found is not None and found[0] in indexes:
            wide = parse_attrs(payload, IFADDRMSG.size).get(IFA_FLAGS)
            out[found] = struct.unpack("=I", wide[:4])[0] if wide else IFADDRMSG.unpack_from(payload)[2]
    return out


def deladdr(device: str, index: int, cidr: str, step: str = "address") -> Request:
    """RTM_DELADDR of ``cidr``; an address already gone is not an error."""
    iface = _interface(cidr)
    family = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
    body = IFADDRMSG.pack(family, iface.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    body += attr(IFA_LOCAL, iface.ip.packed) + attr(IFA_ADDRESS, iface.ip.packed)
    return Request(RTM_DELADDR, 0, body, device, step, f"delete {cidr}", (errno.EADDRNOTAVAIL, errno.ENODEV))


def newroute(device: str, index: int, route: Route, step: str = "route") -> Request:
    """RTM_NEWROUTE through ``index``; an existing route is not an error."""
    dst = _network(route.dst) if route.dst else None
    table = route.table or RT_TABLE_MAIN
    body = RTMSG.pack(
        route.family,
        dst.prefixlen if dst else 0,
        0,
        0,
        table if table < 256 else 0,
        route.proto,
        route.scope,
        RTN_UNICAST,
        0,
    )
    body += attr(RTA_TABLE, struct.pack("=I", table)) + attr(RTA_OIF, struct.pack("=i", index))
    if dst is not None:
        body += attr(RTA_DST, dst.network_address.packed)
    if route.gateway:
        body += attr(RTA_GATEWAY, _address(route.gateway).packed)
    if route.prefsrc:
        body += attr(RTA_PREFSRC, _address(route.prefsrc).packed)
    if route.priority is not None:
        body += attr(RTA_PRIORITY, struct.pack("=I", route.priority))
    what = f"{route.dst or 'default'} via {route.gateway or '-'} table {table}"
    return Request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, device, step, what, (errno.EEXIST,))


def restorable_route(payload: bytes, oifs: Container[int]) -> tuple[int, Route] | None:
    """A route dump's entry through one of ``oifs``, as ``(ifindex, Route)``: what :func:`newroute` recreates.

    None for routes through other links and for those a return must not recreate: what the
    kernel makes by itself (``proto kernel``, the local table), non-unicast and multipath (no
    RTA_OIF) routes. The header is checked before the attributes are parsed: an unfiltered dump
    (kernels without strict checking) is mostly other links' routes.
    """
    family, dst_len, _src_len, _tos, table, proto, scope, rtype, _flags = RTMSG.unpack_from(payload)
    if rtype != RTN_UNICAST or proto == RTPROT_KERNEL:
        return None
    attrs = parse_attrs(payload, RTMSG.size)
    oif = attrs.get(RTA_OIF)
    index = struct.unpack("=i", oif)[0] if oif else None
    if index is None or index not in oifs:
        return None
    if RTA_TABLE in attrs:
        table = struct.unpack("=I", attrs[RTA_TABLE])[0]
    if table == RT_TABLE_LOCAL:
        return None
    dst = ip_attr(attrs, RTA_DST)
    route = Route(
        dst=f"{dst}/{dst_len}" if dst is not None else None,
        gateway=ip_attr(attrs, RTA_GATEWAY),
        prefsrc=ip_attr(attrs, RTA_PREFSRC),
        table=table,
        priority=struct.unpack("=I", attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else None,
        scope=scope,
        proto=proto,
        family=family,
    )
    return index, route


INDEX_SEARCH_BASE = 1 << 20
"""Where a free ifindex is looked for when the preferred one is taken: far above what the kernel
hands out (it counts up from 1 per namespace), so a pick is almost always free at once."""


def free_indexes(
    rtnl: Rtnl, preferred: Sequence[int], taken: set[int] | None = None, also: Rtnl | None = None
) -> list[int]:
    """An ifindex per entry of ``preferred``, free in ``rtnl``'s namespace and distinct: the preferred
    one when free, else one far above what the kernel hands out (0: no preference). ``taken``: the
    indexes in use when known (a dump); else one pipelined lookup per round. ``also``: another
    namespace where the index must be free too (one pipelined lookup per round).

    A link created between this check and the move makes the move fail (EBUSY) before it happens.
    """
    out = list(preferred)
    rng = random.SystemRandom()
    pending = list(range(len(out)))
    for _ in range(8):
        asked = [out[i] for i in pending if out[i] > 0]  # 0: no preference, nothing to look up
        busy = set(taken) if taken is not None else set()
        for ns in (rtnl if taken is None else None, also):
            if ns is not None and asked:
                busy |= {index for index, link in zip(asked, ns.links_by_index(asked), strict=True) if link}
        used = {out[j] for j in range(len(out)) if j not in pending}
        retry = []
        for i in pending:
            if out[i] <= 0 or out[i] in busy or out[i] in used:
                retry.append(i)
            else:
                used.add(out[i])
        if not retry:
            return out
        for i in retry:
            out[i] = INDEX_SEARCH_BASE + rng.randrange(1 << 28)
        pending = retry
    raise OSError("no free interface index found")
