"""Policy-routing rules (``ip rule``) of a NIC: the claim's in the pod, the host's carried along and back.

A claim's ``rules`` (and a cloud provider's, merged under them at prepare) are added in the pod in
its configuration batch. A NIC's host rules (source inside one of its addresses' networks,
``iif``/``oif`` its name, or a lookup in a table it has routes in other than main) are recorded
before the move, from one dump of the host's rules for all the pod's NICs; they stay in the host
when the NIC leaves, and are copied into the pod (naming the NIC as the pod knows it) when the NIC
keeps its host addresses, the claim sets no rule of its own and no VRF decides the lookup;
otherwise, as dranet, those looking up its policy tables still are (their routes come along,
:func:`~driver.nic_settings.addresses.pod_addresses`). They are added on the host again when the
NIC returns (one still there is no error).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import MovedDevice
from driver.netlink.channel import NLM_F_CREATE, NLM_F_EXCL, RT_TABLE_MAIN, attr, parse_attrs, text
from driver.netlink.rtnl import Request, Rtnl
from driver.nic_settings.addresses import keeps_host_addresses, policy_tables
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns

RTM_NEWRULE, RTM_GETRULE = 32, 34
FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, res1, res2, action, flags
FRA_DST, FRA_SRC, FRA_IIFNAME, FRA_PRIORITY, FRA_TABLE, FRA_OIFNAME = 1, 2, 3, 6, 15, 17
FRA_FWMARK, FRA_L3MDEV = 10, 19
FR_ACT_TO_TBL = 1
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


def rules_of(rules: list[Rule], ifname: str, addresses: list[str], tables: Collection[int] = ()) -> list[Rule]:
    """The rules that belong to one NIC: ``iif``/``oif`` its name, a source network holding one
    of its addresses (a source of length 0, "from all", belongs to no NIC), or a lookup in one of
    ``tables`` (the NIC's policy tables, :func:`~driver.nic_settings.addresses.policy_tables`)."""
    ips = [ipaddress.ip_interface(a).ip for a in addresses]
    out = []
    for rule in rules:
        if ifname in (rule.iifname, rule.oifname) or rule.table in tables:
            out.append(rule)
        elif rule.src and not rule.src.endswith("/0"):
            net = ipaddress.ip_network(rule.src, strict=False)
            if any(ip.version == net.version and ip in net for ip in ips):
                out.append(rule)
    return out


def _host_rule_in_pod(rule: Rule, host_name: str, pod_name: str) -> Rule:
    """A host rule naming the NIC (iif/oif) names it as the pod knows it."""
    return replace(
        rule,
        iifname=pod_name if rule.iifname == host_name else rule.iifname,
        oifname=pod_name if rule.oifname == host_name else rule.oifname,
    )


def pod_rules(
    config: NetworkConfig,
    cloud: NetworkConfig | None,
    host_name: str,
    pod_name: str,
    host: list[Rule],
    vrf: bool,
    tables: Collection[int] = (),
) -> list[Rule]:
    """The rules added in the pod for a NIC: the claim's (with the cloud provider's), after its host
    rules (``host``, renamed). All of those when it keeps its host addresses and sets no rule of its
    own; otherwise those that look up one of its policy ``tables`` (whose routes it carries, as
    dranet). None in a VRF (the VRF's table decides the lookup)."""
    rules = [config_rule(r.priority, r.source, r.destination, r.table) for r in config.rules or ()]
    cloud_rules = set(cloud.rules or ()) if cloud is not None else set()
    if vrf:
        return rules
    if keeps_host_addresses(config) and all(r in cloud_rules for r in config.rules or ()):
        carried = host
    else:
        carried = [r for r in host if r.table in tables]
    return [_host_rule_in_pod(r, host_name, pod_name) for r in carried if r not in rules] + rules


NAME = "rules"


def _recorded(records: dict[str, Any]) -> list[Rule]:
    return [Rule.from_dict(r) for r in records.get(NAME) or ()]


class Rules(NicSetting):
    """The claim's ``rules`` in the pod; the NIC's host rules carried along and put back."""

    name = NAME
    sub_interfaces = True  # the claim's own entries; the host's are carried only with a NIC that moves

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Record each NIC's host rules (one dump of the host's rules for every NIC)."""
        if not any(not n.sub_interface for n in nics):
            return
        rules = host_rules(host.rtnl())
        for nic in (n for n in nics if not n.sub_interface):
            mine = rules_of(rules, nic.host.ifname, nic.host.addresses, policy_tables(nic.host.routes))
            if mine:
                nic.records[self.name] = [r.to_dict() for r in mine]

    def requests(self, nic: Nic) -> list[Request]:
        found = pod_rules(
            nic.config,
            nic.device.cloud_config,
            nic.host.ifname,
            nic.pod.ifname,
            _recorded(nic.records),
            nic.pod.table is not None,
            policy_tables(nic.host.routes),
        )
        return [newrule(nic.name, r) for r in found]

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        return [newrule(nic.device, r) for r in _recorded(nic.records)]
