"""The PF's settings of a VF a claim holds on vfio-pci: MAC, VLAN, spoof checking, trust, rates, link state.

A VF handed to a DPDK process or a VM (``sriov.driver: vfio-pci``) has no netdev in the pod, but its
PF still holds its MAC, VLAN, spoof checking, trust, tx rates and link state (the SR-IOV CNI sets
them in its vfio mode too: a KubeVirt VM's VF gets its MAC and VLAN this way). They are the same
settings, through the same netlink (:mod:`driver.netlink.sriov_vf`), as a moved VF's
(:mod:`driver.nic_settings.sriov_vf`), at other moments:

- at prepare, before the record is stored: what the PF reports for the VF now and what the claim
  wants are written into the record (``PreparedDevice.vf_settings``), so that whatever happens
  after, a driver can put them back;
- once the VF is on vfio-pci: each setting that differs is one request to the PF (also at a
  retried prepare and at every start: a reboot resets the PF's VF settings); a refusal names the
  claim field and the PF's words, and the claim is taken back;
- at unprepare, before the VF goes back to its driver: what the PF reported before, where it
  reports something else. A MAC of none is written back too: no host netdev has a unicast filter
  to lose, and the VF's driver takes a MAC of its own at probe.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import replace

from driver.api.v1alpha1.decode_sriov import VF_SETTINGS
from driver.api.v1alpha1.network_config import SriovConfig
from driver.checkpoint.state import PreparedDevice
from driver.netlink import sriov_vf
from driver.netlink.channel import NetlinkChannel
from driver.netlink.sriov_vf import VfError, VfState
from driver.nic_settings.sriov_vf import FIELDS, wanted

log = logging.getLogger(__name__)

PfChannel = Callable[[], NetlinkChannel]
"""A new rtnetlink channel where the PFs are (the driver's own namespace: the host's)."""


def host_channel() -> NetlinkChannel:
    """An rtnetlink socket in the driver's namespace, asking for the kernel's error strings."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    return NetlinkChannel(sock, ext_ack=True)


def wants_pf_settings(device: PreparedDevice) -> bool:
    """Whether the device is a VF on vfio-pci whose claim sets any of its PF's VF settings."""
    sriov = device.config.sriov
    return device.vfio and sriov is not None and any(getattr(sriov, f) is not None for f in VF_SETTINGS)


class VfioVfSettings:
    """Record, apply and restore the PF settings of the claims' VFs on vfio-pci."""

    def __init__(self, sysfs_root: str, channel: PfChannel = host_channel) -> None:
        self.sysfs_root, self.channel = sysfs_root, channel

    def recorded(self, devices: list[PreparedDevice]) -> list[PreparedDevice]:
        """``devices`` with, on each VF for vfio-pci that asks for PF settings, where they are, what
        the PF reports now and what the claim wants; :class:`VfError` naming the device when its PF
        cannot be found or read."""
        todo = [d for d in devices if wants_pf_settings(d)]
        if not todo:
            return devices
        out = {}
        channel = self.channel()
        try:
            for d in todo:
                try:
                    place = sriov_vf.locate(d.snapshot.host.pci_address or "", self.sysfs_root)
                    before = sriov_vf.read(channel, place)
                except VfError as exc:
                    raise VfError(exc.setting, f"device {d.device}: {exc.reason}", exc.errno) from exc
                goal = wanted(before, d.config.sriov or SriovConfig())
                record = {"pf": place.pf_pci, "vf": place.vf, "host": before.to_dict(), "pod": goal.to_dict()}
                out[d.device] = replace(d, vf_settings=record)
        finally:
            channel.close()
        return [out.get(d.device, d) for d in devices]

    def apply(self, devices: list[PreparedDevice]) -> str | None:
        """Set through each VF's PF what its record wants, where the PF reports something else
        (idempotent); the first refusal, naming the device and the claim field, or None."""
        todo = [d for d in devices if d.vf_settings]
        if not todo:
            return None
        channel = self.channel()
        try:
            for d in todo:
                record = d.vf_settings or {}
                try:
                    place = sriov_vf.pf_place(record["pf"], record["vf"], self.sysfs_root)
                    current = sriov_vf.read(channel, place)
                except VfError as exc:
                    return f"device {d.device}: {exc}"
                goal = VfState.from_dict(record["pod"])
                refused = sriov_vf.apply(channel, place, goal, sriov_vf.changes(current, goal))
                if refused:
                    return f"device {d.device}: {FIELDS[refused[0].setting]}: {refused[0].reason}"
        finally:
            channel.close()
        return None

    def restore(self, device: PreparedDevice) -> str | None:
        """Put back through the VF's PF what it reported before the claim; the refusal, or None. A PF
        that no longer lists the VF (its count lowered, which resets them) needs nothing."""
        record = device.vf_settings
        if not record:
            return None
        channel = self.channel()
        try:  # a MAC of none too: on vfio-pci there is no host unicast filter to lose
            before = VfState.from_dict(record["host"])
            refused = sriov_vf.put_back(channel, record["pf"], record["vf"], before, self.sysfs_root, none_mac=True)
        except VfError as exc:
            log.info("VF settings not restored", extra={"kv": {"device": device.device, "reason": str(exc)}})
            return None
        finally:
            channel.close()
        if refused:
            return f"device {device.device}: VF settings not restored: " + "; ".join(str(e) for e in refused)
        return None
