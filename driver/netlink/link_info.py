"""What one ``RTM_GETLINK`` answer says about a link: :class:`LinkInfo`, parsed by :func:`link_info`.

The one parser of an ``RTM_NEWLINK`` payload: the hooks' and discovery's
(:mod:`driver.inventory.netlink_facts`). Only the attributes the driver uses are copied out of the
answer (which carries ~50, some of them kilobytes): name, MTU, MAC, flags and operational state,
what tells the link from every other one (its permanent address, bus parent, kind, peer;
:mod:`driver.netlink.link_identity`), its MTU limits, and for discovery its link type, alias and
master. A permanent address of all zeros (a virtual link's, where a kernel reports one) is no
permanent address.

Hand-written on purpose: pyroute2's ``ifinfmsg`` decodes every attribute of the answer, about ten
times the Python of reading only these, and a pod start reads each of its NICs two to three times
(host record, checks in the pod, the way back); ``bench.bench_hooks`` measures what the library
costs the pod path in the same run (docs/performance.md, "pyroute2 or hand-packed netlink").
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_IFALIAS,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_OPERSTATE,
    IFLA_PERM_ADDRESS,
    attr_list,
    mac_str,
    pick_attrs,
)

IFLA_LINK, IFLA_LINK_NETNSID, IFLA_NEW_IFINDEX = 5, 37, 49
IFLA_MIN_MTU, IFLA_MAX_MTU, IFLA_PARENT_DEV_NAME = 50, 51, 56


@dataclass
class LinkInfo:
    """The link facts the hooks need (from one RTM_GETLINK): what it is called and set to, and what
    tells it from every other link (:mod:`driver.netlink.link_identity`)."""

    index: int
    ifname: str
    mtu: int
    mac: str
    permanent_mac: str | None = None
    parent: str | None = None  # the bus device under the netdev (a PCI address), None for a virtual one
    kind: str | None = None  # rtnl link kind (veth, macvlan, vrf...), None for a physical NIC
    peer: int | None = None  # IFLA_LINK: the peer's or lower device's ifindex (in its own netns)
    peer_netnsid: int | None = None  # IFLA_LINK_NETNSID: the peer is in another netns (id as seen here)
    min_mtu: int | None = None
    max_mtu: int | None = None
    flags: int = 0  # IFF_* (IFF_UP: administratively up, IFF_LOWER_UP: carrier)
    operstate: int | None = None  # IF_OPER_* (RFC 2863), None when the kernel does not say
    arphrd: int = 0  # ifi_type: ARPHRD_* (1 Ethernet, 32 InfiniBand, 772 loopback, ...)
    alias: str | None = None  # IFLA_IFALIAS, None when empty
    master: int | None = None  # IFLA_MASTER: the bond's, bridge's or VRF's ifindex, None for none


_LINK_INFO_ATTRS = frozenset(
    {
        IFLA_IFNAME,
        IFLA_MTU,
        IFLA_ADDRESS,
        IFLA_PERM_ADDRESS,
        IFLA_PARENT_DEV_NAME,
        IFLA_LINKINFO,
        IFLA_LINK,
        IFLA_LINK_NETNSID,
        IFLA_MIN_MTU,
        IFLA_MAX_MTU,
        IFLA_OPERSTATE,
        IFLA_IFALIAS,
        IFLA_MASTER,
    }
)


def _u32(raw: bytes | None) -> int | None:
    return struct.unpack("=I", raw[:4])[0] if raw is not None and len(raw) >= 4 else None


def _s32(raw: bytes | None) -> int | None:
    return struct.unpack("=i", raw[:4])[0] if raw is not None and len(raw) >= 4 else None


def _kind(linkinfo: bytes | None) -> str | None:
    if not linkinfo:
        return None
    for kind, data in attr_list(linkinfo):
        if kind == IFLA_INFO_KIND:
            return data.split(b"\0", 1)[0].decode("ascii", "replace") or None
    return None


def link_info(payload: bytes) -> LinkInfo:
    """The :class:`LinkInfo` of an ``RTM_NEWLINK`` payload (a GETLINK answer or a dump entry)."""
    _fam, arphrd, index, flags, _change = IFINFOMSG.unpack_from(payload)
    attrs = pick_attrs(payload, IFINFOMSG.size, _LINK_INFO_ATTRS)
    perm, parent, peer = attrs.get(IFLA_PERM_ADDRESS), attrs.get(IFLA_PARENT_DEV_NAME), _s32(attrs.get(IFLA_LINK))
    alias = attrs.get(IFLA_IFALIAS)
    return LinkInfo(
        index=index,
        ifname=os.fsdecode(attrs[IFLA_IFNAME].split(b"\0", 1)[0]),  # any bytes: as os.listdir decodes
        mtu=struct.unpack("=I", attrs[IFLA_MTU])[0],
        mac=mac_str(attrs.get(IFLA_ADDRESS, b"")),
        permanent_mac=mac_str(perm) if perm and any(perm) else None,  # all zeros: none
        parent=os.fsdecode(parent.split(b"\0", 1)[0]) or None if parent else None,
        kind=_kind(attrs.get(IFLA_LINKINFO)),
        peer=peer if peer and peer != index else None,  # a physical NIC reports itself
        peer_netnsid=_s32(attrs.get(IFLA_LINK_NETNSID)),
        min_mtu=_u32(attrs.get(IFLA_MIN_MTU)),
        max_mtu=_u32(attrs.get(IFLA_MAX_MTU)),
        flags=flags,
        operstate=attrs[IFLA_OPERSTATE][0] if attrs.get(IFLA_OPERSTATE) else None,
        arphrd=arphrd,
        alias=alias.split(b"\0", 1)[0].decode(errors="replace") or None if alias else None,
        master=_u32(attrs.get(IFLA_MASTER)) or None,
    )
