"""Re-learning which NICs sit in which pod from the kernel, when the pod state was lost.

``pods.json`` is what lets StopPodSandbox give a NIC back. If it was corrupt at start (moved
aside by the store) the driver no longer knows that pod P holds NIC N, and N would stay in P's
namespace until the namespace dies (a physical NIC then comes back as ``ethN``, without its
name and addresses; a veth is destroyed). At Synchronize the runtime lists every running pod
with its network namespace; for each pod with prepared claims but no recorded state, the NICs
of those claims are looked up in the pod's namespace, by the name the pod gets and the MAC it
has (configured, current or permanent), and only a link the pod cannot have made is taken: a
physical one (on the bus address the device was prepared with, when it had one) or a virtual one
whose peer is outside the pod (a link a pod makes has its peer in the pod). Those found are
recorded as ``in-pod``, with their ifindex and identity in the pod and the host name, MTU, MAC and
addresses the device had when it was prepared (its snapshot), so the normal return restores them.
Host routes were only recorded in the lost file: they are not restored.
"""

from __future__ import annotations

import logging
from typing import Any

from driver.checkpoint.state import IN_POD, MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.claims.claim_build import sub_interface_kind
from driver.model.device import ATTRIBUTE_DOMAIN
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rtnl import Rtnl, link_addresses
from driver.netlink.sub_interfaces import LEASE, RECORD
from driver.nic_settings import addresses, rdma
from driver.nic_settings.setting import HostNetns

log = logging.getLogger(__name__)


def _snapshot_text(device: PreparedDevice, name: str) -> str | None:
    value = device.snapshot.attributes.get(f"{ATTRIBUTE_DOMAIN}/{name}")
    return value if isinstance(value, str) and value else None


def _find(rtnl: Rtnl, device: PreparedDevice) -> LinkInfo | None:
    """The link in ``rtnl``'s namespace that is ``device``: by its pod name, then its host name."""
    iface = device.config.interface
    host = device.snapshot.host
    macs = {m.lower() for m in (device.config.pod_mac, host.permanent_mac, _snapshot_text(device, "mac")) if m}
    for name in dict.fromkeys(n for n in (iface.name if iface else None, host.ifname) if n):
        link = rtnl.link(name)
        if link is None:
            continue
        if not macs or link.mac.lower() in macs or (link.permanent_mac or "").lower() in macs:
            return link if _not_the_pods(link, host.pci_address) else None
    return None


def _not_the_pods(link: LinkInfo, pci_address: str | None) -> bool:
    """Whether ``link`` can be a NIC the driver moved, not one the pod made: a physical link (on the
    device's bus address when that is known) or a virtual one whose peer is in another namespace."""
    if link.parent is not None or link.permanent_mac is not None:
        return pci_address is None or link.parent is None or link.parent == pci_address
    return link.peer_netnsid is not None


def _find_sub(rtnl: Rtnl, host: HostNetns, device: PreparedDevice) -> tuple[LinkInfo, int] | None:
    """The device's sub-interface in ``rtnl``'s namespace and its NIC's host ifindex: the link under
    the pod name of the kind the claim asks for, whose lower device is the NIC in another namespace."""
    parent = device.snapshot.host.ifname or ""
    iface = device.config.interface
    link = rtnl.link((iface.name if iface and iface.name else None) or parent)
    nic = host.rtnl().link(parent)
    if link is None or nic is None or link.kind != sub_interface_kind(device.config):
        return None
    # The lower device's ifindex (its own namespace's): read as none when it equals the link's own
    # index, which is how the hooks place a sub-interface when the pod has that index free.
    lower = link.peer if link.peer is not None else link.index
    return (link, nic.index) if lower == nic.index and link.peer_netnsid is not None else None


def _sub_interface(rtnl: Rtnl, device: PreparedDevice, link: LinkInfo, parent_index: int) -> MovedDevice:
    """The record of a sub-interface found in the pod; its IPv4 address is its lease from the NIC's
    pool when the claim gives none (so the pool does not hand it out again)."""
    sub: dict[str, Any] = {"kind": link.kind, "parent": device.snapshot.host.ifname, "parentIndex": parent_index}
    iface = device.config.interface
    if not (iface and (iface.addresses or iface.dhcp)):
        v4 = sorted(a for a in link_addresses(rtnl, {link.index}).get(link.index, ()) if ":" not in a)
        if v4:
            sub[LEASE] = v4[0]
    return MovedDevice(
        device=device.device,
        host_ifname=device.snapshot.host.ifname or "",
        pod_ifname=link.ifname,
        pod_mac=link.mac,
        step=IN_POD,
        pod_index=link.index,
        identity=LinkIdentity.of(link, in_pod=True).to_dict(),
        records={RECORD: sub},
    )


def _moved(device: PreparedDevice, link: LinkInfo, rdma_exclusive: bool) -> MovedDevice:
    host = device.snapshot.host
    mtu = device.snapshot.attributes.get(f"{ATTRIBUTE_DOMAIN}/mtu")
    cidrs = [cidr for key in ("ipv4", "ipv6") for cidr in (_snapshot_text(device, key) or "").split(",") if cidr]
    records: dict[str, Any] = {}
    found = addresses.record(cidrs)
    if found is not None:
        records[addresses.Addresses.name] = found
    if rdma_exclusive and host.rdma_device:
        records[rdma.RdmaDevice.name] = host.rdma_device
    return MovedDevice(
        device=device.device,
        host_ifname=host.ifname or link.ifname,
        pod_ifname=link.ifname,
        permanent_mac=host.permanent_mac,
        pci_address=host.pci_address,
        host_mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else None,
        host_mac=_snapshot_text(device, "mac"),
        pod_mac=link.mac,
        step=IN_POD,
        pod_index=link.index,
        identity=LinkIdentity.of(link, in_pod=True).to_dict(),
        records=records,
    )


def adopt(
    host: HostNetns,
    pod_uid: str,
    netns_path: str,
    netdevs: list[tuple[PreparedClaim, PreparedDevice]],
    *,
    sandbox_id: str = "",
    namespace: str = "",
    name: str = "",
) -> PodNetState | None:
    """The state of the pod's NICs found in ``netns_path``, or None when none is there."""
    found: list[MovedDevice] = []
    try:
        with host.ns.pod(netns_path) as (rtnl, _):
            for _claim, device in netdevs:
                if device.sub_interface:
                    sub = _find_sub(rtnl, host, device)
                    if sub is not None:
                        found.append(_sub_interface(rtnl, device, *sub))
                    continue
                link = _find(rtnl, device)
                if link is not None:
                    found.append(_moved(device, link, host.rdma_exclusive))
    except (NetnsGone, OSError) as exc:
        log.debug("adoption: pod namespace unusable", extra={"kv": {"pod": pod_uid, "error": str(exc)}})
        return None
    if not found:
        return None
    log.warning(
        "pod state was lost: NICs found in the pod's namespace recorded again",
        extra={"kv": {"pod": pod_uid, "netns": netns_path, "devices": [m.device for m in found]}},
    )
    return PodNetState(
        pod_uid=pod_uid, sandbox_id=sandbox_id, namespace=namespace, name=name, netns_path=netns_path, devices=found
    )
