"""Sub-interfaces of a shared NIC, made in a pod's namespace and deleted there (raw rtnetlink).

A pod's share of a shared NIC is a macvlan link on the NIC, created straight into the pod's
namespace by one request sent in the host's (``ip link add link ib0 name net1 netns POD address
MAC mtu N type macvlan mode bridge``): the ``IFLA_LINK`` parent is the NIC's host ifindex, the new
link gets the ifindex the hook planned (the request's ``ifi_index``, free in the pod and on the host:
kernels before the 2025 rtnetlink change look it up in the sender's namespace, EEXIST; a taken one
fails, EBUSY, before anything exists) and is never in the host namespace, so the host has nothing
to clean up;
the NIC itself is never moved nor changed. Deleting one is by that ifindex in the pod, only while
the link there is still a sub-interface under the recorded name: a link the pod made is left alone.
A namespace that is gone took its sub-interfaces with it.
"""

from __future__ import annotations

import errno
import socket
import struct

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    NLA_F_NESTED,
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_DELLINK,
    RTM_NEWLINK,
    attr,
)
from driver.netlink.link_info import IFLA_LINK, LinkInfo
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, mac_bytes

RECORD = "subInterface"
"""The key of a sub-interface's record in the pod state (``MovedDevice.records``): ``{"kind",
"parent", "parentIndex"}`` and, from the NIC's address pool, :data:`LEASE`."""
LEASE = "lease"
"""The key of a sub-interface's address from its NIC's pool in its record."""
MACVLAN = "macvlan"
IPVLAN = "ipvlan"
KINDS = (MACVLAN, IPVLAN)
IFLA_INFO_DATA = 2
IFLA_MACVLAN_MODE, MACVLAN_MODE_BRIDGE = 1, 4  # pods on one NIC reach each other through it
IFLA_IPVLAN_MODE, IPVLAN_MODE_L2 = 1, 0


def newsub(
    device: str,
    parent_index: int,
    ifname: str,
    pod_index: int,
    ns_fd: int,
    kind: str = MACVLAN,
    mtu: int | None = None,
    mac: str | None = None,
) -> Request:
    """RTM_NEWLINK creating a ``kind`` sub-interface of ``parent_index`` in ``ns_fd``'s namespace, at
    ``pod_index`` under ``ifname`` (sent on the host's socket, where the parent is)."""
    mode = (
        attr(IFLA_MACVLAN_MODE, struct.pack("=I", MACVLAN_MODE_BRIDGE))
        if kind == MACVLAN
        else attr(IFLA_IPVLAN_MODE, struct.pack("=H", IPVLAN_MODE_L2))
    )
    info = attr(IFLA_INFO_KIND, kind.encode()) + attr(IFLA_INFO_DATA | NLA_F_NESTED, mode)
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, pod_index, 0, 0)
    body += attr(IFLA_LINK, struct.pack("=I", parent_index))
    body += attr(IFLA_NET_NS_FD, struct.pack("=I", ns_fd))
    body += attr(IFLA_IFNAME, ifname.encode() + b"\0")
    if mtu is not None:
        body += attr(IFLA_MTU, struct.pack("=I", mtu))
    if mac is not None:
        body += attr(IFLA_ADDRESS, mac_bytes(mac))
    body += attr(IFLA_LINKINFO | NLA_F_NESTED, info)
    what = f"{kind} {ifname} on ifindex {parent_index} at ifindex {pod_index}"
    return Request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, device, "create", what)


def is_ours(link: LinkInfo | None, ifname: str, kind: str, mac: str | None = None) -> bool:
    """Whether ``link`` is still the sub-interface the hook made: its kind, its name, its MAC once known."""
    if link is None or link.kind != kind or link.ifname != ifname:
        return False
    return mac is None or link.mac.lower() == mac.lower()


def delsub(device: str, index: int, ifname: str) -> Request:
    """RTM_DELLINK of the sub-interface at ``index``; already gone is not an error."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
    return Request(RTM_DELLINK, 0, body, device, "delete", f"sub-interface {ifname}", (errno.ENODEV,))


def delete_subs(pod: Rtnl, subs: list[tuple[str, int, str, str, str | None]]) -> dict[str, str | NetnsOpError]:
    """Delete each ``(device, index, ifname, kind, mac)`` still ours in ``pod``'s namespace, in one
    pipelined send; per device, what happened ("deleted", why there was nothing to delete, or the
    kernel's refusal)."""
    found = pod.links_by_index([index for _, index, _, _, _ in subs])
    todo = [s for s, link in zip(subs, found, strict=True) if is_ours(link, s[2], s[3], s[4])]
    reqs = [delsub(device, index, ifname) for device, index, ifname, _, _ in todo]
    errors = pod.run_each(reqs)
    out: dict[str, str | NetnsOpError] = {
        device: f"no sub-interface {ifname} at ifindex {index} (gone)" for device, index, ifname, _, _ in subs
    }
    for (device, _, _, _, _), err in zip(todo, errors, strict=True):
        out[device] = "deleted" if err is None else err
    return out
