"""The discovery scan: sysfs + one netlink dump each of links/addresses/routes -> sorted devices.

Pipeline (one :class:`SysfsReader` per scan, so every file is read at most once):

1. netdevs from ``class/net`` (plus netlink links when netlink applies), each resolved to its PCI
   function when it has one;
2. exclusions: loopback, the Go driver's ignored names, the default-route interfaces and
   ``exclude_interfaces`` together with everything enslaved to them (master chain);
3. PCI network functions (class ``0x02xxxx``) from ``bus/pci/devices``, skipping unbound ones and
   those taken by user-space drivers but VFs on vfio-pci (published for claims that take them so);
   a function whose netdev is in a pod's netns still appears
   (``net/`` entries are netns-tagged) without netdev attributes;
4. RDMA devices from ``class/infiniband``: attached to their PCI device, or published alone
   (``pci-...``) when their function is not a network function (e.g. eRDMA, class ``0x00ff``);
   a soft one (rxe, siw: no bus device) to the device of the netdev the kernel ties it to; one
   with neither is skipped with the reason;
5. non-PCI netdevs become devices named after the interface.

Each device (its attributes and host facts) is built by
:class:`~driver.inventory.device_builder.DeviceBuilder`; this module decides which devices there are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from driver.api.v1alpha1.network_config import VFIO_PCI
from driver.inventory import attributes as attrs
from driver.inventory.device_builder import PCI_IDS_PATHS, DeviceBuilder, Netdev
from driver.inventory.netlink_facts import ARPHRD_LOOPBACK, LinkFacts, LinkQuery, NetlinkFacts, enslaved_closure
from driver.inventory.rdma import RdmaDevice, rdma_has_pyverbs, scan_rdma
from driver.inventory.scan_replay import RecordingIO, ScanReplay, is_sysfs
from driver.inventory.scan_report import ScanReport, ScanWarnings
from driver.inventory.sysfs import (
    PLAIN_IO,
    IdentityCache,
    ImmutableFacts,
    SysfsReader,
    ifname_problem,
    name_bytes,
    pci_address_of,
)
from driver.model.device import Device

log = logging.getLogger(__name__)

USERSPACE_DRIVERS = frozenset({"vfio-pci", "uio_pci_generic", "igb_uio", "pci-stub"})
IGNORED_INTERFACES = frozenset({"cilium_net", "cilium_host", "docker0"})
PCI_IDENTITY = ImmutableFacts(("class", "vendor", "device", "subsystem_device", "sriov_totalvfs"), ("", "/physfn"))
"""A PCI function's read-only config-space copies, its place in the tree and its PF: fixed for
the function object's lifetime."""


@dataclass
class ScanState:
    """What the last full scan learnt that an incremental update of one link needs.

    Kept by the :class:`Scanner` (replaced by each full scan, edited in place by
    :mod:`driver.inventory.incremental`), never published.
    """

    netdevs: dict[str, Netdev]  # every netdev by name, excluded ones too
    excluded: set[str]  # excluded netdev names (roots, their slaves, loopback, ignored names)
    roots: set[str]  # exclude_interfaces and the default-route interfaces
    rdma_by_pci: dict[str, RdmaDevice]
    by_index: dict[int, str] = field(default_factory=dict)  # ifindex -> name (netlink only)
    rdma_by_netdev: dict[str, RdmaDevice] = field(default_factory=dict)  # soft RDMA devices by netdev


def _is_host_sysfs(root: str) -> bool:
    return os.path.realpath(root) == "/sys"


class Scanner:
    """Scans one node's sysfs (and netlink when it is the host's own) into publishable devices."""

    def __init__(
        self,
        sysfs_root: str = "/sys",
        netlink: bool = True,
        exclude_interfaces: Sequence[str] = (),
        *,
        netns: str | None = None,
        pci_ids_paths: Sequence[str] = PCI_IDS_PATHS,
        use_pyverbs: bool = True,
        numa_list: bool = False,
        replay: bool = True,
    ) -> None:
        self.sysfs_root = sysfs_root
        # Netlink describes the host, so it only applies to the host's own sysfs.
        self.netlink = netlink and _is_host_sysfs(sysfs_root)
        self.exclude_interfaces = tuple(exclude_interfaces)
        self.netns = netns
        self.use_pyverbs = use_pyverbs and self.netlink
        self.builder = DeviceBuilder(pci_ids_paths, numa_list)  # one device's attributes and host facts
        self.identity = IdentityCache()  # immutable per-object facts, across scans
        self.warnings = ScanWarnings()  # skipped devices, unreadable files: warned once each
        self.state: ScanState | None = None  # what the last full scan learnt (incremental updates)
        self._query: LinkQuery | None = None
        self._replay: ScanReplay | None = None
        self._report: tuple[ScanReport, dict[str, str]] | None = None  # the last full scan's
        # ``replay``: rescans replay the last full scan (a daemon); a one-shot scan (dranet
        # discover) has nothing to replay. pyverbs answers are inputs the replay cannot repeat.
        self._replayable = replay and not (self.use_pyverbs and rdma_has_pyverbs())
        self._on_sysfs = is_sysfs(sysfs_root)

    @property
    def numa_list(self) -> bool:
        """``resource.kubernetes.io/numaNode`` as a list (``--feature-gates DRAListTypeAttributes=true``)."""
        return self.builder.numa_list

    @numa_list.setter
    def numa_list(self, value: bool) -> None:
        self.builder.numa_list = value

    def link_query(self) -> LinkQuery:
        """The scanner's rtnetlink socket (opened on first use, kept across scans)."""
        if self._query is None:
            self._query = LinkQuery(self.netns)
        return self._query

    def close(self) -> None:
        """Close the netlink socket and the files the replay keeps open."""
        if self._query is not None:
            self._query.close()
            self._query = None
        if self._replay is not None:
            self._replay.close()
            self._replay = None

    # -- step 1: netdevs --------------------------------------------------------------------
    def _netdevs(self, sysfs: SysfsReader, facts: NetlinkFacts | None, report: ScanReport) -> dict[str, Netdev]:
        listed = set(sysfs.listdir("class/net"))
        names = set(listed)
        if facts:
            # netlink may give a name that is not UTF-8 as bytes: the same surrogate-escaped str as listdir
            names.update(os.fsdecode(n) for n in facts.links)
        names_by_index = facts.names_by_index() if facts else {}
        out: dict[str, Netdev] = {}
        for ifname in sorted(names):
            real = sysfs.resolve(f"class/net/{ifname}")
            problem = ifname_problem(ifname)
            if problem is None and ifname in listed and not sysfs.is_dir(f"class/net/{ifname}"):
                problem, real = "class/net entry is a dangling or looping link (no such device)", None
            if problem is not None:
                report.skip(f"netdev {name_bytes(ifname)}", problem, pci_address_of(real) if real else None)
                continue
            out[ifname] = self.netdev(sysfs, ifname, facts.links.get(ifname) if facts else None, names_by_index)
        return out

    @staticmethod
    def netdev(sysfs: SysfsReader, ifname: str, link: LinkFacts | None, names_by_index: dict[int, str]) -> Netdev:
        """One netdev: its sysfs object, PCI function and master (``names_by_index`` names the master)."""
        real = sysfs.resolve(f"class/net/{ifname}")
        master = None
        if link and link.master and link.master in names_by_index:
            master = names_by_index[link.master]
        elif real:
            master = sysfs.link_name(f"class/net/{ifname}/master")
        pci = pci_address_of(real) if real else None
        virtual = real is None or real.startswith("devices/virtual/")
        return Netdev(ifname, real, pci, virtual and pci is None, link, master)

    # -- step 2: exclusions -----------------------------------------------------------------
    def _roots(self, facts: NetlinkFacts | None) -> set[str]:
        roots = set(self.exclude_interfaces)
        if facts:
            roots |= facts.default_route_ifnames
        return roots

    def _excluded(self, sysfs: SysfsReader, netdevs: dict[str, Netdev], roots: set[str]) -> set[str]:
        excluded = enslaved_closure(roots, {n: d.master for n, d in netdevs.items() if d.master})
        for name, dev in netdevs.items():
            if self.excluded_by_itself(sysfs, dev):
                excluded.add(name)
        return excluded

    @staticmethod
    def excluded_by_itself(sysfs: SysfsReader, dev: Netdev) -> bool:
        """Loopback or a name the Go driver ignores (not counting roots and master chains)."""
        name = dev.ifname
        arphrd = dev.link.arphrd if dev.link else sysfs.read_int(f"class/net/{name}/type")
        return (
            name == "lo"
            or arphrd == ARPHRD_LOOPBACK
            or bool(dev.link and dev.link.loopback)
            or name in IGNORED_INTERFACES
        )

    # -- the scan ---------------------------------------------------------------------------
    def scan(self) -> list[Device]:
        """All publishable devices, sorted by name (deterministic for identical inputs).

        After the first scan, the calls of the last full scan are replayed first
        (:mod:`driver.inventory.scan_replay`): when every file, link, listing and netlink fact is
        as it was, the devices are the same and are returned without building them again.
        """
        facts: NetlinkFacts | None = None
        if self.netlink:
            try:
                facts = self.link_query().collect()
            except Exception as err:  # noqa: BLE001 - a scan must not kill the daemon
                log.warning("netlink dump failed, scanning sysfs only", extra={"kv": {"error": str(err)}})
                self.close()  # a fresh socket next time
        replay = self._replay
        if replay is not None and replay.result[1:] == (facts, self.numa_list) and replay.verify():
            if self._report is not None:
                self.warnings.emit(*self._report)  # the same skips and problems as the full scan
            return list(replay.result[0])
        if replay is not None:
            replay.close()
            self._replay = None
        io = RecordingIO(self._on_sysfs) if self._replayable else PLAIN_IO
        sysfs = SysfsReader(self.sysfs_root, io)
        devices = self._full_scan(sysfs, facts)
        del sysfs  # the scan's memo goes before the replay is set up, not after
        if isinstance(io, RecordingIO):
            self._replay = ScanReplay(io, (devices, facts, self.numa_list))
        return list(devices)

    def _full_scan(self, sysfs: SysfsReader, facts: NetlinkFacts | None) -> list[Device]:
        report = ScanReport()
        netdevs = self._netdevs(sysfs, facts, report)
        roots = self._roots(facts)
        excluded = self._excluded(sysfs, netdevs, roots)
        excluded_pci = {d.pci_address for n, d in netdevs.items() if n in excluded and d.pci_address}
        pci_netdevs: dict[str, list[Netdev]] = {}
        for name, dev in netdevs.items():
            if dev.pci_address and name not in excluded:
                pci_netdevs.setdefault(dev.pci_address, []).append(dev)
        rdma_devices = scan_rdma(sysfs, use_pyverbs=self.use_pyverbs, identity=self.identity, report=report)
        rdma_by_pci: dict[str, RdmaDevice] = {}
        for rdma in rdma_devices.values():
            if rdma.pci_address:
                rdma_by_pci.setdefault(rdma.pci_address, rdma)
        rdma_by_netdev = self._soft_rdma(rdma_devices, netdevs, excluded, report)

        devices: list[Device] = []
        listed = sysfs.listdir("bus/pci/devices")
        identity_keys = {bdf: self.identity.prime(sysfs, f"bus/pci/devices/{bdf}", PCI_IDENTITY) for bdf in listed}
        network_pci = self._network_functions(sysfs, listed, report)
        for bdf in network_pci:
            if bdf in excluded_pci or bdf in report.skipped_pci or not self.bound_to_kernel(sysfs, bdf):
                continue
            functions = pci_netdevs.get(bdf, [])
            paired = rdma_by_pci.get(bdf) or (rdma_by_netdev.get(functions[0].ifname) if functions else None)
            self._add(devices, report, f"PCI function {bdf}", self.builder.pci_device, sysfs, bdf, functions, paired)

        network = set(network_pci)
        for rdma in rdma_devices.values():
            pci = rdma.pci_address
            if pci is None or pci in network or pci in excluded_pci or pci in report.skipped_pci:
                continue  # soft RDMA (rxe/siw) has no function: with its netdev; network ones were handled above
            self._add(devices, report, f"PCI function {pci}", self.builder.pci_device, sysfs, pci, [], rdma)
        for bdf, key in identity_keys.items():
            self.identity.remember(sysfs, f"bus/pci/devices/{bdf}", key, PCI_IDENTITY)
        self.identity.end_scan()

        for name, dev in netdevs.items():
            if dev.pci_address or name in excluded:
                continue
            build = self.builder.netdev_device
            self._add(devices, report, f"netdev {name_bytes(name)}", build, sysfs, dev, rdma_by_netdev.get(name))

        devices.sort(key=lambda d: d.name)
        self.warnings.emit(report, sysfs.problems)
        self._report = (report, dict(sysfs.problems))  # a replay reports the same again
        # Skipped netdevs stay out of the state too: an event for one is handled like a new link.
        by_index = facts.names_by_index() if facts else {}
        self.state = ScanState(netdevs, excluded, roots, rdma_by_pci, by_index, rdma_by_netdev)
        return devices

    @staticmethod
    def _soft_rdma(
        rdma_devices: dict[str, RdmaDevice], netdevs: dict[str, Netdev], excluded: set[str], report: ScanReport
    ) -> dict[str, RdmaDevice]:
        """Soft RDMA devices (no PCI function) by the netdev they are tied to; one whose netdev is
        unknown or excluded is skipped into ``report`` with the reason."""
        out: dict[str, RdmaDevice] = {}
        for rdma in rdma_devices.values():
            if rdma.pci_address:
                continue
            what = f"RDMA device {name_bytes(rdma.name)}"
            if not rdma.netdev:
                report.skip(what, "no PCI function and no netdev in port 1's GID table (nothing to publish it with)")
            elif rdma.netdev not in netdevs:
                report.skip(what, f"its netdev {name_bytes(rdma.netdev)} is not in this network namespace")
            elif rdma.netdev in excluded:
                report.skip(what, f"its netdev {name_bytes(rdma.netdev)} is excluded (uplink, its slave or filtered)")
            else:
                out.setdefault(rdma.netdev, rdma)
        return out

    @staticmethod
    def _network_functions(sysfs: SysfsReader, listed: list[str], report: ScanReport) -> list[str]:
        """The PCI functions of class network (0x02...), in listing order; one whose class cannot be
        read is skipped (reported once)."""
        out = []
        for bdf in listed:
            cls = sysfs.read(f"bus/pci/devices/{bdf}/class")
            if cls is None and f"bus/pci/devices/{bdf}/class" in sysfs.problems:
                reason = sysfs.problems.pop(f"bus/pci/devices/{bdf}/class")  # warned about here, once
                report.skip(f"PCI function {bdf}", f"its class cannot be read: {reason}")
            elif (cls or "").lower().startswith("0x02"):
                out.append(bdf)
        return out

    @staticmethod
    def _add(devices: list[Device], report: ScanReport, what: str, build: Callable[..., Device], *args: Any) -> None:
        """Append ``build(*args)``; a device whose facts make it fail is skipped, never the scan."""
        try:
            devices.append(build(*args))
        except Exception as exc:  # noqa: BLE001 - one bad device must not hide the others
            report.skip(what, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def bound_to_kernel(sysfs: SysfsReader, bdf: str) -> bool:
        """Whether a PCI function is published by its driver: a kernel driver, or a VF on vfio-pci
        (for claims that take it on vfio-pci: ``dra.net/pciDriver``); unbound functions and other
        user-space-driven ones are skipped."""
        driver = sysfs.link_name(f"bus/pci/devices/{bdf}/driver")
        if driver == VFIO_PCI and sysfs.resolve(f"bus/pci/devices/{bdf}/physfn"):
            return True
        if driver is None or driver in USERSPACE_DRIVERS:
            log.debug("skipping PCI function", extra={"kv": {"pci": bdf, "driver": driver}})
            return False
        return True


def merge_allocated(scanned: list[Device], allocated: dict[str, Device]) -> list[Device]:
    """Scanned devices plus allocated ones whose netdev moved into a pod, with last known attributes.

    Live attributes win where present; attributes only the snapshot knows (``ifName``, ``mac``,
    ...) fill in, so the published device does not change while a pod uses it. Allocated devices
    missing from the scan altogether (virtual netdevs) are kept as they were.
    """
    by_name = {d.name: d for d in scanned}
    out: dict[str, Device] = dict(by_name)
    for name, snapshot in allocated.items():
        live = by_name.get(name)
        if live is None:
            out[name] = replace(snapshot, attributes=dict(snapshot.attributes), host=replace(snapshot.host))
            continue
        merged_host = replace(live.host)
        for fname in ("pci_address", "ifname", "permanent_mac", "rdma_device", "numa_node", "sriov_pf"):
            if getattr(merged_host, fname) is None:
                setattr(merged_host, fname, getattr(snapshot.host, fname))
        if not merged_host.char_devices:
            merged_host.char_devices = list(snapshot.host.char_devices)
        merged = {**snapshot.attributes, **live.attributes}
        out[name] = Device(name, attrs.finalize(merged, name), merged_host)
    return [out[n] for n in sorted(out)]
