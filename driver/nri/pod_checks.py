"""What RunPodSandbox can know before a NIC moves: refused then, before anything is touched.

A pod's NICs may come from several claims, each checked on its own at prepare; only here are they
seen together, and with the pod's namespace as the runtime made it (its ``eth0``, a ``net1`` that
Multus added). The kernel would refuse a name already taken, or an MTU the NIC cannot take, only
once the NIC is in the pod; here such a pod fails with the device and the field named, every NIC
still on the host as it was.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from driver.api.v1alpha1.decode_interface import IPV6_MIN_MTU
from driver.checkpoint.state import PreparedDevice
from driver.netlink import mtu_limits
from driver.netlink.nic_moves import LinkState, PodLinkConfig


class PodCheckError(Exception):
    """A NIC of the pod cannot go in as configured; nothing was touched."""

    def __init__(self, device: str, step: str, reason: str) -> None:
        super().__init__(f"device {device}: {step} failed: {reason}")
        self.device, self.step, self.reason = device, step, reason


@dataclass(frozen=True)
class PlannedNic:
    """One NIC of the pod: the prepared device, its host record, what it gets in the pod."""

    device: PreparedDevice
    host: LinkState
    config: PodLinkConfig


def _vrf_name(nic: PlannedNic) -> str | None:
    iface = nic.device.config.interface
    return iface.vrf.name if iface is not None and iface.vrf is not None else None


def check(nics: Sequence[PlannedNic], pod_links: Collection[str], sysfs_root: str = "/sys") -> None:
    """Refuse (:class:`PodCheckError`) a pod whose NICs cannot all go in as configured: a name the pod
    already has (``pod_links``: its links' names) or that two NICs (of any of its claims) would get,
    a VRF named like a link of the pod or one of its NICs, an MTU the NIC (or a VF's PF) cannot take."""
    existing = set(pod_links)
    names: dict[str, str] = {}
    for nic in nics:
        name, device = nic.config.ifname, nic.device.device
        if name in existing:
            raise PodCheckError(
                device, "name", f"the pod already has an interface {name!r}; set interface.name to another name"
            )
        if name in names:
            raise PodCheckError(
                device, "name", f"{name!r} is also the name of device {names[name]} of this pod (another claim)"
            )
        names[name] = device
    for nic in nics:
        vrf = _vrf_name(nic)
        if vrf is None:
            continue
        if vrf in existing:
            raise PodCheckError(
                nic.device.device, "vrf", f"interface.vrf.name: the pod already has an interface {vrf!r}"
            )
        if vrf in names:
            raise PodCheckError(
                nic.device.device, "vrf", f"interface.vrf.name: {vrf!r} is the interface name of device {names[vrf]}"
            )
    for nic in nics:
        if nic.config.mtu is None:
            continue
        pf = mtu_limits.pf_mtu(nic.host.ifname, sysfs_root)
        problem = mtu_limits.problem(nic.config.mtu, nic.host.min_mtu, nic.host.max_mtu, pf)
        v6 = [a for a in nic.config.addresses if ":" in a]
        if not problem and v6 and nic.config.mtu < IPV6_MIN_MTU:  # the host's addresses, copied
            problem = f"interface.mtu: {nic.config.mtu} is below {IPV6_MIN_MTU}, the IPv6 minimum, and it gets {v6[0]}"
        if problem:
            raise PodCheckError(nic.device.device, "mtu", problem)
