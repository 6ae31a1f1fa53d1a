"""Decoding of the ``interface`` object of a ``dra.net`` config (part of :mod:`driver.api.v1alpha1.decode`).

How the NIC looks in the pod: its name, addresses (or DHCP), MTU, MAC, offload size limits,
per-interface sysctls, eBPF detachment and VRF. Every reader records its errors with the field
path and returns ``None`` for a refused value, so one pass reports every mistake.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from driver.api.v1alpha1.fields import (
    MAX_TABLE,
    FieldErrors,
    json_type_name,
    read_bool,
    read_int,
    read_object,
    read_str,
    shown,
)
from driver.api.v1alpha1.network_config import InterfaceConfig, VrfConfig

MAX_IFNAME_LENGTH = 15  # IFNAMSIZ - 1
MIN_MTU = 68  # RFC 791 minimum; the kernel refuses less for IPv4
MAX_MTU = 65536  # the largest max_mtu any Linux netdev reports (loopback)
# Matched with fullmatch: "$" would also accept a trailing newline ("net1\n").
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
RESERVED_IFNAMES = frozenset({"all", "default"})
"""Names that collide with the kernel's per-interface sysctl directories
(``/proc/sys/net/ipv4/conf/{all,default}``): the kernel refuses to rename a NIC so."""


def decode_ifname(raw: Any, path: str, errs: FieldErrors) -> str | None:
    """An interface name the kernel accepts for a NIC in a pod (``None`` after an error)."""
    name = read_str(raw, path, errs)
    if name is None:
        return None
    if not name:
        errs.add(path, "must not be empty")
    elif len(name) > MAX_IFNAME_LENGTH:
        errs.add(path, f"{name!r} is {len(name)} characters; Linux allows at most {MAX_IFNAME_LENGTH}")
    elif name in (".", ".."):
        errs.add(path, f"{name!r} is not a valid interface name")
    elif name in RESERVED_IFNAMES:
        errs.add(path, f"{name!r} is reserved (the kernel's per-interface settings use 'all' and 'default')")
    elif not _IFNAME_RE.fullmatch(name):
        errs.add(path, f"{name!r} may contain only letters, digits, '-', '_' and '.'")
    elif name == "lo":
        # Every pod namespace already has "lo"; the rename would fail at pod start.
        errs.add(path, "'lo' already exists in every pod network namespace")
    else:
        return name
    return None


def decode_mac(raw: Any, path: str, errs: FieldErrors) -> str | None:
    """A unicast, non-zero Ethernet MAC in lower case (``None`` after an error)."""
    mac = read_str(raw, path, errs)
    if mac is None:
        return None
    if not _MAC_RE.fullmatch(mac):
        errs.add(path, f"{mac!r} is not a MAC address (six hex octets separated by ':')")
        return None
    first = int(mac[:2], 16)
    if first & 1:
        errs.add(path, f"{mac!r} is a multicast address; a NIC needs a unicast address")
        return None
    if int(mac.replace(":", ""), 16) == 0:
        errs.add(path, "the all-zero MAC address cannot be assigned")
        return None
    return mac.lower()


def _decode_addresses(raw: Any, path: str, errs: FieldErrors) -> tuple[str, ...] | None:
    """``interface.addresses``: CIDRs with a prefix length, no zone, no duplicates; canonical form."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        errs.add(path, f"must be an array of CIDR strings, got {json_type_name(raw)}")
        return None
    seen: set[str] = set()
    out: list[str] = []
    for i, item in enumerate(raw):
        ipath = f"{path}[{i}]"
        text = read_str(item, ipath, errs)
        if text is None:
            if item is None:
                errs.add(ipath, "must be a CIDR string, got null")
            continue
        if "/" not in text:
            errs.add(ipath, f"{text!r} has no prefix length (write e.g. 192.0.2.5/24)")
            continue
        if "%" in text:
            errs.add(ipath, f"{text!r} has a zone (%...): the zone of an address in a pod is its interface")
            continue
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError:
            errs.add(ipath, f"{text!r} is not a CIDR address")
            continue
        canonical = iface.with_prefixlen
        if canonical in seen:
            errs.add(ipath, f"{text!r} is listed twice")
            continue
        refused = _unassignable(iface) or _ipv6_again(iface, out)
        if refused:
            errs.add(ipath, f"{text!r} {refused}")
            continue
        seen.add(canonical)
        out.append(canonical)
    return tuple(out)


def _unassignable(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> str | None:
    """Why the kernel refuses (or, for 0.0.0.0, acknowledges and keeps nothing of) ``iface`` as a
    NIC's address, if it does."""
    ip = iface.ip
    if ip.is_unspecified:
        return "is the unspecified address; a NIC cannot hold it"
    if ip.version == 6 and ip.is_loopback:
        return "is IPv6's loopback address; the kernel allows it on lo only"
    if ip.version == 6 and ip.is_multicast:
        return "is an IPv6 multicast address; a NIC's address must be unicast"
    return None


def _ipv6_again(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface, earlier: list[str]) -> str | None:
    """The same IPv6 address at another prefix length: the kernel keeps an IPv6 address once."""
    if iface.version != 6:
        return None
    for other in earlier:
        if ":" in other and ipaddress.ip_interface(other).ip == iface.ip:
            return f"is {other} again at another prefix length; a NIC holds an IPv6 address only once"
    return None


IPV6_MIN_MTU = 1280  # RFC 8200: the kernel turns IPv6 off on a link below it


def ipv6_mtu_error(iface: InterfaceConfig | None) -> str | None:
    """An MTU below IPv6's minimum with IPv6 addresses to assign: the kernel refuses every one."""
    if iface is None or iface.mtu is None or iface.mtu >= IPV6_MIN_MTU:
        return None
    v6 = [a for a in iface.addresses or () if ":" in a]
    if not v6:
        return None
    return f"{iface.mtu} is below {IPV6_MIN_MTU}, the IPv6 minimum: the kernel would refuse {v6[0]}"


MAX_OFFLOAD_SIZE = 2**31 - 1  # dranet's int32; the NIC's own limit is checked at prepare and in the hook
ARP_IGNORE_VALUES = (0, 1, 2, 3, 8)  # the levels net.ipv4.conf.<if>.arp_ignore defines
MAX_ARP_ANNOUNCE = 2
RESERVED_TABLES = {253: "default", 254: "main", 255: "local"}
INTERFACE_FIELDS = [
    "name",
    "addresses",
    "dhcp",
    "mtu",
    "hardwareAddr",
    "gsoMaxSize",
    "groMaxSize",
    "gsoIPv4MaxSize",
    "groIPv4MaxSize",
    "disableEbpfPrograms",
    "forwarding",
    "arpIgnore",
    "arpAnnounce",
    "vrf",
    "type",
]
SUB_INTERFACE_TYPES = ("macvlan", "ipvlan")
"""``interface.type``: the kernel's link kinds of a sub-interface (dranet writes ``IPVLAN``)."""


def _decode_type(raw: Any, path: str, errs: FieldErrors) -> str | None:
    """``interface.type``, in any case (dranet's ``IPVLAN``), as the kernel's link kind."""
    text = read_str(raw, path, errs)
    if text is None:
        return None
    if text.lower() not in SUB_INTERFACE_TYPES:
        errs.add(path, f"{shown(text)} is not a sub-interface type ({', '.join(SUB_INTERFACE_TYPES)})")
        return None
    return text.lower()


def _decode_vrf(raw: Any, path: str, errs: FieldErrors) -> VrfConfig | None:
    """``interface.vrf``: a name (required, an interface name) and an optional table (not 253-255)."""
    obj = read_object(raw, path, ["name", "table"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    if obj.get("name") is None:
        errs.add(f"{path}.name", "is required (the VRF device's name in the pod, e.g. vrf-blue)")
    name = decode_ifname(obj.get("name"), f"{path}.name", errs)
    table = read_int(obj.get("table"), f"{path}.table", errs, 1, MAX_TABLE)
    if table in RESERVED_TABLES:
        errs.add(f"{path}.table", f"{table} is the kernel's {RESERVED_TABLES[table]} table; a VRF needs its own")
    return None if len(errs.items) != before else VrfConfig(name=name, table=table)


def decode_interface(raw: Any, path: str, errs: FieldErrors) -> InterfaceConfig | None:
    """``interface``: every field of :class:`InterfaceConfig`, with the rules of docs/configuration.md."""
    obj = read_object(raw, path, INTERFACE_FIELDS, errs)
    if obj is None:
        return None
    sizes = {
        key: read_int(obj.get(key), f"{path}.{key}", errs, 1, MAX_OFFLOAD_SIZE)
        for key in ("gsoMaxSize", "groMaxSize", "gsoIPv4MaxSize", "groIPv4MaxSize")
    }
    arp_ignore = read_int(obj.get("arpIgnore"), f"{path}.arpIgnore", errs, 0, max(ARP_IGNORE_VALUES))
    if arp_ignore is not None and arp_ignore not in ARP_IGNORE_VALUES:
        errs.add(f"{path}.arpIgnore", f"{arp_ignore} is not an arp_ignore level (0, 1, 2, 3 or 8)")
        arp_ignore = None
    config = InterfaceConfig(
        name=decode_ifname(obj.get("name"), f"{path}.name", errs),
        addresses=_decode_addresses(obj.get("addresses"), f"{path}.addresses", errs),
        dhcp=read_bool(obj.get("dhcp"), f"{path}.dhcp", errs),
        mtu=read_int(obj.get("mtu"), f"{path}.mtu", errs, MIN_MTU, MAX_MTU),
        hardware_addr=decode_mac(obj.get("hardwareAddr"), f"{path}.hardwareAddr", errs),
        gso_max_size=sizes["gsoMaxSize"],
        gro_max_size=sizes["groMaxSize"],
        gso_ipv4_max_size=sizes["gsoIPv4MaxSize"],
        gro_ipv4_max_size=sizes["groIPv4MaxSize"],
        disable_ebpf_programs=read_bool(obj.get("disableEbpfPrograms"), f"{path}.disableEbpfPrograms", errs),
        forwarding=read_bool(obj.get("forwarding"), f"{path}.forwarding", errs),
        arp_ignore=arp_ignore,
        arp_announce=read_int(obj.get("arpAnnounce"), f"{path}.arpAnnounce", errs, 0, MAX_ARP_ANNOUNCE),
        vrf=None if obj.get("vrf") is None else _decode_vrf(obj["vrf"], f"{path}.vrf", errs),
        type=_decode_type(obj.get("type"), f"{path}.type", errs),
    )
    return config
