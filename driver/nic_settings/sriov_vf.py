"""``sriov``: an SR-IOV VF's MAC, VLAN and QoS, spoof checking, trust, tx rates and link state, set through its PF.

The PF's driver holds these for each of its VFs (:mod:`driver.netlink.sriov_vf`), so they are set
on the host, on the PF, whichever namespace the VF's netdev is in. At RunPodSandbox the VF's PF and
index are found by the VF's PCI function and what the PF reports now is recorded (written ahead
with the NIC); once the VF is in the pod, before it is configured and up, the claim's settings are
applied, one request each: a refusal names the claim field and the PF's words, and the pod is
refused with every NIC returned. At every return (StopPodSandbox, a rollback, a restarted driver
finishing one) the recorded values are put back, once the VF is home: a VF the PF no longer lists
(an admin lowered the count, which resets the PF's VF settings) needs nothing.

A MAC goes in two places, in this order: the VF's netdev gets it in the pod with the MAC of
``interface.hardwareAddr`` (its driver tells the PF, which takes it while the PF holds none), then
the PF sets it, which locks it (igb and ixgbe then refuse the VF any other MAC unless trusted). So
before the VF leaves the pod the PF's MAC is cleared (all zeros: "remove administratively set MAC"),
which lets the return give the netdev its host MAC back; once home, the PF reports the VF's own MAC
again, and only a MAC it does not report is written.

Only claims that set ``sriov`` pay for it (one socket in the host namespace, one read of the PF).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import replace

from driver.api.v1alpha1.network_config import NetworkConfig, SriovConfig
from driver.checkpoint.state import SRIOV_RECORD, MovedDevice
from driver.model.device import Device
from driver.netlink import sriov_vf
from driver.netlink.channel import NetlinkChannel
from driver.netlink.rtnl import NetnsOpError
from driver.netlink.sriov_vf import VfError, VfState
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

log = logging.getLogger(__name__)

FIELDS = {
    "mac": "sriov.mac",
    "vlan": "sriov.vlan",
    "spoofchk": "sriov.spoofChk",
    "trust": "sriov.trust",
    "rate": "sriov.minTxRate/maxTxRate",
    "link_state": "sriov.linkState",
}
"""Each request of :data:`driver.netlink.sriov_vf.SETTINGS` by the claim fields it sets (errors name them)."""


def wanted(current: VfState, config: SriovConfig) -> VfState:
    """``current`` with what ``config`` sets over it (a VLAN set without QoS or protocol: 0, 802.1Q)."""
    out = current
    if config.mac is not None:
        out = replace(out, mac=config.mac)
    if config.vlan is not None:
        out = replace(out, vlan=config.vlan, qos=config.vlan_qos or 0, vlan_proto=config.vlan_proto or "802.1Q")
    if config.spoof_chk is not None:
        out = replace(out, spoofchk=config.spoof_chk)
    if config.trust is not None:
        out = replace(out, trust=config.trust)
    if config.min_tx_rate is not None or config.max_tx_rate is not None:
        low = config.min_tx_rate if config.min_tx_rate is not None else current.min_tx_rate
        high = config.max_tx_rate if config.max_tx_rate is not None else current.max_tx_rate
        out = replace(out, min_tx_rate=low, max_tx_rate=high)
    if config.link_state is not None:
        out = replace(out, link_state=config.link_state)
    return out


def _pod_mac(nic: MovedDevice) -> bool:
    """Whether the VF's claim set its MAC through the PF (a record of a claim with ``sriov.mac``)."""
    record = nic.records.get(SRIOV_RECORD) or {}
    wanted, before = (record.get("pod") or {}).get("mac"), (record.get("host") or {}).get("mac")
    return bool(wanted) and wanted != before


def _channel(host: HostNetns) -> NetlinkChannel:
    """A socket in the host namespace, where the PF is, asking for the kernel's error strings."""
    return NetlinkChannel(host.ns.socket_in(host.fd, socket.NETLINK_ROUTE), ext_ack=True)


class SriovVf(NicSetting):
    """The claim's ``sriov`` settings of a VF, through its PF."""

    name = SRIOV_RECORD

    def prepare_problems(self, device: Device, config: NetworkConfig) -> list[str]:
        if config.sriov is None or config.vfio:  # a VF on vfio-pci: the claim builder's to check
            return []
        if not device.host.sriov_pf or not device.host.pci_address:
            return [f"sriov: device {device.name} is not an SR-IOV VF: only a VF's PF holds these settings"]
        return []

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Find each configured VF's PF and record what it reports now, with what the claim wants."""
        todo = [nic for nic in nics if nic.config.sriov is not None]
        if not todo:
            return
        channel = _channel(host)
        try:
            for nic in todo:
                pci = nic.host.pci_address or nic.device.snapshot.host.pci_address or ""
                try:
                    place = sriov_vf.locate(pci, host.sysfs_root)
                    current = sriov_vf.read(channel, place)
                except (VfError, OSError) as exc:
                    raise SettingRefused(nic.name, "sriov", str(exc)) from exc
                goal = wanted(current, nic.config.sriov or SriovConfig())
                nic.records[self.name] = {
                    "pf": place.pf_pci,
                    "vf": place.vf,
                    "host": current.to_dict(),
                    "pod": goal.to_dict(),
                }
        finally:
            channel.close()

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Apply each VF's settings through its PF (the VF in the pod, not yet up)."""
        todo = [nic for nic in nics if nic.records.get(self.name)]
        if not todo:
            return
        channel = _channel(pod.host)
        try:
            for nic in todo:
                record = nic.records[self.name]
                before, goal = VfState.from_dict(record["host"]), VfState.from_dict(record["pod"])
                try:
                    place = sriov_vf.pf_place(record["pf"], record["vf"], pod.host.sysfs_root)
                except VfError as exc:
                    raise NetnsOpError(nic.name, "sriov", str(exc)) from exc
                refused = sriov_vf.apply(channel, place, goal, sriov_vf.changes(before, goal))
                if refused:
                    first = refused[0]
                    raise NetnsOpError(nic.name, FIELDS[first.setting], first.reason, first.errno)
        finally:
            channel.close()

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """Clear the MAC the PF set for each VF whose claim gave it one, so that the VF may take its
        host MAC again at the return (a PF that keeps it refuses the VF's netdev any other). Best
        effort: a PF that cannot clear it gets the host's MAC through it once the VF is home."""
        todo = [m for m in nics if _pod_mac(m)]
        if not todo:
            return
        channel = _channel(pod.host)
        try:
            for m in todo:
                record = m.records[self.name]
                try:
                    place = sriov_vf.pf_place(record["pf"], record["vf"], pod.host.sysfs_root)
                    now = sriov_vf.read(channel, place)
                except VfError as exc:
                    log.info("VF MAC not cleared", extra={"kv": {"device": m.device, "reason": str(exc)}})
                    continue
                if now.mac.lower() != str(record["pod"]["mac"]).lower():
                    continue  # not (or no longer) the pod's: a return run again after the VF came home
                cleared = replace(VfState.from_dict(record["pod"]), mac=sriov_vf.NO_MAC)
                for refused in sriov_vf.apply(channel, place, cleared, ["mac"]):
                    log.warning("VF MAC not cleared", extra={"kv": {"device": m.device, "reason": str(refused)}})
        finally:
            channel.close()

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """Put back what the PF reported for the VF before the pod (read again: only what differs
        is written, so a return that runs twice writes nothing the second time)."""
        record = nic.records.get(self.name)
        if not record:
            return
        channel = _channel(host)
        try:
            before = VfState.from_dict(record["host"])
            refused = sriov_vf.put_back(channel, record["pf"], record["vf"], before, host.sysfs_root)
        except VfError as exc:
            # A PF gone or no longer listing the VF holds none of its settings any more.
            log.info("VF settings not restored", extra={"kv": {"device": nic.device, "reason": str(exc)}})
            return
        finally:
            channel.close()
        if refused:
            reasons = "; ".join(str(e) for e in refused)
            raise NetnsOpError(nic.device, "sriov-restore", reasons, refused[0].errno)
