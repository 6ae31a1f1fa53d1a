"""Shares of a shared NIC in pods: each a sub-interface, checked against its NIC, leased an address.

A share of a shared NIC (an allocation with a ``shareID``) or a claim asking for ``interface.type``
gets a sub-interface instead of the NIC (:mod:`driver.netlink.sub_interfaces`): made straight into
the pod at its planned ifindex, recorded ahead like a move (``records["subInterface"]``, with its
lease from the NIC's address pool, :mod:`driver.nri.address_pool`), configured by the settings
that handle sub-interfaces (``NicSetting.sub_interfaces``), deleted at the return; the NIC stays
on the host. :class:`SharePlanner` leases the addresses and refuses, before anything is made,
what a share cannot be; the functions below make and delete the sub-interfaces.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from driver.checkpoint.state import DriverState, MovedDevice, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.config import IPNetwork
from driver.netlink import arp_probe, sub_interfaces
from driver.netlink.namespaces import NetnsGone
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import NetnsOpError, Request
from driver.nic_settings.setting import HostNetns, Nic, PodNetns, SettingRefused
from driver.nri import address_pool
from driver.nri.address_pool import PoolError

log = logging.getLogger(__name__)

SUB_INTERFACE = sub_interfaces.RECORD
"""The pod state's record of a sub-interface of a NIC: the NIC stays on the host, the pod's
sub-interface is deleted at the return."""
MIN_MTU = 68  # include/linux/if_ether.h ETH_MIN_MTU: what a macvlan or ipvlan takes at least
PROBE_WAIT = 0.1
"""Seconds an ARP probe of a pool address waits for a host holding it to answer (RFC 5227 waits
longer; a pod start waits on this, and a host that holds an address answers in microseconds)."""


class SharePlanner:
    """The shares of a pod before anything is made: their leases from the NICs' address pools, and
    every refusal a share can meet. ``pools``: shared NIC name -> its address pool on this node
    (None: its subnet), the node's ``dra.net/sharing-pools`` annotation over ``--sharing-pools``;
    ``probe_wait``: seconds an ARP probe of a lease waits for an answer (0: no probe)."""

    def __init__(
        self,
        store: CheckpointStore,
        host: HostNetns,
        pools: Mapping[str, IPNetwork | None] | None = None,
        probe_wait: float = PROBE_WAIT,
    ) -> None:
        self.store = store
        self.host = host
        self.pools = dict(pools or {})
        self.probe_wait = probe_wait

    def leases(
        self, netdevs: Sequence[tuple[PreparedClaim, PreparedDevice]], hosts: Mapping[str, LinkState]
    ) -> dict[str, str]:
        """For the pod's sub-interfaces: refuse an address its claim sets that is in use on this
        node (naming who holds it), and lease one of its NIC's pool to each whose claim sets none
        (device -> CIDR): not in use on this node, and not answering an ARP probe on the link."""
        shares = [d for _, d in netdevs if d.sub_interface]
        if not shares:
            return {}
        host = address_pool.host_addresses(self.host.rtnl())
        taken = self.store.read(lambda s: address_pool.in_use(s, host, skip=[c.uid for c, _ in netdevs]))
        for d in shares:
            for cidr in (d.config.interface.addresses if d.config.interface else None) or ():
                holder = taken.get(cidr.split("/", 1)[0])
                if holder is not None:
                    raise PoolError(f"device {d.device}: interface.addresses: {cidr} is in use by {holder}")
        out: dict[str, str] = {}
        for d in shares:
            if addressed(d):
                continue
            nic = hosts[d.snapshot.host.ifname or ""]
            own = [cidr for link, cidr in host.values() if link == nic.ifname]

            def answered(address: str, nic: LinkState = nic) -> bool:
                return self._arp_answered(nic, address)

            out[d.device] = address_pool.lease(nic.ifname, own, taken, self.pools, answered)
            taken[out[d.device].split("/", 1)[0]] = f"device {d.device} of this pod"
        return out

    def _arp_answered(self, nic: LinkState, address: str) -> bool:
        """Whether a host on ``nic``'s link answers an ARP probe for IPv4 ``address`` (bounded wait);
        an IPv6 one is left to the kernel's own duplicate address detection. A NIC that cannot
        send (down) cannot tell: the address is taken as free, and that is logged."""
        if ":" in address or not nic.mac or self.probe_wait <= 0:
            return False
        try:
            return arp_probe.in_use(self.host.fd, nic.ifname, nic.mac, address, self.probe_wait)
        except OSError as exc:
            log.warning("ARP probe not sent", extra={"kv": {"nic": nic.ifname, "address": address, "error": str(exc)}})
            return False

    def check(self, pod_uid: str, nics: Sequence[Nic], hosts: Mapping[str, LinkState]) -> None:
        """Refuse what a sub-interface cannot be, in the driver's words before the kernel's: two
        shares of one NIC in one pod (one record per device), a share of a NIC whose RDMA device
        would have to move (exclusive RDMA mode), and what its NIC does not allow (:func:`share_limits`)."""
        seen: set[str] = set()
        shares = [nic for nic in nics if nic.sub_interface]
        others = self.store.read(lambda s: share_macs(s, pod_uid)) if shares else {}
        for nic in shares:
            if nic.name in seen:
                raise SettingRefused(nic.name, "share", "this pod holds two shares of this NIC; one share per pod")
            seen.add(nic.name)
            if self.host.rdma_exclusive and nic.device.snapshot.host.rdma_device:
                reason = (
                    "the runtime's RDMA namespace mode is exclusive: an RDMA device is in one namespace at "
                    "a time, so a shared RDMA NIC cannot serve several pods (rdma system set netns shared)"
                )
                raise SettingRefused(nic.name, "rdma", reason)
            share_limits(nic, hosts[nic.host.ifname], others.get(nic.host.ifname, {}))


def share_macs(state: DriverState, pod_uid: str) -> dict[str, dict[str, str]]:
    """NIC name -> MAC -> the pod holding a share of it with that MAC (other pods than ``pod_uid``)."""
    out: dict[str, dict[str, str]] = {}
    for uid, pod in state.pods.items():
        for m in pod.devices:
            sub = m.records.get(SUB_INTERFACE)
            if uid != pod_uid and sub and m.pod_mac:
                out.setdefault(str(sub.get("parent")), {})[m.pod_mac.lower()] = f"{pod.namespace}/{pod.name}"
    return out


def share_limits(nic: Nic, parent: LinkState, taken: Mapping[str, str]) -> None:
    """Refuse a share its NIC cannot carry, naming the field: an MTU above the NIC's (or below the
    least any link takes), a MAC for an ipvlan (it has its NIC's), or a macvlan MAC that is its NIC's
    or another share's (the kernel would refuse it only at link-up, EADDRINUSE)."""
    kind = nic.records[SUB_INTERFACE]["kind"]
    mtu, mac = nic.pod.mtu, nic.pod.mac
    if mtu is not None and parent.mtu and mtu > parent.mtu:
        why = f"interface.mtu: {mtu} is above the MTU {parent.mtu} of {parent.ifname}, the NIC this {kind} shares"
        raise SettingRefused(nic.name, "mtu", why)
    if mtu is not None and mtu < MIN_MTU:
        raise SettingRefused(nic.name, "mtu", f"interface.mtu: {mtu} is below the least MTU a link takes ({MIN_MTU})")
    if mac is None:
        return
    if kind != sub_interfaces.MACVLAN:
        why = f"interface.hardwareAddr: an {kind} has the MAC of its NIC; a macvlan share can have its own"
        raise SettingRefused(nic.name, "mac", why)
    if parent.mac and mac.lower() == parent.mac.lower():
        why = f"interface.hardwareAddr: {mac} is the MAC of {parent.ifname}, the NIC this {kind} shares"
        raise SettingRefused(nic.name, "mac", why)
    if mac.lower() in taken:
        why = f"interface.hardwareAddr: {mac} is the MAC of another share of {parent.ifname} (pod {taken[mac.lower()]})"
        raise SettingRefused(nic.name, "mac", why)


def addressed(device: PreparedDevice) -> bool:
    """Whether the claim gives the NIC its addresses (``interface.addresses`` or ``dhcp``)."""
    iface = device.config.interface
    return bool(iface and (iface.addresses or iface.dhcp))


def create_request(nic: Nic, ns_fd: int) -> Request:
    """The request that makes a share's sub-interface in the pod, at its planned ifindex."""
    sub = nic.records[SUB_INTERFACE]
    return sub_interfaces.newsub(
        nic.name, sub["parentIndex"], nic.pod.ifname, nic.pod_index, ns_fd, sub["kind"], nic.pod.mtu, nic.pod.mac
    )


def delete_subs(pod: PodNetns, subs: list[MovedDevice]) -> dict[str, str | NetnsOpError]:
    """Delete the pod's sub-interfaces still there; a namespace that is gone took them with it."""
    if not subs:
        return {}
    try:
        rtnl = pod.rtnl
    except NetnsGone:
        return dict.fromkeys((m.device for m in subs), "gone with the pod's namespace")
    items = [
        (m.device, m.pod_index or 0, m.pod_ifname, m.records[SUB_INTERFACE]["kind"], m.pod_mac or None) for m in subs
    ]
    return sub_interfaces.delete_subs(rtnl, items)


def sub_interface_addresses(devices: Sequence[PreparedDevice], moved: Sequence[MovedDevice]) -> dict[str, list[str]]:
    """Each sub-interface's addresses in the pod: its claim's, else its lease from the NIC's pool."""
    leases = {m.device: (m.records.get(SUB_INTERFACE) or {}).get(sub_interfaces.LEASE) for m in moved}
    out: dict[str, list[str]] = {}
    for d in devices:
        if not d.sub_interface:
            continue
        iface = d.config.interface
        lease = leases.get(d.device)
        out[d.device] = list(iface.addresses) if iface and iface.addresses else ([lease] if lease else [])
    return out
