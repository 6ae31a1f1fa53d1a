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
from collections.abc import Callable, Sequence
from typing import Any

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


def create(
    rtnl: Rtnl, vrfs: dict[str, tuple[str, int]], record: Callable[[dict[str, object]], None] | None = None
) -> dict[str, int]:
    """Create and set up ``{name: (device, table)}`` in ``rtnl``'s netns; their ifindexes by name.

    Each VRF created is looked up at once and handed to ``record`` as ``{"kind": "vrf", "index",
    "name"}`` (the pod state keeps it: only a link recorded so is ever deleted, see
    :func:`delete_created`), before anything else can fail. Raises :class:`NetnsOpError` naming the
    device whose VRF failed (:data:`NO_VRF` when the kernel has no VRF support); a VRF refused
    because its name is taken was not created, and nothing is recorded for it.
    """
    if not vrfs:
        return {}
    errors = rtnl.run_each([newvrf(dev, name, table) for name, (dev, table) in vrfs.items()])
    made = [name for name, err in zip(vrfs, errors, strict=True) if err is None]
    indexes = {}
    for name, link in zip(made, rtnl.links_by_name(made), strict=True):
        if link is None or link.kind != "vrf":
            raise NetnsOpError(vrfs[name][0], "vrf create", f"vrf {name} was created but is not there")
        indexes[name] = link.index
        if record is not None:
            record({"kind": "vrf", "index": link.index, "name": name})
    for (name, (device, table)), err in zip(vrfs.items(), errors, strict=True):
        if err is not None:  # its reason already names the VRF and its table
            unsupported = "Operation not supported" in err.reason
            raise NetnsOpError(
                device, "vrf create", f"vrf {name} table {table}: {NO_VRF}" if unsupported else err.reason
            )
    rtnl.run([newlink(vrfs[name][0], index, up=True, step="vrf up") for name, index in indexes.items()])
    return indexes


def delete_created(rtnl: Rtnl, device: str, created: Sequence[dict[str, Any]]) -> list[Request]:
    """The deletions of the links recorded in ``created`` that are still what was created (same ifindex,
    same kind); a link at that index of another kind (the pod's own) is left alone."""
    records = [c for c in created if isinstance(c.get("index"), int) and c.get("kind")]
    reqs = []
    for c, link in zip(records, rtnl.links_by_index([c["index"] for c in records]), strict=True):
        if link is not None and link.kind == c["kind"]:
            reqs.append(dellink(device, link.index, link.ifname))
    return reqs


def release(device: str, index: int) -> Request:
    """RTM_NEWLINK taking NIC ``index`` out of its VRF (master 0)."""
    return newlink(device, index, master=0, step="vrf release")
