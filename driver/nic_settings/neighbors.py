"""Permanent neighbor entries (``ip neigh ... nud permanent``) of a NIC: the claim's and the host's.

A claim's ``neighbors`` are added on the NIC in the pod, in its configuration batch. The NIC's own
permanent entries on the host are recorded before the move (one dump per NIC, which the kernel
filters to it): the kernel flushes them when the NIC leaves the namespace, so they are added in the
pod too (unless the claim sets one for the same IP: the claim's wins) and again on the host when
the NIC returns.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import MovedDevice
from driver.netlink.channel import NLM_F_CREATE, attr, mac_str, parse_attrs
from driver.netlink.rtnl import Request, Rtnl, mac_bytes
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns

RTM_NEWNEIGH, RTM_GETNEIGH = 28, 30
NLM_F_REPLACE = 0x100
NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
NDA_DST, NDA_LLADDR, NDA_IFINDEX = 1, 2, 8
NUD_PERMANENT = 0x80
NAME = "neighbors"


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


def newneigh(device: str, index: int, neighbor: Neighbor, step: str = "neighbor") -> Request:
    """RTM_NEWNEIGH: ``neighbor`` as a permanent entry on ``index`` (replacing one for the same IP)."""
    ip = ipaddress.ip_address(neighbor.dst)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    body = NDMSG.pack(family, index, NUD_PERMANENT, 0, 0)
    body += attr(NDA_DST, ip.packed) + attr(NDA_LLADDR, mac_bytes(neighbor.lladdr))
    what = f"neighbor {neighbor.dst} lladdr {neighbor.lladdr}"
    return Request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body, device, step, what)


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


def pod_neighbors(config: NetworkConfig, host: Sequence[Neighbor]) -> list[Neighbor]:
    """The NIC's entries in the pod: the host's, except where the claim sets one for the same IP, then the claim's."""
    claimed = {n.destination: Neighbor(n.destination, n.hardware_addr) for n in config.neighbors or ()}
    return [n for n in host if n.dst not in claimed] + list(claimed.values())


def _recorded(records: dict[str, Any]) -> list[Neighbor]:
    return [Neighbor.from_dict(n) for n in records.get(NAME) or ()]


class Neighbors(NicSetting):
    """The claim's ``neighbors`` in the pod; the NIC's host entries carried along and put back."""

    name = NAME
    sub_interfaces = True  # the claim's own entries; the host's are carried only with a NIC that moves

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Record each NIC's permanent neighbor entries on the host."""
        for nic in (n for n in nics if not n.sub_interface):
            mine = permanent_neighbors(host.rtnl(), nic.host.index or 0)
            if mine:
                nic.records[self.name] = [n.to_dict() for n in mine]

    def requests(self, nic: Nic) -> list[Request]:
        return [newneigh(nic.name, nic.index, n) for n in pod_neighbors(nic.config, _recorded(nic.records))]

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        return [newneigh(nic.device, index, n) for n in _recorded(nic.records)]
