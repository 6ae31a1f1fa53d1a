"""Is a NIC's link up? Carrier and operstate from RTM_GETLINK, in the host or in a pod's namespace.

A NIC handed to a pod lives in the pod's network namespace, where the host's ``/sys/class/net``
cannot see it: its link is asked for with netlink inside that namespace. All links of one
namespace go to the kernel in one pipelined lookup (:meth:`driver.netlink.rtnl.Rtnl.links_by_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.rtnl import IFF_UP, Rtnl

IFF_LOWER_UP = 0x10000  # the driver (or the veth peer) signals carrier
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
    out = {}
    for name, link in zip(names, rtnl.links_by_name(names), strict=True):
        if link is None:
            continue
        oper = link.operstate or 0
        out[name] = LinkFacts(
            ifname=name,
            admin_up=bool(link.flags & IFF_UP),
            carrier=bool(link.flags & IFF_LOWER_UP),
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
