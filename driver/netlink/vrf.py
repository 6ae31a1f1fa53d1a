"""VRF devices in a pod (``ip link add NAME type vrf table N``), raw rtnetlink.

A claim's ``interface.vrf`` puts the NIC into a VRF device created in the pod: created and set up
before the NIC's addresses, the NIC enslaved to it (``IFLA_MASTER``), every route of the NIC in
the VRF's table. At return the NIC is released (master 0) and the VRF deleted before the NIC
moves back. NICs of one pod naming the same VRF share it. A kernel built without VRF support
(``CONFIG_NET_VRF``) answers the create with ``EOPNOTSUPP``: the pod is refused with a message
that says so (:data:`NO_VRF`).
"""

from __future__ import annotations

import errno
import socket
import struct

from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, newlink
from driver.netlink_channel import (
    IFINFOMSG,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    NLA_F_NESTED,
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_DELLINK,
    RTM_NEWLINK,
    attr,
)

IFLA_INFO_DATA = 2
IFLA_VRF_TABLE = 1
NO_VRF = (
    "this kernel cannot create VRF devices (built without CONFIG_NET_VRF, or the vrf module is not "
    "available); interface.vrf cannot be honoured on this node"
)


def newvrf(device: str, name: str, table: int) -> Request:
    """RTM_NEWLINK creating VRF ``name`` bound to routing table ``table`` (an existing one is an error)."""
    data = attr(IFLA_VRF_TABLE, struct.pack("=I", table))
    info = attr(IFLA_INFO_KIND, b"vrf") + attr(IFLA_INFO_DATA | NLA_F_NESTED, data)
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr(IFLA_IFNAME, name.encode() + b"\0")
    body += attr(IFLA_LINKINFO | NLA_F_NESTED, info)
    return Request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, device, "vrf create", f"vrf {name} table {table}")


def dellink(device: str, index: int, name: str) -> Request:
    """RTM_DELLINK of ``index`` (the VRF ``name``); already gone is not an error."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
    return Request(RTM_DELLINK, 0, body, device, "vrf delete", f"vrf {name}", (errno.ENODEV,))


def create(rtnl: Rtnl, vrfs: dict[str, tuple[str, int]]) -> dict[str, int]:
    """Create and set up ``{name: (device, table)}`` in ``rtnl``'s netns; their ifindexes by name.

    Raises :class:`NetnsOpError` naming the device whose VRF failed (:data:`NO_VRF` when the
    kernel has no VRF support).
    """
    if not vrfs:
        return {}
    for (name, (device, table)), err in zip(
        vrfs.items(), rtnl.run_each([newvrf(dev, name, table) for name, (dev, table) in vrfs.items()]), strict=True
    ):
        if err is not None:
            reason = NO_VRF if "Operation not supported" in err.reason else err.reason
            raise NetnsOpError(device, "vrf create", f"vrf {name} table {table}: {reason}")
    indexes = {}
    for (name, (device, _)), link in zip(vrfs.items(), rtnl.links_by_name(list(vrfs)), strict=True):
        if link is None:
            raise NetnsOpError(device, "vrf create", f"vrf {name} was created but is not there")
        indexes[name] = link.index
    rtnl.run([newlink(vrfs[name][0], index, up=True, step="vrf up") for name, index in indexes.items()])
    return indexes


def release(device: str, index: int) -> Request:
    """RTM_NEWLINK taking NIC ``index`` out of its VRF (master 0)."""
    return newlink(device, index, master=0, step="vrf release")
