"""Policy-routing rules (``ip rule``) and permanent neighbor entries (``ip neigh ... nud permanent``),
raw rtnetlink: the requests that add them and the dumps that record a host NIC's own.

A claim's ``rules`` and ``neighbors`` (and a cloud provider's rules) are added in the pod with the
NIC's addresses and routes, in the same pipelined batch (:mod:`driver.netlink.nic_moves`). A NIC's
host rules (source inside one of its addresses' networks, or ``iif``/``oif`` its name) and its
permanent neighbors are recorded before the move: the neighbors are flushed by the kernel when
the NIC leaves, the rules stay in the host; both are copied into the pod like the NIC's host
routes and put back on the host when the NIC returns.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any

from driver.netlink.rtnl import Request, Rtnl, mac_bytes
from driver.netlink_channel import NLM_F_CREATE, NLM_F_EXCL, RT_TABLE_MAIN, attr, mac_str, parse_attrs, text

RTM_NEWNEIGH, RTM_GETNEIGH = 28, 30
RTM_NEWRULE, RTM_GETRULE = 32, 34
NLM_F_REPLACE = 0x100
FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, res1, res2, action, flags
FRA_DST, FRA_SRC, FRA_IIFNAME, FRA_PRIORITY, FRA_TABLE, FRA_OIFNAME = 1, 2, 3, 6, 15, 17
FRA_FWMARK, FRA_L3MDEV = 10, 19
FR_ACT_TO_TBL = 1
NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
NDA_DST, NDA_LLADDR, NDA_IFINDEX = 1, 2, 8
NUD_PERMANENT = 0x80
DEFAULT_RULE_PRIORITIES = frozenset({0, 32766, 32767})  # lookup local, main, default: every netns has them


@dataclass(frozen=True)
class Rule:
    """One ``FR_ACT_TO_TBL`` rule, JSON-serializable (stored in the pod state as a dict)."""

    family: int = socket.AF_INET
    priority: int | None = None  # None: the kernel picks one
    src: str | None = None  # CIDR
    dst: str | None = None  # CIDR
    table: int = RT_TABLE_MAIN
    iifname: str | None = None
    oifname: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Pod state form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rule:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class Neighbor:
    """One permanent neighbor entry (IP -> link-layer address) on a NIC."""

    dst: str
    lladdr: str

    def to_dict(self) -> dict[str, Any]:
        """Pod state form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Neighbor:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def config_rule(priority: int | None, source: str | None, destination: str | None, table: int | None) -> Rule:
    """A claim's (or cloud provider's) rule; validated at prepare. No source or destination: IPv4 (as dranet)."""
    cidr = source or destination
    family = socket.AF_INET6 if cidr and ":" in cidr else socket.AF_INET
    return Rule(family=family, priority=priority, src=source, dst=destination, table=table or RT_TABLE_MAIN)


def newrule(device: str, rule: Rule, step: str = "rule") -> Request:
    """RTM_NEWRULE ``from src to dst [iif] [oif] lookup table [priority]``; an existing one is not an error."""
    src = ipaddress.ip_network(rule.src, strict=False) if rule.src else None
    dst = ipaddress.ip_network(rule.dst, strict=False) if rule.dst else None
    table = rule.table or RT_TABLE_MAIN
    body = FIB_RULE_HDR.pack(
        rule.family,
        dst.prefixlen if dst else 0,
        src.prefixlen if src else 0,
        0,
        table if table < 256 else 0,
        0,
        0,
        FR_ACT_TO_TBL,
        0,
    )
    body += attr(FRA_TABLE, struct.pack("=I", table))
    if rule.priority is not None:
        body += attr(FRA_PRIORITY, struct.pack("=I", rule.priority))
    if src is not None:
        body += attr(FRA_SRC, src.network_address.packed)
    if dst is not None:
        body += attr(FRA_DST, dst.network_address.packed)
    for kind, name in ((FRA_IIFNAME, rule.iifname), (FRA_OIFNAME, rule.oifname)):
        if name:
            body += attr(kind, name.encode() + b"\0")
    what = " ".join(
        f"{k} {v}" for k, v in (("from", rule.src), ("to", rule.dst), ("iif", rule.iifname), ("oif", rule.oifname)) if v
    )
    what = f"rule {what or 'all'} lookup {table}" + (f" priority {rule.priority}" if rule.priority is not None else "")
    return Request(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, body, device, step, what, (errno.EEXIST,))


def newneigh(device: str, index: int, neighbor: Neighbor, step: str = "neighbor") -> Request:
    """RTM_NEWNEIGH: ``neighbor`` as a permanent entry on ``index`` (replacing one for the same IP)."""
    ip = ipaddress.ip_address(neighbor.dst)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    body = NDMSG.pack(family, index, NUD_PERMANENT, 0, 0)
    body += attr(NDA_DST, ip.packed) + attr(NDA_LLADDR, mac_bytes(neighbor.lladdr))
    what = f"neighbor {neighbor.dst} lladdr {neighbor.lladdr}"
    return Request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body, device, step, what)


def parse_rule(payload: bytes) -> Rule | None:
    """A rule of an RTM_GETRULE dump, or None for what a NIC never owns (other actions, fwmark,
    l3mdev, the three default rules)."""
    family, dst_len, src_len, _tos, table, _r1, _r2, action, _flags = FIB_RULE_HDR.unpack_from(payload)
    attrs = parse_attrs(payload, FIB_RULE_HDR.size)
    if action != FR_ACT_TO_TBL or FRA_FWMARK in attrs or FRA_L3MDEV in attrs:
        return None
    priority = struct.unpack("=I", attrs[FRA_PRIORITY])[0] if FRA_PRIORITY in attrs else 0
    if FRA_TABLE in attrs:
        table = struct.unpack("=I", attrs[FRA_TABLE])[0]
    src = f"{ipaddress.ip_address(attrs[FRA_SRC])}/{src_len}" if FRA_SRC in attrs else None
    dst = f"{ipaddress.ip_address(attrs[FRA_DST])}/{dst_len}" if FRA_DST in attrs else None
    iif = text(attrs[FRA_IIFNAME]) if FRA_IIFNAME in attrs else None
    oif = text(attrs[FRA_OIFNAME]) if FRA_OIFNAME in attrs else None
    if priority in DEFAULT_RULE_PRIORITIES and not (src or dst or iif or oif):
        return None
    return Rule(family=family, priority=priority, src=src, dst=dst, table=table, iifname=iif, oifname=oif)


def host_rules(rtnl: Rtnl) -> list[Rule]:
    """Every rule of ``rtnl``'s netns (one dump, both families) except the default ones."""
    rules = (parse_rule(p) for p in rtnl.dump(RTM_GETRULE, FIB_RULE_HDR.pack(socket.AF_UNSPEC, *(0,) * 8)))
    return [r for r in rules if r is not None]


def rules_of(rules: list[Rule], ifname: str, addresses: list[str]) -> list[Rule]:
    """The rules that belong to one NIC: ``iif``/``oif`` its name, or a source network holding one
    of its addresses (a source of length 0, "from all", belongs to no NIC)."""
    ips = [ipaddress.ip_interface(a).ip for a in addresses]
    out = []
    for rule in rules:
        if ifname in (rule.iifname, rule.oifname):
            out.append(rule)
        elif rule.src and not rule.src.endswith("/0"):
            net = ipaddress.ip_network(rule.src, strict=False)
            if any(ip.version == net.version and ip in net for ip in ips):
                out.append(rule)
    return out


def permanent_neighbors(rtnl: Rtnl, index: int) -> list[Neighbor]:
    """The permanent neighbor entries on link ``index`` (one dump the kernel filters by link when
    strict checking is on)."""
    body = NDMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    if rtnl.strict():
        body += attr(NDA_IFINDEX, struct.pack("=I", index))
    out = []
    for payload in rtnl.dump(RTM_GETNEIGH, body):
        _family, ifindex, state, _flags, _type = NDMSG.unpack_from(payload)
        attrs = parse_attrs(payload, NDMSG.size)
        if ifindex == index and state & NUD_PERMANENT and NDA_DST in attrs and NDA_LLADDR in attrs:
            out.append(Neighbor(str(ipaddress.ip_address(attrs[NDA_DST])), mac_str(attrs[NDA_LLADDR])))
    return out
