"""A NIC's IOMMU group, and ``vfioUnsafe`` where its group holds other functions (a fixture tree
with the kernel's ``iommu_group`` links added; the real groups of QEMU's emulated IOMMU are read in
the SR-IOV guests, tests/inventory/test_sriov_vfs.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from driver.inventory.discovery import Scanner
from driver.model.device import Device
from harness.sysfs import SysfsTrees

D = "dra.net/"


def _group(root: Path, number: int, functions: list[str]) -> None:
    """IOMMU group ``number`` holding ``functions``, linked both ways as the kernel does."""
    devices = root / "kernel" / "iommu_groups" / str(number) / "devices"
    devices.mkdir(parents=True)
    for bdf in functions:
        real = (root / "bus" / "pci" / "devices" / bdf).resolve()
        (devices / bdf).symlink_to(os.path.relpath(real, devices))
        (real / "iommu_group").symlink_to(os.path.relpath(devices.parent, real))


def _scan(root: Path) -> dict[str, Device]:
    scanner = Scanner(str(root), pci_ids_paths=(), replay=False)
    try:
        return {d.attributes[D + "pciAddress"]: d for d in scanner.scan() if D + "pciAddress" in d.attributes}
    finally:
        scanner.close()


def test_a_shared_group_makes_its_nics_vfio_unsafe_and_names_the_others(
    build_topology: Callable[[str], Path],
) -> None:
    root = build_topology("single-socket")
    _group(root, 7, ["0000:17:00.0", "0000:17:00.1"])  # two ports of one NIC, no ACS between them
    _group(root, 8, ["0000:00:01.0", "0000:31:00.0"])  # a NIC behind its root port
    _group(root, 9, ["0000:03:00.0", "0000:5e:00.0"])  # a device beside the VGA (not published itself)
    devices = _scan(root)
    first, second = devices["0000:17:00.0"].attributes, devices["0000:17:00.1"].attributes
    assert (first[D + "iommuGroup"], first[D + "vfioUnsafe"]) == (7, True)
    assert first[D + "vfioUnsafeReason"] == "IOMMU group 7 also holds 0000:17:00.1"
    assert second[D + "vfioUnsafeReason"] == "IOMMU group 7 also holds 0000:17:00.0"
    behind_port = devices["0000:31:00.0"].attributes
    assert behind_port[D + "iommuGroup"] == 8
    assert D + "vfioUnsafe" not in behind_port and D + "vfioUnsafeReason" not in behind_port, "a bridge is no reason"
    beside_vga = devices["0000:5e:00.0"].attributes
    assert beside_vga[D + "vfioUnsafeReason"] == "IOMMU group 9 also holds 0000:03:00.0"


def test_without_an_iommu_there_is_no_group_and_nothing_said(sysfs_trees: SysfsTrees) -> None:
    root = sysfs_trees.get("single-socket")
    for device in _scan(root).values():
        assert not {D + "iommuGroup", D + "vfioUnsafe", D + "vfioUnsafeReason"} & set(device.attributes)
