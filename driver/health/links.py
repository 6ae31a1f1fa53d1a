"""Is a NIC's link up? Carrier and operstate from RTM_GETLINK, in the host or in a pod's namespace.

A NIC handed to a pod lives in the pod's network namespace, where the host's ``/sys/class/net``
cannot see it: its link is asked for with netlink inside that namespace. All links of one
namespace go to the kernel in one pipelined exchange.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.rtnl import IFF_UP, IFINFOMSG, IFLA_IFNAME, RTM_GETLINK, Rtnl
from driver.netlink_channel import NLM_F_REQUEST, attr, parse_attrs

IFF_LOWER_UP = 0x10000  # the driver (or the veth peer) signals carrier
IFLA_OPERSTATE = 16
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")  # RFC 2863


@dataclass(frozen=True)
class LinkFacts:
    """A netdev's link as the kernel reports it, wherever it is (host or a pod's namespace)."""

    ifname: str
    admin_up: bool  # IFF_UP
    carrier: bool  # IFF_LOWER_UP: the physical link (for a veth: its peer) is up
    operstate: str  # "up", "down", "lowerlayerdown", ...
    where: str = "host"  # "host", or the pod ("<namespace>/<name>") whose namespace holds it


def link_facts(rtnl: Rtnl, ifnames: Iterable[str], where: str = "host") -> dict[str, LinkFacts]:
    """The links named ``ifnames`` in ``rtnl``'s namespace (absent names are left out)."""
    names = list(ifnames)
    if not names:
        return {}
    requests = [
        (
            RTM_GETLINK,
            NLM_F_REQUEST,
            IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr(IFLA_IFNAME, n.encode() + b"\0"),
        )
        for n in names
    ]
    out = {}
    for name, reply in zip(names, rtnl.exchange(requests), strict=True):
        if reply.error in (errno.ENODEV, errno.ENOENT) or not reply.payloads:
            continue
        if reply.error:
            raise OSError(reply.error, f"RTM_GETLINK {name}")
        payload = reply.payloads[0]
        _fam, _type, _index, flags, _change = IFINFOMSG.unpack_from(payload)
        attrs = parse_attrs(payload, IFINFOMSG.size)
        oper = attrs.get(IFLA_OPERSTATE, b"\0")[0]
        out[name] = LinkFacts(
            ifname=name,
            admin_up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
            operstate=OPERSTATES[oper] if oper < len(OPERSTATES) else str(oper),
            where=where,
        )
    return out


class LinkProbe:
    """Asks for links in the host namespace and in pod namespaces; use from ONE thread."""

    def __init__(self, ns: Namespaces) -> None:
        self.ns = ns

    def host(self, ifnames: Iterable[str]) -> dict[str, LinkFacts]:
        """Links in the host namespace."""
        return link_facts(self.ns.host_rtnl(), ifnames)

    def pod(self, netns_path: str, ifnames: Iterable[str], where: str) -> dict[str, LinkFacts]:
        """Links in the pod namespace at ``netns_path``; empty when the namespace is gone."""
        try:
            with self.ns.pod(netns_path) as (rtnl, _fd):
                return link_facts(rtnl, ifnames, where)
        except (NetnsGone, OSError):
            return {}
