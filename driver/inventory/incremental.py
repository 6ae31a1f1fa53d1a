"""One link event, one device: the inventory kept current between full scans.

A link event (RTM_NEWLINK/RTM_DELLINK) names one link. :class:`LinkUpdater` rebuilds only
what that link feeds: its own device when it is a virtual netdev, or the device of its PCI
function (whose RDMA port facts are read again too; a netdev with a soft RDMA device, whose
device comes and goes with it without an event of its own, asks for a full scan), from that link's netlink facts (one
RTM_GETLINK and a filtered address dump, :meth:`LinkQuery.link`) and its sysfs files. Everything
else comes from what the last full scan learnt (:class:`~driver.inventory.discovery.ScanState`:
the netdevs, exclusions, RDMA devices), which the update edits in place.

When a change reshapes the exclusions of other interfaces (a link with slaves becomes or stops
being excluded), or the last full scan is unknown, the answer is "do a full scan"
(:attr:`InventoryDelta.full_scan`). The full scan at start and on the resync timer stays the
safety net for what link events never say (routes: the uplink; PCI hotplug without a netdev).

Kept apart from :mod:`driver.inventory.discovery` on purpose: the full scan's pipeline and the
per-link path share the reading of one netdev (:meth:`Scanner.netdev`) and the per-device
builders (:class:`~driver.inventory.device_builder.DeviceBuilder`), nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from driver.inventory.device_builder import Netdev
from driver.inventory.discovery import PCI_IDENTITY, Scanner, ScanState
from driver.inventory.names import netdev_device_name, pci_device_name
from driver.inventory.rdma import refresh_ports
from driver.inventory.sysfs import SysfsReader, ifname_problem, name_bytes
from driver.model.device import Device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkChange:
    """A link event as the updater needs it: the link's ifindex (0: unknown) and the name it carried."""

    index: int
    ifname: str


@dataclass
class InventoryDelta:
    """Devices rebuilt (by name) and device names gone; ``full_scan`` when only a full scan is right."""

    updated: dict[str, Device] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    full_scan: bool = False

    def __bool__(self) -> bool:
        return bool(self.updated or self.removed or self.full_scan)


class LinkUpdater:
    """Applies link changes to the :class:`Scanner`'s last scan state; one device each."""

    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner

    def apply(self, changes: Iterable[LinkChange], pause: Callable[[], object] | None = None) -> InventoryDelta:
        """The devices ``changes`` affect, rebuilt; ``pause`` is called between two links (a hook
        waiting for the interpreter must not wait for a whole batch)."""
        delta = InventoryDelta()
        state = self.scanner.state
        if state is None:
            delta.full_scan = True
            return delta
        sysfs = SysfsReader(self.scanner.sysfs_root)
        for i, change in enumerate(changes):
            if pause is not None and i:
                pause()
                sysfs = SysfsReader(self.scanner.sysfs_root)  # time passed: read afresh
            try:
                self._one(sysfs, state, change, delta)
            except OSError as err:  # netlink refused: let the full scan sort it out
                log.warning("link update failed", extra={"kv": {"ifname": change.ifname, "error": str(err)}})
                delta.full_scan = True
            if delta.full_scan:
                break
        delta.removed -= set(delta.updated)
        return delta

    # -- one link ---------------------------------------------------------------------------
    def _current(self, sysfs: SysfsReader, change: LinkChange) -> tuple[str | None, Netdev | None]:
        """The link's name now and its netdev, or (None, None) when it is gone from this netns
        or is one the full scan skips (a name we cannot publish, a dangling class/net link)."""
        scanner = self.scanner
        if scanner.netlink and change.index:
            link = scanner.link_query().link(change.index)
            if link is None:
                return None, None
            name: str = link.ifname
        else:
            link, name = None, change.ifname
        in_sysfs = sysfs.resolve(f"class/net/{name}") is not None
        if not in_sysfs and link is None:
            return None, None
        problem = ifname_problem(name)
        if problem is None and in_sysfs and not sysfs.is_dir(f"class/net/{name}"):
            problem = "class/net entry is a dangling or looping link (no such device)"
        if problem is not None:
            log.info("link skipped", extra={"kv": {"ifname": name_bytes(name), "reason": problem}})
            return None, None
        state = scanner.state
        assert state is not None
        return name, scanner.netdev(sysfs, name, link, state.by_index)

    def _one(self, sysfs: SysfsReader, state: ScanState, change: LinkChange, delta: InventoryDelta) -> None:
        if {change.ifname, state.by_index.get(change.index)} & state.rdma_by_netdev.keys():
            # A soft RDMA device (rxe, siw) lives and dies with its netdev, with no event of its own.
            delta.full_scan = True
            return
        name, dev = self._current(sysfs, change)
        pci = self._forget_old(state, change, name, delta)
        if pci is None:
            return  # delta.full_scan
        if change.index and name is None:
            state.by_index.pop(change.index, None)
        if name is not None and dev is not None:
            found = self._record(sysfs, state, change, name, dev, delta)
            if found is None:
                return  # delta.full_scan
            pci |= found
        for bdf in pci:
            self._pci(sysfs, state, bdf, delta)

    def _forget_old(
        self, state: ScanState, change: LinkChange, name: str | None, delta: InventoryDelta
    ) -> set[str] | None:
        """Forget the link's old names (renamed away or gone): the PCI functions whose netdev went,
        or None when only a full scan can tell (``delta.full_scan`` set)."""
        pci: set[str] = set()
        for old in {n for n in (state.by_index.get(change.index), change.ifname) if n and n != name}:
            gone = state.netdevs.pop(old, None)
            if gone is None:
                continue
            if self._has_slaves(state, old) and old in state.excluded:
                delta.full_scan = True  # its slaves were excluded through it
                return None
            if gone.pci_address:
                pci.add(gone.pci_address)
            elif old not in state.excluded:
                delta.removed.add(netdev_device_name(old))
            state.excluded.discard(old)
        return pci

    def _record(
        self, sysfs: SysfsReader, state: ScanState, change: LinkChange, name: str, dev: Netdev, delta: InventoryDelta
    ) -> set[str] | None:
        """Record the link as it is now: the PCI functions to rebuild for it (a netdev without one is
        built here), or None when only a full scan can tell (``delta.full_scan`` set)."""
        previous = state.netdevs.get(name)
        excluded = (
            name in state.roots
            or (dev.master is not None and dev.master in state.excluded)
            or self.scanner.excluded_by_itself(sysfs, dev)
        )
        if excluded != (name in state.excluded) and self._has_slaves(state, name):
            delta.full_scan = True  # the exclusion of its slaves changes with it
            return None
        state.netdevs[name] = dev
        if change.index:
            state.by_index[change.index] = name
        (state.excluded.add if excluded else state.excluded.discard)(name)
        pci: set[str] = set()
        if previous is not None and previous.pci_address and previous.pci_address != dev.pci_address:
            pci.add(previous.pci_address)
        if dev.pci_address:
            pci.add(dev.pci_address)
        elif excluded:
            delta.removed.add(netdev_device_name(name))
        else:
            self._build(delta, netdev_device_name(name), self.scanner.builder.netdev_device, sysfs, dev)
        return pci

    @staticmethod
    def _has_slaves(state: ScanState, name: str) -> bool:
        return any(d.master == name for d in state.netdevs.values())

    def _pci(self, sysfs: SysfsReader, state: ScanState, bdf: str, delta: InventoryDelta) -> None:
        """Rebuild PCI function ``bdf`` (its netdev changed), as the full scan would."""
        scanner = self.scanner
        base = f"bus/pci/devices/{bdf}"
        key = scanner.identity.prime(sysfs, base, PCI_IDENTITY)
        name = pci_device_name(bdf)
        if not (sysfs.read(f"{base}/class") or "").lower().startswith("0x02"):
            return  # not a network function: published for its RDMA device only, which no link event changes
        netdevs = sorted((d for d in state.netdevs.values() if d.pci_address == bdf), key=lambda d: d.ifname)
        if any(d.ifname in state.excluded for d in netdevs) or not scanner.bound_to_kernel(sysfs, bdf):
            delta.removed.add(name)
            delta.updated.pop(name, None)
            return
        rdma = state.rdma_by_pci.get(bdf)
        if rdma is not None:
            rdma = state.rdma_by_pci[bdf] = refresh_ports(sysfs, rdma, scanner.use_pyverbs)
        self._build(delta, name, scanner.builder.pci_device, sysfs, bdf, netdevs, rdma)
        scanner.identity.remember(sysfs, base, key, PCI_IDENTITY)

    @staticmethod
    def _build(delta: InventoryDelta, name: str, build: Callable[..., Device], *args: Any) -> None:
        """``delta.updated[name] = build(*args)``; a device whose facts make it fail is left out
        (as the full scan skips it), never the whole update."""
        try:
            delta.updated[name] = build(*args)
        except Exception as exc:  # noqa: BLE001 - one bad device must not stop the others
            log.warning("device skipped", extra={"kv": {"device": name, "error": f"{type(exc).__name__}: {exc}"}})
            delta.updated.pop(name, None)
            delta.removed.add(name)
