"""A VF to vfio-pci and back (:mod:`driver.inventory.vfio_binding`) on a sysfs tree whose PCI bus
answers writes as the kernel's (:class:`tests.inventory.pci_kernel.PciKernel`); the real bind, on
QEMU's igb VFs, is in tests/inventory/test_sriov_vfs.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from driver.inventory.vfio_binding import VfioBinder, VfioError
from tests.inventory.pci_kernel import PciKernel

VF, OTHER, BRIDGE = "0000:44:10.0", "0000:44:10.2", "0000:40:01.0"


@pytest.fixture
def kernel(tmp_path: Path) -> PciKernel:
    k = PciKernel(tmp_path)
    k.function(VF, "igbvf", 22)
    return k


def _binder(kernel: PciKernel) -> VfioBinder:
    return VfioBinder(str(kernel.root), timeout_s=0.2, write=kernel.write)


def test_a_vf_goes_to_vfio_pci_and_back_to_its_driver(kernel: PciKernel) -> None:
    binder = _binder(kernel)
    devices = binder.bind(VF)
    assert kernel.driver(VF) == "vfio-pci"
    assert (devices.group, devices.group_path, devices.container_path) == (22, "/dev/vfio/22", "/dev/vfio/vfio")
    assert (kernel.root / "class/vfio/22").is_dir()
    assert binder.give_back(VF, "igbvf") is True
    assert kernel.driver(VF) == "igbvf"
    override = (kernel.root / "bus/pci/devices" / VF / "driver_override").read_text().strip()
    assert override == "(null)", "cleared: the next probe of the VF is its own driver's again"


def test_bind_and_give_back_twice_write_nothing_the_second_time(kernel: PciKernel) -> None:
    """A retried prepare, or a restarted driver finishing one, finds the VF where it should be."""
    binder = _binder(kernel)
    binder.bind(VF)
    before = len(kernel.writes)
    binder.bind(VF)
    assert len(kernel.writes) == before
    binder.give_back(VF, "igbvf")
    before = len(kernel.writes)
    binder.give_back(VF, "igbvf")
    assert len(kernel.writes) == before


def test_a_gone_vf_has_nothing_to_give_back(kernel: PciKernel) -> None:
    assert _binder(kernel).give_back("0000:44:10.6", "igbvf") is False


def test_a_refused_unbind_names_the_step_and_the_kernels_words(kernel: PciKernel) -> None:
    kernel.refuse["driver/unbind"] = errno.EBUSY
    with pytest.raises(VfioError, match=r"0000:44:10.0: unbind from igbvf .* failed: Device or resource busy"):
        _binder(kernel).bind(VF)


def test_a_driver_that_never_comes_is_a_timeout_naming_what_the_vf_has(kernel: PciKernel) -> None:
    binder = VfioBinder(str(kernel.root), timeout_s=0.05, write=lambda p, v: None)  # the kernel ignores every write
    with pytest.raises(VfioError, match=r"did not get to be bound to vfio-pci within 0.05 s \(it has igbvf\)"):
        binder.bind(VF)


def test_problems_name_the_group_the_iommu_and_the_driver(kernel: PciKernel) -> None:
    binder = _binder(kernel)
    assert binder.problems(VF, {VF}) == []
    kernel.function(OTHER, "igbvf", 22)
    kernel.function(BRIDGE, "pcieport", 22, cls="0x060400")
    [problem] = binder.problems(VF, {VF})
    assert problem.startswith(f"IOMMU group 22 of {VF} also holds {OTHER}, which the claim did not get")
    assert BRIDGE not in problem, "a bridge gives up DMA by itself"
    assert binder.problems(VF, {VF, OTHER}) == [], "the claim holds the whole group"
    kernel.function("0000:45:00.0", "igbvf", None)
    [no_iommu] = binder.problems("0000:45:00.0", {"0000:45:00.0"})
    assert "has no IOMMU group" in no_iommu and "intel_iommu=on" in no_iommu
    (kernel.root / "bus/pci/drivers/vfio-pci/bind").unlink()
    (kernel.root / "bus/pci/drivers/vfio-pci").rmdir()
    assert binder.problems(VF, {VF, OTHER}) == ["the vfio-pci driver is not loaded on this node (modprobe vfio-pci)"]
