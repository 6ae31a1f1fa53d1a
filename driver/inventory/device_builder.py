"""One publishable device from what a scan found: a PCI function (with its netdev and RDMA device)
or a netdev without a PCI function.

Owns the attributes a device carries (``dra.net/...`` and the standard ``resource.kubernetes.io/...``
ones, from sysfs and netlink facts) and the host facts the driver keeps for itself. Shared by the
full scan (:class:`driver.inventory.discovery.Scanner`) and the one-link updates
(:mod:`driver.inventory.incremental`), so a device is built the same way by both.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from driver.api.v1alpha1.network_config import VFIO_PCI
from driver.inventory import attributes as attrs
from driver.inventory.attributes import D
from driver.inventory.names import netdev_device_name, pci_device_name
from driver.inventory.netlink_facts import ARPHRD_ENCAP, LinkFacts
from driver.inventory.numa_list import numa_node_list
from driver.inventory.rdma import RdmaDevice
from driver.inventory.sysfs import SysfsReader, data_direct_for, is_data_direct_function, pcie_root_of
from driver.model.device import INT64_MAX, STANDARD_DOMAIN, AttributeValue, Device, HostFacts

log = logging.getLogger(__name__)

PCI_IDS_PATHS: tuple[str, ...] = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")
S = STANDARD_DOMAIN + "/"


@dataclass(slots=True)
class Netdev:
    """One netdev as seen by this scan (sysfs and, when available, netlink)."""

    ifname: str
    sysfs_path: str | None  # resolved class/net/<if> path relative to the sysfs root
    pci_address: str | None
    virtual: bool
    link: LinkFacts | None
    master: str | None


class NotANetworkDevice(ValueError):
    """A PCI function of network class that is no NIC (a ConnectX-8 Data Direct DMA engine): the
    scan skips it with this reason instead of publishing a device no pod could use."""


class PciIds:
    """Vendor/device names from pci.ids, loaded lazily, only for the IDs actually asked about."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._path = next((p for p in paths if os.path.isfile(p)), None)
        self._vendors: dict[str, str] | None = None
        self._devices: dict[tuple[str, str], str] = {}

    def _load(self) -> None:
        self._vendors = {}
        if not self._path:
            return
        vendor = ""
        with open(self._path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue
                if line.startswith("C "):
                    break  # device classes follow the vendor list
                if line[0] != "\t":
                    vendor = line[:4].lower()
                    self._vendors[vendor] = line[4:].strip()
                elif line[1] != "\t":
                    self._devices[(vendor, line[1:5].lower())] = line[5:].strip()

    def vendor(self, vid: str) -> str:
        """The vendor name, or the 4-digit hex ID when unknown."""
        if self._vendors is None:
            self._load()
        return self._vendors.get(vid, vid) if self._vendors else vid

    def device(self, vid: str, did: str) -> str:
        """The device name, or the 4-digit hex ID when unknown."""
        if self._vendors is None:
            self._load()
        return self._devices.get((vid, did), did)


PCI_BRIDGE_CLASS = "0x0604"
"""A PCI-to-PCI bridge (a PCIe port): in an IOMMU group, it does not keep a function from vfio-pci."""


def _hex4(text: str | None) -> str | None:
    if not text:
        return None
    text = text.lower()
    # Interned: a node has a handful of distinct IDs, each kept once however many devices carry it.
    return sys.intern(text[2:] if text.startswith("0x") else text)


class DeviceBuilder:
    """Builds the :class:`Device` of one PCI function or one netdev from a :class:`SysfsReader`.

    ``numa_list``: publish ``resource.kubernetes.io/numaNode`` as a list (``--feature-gates
    DRAListTypeAttributes=true``).
    """

    def __init__(self, pci_ids_paths: Sequence[str] = PCI_IDS_PATHS, numa_list: bool = False) -> None:
        self.pci_ids = PciIds(pci_ids_paths)
        self.numa_list = numa_list

    def netdev_device(self, sysfs: SysfsReader, dev: Netdev, rdma: RdmaDevice | None = None) -> Device:
        """The device of a netdev without a PCI function (virtual, or non-PCI hardware), named after
        it, with the soft RDMA device tied to it (rxe, siw) if any."""
        if not dev.virtual:
            log.debug(
                "non-PCI hardware netdev published as a standalone device",
                extra={"kv": {"ifname": dev.ifname, "path": dev.sysfs_path}},
            )
        values = self._netdev_attributes(sysfs, dev)
        host = HostFacts(ifname=dev.ifname, virtual=dev.virtual, permanent_mac=self._perm_mac(dev, values))
        self._rdma_attributes(rdma, values, host)
        dev_name = netdev_device_name(dev.ifname)
        return Device(dev_name, attrs.finalize(values, dev_name), host)

    def pci_device(self, sysfs: SysfsReader, bdf: str, netdevs: list[Netdev], rdma: RdmaDevice | None) -> Device:
        """The device of PCI function ``bdf`` with its (non-excluded) netdevs and RDMA device.

        Raises :class:`NotANetworkDevice` for a Data Direct DMA function: it may report a network
        class, but it has no port, netdev or RDMA device of its own (its NIC is published instead).
        """
        if not netdevs and rdma is None and is_data_direct_function(sysfs, bdf):
            raise NotANetworkDevice("a ConnectX-8 Data Direct DMA function: it carries the DMA of its NIC, not traffic")
        values, host = self._pci_attributes(sysfs, bdf)
        if netdevs:
            # A multi-port function (rare) publishes its first netdev by name; the device is the function.
            dev = netdevs[0]
            values.update(self._netdev_attributes(sysfs, dev))
            host.ifname = dev.ifname
            host.permanent_mac = self._perm_mac(dev, values)
            if rdma is None or not rdma.rate_gbps:
                speed = self._speed_gbps(sysfs, dev.ifname)
                if speed:
                    values[D + "rateGbps"] = speed
        self._rdma_attributes(rdma, values, host)
        name = pci_device_name(bdf)
        return Device(name, attrs.finalize(values, name), host)

    @staticmethod
    def _perm_mac(dev: Netdev, values: dict[str, AttributeValue]) -> str | None:
        if dev.link and dev.link.permanent_mac:
            return dev.link.permanent_mac
        mac = values.get(D + "mac")
        return mac if isinstance(mac, str) else None

    def _netdev_attributes(self, sysfs: SysfsReader, dev: Netdev) -> dict[str, AttributeValue]:
        base = f"class/net/{dev.ifname}"
        link = dev.link
        out: dict[str, AttributeValue] = {D + "ifName": dev.ifname, D + "virtual": dev.virtual}
        mac = link.mac if link and link.mac else sysfs.read(f"{base}/address")
        if mac:
            out[D + "mac"] = mac
        mtu = link.mtu if link and link.mtu else sysfs.read_int(f"{base}/mtu")
        if mtu is not None:
            out[D + "mtu"] = mtu
        state = link.operstate if link and link.operstate else sysfs.read(f"{base}/operstate")
        if state:
            out[D + "state"] = sys.intern(state)  # up, down...: one string for every device
        arphrd = link.arphrd if link else sysfs.read_int(f"{base}/type")
        if arphrd is not None:
            out[D + "encapsulation"] = ARPHRD_ENCAP.get(arphrd, "unknown")
        kind = self._kind(sysfs, dev, arphrd)
        if kind:
            out[D + "type"] = kind
        alias = link.alias if link else sysfs.read(f"{base}/ifalias")
        if alias:
            out[D + "alias"] = alias
        if link and link.ipv4:
            out[D + "ipv4"] = ",".join(link.ipv4)
        if link and link.ipv6:
            out[D + "ipv6"] = ",".join(link.ipv6)
        if link:  # as dranet: whether any TC bpf filter or tcx program is attached, and their names
            out[D + "ebpf"] = bool(link.tc_filters or link.tcx_programs)
            if link.tc_filters:
                out[D + "tcFilterNames"] = ",".join(link.tc_filters)
            if link.tcx_programs:
                out[D + "tcxProgramNames"] = ",".join(link.tcx_programs)
        return out

    @staticmethod
    def _kind(sysfs: SysfsReader, dev: Netdev, arphrd: int | None) -> str | None:
        """``type`` like Go's ``link.Type()``; from sysfs only when sysfs can tell."""
        if dev.link:
            return dev.link.kind or "device"
        if dev.pci_address:
            return "ipoib" if arphrd == 32 else "device"
        base = f"class/net/{dev.ifname}"
        if sysfs.exists(f"{base}/bridge"):
            return "bridge"
        if sysfs.exists(f"{base}/bonding"):
            return "bond"
        if not dev.virtual:
            return "device"
        return None  # a virtual link sysfs cannot classify (veth, vlan, ...)

    def _pci_attributes(self, sysfs: SysfsReader, bdf: str) -> tuple[dict[str, AttributeValue], HostFacts]:
        base = f"bus/pci/devices/{bdf}"
        out: dict[str, AttributeValue] = {D + "pciAddress": bdf, S + "pciBusID": bdf}
        host = HostFacts(pci_address=bdf)
        real = sysfs.resolve(base)
        root = pcie_root_of(real) if real else None
        direct = data_direct_for(sysfs, bdf)
        if direct.function is not None and direct.function.pcie_root:
            # The NIC's RDMA DMA goes through its Data Direct function: the GPU it pairs with (and
            # that a claim's matchAttribute on pcieRoot must find) is under that function's root.
            root = direct.function.pcie_root
            out[D + "dataDirectPciAddress"] = direct.function.pci_address
        elif direct.problem:
            log.warning(
                "Data Direct function not used: pcieRoot is the NIC function's own",
                extra={"kv": {"pci": bdf, "reason": direct.problem, "pcieRoot": root}},
            )
        if root:
            out[S + "pcieRoot"] = sys.intern(root)  # shared by every function under the host bridge
        vid, did = _hex4(sysfs.read(f"{base}/vendor")), _hex4(sysfs.read(f"{base}/device"))
        if vid:
            out[D + "pciVendor"] = self.pci_ids.vendor(vid)
            if did:
                out[D + "pciDevice"] = self.pci_ids.device(vid, did)
        sub = _hex4(sysfs.read(f"{base}/subsystem_device"))
        if sub:
            out[D + "pciSubsystem"] = sub
        numa = sysfs.read_int(f"{base}/numa_node")
        if numa is not None and numa >= 0:  # -1 = firmware does not say: publish nothing
            sane = numa <= INT64_MAX  # else a corrupt value: attributes.finalize drops it, with a warning
            out[D + "numaNode"] = numa
            out[S + "numaNode"] = numa_node_list(sysfs, numa) if self.numa_list and sane else numa
            host.numa_node = numa if sane else None
        out.update(self._iommu_attributes(sysfs, bdf))
        physfn = sysfs.resolve(f"{base}/physfn")
        # A VF has no SR-IOV capability of its own, so the kernel gives it no sriov_* files:
        # skip that (failing) open on every VF, the bulk of an SR-IOV host's functions.
        total = None if physfn else sysfs.read_int(f"{base}/sriov_totalvfs")
        out[D + "sriov"] = bool(total)
        if total:
            out[D + "sriovVfs"] = sysfs.read_int(f"{base}/sriov_numvfs") or 0
        if physfn:
            out[D + "isSriovVf"] = True
            host.sriov_pf = os.path.basename(physfn)
            out.update(self._pf_attributes(sysfs, host.sriov_pf, real))
            if sysfs.link_name(f"{base}/driver") == VFIO_PCI:  # on vfio-pci already: for vfio claims only
                out[D + "pciDriver"] = VFIO_PCI
        return out, host

    @staticmethod
    def _iommu_attributes(sysfs: SysfsReader, bdf: str) -> dict[str, AttributeValue]:
        """The function's IOMMU group (none: the IOMMU is off), and whether the function could go to
        vfio-pci alone: the kernel hands a group to a VM or a DPDK process only whole, so every
        other function of the group would have to leave its driver too (PCIe bridges aside: their
        driver gives up DMA on its own). A shared group makes the function ``vfioUnsafe``, the
        reason naming the other functions; the function stays published for its netdev's uses."""
        group = sysfs.resolve(f"bus/pci/devices/{bdf}/iommu_group")
        name = os.path.basename(group) if group else ""
        if not name.isdigit():
            return {}
        others = [
            f
            for f in sysfs.listdir(f"{group}/devices")
            if f != bdf and not (sysfs.read(f"bus/pci/devices/{f}/class") or "").startswith(PCI_BRIDGE_CLASS)
        ]
        out: dict[str, AttributeValue] = {D + "iommuGroup": int(name)}
        if others:
            out[D + "vfioUnsafe"] = True
            out[D + "vfioUnsafeReason"] = f"IOMMU group {name} also holds {','.join(others)}"
        return out

    @staticmethod
    def _pf_attributes(sysfs: SysfsReader, pf: str, vf_real: str | None) -> dict[str, AttributeValue]:
        """What a VF's claim may select on about its PF, under the names the SR-IOV DRA driver uses
        for the same facts: the PF's address, its netdev, its device ID, the VF's index on it
        (the PF's ``virtfn<N>`` link that leads to this VF)."""
        base = f"bus/pci/devices/{pf}"
        out: dict[str, AttributeValue] = {D + "pfPciAddress": pf}
        names = sysfs.listdir(f"{base}/net")
        if names:
            out[D + "pfName"] = names[0]
        did = _hex4(sysfs.read(f"{base}/device"))
        if did:
            out[D + "pfDeviceID"] = did
        for entry in sysfs.listdir(base):
            if entry.startswith("virtfn") and entry[6:].isdigit() and sysfs.resolve(f"{base}/{entry}") == vf_real:
                out[D + "vfIndex"] = int(entry[6:])
                break
        return out

    @staticmethod
    def _rdma_attributes(rdma: RdmaDevice | None, out: dict[str, AttributeValue], host: HostFacts) -> None:
        out[D + "rdma"] = rdma is not None
        if rdma is None:
            return
        out[D + "rdmaDevice"] = rdma.name
        if rdma.link_layer:
            out[D + "linkLayer"] = rdma.link_layer
        if rdma.rate_gbps:
            out[D + "rateGbps"] = rdma.rate_gbps
        host.rdma_device = rdma.name
        host.char_devices = list(rdma.char_devices)

    @staticmethod
    def _speed_gbps(sysfs: SysfsReader, ifname: str) -> int | None:
        mbps = sysfs.read_int(f"class/net/{ifname}/speed")
        return mbps // 1000 if mbps and mbps >= 1000 else None
